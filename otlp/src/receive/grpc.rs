//! gRPC `ProfilesService/Export`, framed here rather than by a generated
//! server so that the token is checked before the body is read, the body is
//! read under the budget and a deadline, and every refusal has the status a
//! client should act on.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, header};
use http_body::Body;
use prost::Message;

use super::ProfilesReceiver;
use super::body::{UnaryBody, read_body};
use super::outcome::{Outcome, Refusal};

/// The path of the one method served.
pub const GRPC_EXPORT_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";
/// The compressed flag and the length before every gRPC message.
const PREFIX: usize = 5;

impl ProfilesReceiver {
    /// Serves one gRPC request (any path; only the export method exists).
    pub async fn grpc<B>(&self, request: Request<B>) -> Response<UnaryBody>
    where
        B: Body,
        B::Error: std::fmt::Display,
    {
        let result = self.grpc_export(request).await;
        self.count(&result);
        match result {
            Ok(message) => {
                let mut body = BytesMut::with_capacity(PREFIX + message.len());
                body.put_u8(0);
                body.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
                body.put_slice(&message);
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                let mut response = Response::new(UnaryBody::new(body.freeze(), Some(trailers)));
                let headers = response.headers_mut();
                headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/grpc"),
                );
                headers.insert("grpc-accept-encoding", HeaderValue::from_static("gzip"));
                response
            }
            Err(refusal) => {
                let mut response = tonic::Status::new(refusal.grpc_code(), refusal.message)
                    .into_http::<UnaryBody>();
                response
                    .headers_mut()
                    .insert("grpc-accept-encoding", HeaderValue::from_static("gzip"));
                response
            }
        }
    }

    async fn grpc_export<B>(&self, request: Request<B>) -> Result<Bytes, Refusal>
    where
        B: Body,
        B::Error: std::fmt::Display,
    {
        if request.uri().path() != GRPC_EXPORT_PATH {
            return Err(Refusal::new(
                Outcome::Unsupported,
                format!("unknown method {}", request.uri().path()),
            ));
        }
        let headers = request.headers();
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        self.authorize(text("authorization"))?;
        let gzip = match text("grpc-encoding").map(str::trim) {
            None | Some("" | "identity") => false,
            Some(e) if e.eq_ignore_ascii_case("gzip") => true,
            Some(other) => {
                return Err(Refusal::new(
                    Outcome::Unsupported,
                    format!("message encoding {other:?} is not supported; use gzip or identity"),
                ));
            }
        };
        // The client's deadline, when shorter than the receiver's own.
        let timeout = text("grpc-timeout")
            .and_then(grpc_timeout)
            .map_or(self.options().body_timeout, |t| {
                t.min(self.options().body_timeout)
            });
        let max = self.options().limits.max_message_bytes;
        let mut reservation = self.budget().reservation();
        let data = read_body(request.into_body(), max + PREFIX, timeout, &mut reservation).await?;
        let Some((&flag, rest)) = data.split_first() else {
            return Err(framing("an empty body; a call carries one message"));
        };
        let Some(length) = rest.get(..4) else {
            return Err(framing("the body is shorter than a message prefix"));
        };
        let length = u32::from_be_bytes([length[0], length[1], length[2], length[3]]) as usize;
        if length > max {
            return Err(Refusal::new(
                Outcome::TooLarge,
                format!(
                    "decoded message length too large: found {length} bytes, the limit is: {max} bytes"
                ),
            ));
        }
        if data.len() - PREFIX != length {
            return Err(framing(
                "the body is not one message of its prefix's length (a unary call carries one)",
            ));
        }
        let compressed = match flag {
            0 => false,
            1 if gzip => true,
            1 => return Err(framing("a compressed message without grpc-encoding")),
            _ => return Err(framing("the message's compressed flag is neither 0 nor 1")),
        };
        let response = self.receive(data, PREFIX, compressed, reservation).await?;
        Ok(Bytes::from(response.encode_to_vec()))
    }
}

fn framing(what: &str) -> Refusal {
    Refusal::new(Outcome::Invalid, format!("malformed gRPC framing: {what}"))
}

/// A `grpc-timeout` header value: up to 8 digits and a unit.
fn grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(grpc_timeout("10S"), Some(Duration::from_secs(10)));
        assert_eq!(grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout("S"), None);
        assert_eq!(grpc_timeout("123456789S"), None);
        assert_eq!(grpc_timeout("10x"), None);
    }
}
