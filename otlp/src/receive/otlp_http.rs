//! OTLP/HTTP: `POST /v1development/profiles` with a protobuf body, for
//! whatever HTTP server hosts it (the binary's, next to the gRPC service).

use std::io::Read;

use flate2::read::GzDecoder;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use prost::Message;

use super::ProfilesReceiver;

/// The path OTLP/HTTP profiles are posted to (the collector's code uses
/// this one, not the `/v1/profiles` its README names).
pub const HTTP_PATH: &str = "/v1development/profiles";

/// A refused OTLP/HTTP request: the status, and a protobuf
/// `google.rpc.Status` body as the OTLP/HTTP specification asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    /// HTTP status code.
    pub status: u16,
    /// What is wrong.
    pub message: String,
    /// The encoded `google.rpc.Status`.
    pub body: Vec<u8>,
}

/// `google.rpc.Status`, the error body of OTLP/HTTP.
#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

impl HttpError {
    fn new(status: u16, code: tonic::Code, message: impl Into<String>) -> Self {
        let message = message.into();
        let body = RpcStatus {
            code: code as i32,
            message: message.clone(),
        }
        .encode_to_vec();
        Self {
            status,
            message,
            body,
        }
    }

    fn from_status(status: &tonic::Status) -> Self {
        let http = match status.code() {
            tonic::Code::InvalidArgument => 400,
            tonic::Code::Unauthenticated => 401,
            tonic::Code::ResourceExhausted => 429,
            tonic::Code::Unavailable => 503,
            _ => 500,
        };
        Self::new(http, status.code(), status.message())
    }
}

/// Handles one OTLP/HTTP request; the `Ok` value is the encoded
/// `ExportProfilesServiceResponse` to send with status 200.
pub fn accept_http(
    receiver: &ProfilesReceiver,
    content_type: Option<&str>,
    content_encoding: Option<&str>,
    authorization: Option<&str>,
    body: &[u8],
) -> Result<Vec<u8>, HttpError> {
    let media = content_type
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim();
    if !media.eq_ignore_ascii_case("application/x-protobuf") {
        return Err(HttpError::new(
            415,
            tonic::Code::InvalidArgument,
            format!("content type {media:?} is not supported; send application/x-protobuf"),
        ));
    }
    let max = receiver.limits().max_message_bytes;
    let too_large = || {
        HttpError::new(
            413,
            tonic::Code::InvalidArgument,
            format!("the request is over the {max}-byte limit"),
        )
    };
    let decompressed;
    let raw = match content_encoding.map(str::trim) {
        None | Some("") | Some("identity") => body,
        Some(e) if e.eq_ignore_ascii_case("gzip") => {
            let mut out = Vec::new();
            GzDecoder::new(body)
                .take(max as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| {
                    HttpError::new(
                        400,
                        tonic::Code::InvalidArgument,
                        format!("bad gzip body: {e}"),
                    )
                })?;
            decompressed = out;
            &decompressed
        }
        Some(other) => {
            return Err(HttpError::new(
                415,
                tonic::Code::InvalidArgument,
                format!("content encoding {other:?} is not supported; use gzip or none"),
            ));
        }
    };
    if raw.len() > max {
        return Err(too_large());
    }
    let request = ExportProfilesServiceRequest::decode(raw).map_err(|e| {
        HttpError::new(
            400,
            tonic::Code::InvalidArgument,
            format!("not an ExportProfilesServiceRequest: {e}"),
        )
    })?;
    receiver
        .handle(authorization, &request)
        .map(|response| response.encode_to_vec())
        .map_err(|status| HttpError::from_status(&status))
}
