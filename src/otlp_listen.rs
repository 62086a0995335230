//! The OTLP Profiles receiver on `--otlp-listen`: gRPC `ProfilesService`
//! and OTLP/HTTP `POST /v1development/profiles` on one port, feeding the
//! sinks. Admission (token, body, memory, decoding) is the receiver's
//! (`icecore_otlp::receive`); the connections are `serve`'s.

use std::sync::{Arc, atomic::AtomicU64};

use bytes::Bytes;
use hyper::{Request, Response, StatusCode, body::Incoming, header};
use icecore_otlp::receive::{
    HTTP_PATH, MemoryBudget, ProfilesReceiver, ReceivedProfiles, ReceiverAuth, ReceiverOptions,
    ReceiverStats, UnaryBody,
};
use tokio::{net::TcpListener, sync::mpsc};
use tracing::info;

use crate::serve::{self, ListenerLimits};

/// Accepted requests waiting for the sinks; more are refused with
/// RESOURCE_EXHAUSTED, and the sender retries. (Their memory is also held
/// in the receiver's budget until the sinks are done with them.)
pub const FORWARD_QUEUE: usize = 16;

/// What `/metrics` reads of a running receiver.
#[derive(Clone)]
pub struct ReceiverMetrics {
    /// Requests by outcome, and samples.
    pub stats: Arc<ReceiverStats>,
    /// Memory held by requests.
    pub budget: Arc<MemoryBudget>,
    /// Connections refused at the listener's limit.
    pub refused_connections: Arc<AtomicU64>,
}

/// Serves the receiver on `listener` (bound at start-up, before the BPF
/// programs load) until the runtime stops.
pub fn serve(
    listener: TcpListener,
    auth: ReceiverAuth,
    options: ReceiverOptions,
    forward: mpsc::Sender<ReceivedProfiles>,
) -> ReceiverMetrics {
    let receiver = ProfilesReceiver::new(forward, auth, options);
    let metrics = ReceiverMetrics {
        stats: receiver.stats(),
        budget: receiver.budget(),
        refused_connections: Arc::default(),
    };
    let bound = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    info!("receiving OTLP profiles on {bound} (gRPC, and HTTP at {HTTP_PATH})");
    serve::spawn(
        listener,
        None,
        ListenerLimits::default(),
        metrics.refused_connections.clone(),
        "OTLP receiver",
        move |request: Request<Incoming>| {
            let receiver = receiver.clone();
            async move { route(&receiver, request).await }
        },
    );
    metrics
}

async fn route(receiver: &ProfilesReceiver, request: Request<Incoming>) -> Response<UnaryBody> {
    if request.uri().path() == HTTP_PATH {
        return receiver.http(request).await;
    }
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/grpc"));
    if grpc {
        return receiver.grpc(request).await;
    }
    let mut response = Response::new(UnaryBody::new(
        Bytes::from_static(
            b"not found: OTLP profiles go to POST /v1development/profiles or gRPC\n",
        ),
        None,
    ));
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}
