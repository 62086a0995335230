//! Who may use `--http-address`, and over what: a bearer token
//! (`--http-bearer-token-file`, compared in constant time by the receiver's
//! [`BearerAuth`]) and HTTPS with the certificate and key of
//! `--http-tls-cert` and `--http-tls-key`, read at start-up so that a bad
//! file stops the agent with a message naming it.

use std::{path::Path, sync::Arc};

use axum::http::{Request, header};
use icecore_otlp::receive::BearerAuth;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio_rustls::TlsAcceptor;

/// Who may use the endpoints, and over what.
#[derive(Clone, Default)]
pub struct Access {
    /// The bearer token every path but [`OPEN_PATHS`] requires, if any.
    pub auth: BearerAuth,
    /// HTTPS instead of plain HTTP, when a certificate is given.
    pub tls: Option<TlsAcceptor>,
}

/// Paths served without the token: a Kubernetes probe (`httpGet`) carries
/// no secret, and these say no more than "up" and which sink last failed.
pub const OPEN_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// Whether `request` may be served: an open path, or the right token.
pub fn allowed<B>(auth: &BearerAuth, request: &Request<B>) -> bool {
    OPEN_PATHS.contains(&request.uri().path())
        || auth.allows(
            request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok()),
        )
}

/// Why the HTTP endpoint's TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum HttpTlsError {
    /// The certificate file is unreadable or not PEM certificates.
    #[error("--http-tls-cert {path}: {message}")]
    Cert {
        /// The file.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// The key file is unreadable or holds no private key.
    #[error("--http-tls-key {path}: {message}")]
    Key {
        /// The file.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// rustls refused the pair (a key that does not match the certificate,
    /// an unsupported key type).
    #[error("--http-tls-cert and --http-tls-key: {0}")]
    Pair(rustls::Error),
}

/// An acceptor serving `cert` (a chain, the server's certificate first)
/// with `key`, offering HTTP/2 and HTTP/1.1.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, HttpTlsError> {
    let cert_error = |message: String| HttpTlsError::Cert {
        path: cert.display().to_string(),
        message,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| cert_error(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cert_error(e.to_string()))?;
    if chain.is_empty() {
        return Err(cert_error("no PEM certificate in the file".to_owned()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| HttpTlsError::Key {
        path: key.display().to_string(),
        message: match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no PEM private key in the file".to_owned()
            }
            other => other.to_string(),
        },
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(HttpTlsError::Pair)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(HttpTlsError::Pair)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_probes_are_open() {
        let auth = BearerAuth::bearer("t0ken");
        let request = |path: &str, authorization: Option<&str>| {
            let mut builder = Request::builder().uri(path);
            if let Some(value) = authorization {
                builder = builder.header(header::AUTHORIZATION, value);
            }
            builder.body(()).unwrap()
        };
        for open in ["/healthz", "/readyz"] {
            assert!(allowed(&auth, &request(open, None)), "{open}");
        }
        for closed in [
            "/metrics",
            "/",
            "/debug/pprof/profile?seconds=1",
            "/healthz/x",
        ] {
            assert!(!allowed(&auth, &request(closed, None)), "{closed}");
            assert!(
                !allowed(&auth, &request(closed, Some("Bearer nope"))),
                "{closed}"
            );
            assert!(
                allowed(&auth, &request(closed, Some("Bearer t0ken"))),
                "{closed}"
            );
        }
        assert!(allowed(&BearerAuth::default(), &request("/metrics", None)));
    }

    fn error(cert: &Path, key: &Path) -> String {
        match acceptor(cert, key) {
            Ok(_) => panic!("{} and {} were accepted", cert.display(), key.display()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let missing = dir.path().join("missing.pem");
        let junk = file("junk.pem", "hello\n");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let cert = file("cert.pem", &cert.pem());
        let other_key = file(
            "other.pem",
            &rcgen::KeyPair::generate().unwrap().serialize_pem(),
        );
        let key = file("key.pem", &key.serialize_pem());
        let err = error(&missing, &key);
        assert!(
            err.starts_with("--http-tls-cert ") && err.contains("missing.pem"),
            "{err}"
        );
        assert!(error(&junk, &key).contains("no PEM certificate"));
        let err = error(&cert, &junk);
        assert!(
            err.starts_with("--http-tls-key ") && err.contains("no PEM private key"),
            "{err}"
        );
        // The key of another certificate.
        assert!(error(&cert, &other_key).starts_with("--http-tls-cert and --http-tls-key: "));
        assert!(acceptor(&cert, &key).is_ok());
    }
}
