//! OTLP Profiles received from other agents and SDKs: checked, converted to
//! the profile model for the sinks that need it, and handed to the sinks.
//!
//! [`ProfilesReceiver`] is the gRPC `ProfilesService`; [`accept_http`] does the
//! same for an OTLP/HTTP protobuf body, for whatever HTTP server hosts it.
//! Bad requests are refused with the problem named and never forwarded; a
//! full forwarding queue refuses with `RESOURCE_EXHAUSTED`, so memory stays
//! bounded whatever the peers send.

mod grpc;
mod http;
mod to_model;
mod validate;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use prost::Message;

pub use grpc::{ProfilesReceiver, ReceiverAuth, ReceiverStats};
pub use http::{HTTP_PATH, HttpError, accept_http};
pub use to_model::{Converted, to_model};
pub use validate::{InvalidProfiles, ReceiveLimits, validate};

/// A request that passed every check, ready for the sinks.
#[derive(Debug, Clone)]
pub struct ReceivedProfiles {
    /// The request re-encoded, for OTLP sinks (unknown fields dropped).
    pub body: Bytes,
    /// Samples it carries.
    pub samples: u64,
    /// Its CPU profiles in the profile model, for pprof and Parca sinks.
    pub converted: Converted,
}

/// Checks a decoded request and prepares it for the sinks.
pub fn accept(
    request: &ExportProfilesServiceRequest,
    limits: &ReceiveLimits,
) -> Result<ReceivedProfiles, InvalidProfiles> {
    let samples = validate(request, limits)?;
    Ok(ReceivedProfiles {
        body: Bytes::from(request.encode_to_vec()),
        samples,
        converted: to_model(request),
    })
}

#[cfg(test)]
mod tests;
