//! The gRPC `ProfilesService/Export` endpoint.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_server::{
    ProfilesService, ProfilesServiceServer,
};
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use tokio::sync::mpsc;
use tonic::codec::CompressionEncoding;

use super::{ReceiveLimits, ReceivedProfiles, accept};

/// Who may send: when a token is set, requests must carry
/// `authorization: Bearer <token>`.
#[derive(Clone, Default)]
pub struct ReceiverAuth {
    bearer_token: Option<Arc<str>>,
}

impl std::fmt::Debug for ReceiverAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiverAuth")
            .field(
                "bearer_token",
                &self.bearer_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl ReceiverAuth {
    /// Requires `authorization: Bearer <token>`.
    pub fn bearer(token: &str) -> Self {
        Self {
            bearer_token: Some(Arc::from(token)),
        }
    }

    /// Whether the `authorization` header value lets the request in.
    pub fn allows(&self, authorization: Option<&str>) -> bool {
        let Some(token) = &self.bearer_token else {
            return true;
        };
        let Some(given) = authorization.and_then(|a| a.strip_prefix("Bearer ")) else {
            return false;
        };
        // Compare every byte, so the time taken does not reveal the prefix matched.
        given.len() == token.len()
            && given
                .bytes()
                .zip(token.bytes())
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }
}

/// Counters of a [`ProfilesReceiver`].
#[derive(Debug, Default)]
pub struct ReceiverStats {
    /// Requests accepted and handed to the sinks.
    pub accepted_requests: AtomicU64,
    /// Samples in them.
    pub accepted_samples: AtomicU64,
    /// Requests refused as malformed (`INVALID_ARGUMENT`).
    pub invalid_requests: AtomicU64,
    /// Requests refused for a missing or wrong token (`UNAUTHENTICATED`).
    pub unauthenticated_requests: AtomicU64,
    /// Requests refused because the sinks were behind (`RESOURCE_EXHAUSTED`).
    pub overloaded_requests: AtomicU64,
}

/// Receives OTLP Profiles and hands each accepted request to the sinks
/// through a bounded channel.
#[derive(Debug, Clone)]
pub struct ProfilesReceiver {
    sink: mpsc::Sender<ReceivedProfiles>,
    auth: ReceiverAuth,
    limits: ReceiveLimits,
    stats: Arc<ReceiverStats>,
}

impl ProfilesReceiver {
    /// A receiver feeding `sink`.
    pub fn new(
        sink: mpsc::Sender<ReceivedProfiles>,
        auth: ReceiverAuth,
        limits: ReceiveLimits,
    ) -> Self {
        Self {
            sink,
            auth,
            limits,
            stats: Arc::new(ReceiverStats::default()),
        }
    }

    /// The counters, live.
    pub fn stats(&self) -> Arc<ReceiverStats> {
        self.stats.clone()
    }

    /// The limits requests are held to.
    pub fn limits(&self) -> &ReceiveLimits {
        &self.limits
    }

    /// The tonic service: gzip accepted, messages bounded by the limits.
    pub fn into_service(self) -> ProfilesServiceServer<Self> {
        let max = self.limits.max_message_bytes;
        ProfilesServiceServer::new(self)
            .accept_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size(max)
    }

    /// Checks, converts and forwards one request; what both the gRPC and
    /// the HTTP endpoints do once they have decoded it.
    pub fn handle(
        &self,
        authorization: Option<&str>,
        request: &ExportProfilesServiceRequest,
    ) -> Result<ExportProfilesServiceResponse, tonic::Status> {
        if !self.auth.allows(authorization) {
            self.stats.unauthenticated_requests.fetch_add(1, Relaxed);
            return Err(tonic::Status::unauthenticated(
                "a valid `authorization: Bearer` token is required",
            ));
        }
        let received = match accept(request, &self.limits) {
            Ok(received) => received,
            Err(invalid) => {
                self.stats.invalid_requests.fetch_add(1, Relaxed);
                return Err(tonic::Status::invalid_argument(invalid.0));
            }
        };
        let samples = received.samples;
        if samples == 0 {
            return Ok(ExportProfilesServiceResponse::default());
        }
        match self.sink.try_send(received) {
            Ok(()) => {
                self.stats.accepted_requests.fetch_add(1, Relaxed);
                self.stats.accepted_samples.fetch_add(samples, Relaxed);
                Ok(ExportProfilesServiceResponse::default())
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.stats.overloaded_requests.fetch_add(1, Relaxed);
                Err(tonic::Status::resource_exhausted(
                    "the agent's sinks are behind; retry later",
                ))
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                Err(tonic::Status::unavailable("the agent is shutting down"))
            }
        }
    }
}

#[tonic::async_trait]
impl ProfilesService for ProfilesReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportProfilesServiceRequest>,
    ) -> Result<tonic::Response<ExportProfilesServiceResponse>, tonic::Status> {
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.handle(authorization.as_deref(), request.get_ref())
            .map(tonic::Response::new)
    }
}
