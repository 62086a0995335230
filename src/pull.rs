//! `GET /debug/pprof/profile?seconds=N`: a gzipped pprof of the next N
//! seconds, cut from the batches the sinks see, as Go's net/http/pprof
//! serves it to Parca's and Prometheus-style scrapers.
//!
//! Samples are taken from batches by timestamp. When the N seconds are
//! over, the pull asks the profiler to cut its batch at once, so the answer
//! comes within moments of the window's end (clients such as `go tool
//! pprof` wait 1.5 times N for it), not up to a `--reporter-interval` later.

use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use icecore_otlp::{
    encode_gzip,
    model::{ProfileBatch, ProfileKind},
};
use tokio::sync::{Notify, Semaphore, broadcast};

/// Default of `seconds`, as in Go's net/http/pprof.
pub const DEFAULT_SECONDS: u64 = 30;
/// Longest pull accepted.
pub const MAX_SECONDS: u64 = 600;
/// Pulls served at once; more are refused (each holds up to N seconds of
/// batches).
const MAX_CONCURRENT_PULLS: usize = 4;
/// Batches buffered per pull between the sinks and the pull's task.
const BUFFERED_BATCHES: usize = 64;

/// Why a pull has no profile.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// `seconds` is not an integer from 1 to [`MAX_SECONDS`].
    #[error("seconds must be an integer from 1 to {MAX_SECONDS}")]
    BadSeconds,
    /// [`MAX_CONCURRENT_PULLS`] pulls are running.
    #[error("too many profile pulls at once; retry later")]
    Busy,
    /// No batch covering the window's end came in time (the agent is
    /// stopping, or the source is stuck).
    #[error("no profile data covering the requested window arrived")]
    NoData,
    /// The pull fell so far behind that batches were lost.
    #[error("the pull fell behind and lost batches")]
    Lagged,
    /// Encoding failed.
    #[error("encoding the profile failed: {0}")]
    Encode(String),
}

/// Hands every batch to the pulls waiting for it.
pub struct PullHub {
    batches: broadcast::Sender<Arc<ProfileBatch>>,
    reporter_interval: Duration,
    slots: Semaphore,
    cut_now: Arc<Notify>,
}

impl PullHub {
    /// A hub for batches made every `reporter_interval`.
    pub fn new(reporter_interval: Duration) -> Self {
        Self {
            batches: broadcast::channel(BUFFERED_BATCHES).0,
            reporter_interval,
            slots: Semaphore::new(MAX_CONCURRENT_PULLS),
            cut_now: Arc::new(Notify::new()),
        }
    }

    /// Notified when a pull's window is over: the profiler then cuts its
    /// batch without waiting for the interval.
    pub fn cut_signal(&self) -> Arc<Notify> {
        self.cut_now.clone()
    }

    /// Offers a batch to the running pulls (none: dropped at once). Only
    /// CPU profiles are pulled, as `/debug/pprof/profile` serves in Go.
    pub fn publish(&self, batch: Arc<ProfileBatch>) {
        if batch.kind == ProfileKind::Cpu {
            let _ = self.batches.send(batch);
        }
    }

    /// The gzipped pprof of the next `seconds` seconds.
    pub async fn profile(&self, seconds: Option<&str>) -> Result<Vec<u8>, PullError> {
        let seconds = match seconds {
            None => DEFAULT_SECONDS,
            Some(text) => text
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|s| (1..=MAX_SECONDS).contains(s))
                .ok_or(PullError::BadSeconds)?,
        };
        let _slot = self.slots.try_acquire().map_err(|_| PullError::Busy)?;
        let mut batches_rx = self.batches.subscribe();
        let start = now_unix_nanos();
        let end = start + seconds * 1_000_000_000;
        let window_over = tokio::time::Instant::now() + Duration::from_secs(seconds);
        // The batch normally comes right after the cut; the interval is the
        // fallback should the profiler be busy.
        let deadline = window_over + self.reporter_interval + Duration::from_secs(5);
        let mut batches = Vec::new();
        let mut cut_asked = false;
        loop {
            if !cut_asked && tokio::time::Instant::now() >= window_over {
                self.cut_now.notify_one();
                cut_asked = true;
            }
            let wait_until = if cut_asked { deadline } else { window_over };
            match tokio::time::timeout_at(wait_until, batches_rx.recv()).await {
                Ok(Ok(batch)) => {
                    let covers_end =
                        batch.start_unix_nanos.saturating_add(batch.duration_nanos) >= end;
                    batches.push(batch);
                    if covers_end {
                        break;
                    }
                }
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => return Err(PullError::Lagged),
                Ok(Err(broadcast::error::RecvError::Closed)) => return Err(PullError::NoData),
                Err(_) if !cut_asked => {} // the window is over: ask for the cut
                Err(_) => return Err(PullError::NoData),
            }
        }
        let window = ProfileBatch::window_of(&batches, start, end);
        tokio::task::spawn_blocking(move || encode_gzip(&window))
            .await
            .map_err(|e| PullError::Encode(e.to_string()))?
            .map_err(|e| PullError::Encode(e.to_string()))
    }
}

fn now_unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
