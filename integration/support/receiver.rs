// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! In-test OTLP Profiles gRPC receiver.
//!
//! It serves `/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export`
//! like the generated `ProfilesServiceServer` does (same `tonic::server::Grpc`
//! machinery, gzip accepted), but with a codec that keeps the raw request bytes:
//! they are decoded twice, once into the `opentelemetry-proto` types for the
//! assertions, and once reflectively (prost-reflect, from the crate's bundled
//! file descriptors) to detect fields the v1.10 schema does not know, which prost
//! would silently drop.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use prost::Message as _;
use prost::bytes::Buf as _;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, Value};
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{BoxFuture, Context, Poll, Service, StdError, http};
use tonic::server::NamedService;

const SERVICE_NAME: &str = "opentelemetry.proto.collector.profiles.v1development.ProfilesService";
const EXPORT_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";
const REQUEST_MESSAGE: &str =
    "opentelemetry.proto.collector.profiles.v1development.ExportProfilesServiceRequest";

/// One Export call as received.
#[derive(Debug, Clone)]
pub struct ReceivedRequest {
    /// When the call arrived (Unix epoch nanoseconds).
    pub arrived_unix_nanos: u64,
    /// When the call arrived (monotonic).
    pub arrived: Instant,
    /// The `grpc-encoding` request header (`gzip` expected).
    pub grpc_encoding: Option<String>,
    /// Every ASCII request header, as (name, value).
    pub headers: Vec<(String, String)>,
    /// The decoded request.
    pub request: ExportProfilesServiceRequest,
    /// Fields unknown to the v1.10 schema, as `Message.path: field number`.
    pub unknown_fields: Vec<String>,
}

#[derive(Default)]
struct State {
    requests: Mutex<Vec<ReceivedRequest>>,
    /// Calls that could not be handled (undecodable bytes, wrong path, …).
    errors: Mutex<Vec<String>>,
    /// How long each export call waits before it is answered (a slow endpoint).
    delay: Duration,
}

/// A running receiver; stopped on drop.
pub struct OtlpReceiver {
    pub addr: SocketAddr,
    state: Arc<State>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl OtlpReceiver {
    /// Binds 127.0.0.1:0 and starts serving on a private tokio runtime.
    pub fn start() -> OtlpReceiver {
        OtlpReceiver::start_on("127.0.0.1:0".parse().expect("literal address"))
    }

    /// Binds `addr` and starts serving on a private tokio runtime.
    pub fn start_on(addr: SocketAddr) -> OtlpReceiver {
        OtlpReceiver::start_slow_on(addr, Duration::ZERO)
    }

    /// Like [`OtlpReceiver::start_on`], answering each export only `delay`
    /// after it arrived.
    pub fn start_slow_on(addr: SocketAddr, delay: Duration) -> OtlpReceiver {
        let std_listener = std::net::TcpListener::bind(addr).expect("bind OTLP receiver");
        OtlpReceiver::start_slow_with(std_listener, delay)
    }

    /// Like [`OtlpReceiver::start_slow_on`], serving a listener the caller
    /// bound.
    pub fn start_slow_with(std_listener: std::net::TcpListener, delay: Duration) -> OtlpReceiver {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio runtime");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let addr = std_listener.local_addr().expect("local addr");
        // Fail here, in the test thread, if the descriptors are unusable.
        otlp_descriptor_pool();
        let state = Arc::new(State {
            delay,
            ..State::default()
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let svc = ExportService {
            state: state.clone(),
        };
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("tokio listener");
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            // The service routes by path itself, so no router is needed (tonic's
            // `router` feature, i.e. axum, stays off).
            let result = tonic::transport::Server::builder()
                .serve_with_incoming_shutdown(svc, incoming, async {
                    let _ = rx.await;
                })
                .await;
            if let Err(e) = result {
                eprintln!("OTLP receiver stopped with an error: {e}");
            }
        });
        println!("OTLP receiver listening on {addr}");
        OtlpReceiver {
            addr,
            state,
            shutdown: Some(tx),
            runtime: Some(runtime),
        }
    }

    /// The URL to pass as `--otlp-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A copy of every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<ReceivedRequest> {
        self.state
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn request_count(&self) -> usize {
        self.state
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Calls the receiver could not handle.
    pub fn errors(&self) -> Vec<String> {
        self.state
            .errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until at least `n` requests arrived; false on timeout.
    pub fn wait_for_requests(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.request_count() >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.request_count() >= n
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

/// The OTLP descriptors bundled with opentelemetry-proto (`file-descriptors` feature).
fn otlp_descriptor_pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let pool = DescriptorPool::decode(opentelemetry_proto::DESCRIPTORS)
            .expect("decode opentelemetry-proto file descriptors");
        assert!(
            pool.get_message_by_name(REQUEST_MESSAGE).is_some(),
            "opentelemetry-proto descriptors lack {REQUEST_MESSAGE}"
        );
        pool
    })
}

/// Fields of an encoded `ExportProfilesServiceRequest` that the v1.10 schema does
/// not know, as `Message.path: field N` (prost would drop them silently).
pub fn unknown_otlp_fields(raw: &[u8]) -> Vec<String> {
    let desc: MessageDescriptor = otlp_descriptor_pool()
        .get_message_by_name(REQUEST_MESSAGE)
        .expect("request descriptor");
    let mut out = Vec::new();
    match DynamicMessage::decode(desc, raw) {
        Ok(dynamic) => collect_unknown_fields(&dynamic, "ExportProfilesServiceRequest", &mut out),
        Err(e) => out.push(format!("reflective decode failed: {e}")),
    }
    out
}

/// Paths of unknown fields anywhere in `msg`.
fn collect_unknown_fields(msg: &DynamicMessage, path: &str, out: &mut Vec<String>) {
    for unknown in msg.unknown_fields() {
        out.push(format!("{path}: field {}", unknown.number()));
    }
    for (field, value) in msg.fields() {
        let child = format!("{path}.{}", field.name());
        match value {
            Value::Message(m) => collect_unknown_fields(m, &child, out),
            Value::List(items) => {
                for (i, item) in items.iter().enumerate() {
                    if let Value::Message(m) = item {
                        collect_unknown_fields(m, &format!("{child}[{i}]"), out);
                    }
                }
            }
            _ => {}
        }
    }
}

// ---- codec: request bytes stay raw, responses are prost-encoded ----------------

#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = ExportProfilesServiceResponse;
    type Decode = Vec<u8>;
    type Encoder = ResponseEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ResponseEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct ResponseEncoder;

impl Encoder for ResponseEncoder {
    type Item = ExportProfilesServiceResponse;
    type Error = tonic::Status;

    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        item.encode(dst)
            .map_err(|e| tonic::Status::internal(format!("encode response: {e}")))
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        let mut bytes = vec![0u8; src.remaining()];
        src.copy_to_slice(&mut bytes);
        Ok(Some(bytes))
    }
}

// ---- the service ----------------------------------------------------------------

#[derive(Clone)]
struct ExportService {
    state: Arc<State>,
}

impl NamedService for ExportService {
    const NAME: &'static str = SERVICE_NAME;
}

struct ExportCall {
    state: Arc<State>,
}

impl tonic::server::UnaryService<Vec<u8>> for ExportCall {
    type Response = ExportProfilesServiceResponse;
    type Future = BoxFuture<tonic::Response<Self::Response>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<Vec<u8>>) -> Self::Future {
        let state = self.state.clone();
        Box::pin(async move {
            let arrived = Instant::now();
            let arrived_unix_nanos = super::now_unix_nanos();
            let grpc_encoding = request
                .metadata()
                .get("grpc-encoding")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let headers = request
                .metadata()
                .iter()
                .filter_map(|entry| match entry {
                    tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                        Some((k.to_string(), v.to_str().ok()?.to_string()))
                    }
                    tonic::metadata::KeyAndValueRef::Binary(..) => None,
                })
                .collect();
            let raw = request.into_inner();
            tokio::time::sleep(state.delay).await;
            let decoded = match ExportProfilesServiceRequest::decode(raw.as_slice()) {
                Ok(r) => r,
                Err(e) => {
                    let msg = format!("undecodable ExportProfilesServiceRequest: {e}");
                    state
                        .errors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(msg.clone());
                    return Err(tonic::Status::invalid_argument(msg));
                }
            };
            let unknown_fields = unknown_otlp_fields(&raw);
            state
                .requests
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(ReceivedRequest {
                    arrived_unix_nanos,
                    arrived,
                    grpc_encoding,
                    headers,
                    request: decoded,
                    unknown_fields,
                });
            Ok(tonic::Response::new(
                ExportProfilesServiceResponse::default(),
            ))
        })
    }
}

impl<B> Service<http::Request<B>> for ExportService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let call = ExportCall {
            state: self.state.clone(),
        };
        if req.uri().path() == EXPORT_PATH {
            Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(RawCodec)
                    .accept_compressed(CompressionEncoding::Gzip)
                    .max_decoding_message_size(64 << 20);
                Ok(grpc.unary(call, req).await)
            })
        } else {
            let path = req.uri().path().to_string();
            call.state
                .errors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!("call to unexpected path {path}"));
            Box::pin(async move {
                let mut response = http::Response::new(tonic::body::Body::default());
                let headers = response.headers_mut();
                headers.insert(
                    tonic::Status::GRPC_STATUS,
                    (tonic::Code::Unimplemented as i32).into(),
                );
                headers.insert(
                    http::header::CONTENT_TYPE,
                    tonic::metadata::GRPC_CONTENT_TYPE,
                );
                Ok(response)
            })
        }
    }
}
