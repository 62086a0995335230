//! One HTTP/1.1 GET over a stream icecore opened itself (TCP, TLS, a Unix
//! socket): what the Kubernetes and Docker clients share.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tracing::debug;

/// Why a GET failed.
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    /// Connecting or reading failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The HTTP exchange failed.
    #[error("HTTP: {0}")]
    Http(String),
    /// The server answered something else than 200.
    #[error("the server answered {status}: {body}")]
    Status {
        /// The status code.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The body is not the JSON expected.
    #[error("unreadable answer: {0}")]
    Json(#[from] serde_json::Error),
    /// No answer in time.
    #[error("timed out")]
    Timeout,
}

/// Sends `GET path` (with `Host: host` and a bearer `token` if any) on
/// `stream`; the body as it arrives after a 200.
pub async fn get<S>(
    stream: S,
    host: &str,
    path: &str,
    token: Option<&str>,
) -> Result<hyper::body::Incoming, GetError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let http = |e: hyper::Error| GetError::Http(e.to_string());
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            debug!("metadata connection: {e}");
        }
    });
    let mut request = http::Request::get(path)
        .header(http::header::HOST, host)
        .header(http::header::ACCEPT, "application/json");
    if let Some(token) = token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| GetError::Http(e.to_string()))?;
    let response = sender.send_request(request).await.map_err(http)?;
    let status = response.status().as_u16();
    if status != 200 {
        let body = http_body_util::Limited::new(response.into_body(), 4096)
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_default();
        return Err(GetError::Status { status, body });
    }
    Ok(response.into_body())
}

/// A whole body, at most `limit` bytes.
pub async fn body_bytes(body: hyper::body::Incoming, limit: usize) -> Result<Bytes, GetError> {
    Ok(http_body_util::Limited::new(body, limit)
        .collect()
        .await
        .map_err(|e| GetError::Http(e.to_string()))?
        .to_bytes())
}
