//! OTLP Profiles received from other agents and SDKs: checked, converted to
//! the profile model for the sinks that need it, and handed to the sinks.
//!
//! [`ProfilesReceiver`] serves gRPC `ProfilesService/Export`
//! ([`ProfilesReceiver::grpc`]) and OTLP/HTTP ([`ProfilesReceiver::http`])
//! for whatever HTTP server hosts it. Each request is admitted in the order
//! that keeps a hostile or slow client from hurting the others: the token
//! from the headers first, then the body read as it arrives under a
//! deadline and a memory budget, then its decoded cost reserved before it
//! is decoded (in one of a few decode slots), checked and converted. The
//! reservation travels with the accepted request until the sinks drop it.
//! Bad requests are refused with the problem named and never forwarded;
//! a full budget or forwarding queue refuses with `RESOURCE_EXHAUSTED`.

mod auth;
mod body;
mod budget;
mod decode_cost;
mod grpc;
mod otlp_http;
mod outcome;
mod receiver;
mod to_model;
mod validate;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use prost::Message;

pub use auth::{BearerAuth, ReceiverAuth};
pub use body::UnaryBody;
pub use budget::{MemoryBudget, OverBudget, Reservation};
pub use decode_cost::{WireError, decoded_bytes};
pub use grpc::GRPC_EXPORT_PATH;
pub use otlp_http::HTTP_PATH;
pub use outcome::{Outcome, ReceiverStats, Refusal};
pub use receiver::{ProfilesReceiver, ReceiverOptions};
pub use to_model::{Converted, to_model};
pub use validate::{InvalidProfiles, ReceiveLimits, validate};

/// A request that passed every check, ready for the sinks.
#[derive(Debug)]
pub struct ReceivedProfiles {
    /// The request re-encoded, for OTLP sinks (unknown fields dropped).
    pub body: Bytes,
    /// Samples it carries.
    pub samples: u64,
    /// Its CPU profiles in the profile model, for pprof and Parca sinks.
    pub converted: Converted,
    /// The receiver memory it holds until dropped; `None` outside a receiver.
    pub reservation: Option<Reservation>,
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
        reservation: None,
    })
}

#[cfg(test)]
mod tests;
