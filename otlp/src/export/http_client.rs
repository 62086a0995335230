//! One HTTP endpoint as the plain-HTTP exporters (Pyroscope's Connect
//! protocol) reach it: URL and TLS checked up front, headers and a
//! bearer token on every request, a fresh HTTP/1.1 connection per request
//! (one request per interval: nothing to gain from keeping it), and error
//! statuses turned into gRPC codes as the Connect protocol maps them, so
//! the pipeline retries what is transient and drops what is not.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use tonic::{Code, Status};

use super::ExportError;
use super::tls::TlsOptions;
use super::token_file::{TOKEN_REFRESH, TokenFile};

/// Largest response body read: Connect answers with an empty message or a
/// short JSON error.
const MAX_RESPONSE_BYTES: usize = 64 << 10;

/// A checked HTTP endpoint.
pub(crate) struct HttpTarget {
    url: String,
    host: String,
    port: u16,
    /// The URL's path without its trailing `/`, prefixed to every request's.
    base_path: String,
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
    headers: Vec<(HeaderName, HeaderValue)>,
    token: Option<TokenFile>,
    timeout: Duration,
}

impl std::fmt::Debug for HttpTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Headers may hold credentials: never printed.
        f.debug_struct("HttpTarget")
            .field("url", &self.url)
            .finish()
    }
}

impl HttpTarget {
    /// Checks the URL (`http://` or `https://`), TLS options and headers,
    /// and reads the bearer token file, if any.
    pub(crate) fn new(
        url: &str,
        timeout: Duration,
        headers: &[(String, String)],
        bearer_token_file: Option<&Path>,
        tls: &TlsOptions,
    ) -> Result<Self, ExportError> {
        let invalid = |reason: &str| ExportError::InvalidUrl {
            endpoint: url.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: Uri = url.parse().map_err(|_| invalid("not a URL"))?;
        let secure = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(ExportError::UnsupportedScheme {
                    endpoint: url.to_owned(),
                });
            }
        };
        let authority = uri.authority().ok_or_else(|| invalid("no host"))?;
        if authority.as_str().contains('@') {
            return Err(invalid(
                "credentials belong in the basic auth option, not the URL",
            ));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = authority
            .port_u16()
            .unwrap_or(if secure { 443 } else { 80 });
        let tls = if secure {
            let config = super::tls::client_config(url, tls)?;
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|_| invalid("not a host name TLS can verify"))?;
            Some((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
        } else if tls.is_customised() {
            return Err(ExportError::TlsOptionsWithoutTls {
                endpoint: url.to_owned(),
            });
        } else {
            None
        };
        let headers = headers
            .iter()
            .map(|(name, value)| {
                let header = |reason| ExportError::InvalidHeader {
                    name: name.clone(),
                    reason,
                };
                Ok((
                    HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| header("not a valid HTTP header name"))?,
                    HeaderValue::from_str(value)
                        .map_err(|_| header("the value is not printable ASCII"))?,
                ))
            })
            .collect::<Result<Vec<_>, ExportError>>()?;
        Ok(Self {
            url: url.to_owned(),
            host,
            port,
            base_path: uri.path().trim_end_matches('/').to_owned(),
            tls,
            headers,
            token: bearer_token_file
                .map(|path| TokenFile::open(path, TOKEN_REFRESH))
                .transpose()?,
            timeout,
        })
    }

    /// The URL as given.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// POSTs `body` to `path` (below the URL's path) and returns the
    /// response body of a 2xx answer. Everything else is an
    /// [`ExportError::Rpc`] whose code says whether to retry.
    pub(crate) async fn post(
        &self,
        path: &str,
        content_type: &'static str,
        body: Bytes,
    ) -> Result<Bytes, ExportError> {
        let request = Request::post(format!("{}{path}", self.base_path))
            .header(CONTENT_TYPE, content_type)
            .body(Full::new(body));
        self.call(request, MAX_RESPONSE_BYTES)
            .await
            .map_err(|failure| ExportError::Rpc {
                endpoint: self.url.clone(),
                status: Box::new(failure.into_status()),
            })
    }

    /// GETs `path_and_query` (below the URL's path) and returns the body of
    /// a 2xx answer, refusing one over `max_bytes`.
    pub(crate) async fn get(
        &self,
        path_and_query: &str,
        max_bytes: usize,
    ) -> Result<Bytes, HttpFailure> {
        let request = Request::get(format!("{}{path_and_query}", self.base_path))
            .body(Full::new(Bytes::new()));
        self.call(request, max_bytes).await
    }

    async fn call(
        &self,
        request: Result<Request<Full<Bytes>>, http::Error>,
        max_bytes: usize,
    ) -> Result<Bytes, HttpFailure> {
        let request = request.map_err(|e| HttpFailure::Exchange(e.to_string()))?;
        match tokio::time::timeout(self.timeout, self.exchange(request, max_bytes)).await {
            Ok(result) => result,
            Err(_) => Err(HttpFailure::Timeout(self.timeout)),
        }
    }

    async fn exchange(
        &self,
        mut request: Request<Full<Bytes>>,
        max_bytes: usize,
    ) -> Result<Bytes, HttpFailure> {
        let headers = request.headers_mut();
        if let Ok(host) = HeaderValue::from_str(&format!("{}:{}", self.host, self.port)) {
            headers.insert(HOST, host);
        }
        for (name, value) in &self.headers {
            headers.append(name.clone(), value.clone());
        }
        if let Some(token) = &self.token
            && let Ok(value) = HeaderValue::from_bytes(token.value().as_encoded_bytes())
        {
            headers.insert(AUTHORIZATION, value);
        }
        let unreachable = |e: std::io::Error| HttpFailure::Connect(e.to_string());
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(unreachable)?;
        let (status, answer) = match &self.tls {
            Some((connector, name)) => {
                let stream = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(unreachable)?;
                send(stream, request, max_bytes).await?
            }
            None => send(tcp, request, max_bytes).await?,
        };
        if status.is_success() {
            return Ok(answer);
        }
        Err(HttpFailure::Status(status, answer))
    }
}

/// Why an HTTP request got no 2xx answer.
#[derive(Debug)]
pub(crate) enum HttpFailure {
    /// The TCP or TLS connection could not be made.
    Connect(String),
    /// No whole answer within the timeout.
    Timeout(Duration),
    /// The answer's body was longer than allowed.
    TooLarge(usize),
    /// The server answered with this status (and body).
    Status(StatusCode, Bytes),
    /// The HTTP exchange broke off.
    Exchange(String),
}

impl HttpFailure {
    /// The gRPC status the exporters' retry logic reads: Connect's mapping
    /// of HTTP statuses, transport failures as `unavailable`.
    pub(crate) fn into_status(self) -> Status {
        match self {
            HttpFailure::Connect(e) => Status::unavailable(format!("cannot connect: {e}")),
            HttpFailure::Timeout(t) => Status::deadline_exceeded(format!("no answer within {t:?}")),
            HttpFailure::TooLarge(limit) => {
                Status::unavailable(format!("the answer is over {limit} bytes"))
            }
            HttpFailure::Status(status, body) => Status::new(
                connect_code(status, &body),
                format!("HTTP {status}: {}", String::from_utf8_lossy(&body).trim()),
            ),
            HttpFailure::Exchange(e) => Status::unavailable(format!("HTTP exchange failed: {e}")),
        }
    }
}

impl std::fmt::Display for HttpFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpFailure::Connect(e) => write!(f, "cannot connect: {e}"),
            HttpFailure::Timeout(t) => write!(f, "no answer within {t:?}"),
            HttpFailure::TooLarge(limit) => write!(f, "the answer is over {limit} bytes"),
            HttpFailure::Status(status, body) => {
                let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
                write!(f, "HTTP {status}: {}", text.trim())
            }
            HttpFailure::Exchange(e) => write!(f, "HTTP exchange failed: {e}"),
        }
    }
}

/// Sends `request` on a new HTTP/1.1 connection over `stream`; an answer
/// over `max_bytes` is refused as it arrives.
async fn send<S>(
    stream: S,
    request: Request<Full<Bytes>>,
    max_bytes: usize,
) -> Result<(StatusCode, Bytes), HttpFailure>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let broken = |e: hyper::Error| HttpFailure::Exchange(e.to_string());
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(broken)?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let response = sender.send_request(request).await.map_err(broken);
    let result = match response {
        Ok(response) => {
            let status = response.status();
            match Limited::new(response.into_body(), max_bytes)
                .collect()
                .await
            {
                Ok(body) => Ok((status, body.to_bytes())),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                    Err(HttpFailure::TooLarge(max_bytes))
                }
                Err(e) => Err(HttpFailure::Exchange(format!("reading the answer: {e}"))),
            }
        }
        Err(failure) => Err(failure),
    };
    driver.abort();
    result
}

/// The gRPC code of a failed Connect call: the `code` of its JSON error
/// body when there is one, else the code the protocol assigns the HTTP
/// status.
pub(crate) fn connect_code(status: StatusCode, body: &[u8]) -> Code {
    if let Some(code) = json_code(body) {
        return code;
    }
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        408 => Code::DeadlineExceeded,
        413 => Code::ResourceExhausted,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// The `"code"` of a Connect JSON error (`{"code":"unavailable",…}`).
fn json_code(body: &[u8]) -> Option<Code> {
    let text = std::str::from_utf8(body).ok()?;
    let after = &text[text.find("\"code\"")? + 6..];
    let value = after
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    let name = &value[..value.find('"')?];
    Some(match name {
        "canceled" => Code::Cancelled,
        "unknown" => Code::Unknown,
        "invalid_argument" => Code::InvalidArgument,
        "deadline_exceeded" => Code::DeadlineExceeded,
        "not_found" => Code::NotFound,
        "already_exists" => Code::AlreadyExists,
        "permission_denied" => Code::PermissionDenied,
        "resource_exhausted" => Code::ResourceExhausted,
        "failed_precondition" => Code::FailedPrecondition,
        "aborted" => Code::Aborted,
        "out_of_range" => Code::OutOfRange,
        "unimplemented" => Code::Unimplemented,
        "internal" => Code::Internal,
        "unavailable" => Code::Unavailable,
        "data_loss" => Code::DataLoss,
        "unauthenticated" => Code::Unauthenticated,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_errors_map_to_grpc_codes() {
        let json = br#"{"code":"resource_exhausted","message":"too many"}"#;
        assert_eq!(
            connect_code(StatusCode::BAD_REQUEST, json),
            Code::ResourceExhausted
        );
        assert_eq!(
            connect_code(StatusCode::SERVICE_UNAVAILABLE, b"upstream down"),
            Code::Unavailable
        );
        assert_eq!(
            connect_code(StatusCode::TOO_MANY_REQUESTS, b""),
            Code::Unavailable
        );
        assert_eq!(
            connect_code(StatusCode::UNAUTHORIZED, b""),
            Code::Unauthenticated
        );
        assert_eq!(
            connect_code(StatusCode::BAD_REQUEST, b"{\"code\": \"bogus\"}"),
            Code::Internal
        );
        assert_eq!(
            connect_code(StatusCode::IM_A_TEAPOT, b"{\"code\":"),
            Code::Unknown
        );
    }

    #[test]
    fn urls_are_checked_up_front() {
        let new = |url: &str| {
            HttpTarget::new(
                url,
                Duration::from_secs(1),
                &[],
                None,
                &TlsOptions::default(),
            )
        };
        assert!(new("http://localhost:4040").is_ok());
        assert!(new("http://localhost:4040/prefix/").is_ok_and(|t| t.base_path == "/prefix"));
        assert!(matches!(
            new("ftp://h"),
            Err(ExportError::UnsupportedScheme { .. })
        ));
        assert!(matches!(
            new("http://u:p@h:1"),
            Err(ExportError::InvalidUrl { .. })
        ));
        assert!(matches!(
            new("not a url"),
            Err(ExportError::InvalidUrl { .. })
        ));
    }
}
