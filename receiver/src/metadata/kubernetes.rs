//! The pods of this node from the Kubernetes API server: a list, then a
//! watch from the list's version, filtered to `spec.nodeName`, kept in a
//! [`PodIndex`]; on any failure the index keeps what it has and the list
//! is tried again with a growing delay. Nothing on the sampling path waits
//! for it: processes whose pod is not known yet carry their IDs only, and
//! get names when the pod arrives.
//!
//! With `--kubelet-url` the pods come from the node's kubelet instead
//! (`GET /pods`, its own pods only), polled every [`KUBELET_POLL`]: no load
//! on the API server, at the cost of up to one period's delay.
//!
//! In a pod, the API server, token and CA come from the service account
//! (`KUBERNETES_SERVICE_HOST`, `/var/run/secrets/kubernetes.io/serviceaccount`);
//! the agent's ClusterRole needs `get`, `list` and `watch` on `pods`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use tracing::{debug, info, warn};

use super::pods::{Pod, PodList, PodMeta, SharedPods, WatchEvent};

/// Where the service account's files are in a pod.
const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Longest response or watch line read: a node's pod list is a few MiB at most.
const MAX_BODY_BYTES: usize = 64 << 20;
/// Longest wait for a list or for a watch's headers.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Watches end after this long (the server may end them sooner).
const WATCH_SECONDS: u32 = 300;
/// Delay before the first retry, doubled up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How often the kubelet's pod list is read.
pub const KUBELET_POLL: Duration = Duration::from_secs(10);

/// Where the node's pods are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodSource {
    /// The API server: a list filtered to the node, then a watch.
    #[default]
    ApiServer,
    /// The kubelet's `/pods`, polled.
    Kubelet,
}

/// How to reach the API server (or the kubelet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesOptions {
    /// `https://HOST:PORT` (or `http://` for a local proxy or the kubelet's
    /// read-only port).
    pub api: String,
    /// Which of the two `api` is.
    pub source: PodSource,
    /// The node whose pods are watched.
    pub node_name: String,
    /// A file holding the bearer token, re-read for each list.
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA that signs the API server's certificate.
    pub ca_file: Option<PathBuf>,
}

impl KubernetesOptions {
    /// The in-cluster settings, when running in a pod: the API server from
    /// `KUBERNETES_SERVICE_HOST`/`_PORT`, the service account's token and CA.
    pub fn in_cluster(node_name: String) -> Option<Self> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        Some(KubernetesOptions {
            api: format!("https://{host}:{port}"),
            source: PodSource::ApiServer,
            node_name,
            token_file: Some(Path::new(SERVICE_ACCOUNT).join("token")),
            ca_file: Some(Path::new(SERVICE_ACCOUNT).join("ca.crt")),
        })
    }
}

use super::http_get::{GetError as ApiError, body_bytes, get};

/// Lists and watches the node's pods into `pods` until the runtime stops.
pub fn spawn(options: KubernetesOptions, pods: SharedPods) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        match options.source {
            PodSource::ApiServer => {
                info!(api = %options.api, node = %options.node_name, "watching the node's pods");
            }
            PodSource::Kubelet => {
                info!(kubelet = %options.api, every = ?KUBELET_POLL, "polling the kubelet's pods");
            }
        }
        let mut backoff = MIN_BACKOFF;
        loop {
            let result = match options.source {
                PodSource::ApiServer => list_and_watch(&options, &pods).await,
                PodSource::Kubelet => list_kubelet(&options, &pods).await,
            };
            match result {
                Ok(()) => backoff = MIN_BACKOFF,
                Err(e) => {
                    warn!(api = %options.api, "Kubernetes pods: {e}; retrying in {backoff:?}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    })
}

async fn list_and_watch(options: &KubernetesOptions, pods: &SharedPods) -> Result<(), ApiError> {
    let client = Client::new(options)?;
    let selector = format!("spec.nodeName%3D{}", percent_encode(&options.node_name));
    let body = tokio::time::timeout(
        REQUEST_TIMEOUT,
        client.get_all(&format!("/api/v1/pods?fieldSelector={selector}")),
    )
    .await
    .map_err(|_| ApiError::Timeout)??;
    let list: PodList = serde_json::from_slice(&body)?;
    let version = list.metadata.resource_version.clone();
    let metas: Vec<PodMeta> = list.items.into_iter().filter_map(Pod::into_meta).collect();
    debug!(pods = metas.len(), "listed the node's pods");
    if let Ok(mut index) = pods.write() {
        index.replace(metas);
    }
    let path = format!(
        "/api/v1/pods?fieldSelector={selector}&watch=true&allowWatchBookmarks=true\
         &timeoutSeconds={WATCH_SECONDS}&resourceVersion={}",
        percent_encode(&version)
    );
    let mut stream = tokio::time::timeout(REQUEST_TIMEOUT, client.get_stream(&path))
        .await
        .map_err(|_| ApiError::Timeout)??;
    let mut pending: Vec<u8> = Vec::new();
    while let Some(frame) = stream.frame().await {
        let frame = frame.map_err(|e| ApiError::Http(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        pending.extend_from_slice(&data);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            apply_event(&line, pods)?;
        }
        if pending.len() > MAX_BODY_BYTES {
            return Err(ApiError::Http("a watch event over 64 MiB".into()));
        }
    }
    Ok(())
}

/// Reads the kubelet's pods into `pods`, then waits for the next poll.
async fn list_kubelet(options: &KubernetesOptions, pods: &SharedPods) -> Result<(), ApiError> {
    let client = Client::new(options)?;
    let body = tokio::time::timeout(REQUEST_TIMEOUT, client.get_all("/pods"))
        .await
        .map_err(|_| ApiError::Timeout)??;
    let list: PodList = serde_json::from_slice(&body)?;
    let metas: Vec<PodMeta> = list.items.into_iter().filter_map(Pod::into_meta).collect();
    debug!(pods = metas.len(), "read the kubelet's pods");
    if let Ok(mut index) = pods.write() {
        index.replace(metas);
    }
    tokio::time::sleep(KUBELET_POLL).await;
    Ok(())
}

/// Applies one watch line; an `ERROR` event (the version expired) ends the
/// watch so that the list is taken again.
fn apply_event(line: &[u8], pods: &SharedPods) -> Result<(), ApiError> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    let event: WatchEvent = serde_json::from_slice(line)?;
    match event.kind.as_str() {
        "ADDED" | "MODIFIED" | "DELETED" => {
            let pod: Pod = serde_json::from_value(event.object)?;
            let Some(meta) = pod.into_meta() else {
                return Ok(());
            };
            if let Ok(mut index) = pods.write() {
                if event.kind == "DELETED" {
                    index.remove(&meta.uid);
                } else {
                    index.upsert(meta);
                }
            }
            Ok(())
        }
        "ERROR" => Err(ApiError::Http(format!("watch ended: {}", event.object))),
        _ => Ok(()),
    }
}

/// Percent-encodes what a query value cannot hold as is.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One connection's worth of settings: address, TLS, token.
struct Client {
    host: String,
    port: u16,
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
    token: Option<String>,
}

impl Client {
    fn new(options: &KubernetesOptions) -> Result<Self, ApiError> {
        let bad = |why: &str| ApiError::Http(format!("API server {:?}: {why}", options.api));
        let (secure, rest) = if let Some(rest) = options.api.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = options.api.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(bad("expected https://HOST:PORT or http://HOST:PORT"));
        };
        let authority = rest.trim_end_matches('/');
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !host.ends_with(']') || authority.starts_with('[') => (
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned(),
                port.parse().map_err(|_| bad("bad port"))?,
            ),
            _ => (
                authority
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned(),
                if secure { 443 } else { 80 },
            ),
        };
        let token = match &options.token_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| bad(&format!("token {}: {e}", path.display())))?
                    .trim()
                    .to_owned(),
            ),
            None => None,
        };
        let tls = if secure {
            let mut roots = rustls::RootCertStore::empty();
            if let Some(path) = &options.ca_file {
                use rustls::pki_types::{CertificateDer, pem::PemObject};
                for cert in CertificateDer::pem_file_iter(path)
                    .map_err(|e| bad(&format!("CA {}: {e}", path.display())))?
                {
                    let cert = cert.map_err(|e| bad(&format!("CA {}: {e}", path.display())))?;
                    roots
                        .add(cert)
                        .map_err(|e| bad(&format!("CA {}: {e}", path.display())))?;
                }
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| bad(&e.to_string()))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|e| bad(&e.to_string()))?;
            Some((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
        } else {
            None
        };
        Ok(Client {
            host,
            port,
            tls,
            token,
        })
    }

    /// A GET's whole body (bounded).
    async fn get_all(&self, path: &str) -> Result<Bytes, ApiError> {
        body_bytes(self.get_stream(path).await?, MAX_BODY_BYTES).await
    }

    /// A GET's body as it arrives, after a 200.
    async fn get_stream(&self, path: &str) -> Result<hyper::body::Incoming, ApiError> {
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port)).await?;
        let host = format!("{}:{}", self.host, self.port);
        let token = self.token.as_deref();
        match &self.tls {
            Some((connector, name)) => {
                let stream = connector.connect(name.clone(), tcp).await?;
                get(stream, &host, path, token).await
            }
            None => get(tcp, &host, path, token).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_events_update_the_index() {
        let pods = SharedPods::default();
        let added =
            br#"{"type":"ADDED","object":{"metadata":{"uid":"u1","name":"a","namespace":"n"}}}"#;
        apply_event(added, &pods).unwrap();
        assert_eq!(pods.read().unwrap().get("u1").unwrap().name, "a");
        let deleted = br#"{"type":"DELETED","object":{"metadata":{"uid":"u1"}}}"#;
        apply_event(deleted, &pods).unwrap();
        assert!(pods.read().unwrap().get("u1").is_none());
        apply_event(b"  \n", &pods).unwrap();
        apply_event(br#"{"type":"BOOKMARK","object":{}}"#, &pods).unwrap();
        assert!(apply_event(br#"{"type":"ERROR","object":{"code":410}}"#, &pods).is_err());
        assert!(apply_event(b"{not json", &pods).is_err());
    }

    #[test]
    fn options_from_the_environment_and_urls() {
        assert_eq!(percent_encode("node-1.example"), "node-1.example");
        assert_eq!(percent_encode("a b/c"), "a%20b%2Fc");
        let client = |api: &str| {
            Client::new(&KubernetesOptions {
                api: api.into(),
                source: PodSource::ApiServer,
                node_name: "n".into(),
                token_file: None,
                ca_file: None,
            })
        };
        let plain = client("http://127.0.0.1:8001").unwrap();
        assert_eq!(
            (plain.host.as_str(), plain.port, plain.tls.is_none()),
            ("127.0.0.1", 8001, true)
        );
        let v6 = client("http://[::1]:8001/").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 8001));
        assert!(client("ftp://x").is_err());
        assert!(client("http://host:notaport").is_err());
    }
}
