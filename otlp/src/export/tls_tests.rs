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

/// An HTTP/1.1 server over TLS with `identity`, requiring a client
/// certificate from `client_ca` when given, that answers every request
/// 200 as a Connect server answers a push; returns the port.
async fn serve_https(identity: &(String, String), client_ca: Option<&str>) -> u16 {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(identity.0.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(identity.1.as_bytes()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots.add(cert.unwrap()).unwrap();
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                std::sync::Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder.with_single_cert(certs, key).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut stream) = acceptor.accept(tcp).await else {
                    return;
                };
                // The request's head and body, then the answer.
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&seen);
                    if let Some(head) = text.find("\r\n\r\n") {
                        let length = text[..head]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if seen.len() >= head + 4 + length {
                            break;
                        }
                    }
                }
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/proto\r\nContent-Length: 0\r\n\r\n")
                    .await;
                let _ = stream.shutdown().await;
            });
        }
    });
    port
}

async fn push_with(port: u16, tls: TlsOptions) -> Result<u64, ExportError> {
    let exporter = PyroscopeExporter::new(&PyroscopeOptions {
        timeout: Duration::from_secs(5),
        tls,
        ..PyroscopeOptions::new(format!("https://localhost:{port}"))
    })?;
    let body = exporter.encode_batch(&test_fixtures::batch());
    exporter.send_body(body).await
}

#[tokio::test]
async fn pyroscope_over_https_with_a_private_ca_and_a_client_certificate() {
    let pki = Pki::new("pyroscope-mtls");
    let ca_file = pki.file("ca.pem", &pki.ca);
    let cert = pki.file("client.pem", &pki.client.0);
    let key = pki.file("client-key.pem", &pki.client.1);
    let port = serve_https(&pki.server, Some(&pki.ca)).await;
    push_with(
        port,
        TlsOptions {
            ca_file: Some(ca_file.clone()),
            client_identity: Some((cert, key)),
            insecure_skip_verify: false,
        },
    )
    .await
    .unwrap();
    // Without the client certificate the handshake fails: retryable, as
    // any connection failure is.
    let err = push_with(
        port,
        TlsOptions {
            ca_file: Some(ca_file),
            ..TlsOptions::default()
        },
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ExportError::Rpc { status, .. } if status.code() == tonic::Code::Unavailable),
        "{err}"
    );
    // The system roots do not know the private CA.
    let err = push_with(port, TlsOptions::default()).await.unwrap_err();
    assert!(matches!(err, ExportError::Rpc { .. }), "{err}");
}

#[tokio::test]
async fn pyroscope_skipping_verification_accepts_a_self_signed_server() {
    let pki = Pki::new("pyroscope-insecure");
    let port = serve_https(&pki.self_signed, None).await;
    assert!(push_with(port, TlsOptions::default()).await.is_err());
    push_with(
        port,
        TlsOptions {
            insecure_skip_verify: true,
            ..TlsOptions::default()
        },
    )
    .await
    .unwrap();
}
