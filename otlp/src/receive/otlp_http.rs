//! OTLP/HTTP: `POST /v1development/profiles` with a protobuf body.

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Body;
use prost::Message;

use super::ProfilesReceiver;
use super::body::{UnaryBody, read_body};
use super::outcome::{Outcome, Refusal};

/// The path OTLP/HTTP profiles are posted to (the collector's code uses
/// this one, not the `/v1/profiles` its README names).
pub const HTTP_PATH: &str = "/v1development/profiles";

impl ProfilesReceiver {
    /// Serves one OTLP/HTTP request.
    pub async fn http<B>(&self, request: Request<B>) -> Response<UnaryBody>
    where
        B: Body,
        B::Error: std::fmt::Display,
    {
        let method_allowed = request.method() == Method::POST;
        let result = if method_allowed {
            self.http_export(request).await
        } else {
            Err(Refusal::new(
                Outcome::Unsupported,
                "send OTLP profiles with POST",
            ))
        };
        self.count(&result);
        let (status, body) = match result {
            Ok(body) => (StatusCode::OK, body),
            Err(refusal) => {
                let status = if method_allowed {
                    StatusCode::from_u16(refusal.http_status()).unwrap_or(StatusCode::BAD_REQUEST)
                } else {
                    StatusCode::METHOD_NOT_ALLOWED
                };
                (status, Bytes::from(refusal.rpc_status()))
            }
        };
        let mut response = Response::new(UnaryBody::new(body, None));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        match status {
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            StatusCode::METHOD_NOT_ALLOWED => {
                headers.insert(header::ALLOW, HeaderValue::from_static("POST"));
            }
            _ => {}
        }
        response
    }

    async fn http_export<B>(&self, request: Request<B>) -> Result<Bytes, Refusal>
    where
        B: Body,
        B::Error: std::fmt::Display,
    {
        let headers = request.headers();
        let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
        let media = text(header::CONTENT_TYPE)
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim();
        if !media.eq_ignore_ascii_case("application/x-protobuf") {
            return Err(Refusal::new(
                Outcome::Unsupported,
                format!("content type {media:?} is not supported; send application/x-protobuf"),
            ));
        }
        self.authorize(text(header::AUTHORIZATION))?;
        let gzip = match text(header::CONTENT_ENCODING).map(str::trim) {
            None | Some("" | "identity") => false,
            Some(e) if e.eq_ignore_ascii_case("gzip") => true,
            Some(other) => {
                return Err(Refusal::new(
                    Outcome::Unsupported,
                    format!("content encoding {other:?} is not supported; use gzip or none"),
                ));
            }
        };
        let options = *self.options();
        let mut reservation = self.budget().reservation();
        let data = read_body(
            request.into_body(),
            options.limits.max_message_bytes,
            options.body_timeout,
            &mut reservation,
        )
        .await?;
        let response = self.receive(data, 0, gzip, reservation).await?;
        Ok(Bytes::from(response.encode_to_vec()))
    }
}
