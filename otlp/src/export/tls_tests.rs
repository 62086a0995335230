//! The exporter against real TLS servers with generated certificates.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_server::{
    ProfilesService, ProfilesServiceServer,
};
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use super::*;
use crate::test_fixtures;

struct Accepting;

#[tonic::async_trait]
impl ProfilesService for Accepting {
    async fn export(
        &self,
        _request: tonic::Request<ExportProfilesServiceRequest>,
    ) -> Result<tonic::Response<ExportProfilesServiceResponse>, tonic::Status> {
        Ok(tonic::Response::new(
            ExportProfilesServiceResponse::default(),
        ))
    }
}

/// PEM files of a CA, a server certificate for `localhost` it signed, a
/// client certificate it signed, and a self-signed server certificate.
struct Pki {
    dir: PathBuf,
    ca: String,
    server: (String, String),
    client: (String, String),
    self_signed: (String, String),
}

impl Pki {
    fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("icecore-tls-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let leaf = |names: Vec<String>| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names)
                .unwrap()
                .signed_by(&key, &ca)
                .unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let self_signed_key = KeyPair::generate().unwrap();
        let self_signed = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&self_signed_key)
            .unwrap();
        Pki {
            ca: ca.pem(),
            server: leaf(vec!["localhost".to_owned()]),
            client: leaf(vec!["icecore-agent".to_owned()]),
            self_signed: (self_signed.pem(), self_signed_key.serialize_pem()),
            dir,
        }
    }

    fn file(&self, name: &str, content: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Serves with `identity`, requiring a client certificate from `client_ca`
/// when given; returns the port.
async fn serve_tls(identity: &(String, String), client_ca: Option<&str>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(&identity.0, &identity.1));
    if let Some(ca) = client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(ca));
    }
    let server = Server::builder().tls_config(tls).unwrap().add_service(
        ProfilesServiceServer::new(Accepting)
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
    );
    tokio::spawn(server.serve_with_incoming(TcpIncoming::from(listener)));
    port
}

async fn export_with(port: u16, tls: TlsOptions) -> Result<ExportOutcome, ExportError> {
    let exporter = OtlpExporter::new(OtlpExporterOptions {
        timeout: Duration::from_secs(5),
        tls,
        ..OtlpExporterOptions::new(format!("https://localhost:{port}"))
    })?;
    exporter.export(&test_fixtures::batch()).await
}

fn assert_sent(result: Result<ExportOutcome, ExportError>) {
    match result {
        Ok(ExportOutcome::Sent { samples, .. }) => assert!(samples > 0),
        other => panic!("not sent: {other:?}"),
    }
}

#[tokio::test]
async fn private_ca_and_client_certificate() {
    let pki = Pki::new("mtls");
    let ca_file = pki.file("ca.pem", &pki.ca);
    let cert = pki.file("client.pem", &pki.client.0);
    let key = pki.file("client-key.pem", &pki.client.1);
    let port = serve_tls(&pki.server, Some(&pki.ca)).await;

    assert_sent(
        export_with(
            port,
            TlsOptions {
                ca_file: Some(ca_file.clone()),
                client_identity: Some((cert, key)),
                insecure_skip_verify: false,
            },
        )
        .await,
    );
    // Without the client certificate, the server refuses the handshake.
    let err = export_with(
        port,
        TlsOptions {
            ca_file: Some(ca_file),
            ..TlsOptions::default()
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ExportError::Rpc { .. }), "{err}");
    // The system roots do not know the private CA.
    let err = export_with(port, TlsOptions::default()).await.unwrap_err();
    assert!(matches!(err, ExportError::Rpc { .. }), "{err}");
}

#[tokio::test]
async fn skipping_verification_accepts_a_self_signed_server() {
    let pki = Pki::new("insecure");
    let port = serve_tls(&pki.self_signed, None).await;
    let err = export_with(port, TlsOptions::default()).await.unwrap_err();
    assert!(matches!(err, ExportError::Rpc { .. }), "{err}");
    assert_sent(
        export_with(
            port,
            TlsOptions {
                insecure_skip_verify: true,
                ..TlsOptions::default()
            },
        )
        .await,
    );
}

#[test]
fn tls_files_and_schemes_are_checked_up_front() {
    let pki = Pki::new("files");
    let not_pem = pki.file("not.pem", "hello");
    let make = |endpoint: &str, ca: &Path| {
        OtlpExporter::new(OtlpExporterOptions {
            tls: TlsOptions {
                ca_file: Some(ca.to_owned()),
                ..TlsOptions::default()
            },
            ..OtlpExporterOptions::new(endpoint)
        })
    };
    let err = make("https://localhost:4317", &not_pem).unwrap_err();
    assert!(matches!(err, ExportError::TlsFile { .. }), "{err}");
    let err = make("https://localhost:4317", &pki.dir.join("missing.pem")).unwrap_err();
    assert!(err.to_string().contains("missing.pem"), "{err}");
    let ca = pki.file("ca.pem", &pki.ca);
    let err = make("http://localhost:4317", &ca).unwrap_err();
    assert!(
        matches!(err, ExportError::TlsOptionsWithoutTls { .. }),
        "{err}"
    );
    make("https://localhost:4317", &ca).unwrap();
    let err = OtlpExporter::new(OtlpExporterOptions {
        tls: TlsOptions {
            ca_file: Some(ca),
            insecure_skip_verify: true,
            ..TlsOptions::default()
        },
        ..OtlpExporterOptions::new("https://localhost:4317")
    })
    .unwrap_err();
    assert!(matches!(err, ExportError::TlsConflict { .. }), "{err}");
}
