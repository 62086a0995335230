//! The receiver's pipeline, shared by gRPC and OTLP/HTTP once the body is
//! read: decompress, cost, decode, check, convert and hand to the sinks,
//! every step within the memory budget.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use flate2::read::GzDecoder;
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use prost::Message;
use tokio::sync::{Semaphore, mpsc};

use super::body::over_budget;
use super::budget::{MemoryBudget, Reservation};
use super::outcome::{Outcome, ReceiverStats, Refusal};
use super::{ReceiveLimits, ReceivedProfiles, ReceiverAuth, accept, decode_cost};

/// How much a receiver may take on, and how long it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiverOptions {
    /// What one request may hold.
    pub limits: ReceiveLimits,
    /// Memory for requests being read, decoded and waiting for the sinks.
    pub memory_bytes: usize,
    /// Longest time a request's body may take to arrive.
    pub body_timeout: Duration,
    /// Requests decompressed and decoded at once (CPU work).
    pub decode_slots: usize,
    /// Longest wait for a decode slot before `RESOURCE_EXHAUSTED`.
    pub decode_wait: Duration,
}

impl Default for ReceiverOptions {
    /// 128 MiB, 30 s for a body, two decodes at once, 1 s for a slot.
    fn default() -> Self {
        Self {
            limits: ReceiveLimits::default(),
            memory_bytes: 128 << 20,
            body_timeout: Duration::from_secs(30),
            decode_slots: 2,
            decode_wait: Duration::from_secs(1),
        }
    }
}

/// Receives OTLP Profiles and hands each accepted request to the sinks
/// through a bounded channel.
#[derive(Debug, Clone)]
pub struct ProfilesReceiver {
    sink: mpsc::Sender<ReceivedProfiles>,
    auth: ReceiverAuth,
    options: ReceiverOptions,
    budget: Arc<MemoryBudget>,
    decode_slots: Arc<Semaphore>,
    stats: Arc<ReceiverStats>,
}

impl ProfilesReceiver {
    /// A receiver feeding `sink`.
    pub fn new(
        sink: mpsc::Sender<ReceivedProfiles>,
        auth: ReceiverAuth,
        options: ReceiverOptions,
    ) -> Self {
        Self {
            sink,
            auth,
            budget: MemoryBudget::new(options.memory_bytes),
            decode_slots: Arc::new(Semaphore::new(options.decode_slots.max(1))),
            options,
            stats: Arc::new(ReceiverStats::default()),
        }
    }

    /// The counters, live.
    pub fn stats(&self) -> Arc<ReceiverStats> {
        self.stats.clone()
    }

    /// The memory budget, live.
    pub fn budget(&self) -> Arc<MemoryBudget> {
        self.budget.clone()
    }

    /// The bounds requests are held to.
    pub fn options(&self) -> &ReceiverOptions {
        &self.options
    }

    /// Checks the `authorization` header: the first thing done with a
    /// request, before its body is read.
    pub(super) fn authorize(&self, authorization: Option<&str>) -> Result<(), Refusal> {
        if self.auth.allows(authorization) {
            return Ok(());
        }
        Err(Refusal::new(
            Outcome::Unauthenticated,
            "a valid `authorization: Bearer` token is required",
        ))
    }

    /// Counts how a request ended.
    pub(super) fn count<T>(&self, result: &Result<T, Refusal>) {
        self.stats.count(match result {
            Ok(_) => Outcome::Accepted,
            Err(refusal) => refusal.outcome,
        });
    }

    /// Decodes the message in `data[offset..]` (gzipped when `gzip`),
    /// checks it and hands it to the sinks. `reservation` holds `data`.
    pub(super) async fn receive(
        &self,
        data: Vec<u8>,
        offset: usize,
        gzip: bool,
        reservation: Reservation,
    ) -> Result<ExportProfilesServiceResponse, Refusal> {
        let slot = tokio::time::timeout(
            self.options.decode_wait,
            Arc::clone(&self.decode_slots).acquire_owned(),
        )
        .await;
        let Ok(Ok(slot)) = slot else {
            return Err(Refusal::new(
                Outcome::Overloaded,
                "the receiver is busy decoding other requests; retry later",
            ));
        };
        let limits = self.options.limits;
        let prepared = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            prepare(data, offset, gzip, reservation, &limits)
        })
        .await
        .map_err(|e| Refusal::new(Outcome::Invalid, format!("decoding failed: {e}")))??;
        let Some(received) = prepared else {
            return Ok(ExportProfilesServiceResponse::default());
        };
        let samples = received.samples;
        match self.sink.try_send(received) {
            Ok(()) => {
                self.stats.accepted_samples.fetch_add(samples, Relaxed);
                Ok(ExportProfilesServiceResponse::default())
            }
            Err(mpsc::error::TrySendError::Full(_)) => Err(Refusal::new(
                Outcome::Overloaded,
                "the agent's sinks are behind; retry later",
            )),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(Refusal::new(
                Outcome::ShuttingDown,
                "the agent is shutting down",
            )),
        }
    }
}

/// The CPU part of receiving: `None` for a valid request without samples.
fn prepare(
    mut data: Vec<u8>,
    offset: usize,
    gzip: bool,
    mut reservation: Reservation,
    limits: &ReceiveLimits,
) -> Result<Option<ReceivedProfiles>, Refusal> {
    let max = limits.max_message_bytes;
    if gzip {
        let inflated = gunzip(
            data.get(offset..).unwrap_or_default(),
            max,
            &mut reservation,
        )?;
        let compressed = data.capacity();
        drop(data);
        reservation
            .resize(reservation.bytes() - compressed)
            .map_err(over_budget)?;
        data = inflated;
    } else if data.len() - offset.min(data.len()) > max {
        return Err(too_large(max));
    }
    let wire = data
        .get(if gzip { 0 } else { offset }..)
        .unwrap_or_default();
    let decoded_cost = decode_cost::decoded_bytes(wire).map_err(not_a_request)?;
    reservation.grow(decoded_cost).map_err(over_budget)?;
    let request = ExportProfilesServiceRequest::decode(wire).map_err(not_a_request)?;
    drop(data);
    // From here the request's decoded form is what is held.
    reservation.resize(decoded_cost).map_err(over_budget)?;
    let received =
        accept(&request, limits).map_err(|invalid| Refusal::new(Outcome::Invalid, invalid.0))?;
    drop(request);
    if received.samples == 0 {
        return Ok(None);
    }
    reservation
        .resize(received.body.len() + received.converted.heap_bytes)
        .map_err(over_budget)?;
    Ok(Some(ReceivedProfiles {
        reservation: Some(reservation),
        ..received
    }))
}

fn too_large(max: usize) -> Refusal {
    Refusal::new(
        Outcome::TooLarge,
        format!("the request is over the {max}-byte limit once decompressed"),
    )
}

fn not_a_request(e: impl std::fmt::Display) -> Refusal {
    Refusal::new(
        Outcome::Invalid,
        format!("not an ExportProfilesServiceRequest: {e}"),
    )
}

/// Inflates `gzipped` up to `max` bytes, holding the output in `reservation`.
fn gunzip(gzipped: &[u8], max: usize, reservation: &mut Reservation) -> Result<Vec<u8>, Refusal> {
    let base = reservation.bytes();
    let mut out: Vec<u8> = Vec::new();
    let mut decoder = GzDecoder::new(gzipped);
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = match decoder.read(&mut chunk) {
            Ok(0) => return Ok(out),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(Refusal::new(
                    Outcome::Invalid,
                    format!("bad gzip body: {e}"),
                ));
            }
        };
        let total = out.len() + n;
        if total > max {
            return Err(too_large(max));
        }
        if total > out.capacity() {
            let wanted = total.max(out.capacity() * 2).min(max);
            reservation.resize(base + wanted).map_err(over_budget)?;
            out.reserve_exact(wanted - out.len());
        }
        out.extend_from_slice(&chunk[..n]);
    }
}
