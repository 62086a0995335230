//! The OTLP Profiles receiver on `--otlp-listen`: gRPC `ProfilesService` and
//! OTLP/HTTP `POST /v1development/profiles` on one port, feeding the sinks.

use std::{net::SocketAddr, sync::Arc};

use anyhow::Context;
use axum::{
    Router,
    body::Bytes,
    extract::{DefaultBodyLimit, State},
    http::{HeaderMap, StatusCode, header},
    response::IntoResponse,
    routing::post,
};
use icecore_otlp::receive::{
    HTTP_PATH, ProfilesReceiver, ReceiveLimits, ReceivedProfiles, ReceiverAuth, ReceiverStats,
    accept_http,
};
use tokio::sync::mpsc;
use tower::{ServiceBuilder, limit::GlobalConcurrencyLimitLayer};
use tracing::{info, warn};

/// Requests handled at once; more wait for a slot, which bounds the memory
/// that decoding requests can take to this many times the message limit
/// (16 MiB), plus what decoding expands them to.
const MAX_CONCURRENT_REQUESTS: usize = 4;
/// Accepted requests waiting for the sinks; more are refused with
/// RESOURCE_EXHAUSTED, and the sender retries.
pub const FORWARD_QUEUE: usize = 16;

const GRPC_SERVICE_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/{*method}";

/// Binds `address` and serves until the runtime stops; returns the
/// receiver's counters.
pub async fn serve(
    address: SocketAddr,
    auth: ReceiverAuth,
    forward: mpsc::Sender<ReceivedProfiles>,
) -> anyhow::Result<Arc<ReceiverStats>> {
    let limits = ReceiveLimits::default();
    let receiver = ProfilesReceiver::new(forward, auth, limits);
    let stats = receiver.stats();
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("--otlp-listen {address}: cannot listen"))?;
    let bound = listener.local_addr().unwrap_or(address);
    let app = Router::new()
        .route(HTTP_PATH, post(http_export))
        .route_service(
            GRPC_SERVICE_PATH,
            ServiceBuilder::new()
                .map_response(oversized_is_invalid_argument)
                .service(receiver.clone().into_service()),
        )
        .layer(DefaultBodyLimit::max(limits.max_message_bytes))
        .layer(GlobalConcurrencyLimitLayer::new(MAX_CONCURRENT_REQUESTS))
        .with_state(receiver);
    info!("receiving OTLP profiles on {bound} (gRPC, and HTTP at {HTTP_PATH})");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            warn!("OTLP receiver stopped: {e}");
        }
    });
    Ok(stats)
}

/// tonic refuses a message over the size limit with `OUT_OF_RANGE` before
/// the service sees it; for the receiver that is a bad request like any
/// other, so it answers `INVALID_ARGUMENT` (its message, naming the size and
/// the limit, is kept). The status of such an early refusal is in the
/// response headers (a trailers-only response).
fn oversized_is_invalid_argument<B>(
    mut response: axum::http::Response<B>,
) -> axum::http::Response<B> {
    const OUT_OF_RANGE: &str = "11";
    const INVALID_ARGUMENT: &str = "3";
    let headers = response.headers_mut();
    if headers
        .get("grpc-status")
        .is_some_and(|v| v == OUT_OF_RANGE)
    {
        headers.insert(
            "grpc-status",
            axum::http::HeaderValue::from_static(INVALID_ARGUMENT),
        );
    }
    response
}

async fn http_export(
    State(receiver): State<ProfilesReceiver>,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let header = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let result = accept_http(
        &receiver,
        header(header::CONTENT_TYPE),
        header(header::CONTENT_ENCODING),
        header(header::AUTHORIZATION),
        &body,
    );
    let (status, body) = match result {
        Ok(response) => (StatusCode::OK, response),
        Err(e) => (
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
            e.body,
        ),
    };
    (
        status,
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        body,
    )
}
