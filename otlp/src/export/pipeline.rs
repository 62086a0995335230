//! The export pipeline: batches are encoded into a bounded queue, and one
//! task sends them in order, retrying transient failures with backoff. The
//! same pipeline serves every push sink ([`RequestSender`]: OTLP, Parca).
//!
//! Sending runs in a task of its own, and [`ExportPipeline::submit`] only
//! encodes and queues: an endpoint that is down, slow or hung never holds up
//! the caller (the sink loop, and behind it the sampling loop). Nothing is
//! lost while the endpoint is down for less than the retry budget (an hour
//! by default) and the queue has room (ten minutes of a busy host's batches
//! by default); everything that is dropped is counted, by reason.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::ExportError;
use super::queue::{Dropped, ExportQueue, QueueLimits, QueuedRequest};
use super::retry::{RetryPolicy, is_retryable};
use crate::model::ProfileBatch;

/// A push endpoint the pipeline sends to.
pub trait RequestSender: Send + Sync + 'static {
    /// Encodes a batch (with samples) as one request body.
    fn encode_batch(&self, batch: &ProfileBatch) -> Bytes;
    /// Sends one body, without retrying; `Ok` carries the number of
    /// profiles the endpoint reported rejecting.
    fn send_body(
        &self,
        body: Bytes,
    ) -> Pin<Box<dyn Future<Output = Result<u64, ExportError>> + Send + '_>>;
    /// The endpoint, for logs.
    fn endpoint(&self) -> &str;
}

/// The pipeline of the OTLP exporter.
pub type OtlpPipeline = ExportPipeline<super::OtlpExporter>;

/// Counters of an [`ExportPipeline`], all monotonic except the queue gauges.
#[derive(Debug, Default)]
pub struct ExportStats {
    /// Requests the endpoint accepted.
    pub sent_requests: AtomicU64,
    /// Samples in them.
    pub sent_samples: AtomicU64,
    /// Profiles the endpoint reported rejected in an accepted request.
    pub rejected_profiles: AtomicU64,
    /// Attempts made again after a transient failure.
    pub retries: AtomicU64,
    /// Samples dropped because the queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Samples dropped after retrying for the whole retry budget.
    pub dropped_retries_exhausted: AtomicU64,
    /// Samples the endpoint refused with a non-retryable error.
    pub dropped_rejected: AtomicU64,
    /// Samples still queued when the shutdown deadline passed.
    pub dropped_at_shutdown: AtomicU64,
    /// Requests dropped, for any of the reasons above.
    pub dropped_requests: AtomicU64,
    /// Whether the last attempt to send failed (none yet: false), for
    /// readiness.
    pub last_export_failed: AtomicBool,
    /// Requests waiting now (gauge).
    pub queued_requests: AtomicU64,
    /// Encoded bytes waiting now (gauge).
    pub queued_bytes: AtomicU64,
}

impl ExportStats {
    /// Every dropped sample, whatever the reason.
    pub fn dropped_samples(&self) -> u64 {
        self.dropped_queue_full.load(Relaxed)
            + self.dropped_retries_exhausted.load(Relaxed)
            + self.dropped_rejected.load(Relaxed)
            + self.dropped_at_shutdown.load(Relaxed)
    }
}

struct Shared<S> {
    exporter: S,
    retry: RetryPolicy,
    queue: Mutex<ExportQueue>,
    /// Signalled when a request is queued, and at shutdown.
    wake: Notify,
    /// Signalled at shutdown, to cut a retry's wait short.
    stop: Notify,
    /// Set once by [`ExportPipeline::shutdown`]: give up at this instant.
    deadline: Mutex<Option<Instant>>,
    stats: Arc<ExportStats>,
}

impl<S> Shared<S> {
    fn queue(&self) -> MutexGuard<'_, ExportQueue> {
        // A panic elsewhere cannot leave the queue half-updated: its methods
        // do not panic between updates. Keep going with it.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn deadline(&self) -> Option<Instant> {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update_gauges(&self, queue: &ExportQueue) {
        self.stats
            .queued_requests
            .store(queue.len() as u64, Relaxed);
        self.stats.queued_bytes.store(queue.bytes() as u64, Relaxed);
    }

    fn count_dropped(&self, counter: &AtomicU64, dropped: Dropped) {
        if dropped.requests > 0 {
            counter.fetch_add(dropped.samples, Relaxed);
            self.stats
                .dropped_requests
                .fetch_add(dropped.requests, Relaxed);
        }
    }
}

/// Sends batches to a push endpoint through a bounded queue, with retries.
pub struct ExportPipeline<S> {
    shared: Arc<Shared<S>>,
    sender: JoinHandle<()>,
}

impl<S: RequestSender> ExportPipeline<S> {
    /// Starts the sending task. Must be called within a tokio runtime.
    pub fn start(exporter: S, retry: RetryPolicy, limits: QueueLimits) -> Self {
        let shared = Arc::new(Shared {
            exporter,
            retry,
            queue: Mutex::new(ExportQueue::new(limits)),
            wake: Notify::new(),
            stop: Notify::new(),
            deadline: Mutex::new(None),
            stats: Arc::new(ExportStats::default()),
        });
        let sender = tokio::spawn(send_loop(shared.clone()));
        Self { shared, sender }
    }

    /// The endpoint as configured.
    pub fn endpoint(&self) -> &str {
        self.shared.exporter.endpoint()
    }

    /// The counters, live.
    pub fn stats(&self) -> Arc<ExportStats> {
        self.shared.stats.clone()
    }

    /// Encodes `batch` and queues it; returns at once. A batch without
    /// samples is not sent. When the queue is full, the oldest requests are
    /// dropped (and counted) to make room.
    pub fn submit(&self, batch: &ProfileBatch) {
        let samples = batch.sample_count();
        if samples == 0 {
            return;
        }
        let body = self.shared.exporter.encode_batch(batch);
        self.submit_encoded(body, samples);
    }

    /// Queues an already-encoded request body carrying `samples` samples.
    pub fn submit_encoded(&self, body: Bytes, samples: u64) {
        let request = QueuedRequest {
            body,
            samples,
            queued_at: Instant::now(),
        };
        let mut queue = self.shared.queue();
        let dropped = queue.push(request);
        self.shared.update_gauges(&queue);
        drop(queue);
        if dropped.requests > 0 {
            tracing::warn!(
                requests = dropped.requests,
                samples = dropped.samples,
                endpoint = self.shared.exporter.endpoint(),
                "export queue full: dropped the oldest profiles"
            );
        }
        self.shared
            .count_dropped(&self.shared.stats.dropped_queue_full, dropped);
        self.shared.wake.notify_one();
    }

    /// Sends what is queued, retrying for at most `grace`, then stops; what
    /// is still unsent then is dropped and counted.
    pub async fn shutdown(self, grace: Duration) -> Arc<ExportStats> {
        *self
            .shared
            .deadline
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + grace);
        self.shared.wake.notify_one();
        self.shared.stop.notify_one();
        if let Err(e) = self.sender.await {
            tracing::warn!("the export task failed: {e}");
        }
        self.shared.stats.clone()
    }
}

async fn send_loop<S: RequestSender>(shared: Arc<Shared<S>>) {
    let random = RandomState::new();
    let mut draws = 0u64;
    loop {
        let next = {
            let mut queue = shared.queue();
            let next = queue.pop();
            shared.update_gauges(&queue);
            next
        };
        let Some(request) = next else {
            if shared.deadline().is_some() {
                return;
            }
            shared.wake.notified().await;
            continue;
        };
        let mut retry = 0u32;
        loop {
            let deadline = shared.deadline();
            if deadline.is_some_and(|d| Instant::now() >= d) {
                drop_rest(&shared, request.samples);
                return;
            }
            let attempt = tracing::Instrument::instrument(
                shared.exporter.send_body(request.body.clone()),
                tracing::info_span!(
                    "export",
                    endpoint = shared.exporter.endpoint(),
                    samples = request.samples,
                    retry
                ),
            );
            let result = match deadline {
                Some(d) => tokio::time::timeout_at(d.into(), attempt)
                    .await
                    .unwrap_or_else(|_| {
                        Err(ExportError::Rpc {
                            endpoint: shared.exporter.endpoint().to_owned(),
                            status: Box::new(tonic::Status::deadline_exceeded(
                                "shutdown grace period over",
                            )),
                        })
                    }),
                None => attempt.await,
            };
            match result {
                Ok(rejected) => {
                    let stats = &shared.stats;
                    stats.sent_requests.fetch_add(1, Relaxed);
                    stats.sent_samples.fetch_add(request.samples, Relaxed);
                    stats.last_export_failed.store(false, Relaxed);
                    stats.rejected_profiles.fetch_add(rejected, Relaxed);
                    break;
                }
                Err(e) => {
                    shared.stats.last_export_failed.store(true, Relaxed);
                    let retryable = match &e {
                        ExportError::Rpc { status, .. } => is_retryable(status.code()),
                        _ => false,
                    };
                    if !retryable {
                        tracing::warn!(samples = request.samples, "export refused: {e}");
                        shared
                            .stats
                            .dropped_rejected
                            .fetch_add(request.samples, Relaxed);
                        shared.stats.dropped_requests.fetch_add(1, Relaxed);
                        break;
                    }
                    if request.queued_at.elapsed() >= shared.retry.max_elapsed {
                        tracing::warn!(
                            samples = request.samples,
                            "export still failing after {:?}, dropping: {e}",
                            shared.retry.max_elapsed
                        );
                        shared
                            .stats
                            .dropped_retries_exhausted
                            .fetch_add(request.samples, Relaxed);
                        shared.stats.dropped_requests.fetch_add(1, Relaxed);
                        break;
                    }
                    draws += 1;
                    let unit = (random.hash_one(draws) >> 11) as f64 / (1u64 << 53) as f64;
                    let wait = shared.retry.backoff(retry, unit);
                    if retry == 0 {
                        tracing::warn!("export failed, retrying in {wait:?}: {e}");
                    } else {
                        tracing::debug!(retry, "export failed, retrying in {wait:?}: {e}");
                    }
                    retry = retry.saturating_add(1);
                    shared.stats.retries.fetch_add(1, Relaxed);
                    let mut until = tokio::time::Instant::now() + wait;
                    if let Some(d) = shared.deadline() {
                        until = until.min(d.into());
                    }
                    // Shutdown may shorten the wait: look at the deadline again.
                    tokio::select! {
                        () = tokio::time::sleep_until(until) => {}
                        () = shared.stop.notified() => {}
                    }
                }
            }
        }
    }
}

/// Counts the request in hand and everything queued as dropped at shutdown.
fn drop_rest<S: RequestSender>(shared: &Shared<S>, in_hand: u64) {
    let mut samples = in_hand;
    let mut requests = 1u64;
    let mut queue = shared.queue();
    while let Some(request) = queue.pop() {
        samples += request.samples;
        requests += 1;
    }
    shared.stats.dropped_requests.fetch_add(requests, Relaxed);
    shared.update_gauges(&queue);
    drop(queue);
    if samples > 0 {
        tracing::warn!(
            samples,
            endpoint = shared.exporter.endpoint(),
            "endpoint unreachable at shutdown: dropped unsent profiles"
        );
    }
    shared.stats.dropped_at_shutdown.fetch_add(samples, Relaxed);
}
