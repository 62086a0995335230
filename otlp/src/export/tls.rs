//! TLS settings of the OTLP exporter: a private CA, a client certificate
//! for mutual TLS, and, for tests only, skipping server verification.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::ExportError;

/// Largest certificate or key file read (a chain of a few certificates).
const MAX_PEM_BYTES: u64 = 1 << 20;

/// How an `https://` endpoint's certificate is checked, and what the
/// exporter presents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM file of the CA certificates to trust instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// PEM files of the client certificate (chain) and its private key, for
    /// endpoints that require mutual TLS.
    pub client_identity: Option<(PathBuf, PathBuf)>,
    /// Accept any server certificate. For tests against self-signed
    /// endpoints only: it gives up the protection TLS exists for.
    pub insecure_skip_verify: bool,
}

impl TlsOptions {
    /// Whether any option differs from verifying against the system roots.
    pub fn is_customised(&self) -> bool {
        *self != Self::default()
    }
}

/// `config` with TLS set up as `options` says; reads the PEM files.
pub(crate) fn configure(
    endpoint: &str,
    config: Endpoint,
    options: &TlsOptions,
) -> Result<Endpoint, ExportError> {
    let mut tls = ClientTlsConfig::new();
    match (&options.ca_file, options.insecure_skip_verify) {
        (Some(_), true) => {
            return Err(ExportError::TlsConflict {
                endpoint: endpoint.to_owned(),
            });
        }
        (Some(path), false) => tls = tls.ca_certificate(Certificate::from_pem(read_pem(path)?)),
        (None, false) => tls = tls.with_native_roots(),
        // The verifier below replaces root checks; tonic refuses both.
        (None, true) => {}
    }
    if let Some((cert, key)) = &options.client_identity {
        tls = tls.identity(Identity::from_pem(read_pem(cert)?, read_pem(key)?));
    }
    let tls_error = |source| ExportError::Tls {
        endpoint: endpoint.to_owned(),
        source,
    };
    if options.insecure_skip_verify {
        let verifier = Arc::new(AcceptAnyServerCertificate {
            algorithms: rustls::crypto::ring::default_provider().signature_verification_algorithms,
        });
        config
            .tls_config_with_verifier(tls, verifier)
            .map_err(tls_error)
    } else {
        config.tls_config(tls).map_err(tls_error)
    }
}

/// A rustls client configuration as `options` say, for the exporters that
/// speak plain HTTP (Pyroscope): the same checks as [`configure`] gives
/// tonic's.
pub(crate) fn client_config(
    endpoint: &str,
    options: &TlsOptions,
) -> Result<rustls::ClientConfig, ExportError> {
    use rustls::pki_types::{PrivateKeyDer, pem::PemObject};
    let setup = |reason: String| ExportError::TlsSetup {
        endpoint: endpoint.to_owned(),
        reason,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let algorithms = provider.signature_verification_algorithms;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| setup(e.to_string()))?;
    let builder = match (&options.ca_file, options.insecure_skip_verify) {
        (Some(_), true) => {
            return Err(ExportError::TlsConflict {
                endpoint: endpoint.to_owned(),
            });
        }
        (None, true) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyServerCertificate { algorithms })),
        (ca_file, false) => {
            let mut roots = rustls::RootCertStore::empty();
            match ca_file {
                Some(path) => {
                    let pem = read_pem(path)?;
                    for cert in CertificateDer::pem_slice_iter(&pem) {
                        let cert = cert.map_err(|e| setup(format!("{}: {e}", path.display())))?;
                        roots
                            .add(cert)
                            .map_err(|e| setup(format!("{}: {e}", path.display())))?;
                    }
                }
                None => {
                    let found = rustls_native_certs::load_native_certs();
                    for cert in found.certs {
                        // One unparsable system certificate is no reason to fail.
                        let _ = roots.add(cert);
                    }
                }
            }
            if roots.is_empty() {
                return Err(setup(
                    "no root certificate to verify the server with".into(),
                ));
            }
            builder.with_root_certificates(roots)
        }
    };
    match &options.client_identity {
        Some((cert, key)) => {
            let certs = CertificateDer::pem_slice_iter(&read_pem(cert)?)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| setup(format!("{}: {e}", cert.display())))?;
            let key = PrivateKeyDer::from_pem_slice(&read_pem(key)?)
                .map_err(|e| setup(format!("{}: {e}", key.display())))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| setup(e.to_string()))
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

fn read_pem(path: &Path) -> Result<Vec<u8>, ExportError> {
    use std::io::Read;
    let error = |source| ExportError::TlsFile {
        path: path.to_owned(),
        source,
    };
    let mut pem = Vec::new();
    std::fs::File::open(path)
        .map_err(error)?
        .take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut pem)
        .map_err(error)?;
    if pem.len() as u64 > MAX_PEM_BYTES || !pem.windows(10).any(|w| w == b"-----BEGIN") {
        return Err(error(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a PEM file of at most 1 MiB",
        )));
    }
    Ok(pem)
}

/// Trusts whatever certificate the server shows, but still checks that the
/// handshake is signed by it (so the session is at least encrypted to the
/// holder of that certificate's key).
#[derive(Debug)]
struct AcceptAnyServerCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AcceptAnyServerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
