//! An `ExportProfilesServiceRequest` from another agent or SDK, after its
//! body was read (and inflated): the steps of the receiver's `prepare`,
//! with the same public functions and in the same order. The decoded cost
//! (`decoded_bytes`, a walk of the wire bytes) first, then prost's decode,
//! then `accept`: `validate`, `to_model` and the re-encoding. Then what the
//! sinks do with the converted batch: batches from one host merged, encoded
//! as pprof and as OTLP.
//!
//! The `otlp_receiver` target drives the whole HTTP/gRPC path instead
//! (framing, gzip, budgets) at a lower rate.

use icecore_otlp::opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use icecore_otlp::prost::Message;
use icecore_otlp::receive::{ReceiveLimits, accept, decoded_bytes};

/// Runs one input through the entry points above; panics are the bugs
/// looked for (errors are expected answers to bad input).
pub fn run(data: &[u8]) {
    let limits = ReceiveLimits::default();
    if data.len() > limits.max_message_bytes {
        return;
    }
    let Ok(cost) = decoded_bytes(data) else {
        return;
    };
    // The receiver's budget (128 MiB by default) refuses costlier requests.
    if cost > 128 << 20 {
        return;
    }
    let Ok(request) = ExportProfilesServiceRequest::decode(data) else {
        return;
    };
    let received = match accept(&request, &limits) {
        Ok(received) => received,
        Err(invalid) => {
            let _ = invalid.to_string();
            return;
        }
    };
    let _ = received.converted.batch.heap_bytes();
    let _ = received.converted.batch.sample_count();
    let mut merged = received.converted.batch.clone();
    merged.merge(received.converted.batch);
    let _ = icecore_otlp::encode_profile(&merged);
    let _ = icecore_otlp::encode_request(&merged, "fuzz").encode_to_vec();
}
