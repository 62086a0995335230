//! When and how long to wait before sending a failed export again.
//!
//! The OTLP specification names the gRPC codes worth retrying; the rest mean
//! the request itself is at fault and sending it again cannot help. Waits
//! grow exponentially with random jitter, so that many agents cut off by the
//! same outage do not all come back in the same instant.

use std::time::Duration;

use tonic::Code;

/// Exponential backoff with jitter, bounded per request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Wait before the first retry.
    pub initial_backoff: Duration,
    /// Longest wait between two attempts.
    pub max_backoff: Duration,
    /// Each wait is the previous one times this.
    pub multiplier: f64,
    /// Each wait is drawn uniformly from `wait × (1 ± jitter)`.
    pub jitter: f64,
    /// A request still failing this long after its first attempt is dropped.
    pub max_elapsed: Duration,
}

impl Default for RetryPolicy {
    /// The OpenTelemetry Collector's exporter defaults, except a shorter
    /// first wait (a profiler's batches are minutes apart at most, and an
    /// endpoint restarting is back within seconds) and a longer budget: an
    /// hour, so that the queue's byte bound, sized for ten minutes of a
    /// busy host, is what limits an outage at the default load, rather than
    /// the age of the oldest request (the Collector's 5 minutes would drop
    /// half of a 10-minute outage the queue has room for).
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            multiplier: 1.5,
            jitter: 0.5,
            max_elapsed: Duration::from_secs(3600),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (0 for the first retry), with
    /// `unit` a uniform random number in `[0, 1)` choosing the jitter.
    pub fn backoff(&self, retry: u32, unit: f64) -> Duration {
        let base = self.initial_backoff.as_secs_f64()
            * self.multiplier.max(1.0).powi(retry.min(64) as i32);
        let base = base.min(self.max_backoff.as_secs_f64());
        let jitter = self.jitter.clamp(0.0, 1.0);
        let factor = 1.0 - jitter + 2.0 * jitter * unit.clamp(0.0, 1.0);
        Duration::from_secs_f64((base * factor).min(self.max_backoff.as_secs_f64()))
    }
}

/// Whether an export that failed with `code` may succeed if sent again
/// (the OTLP specification's list: the endpoint is unreachable, overloaded
/// or timed out, not the request at fault).
///
/// `RESOURCE_EXHAUSTED` is retried too: collectors answer it when their
/// memory limiter refuses data, which clears once their queue drains, and
/// icecore's own queue and `max_elapsed` bound how long it keeps trying.
pub fn is_retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::OutOfRange
            | Code::Unavailable
            | Code::DataLoss
            | Code::ResourceExhausted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_the_cap() {
        let policy = RetryPolicy {
            jitter: 0.0,
            ..RetryPolicy::default()
        };
        let waits: Vec<f64> = (0..20)
            .map(|i| policy.backoff(i, 0.3).as_secs_f64())
            .collect();
        assert!((waits[0] - 0.5).abs() < 1e-9, "{waits:?}");
        assert!((waits[1] - 0.75).abs() < 1e-9, "{waits:?}");
        assert!(waits.windows(2).all(|w| w[1] >= w[0]), "{waits:?}");
        assert_eq!(waits[19], 30.0);
        assert_eq!(policy.backoff(u32::MAX, 0.0), Duration::from_secs(30));
    }

    #[test]
    fn jitter_spreads_around_the_base() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.backoff(0, 0.0), Duration::from_millis(250));
        assert_eq!(policy.backoff(0, 0.5), Duration::from_millis(500));
        assert!(policy.backoff(0, 0.999_999) < Duration::from_millis(750));
        // Out-of-range randomness and settings are clamped, never negative.
        let wild = RetryPolicy {
            jitter: 7.0,
            multiplier: -3.0,
            ..RetryPolicy::default()
        };
        assert_eq!(wild.backoff(3, -1.0), Duration::ZERO);
        assert!(wild.backoff(3, 2.0) <= wild.max_backoff);
    }

    #[test]
    fn only_transient_codes_are_retried() {
        for code in [Code::Unavailable, Code::DeadlineExceeded, Code::Aborted] {
            assert!(is_retryable(code), "{code:?}");
        }
        for code in [
            Code::InvalidArgument,
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::Unimplemented,
            Code::NotFound,
            Code::Internal,
        ] {
            assert!(!is_retryable(code), "{code:?}");
        }
    }
}
