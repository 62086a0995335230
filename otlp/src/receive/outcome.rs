//! How each request ended: the refusals, what they answer on gRPC and on
//! HTTP, and the receiver's counters by outcome.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use prost::Message;

/// How a request ended, for `icecore_receiver_requests_total{outcome=…}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted and handed to the sinks.
    Accepted,
    /// Malformed: not a request, or a request that fails the checks.
    Invalid,
    /// Over the size limit, or over the memory budget even when alone.
    TooLarge,
    /// Missing or wrong token.
    Unauthenticated,
    /// Not a method, media type or encoding the receiver speaks.
    Unsupported,
    /// Refused for now: memory budget, decode slots or sinks full.
    Overloaded,
    /// The body did not arrive within the read timeout.
    TimedOut,
    /// The client went away or broke the body off.
    Aborted,
    /// The agent is stopping.
    ShuttingDown,
}

impl Outcome {
    /// Every outcome, in the order `/metrics` lists them.
    pub const ALL: [Outcome; 9] = [
        Outcome::Accepted,
        Outcome::Invalid,
        Outcome::TooLarge,
        Outcome::Unauthenticated,
        Outcome::Unsupported,
        Outcome::Overloaded,
        Outcome::TimedOut,
        Outcome::Aborted,
        Outcome::ShuttingDown,
    ];

    /// The `outcome` label value.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Invalid => "invalid",
            Outcome::TooLarge => "too_large",
            Outcome::Unauthenticated => "unauthenticated",
            Outcome::Unsupported => "unsupported",
            Outcome::Overloaded => "overloaded",
            Outcome::TimedOut => "timed_out",
            Outcome::Aborted => "aborted",
            Outcome::ShuttingDown => "shutting_down",
        }
    }
}

/// A refused request: why, in words the sender can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// Which kind of refusal.
    pub outcome: Outcome,
    /// What is wrong.
    pub message: String,
}

impl Refusal {
    /// A refusal of kind `outcome`.
    pub fn new(outcome: Outcome, message: impl Into<String>) -> Self {
        Self {
            outcome,
            message: message.into(),
        }
    }

    /// The gRPC status code. Size and decoding problems are
    /// `INVALID_ARGUMENT`: the same request would fail again, so a client
    /// must not retry it (`RESOURCE_EXHAUSTED` is retried).
    pub fn grpc_code(&self) -> tonic::Code {
        match self.outcome {
            Outcome::Accepted => tonic::Code::Ok,
            Outcome::Invalid | Outcome::TooLarge => tonic::Code::InvalidArgument,
            Outcome::Unauthenticated => tonic::Code::Unauthenticated,
            Outcome::Unsupported => tonic::Code::Unimplemented,
            Outcome::Overloaded => tonic::Code::ResourceExhausted,
            Outcome::TimedOut => tonic::Code::DeadlineExceeded,
            Outcome::Aborted => tonic::Code::Cancelled,
            Outcome::ShuttingDown => tonic::Code::Unavailable,
        }
    }

    /// The HTTP status of OTLP/HTTP: 429 and 503 are the ones its clients retry.
    pub fn http_status(&self) -> u16 {
        match self.outcome {
            Outcome::Accepted => 200,
            Outcome::Invalid | Outcome::Aborted => 400,
            Outcome::TooLarge => 413,
            Outcome::Unauthenticated => 401,
            Outcome::Unsupported => 415,
            Outcome::Overloaded => 429,
            Outcome::TimedOut => 408,
            Outcome::ShuttingDown => 503,
        }
    }

    /// The `google.rpc.Status` body OTLP/HTTP answers errors with.
    pub fn rpc_status(&self) -> Vec<u8> {
        RpcStatus {
            code: self.grpc_code() as i32,
            message: self.message.clone(),
        }
        .encode_to_vec()
    }
}

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, Message)]
pub(super) struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// Counters of a receiver.
#[derive(Debug, Default)]
pub struct ReceiverStats {
    requests: [AtomicU64; Outcome::ALL.len()],
    /// Samples in accepted requests.
    pub accepted_samples: AtomicU64,
}

impl ReceiverStats {
    /// Counts one request that ended in `outcome`.
    pub fn count(&self, outcome: Outcome) {
        self.requests[outcome as usize].fetch_add(1, Relaxed);
    }

    /// Requests that ended in `outcome` so far.
    pub fn requests(&self, outcome: Outcome) -> u64 {
        self.requests[outcome as usize].load(Relaxed)
    }
}
