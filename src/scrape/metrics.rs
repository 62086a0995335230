//! Per-target scrape counters and their Prometheus text exposition.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use icecore_otlp::scrape::ScrapeFailure;

/// Every scrape's counters.
#[derive(Debug, Default)]
pub struct ScrapeStats {
    /// One per (target, profile), in config order.
    pub(super) targets: Vec<std::sync::Arc<TargetStats>>,
}

/// One (target, profile)'s counters.
#[derive(Debug)]
pub(super) struct TargetStats {
    /// `job="…",instance="…",profile="…"`, escaped once.
    labels: String,
    attempts: AtomicU64,
    up: AtomicU64,
    failures: [AtomicU64; ScrapeFailure::REASONS.len()],
    samples: AtomicU64,
    bytes: AtomicU64,
    resets: AtomicU64,
    last_duration_micros: AtomicU64,
}

impl TargetStats {
    pub(super) fn new(job: &str, instance: &str, profile: &str) -> Self {
        Self {
            labels: format!(
                "job=\"{}\",instance=\"{}\",profile=\"{}\"",
                escape(job),
                escape(instance),
                escape(profile)
            ),
            attempts: AtomicU64::new(0),
            up: AtomicU64::new(0),
            failures: Default::default(),
            samples: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            last_duration_micros: AtomicU64::new(0),
        }
    }

    pub(super) fn record_duration(&self, took: Duration) {
        self.attempts.fetch_add(1, Relaxed);
        self.last_duration_micros
            .store(u64::try_from(took.as_micros()).unwrap_or(u64::MAX), Relaxed);
    }

    pub(super) fn record_success(&self, bytes: usize) {
        self.up.store(1, Relaxed);
        self.bytes.fetch_add(bytes as u64, Relaxed);
    }

    pub(super) fn record_failure(&self, reason: &str) {
        self.up.store(0, Relaxed);
        if let Some(i) = ScrapeFailure::REASONS.iter().position(|r| *r == reason) {
            self.failures[i].fetch_add(1, Relaxed);
        }
    }

    pub(super) fn record_samples(&self, samples: u64) {
        self.samples.fetch_add(samples, Relaxed);
    }

    pub(super) fn record_reset(&self) {
        self.resets.fetch_add(1, Relaxed);
    }
}

/// A per-target series: name, type, help and how to read its value.
type Series = (
    &'static str,
    &'static str,
    &'static str,
    fn(&TargetStats) -> String,
);

/// Appends the scrape metrics to `out`.
pub fn render(out: &mut String, stats: &ScrapeStats) {
    if stats.targets.is_empty() {
        return;
    }
    let counters: [Series; 6] = [
        (
            "icecore_scrape_up",
            "gauge",
            "Whether the target's last scrape succeeded.",
            |t| t.up.load(Relaxed).to_string(),
        ),
        (
            "icecore_scrape_attempts_total",
            "counter",
            "Scrapes of the target's profile, successful or not.",
            |t| t.attempts.load(Relaxed).to_string(),
        ),
        (
            "icecore_scrape_samples_total",
            "counter",
            "Samples of the scraped profiles handed to the sinks (after deltas).",
            |t| t.samples.load(Relaxed).to_string(),
        ),
        (
            "icecore_scrape_received_bytes_total",
            "counter",
            "Bytes of profiles received, as sent (compressed).",
            |t| t.bytes.load(Relaxed).to_string(),
        ),
        (
            "icecore_scrape_resets_total",
            "counter",
            "Cumulative profiles whose counts went down (a restarted target): a new baseline, nothing sent.",
            |t| t.resets.load(Relaxed).to_string(),
        ),
        (
            "icecore_scrape_duration_seconds",
            "gauge",
            "How long the target's last scrape took.",
            |t| format!("{:.6}", t.last_duration_micros.load(Relaxed) as f64 / 1e6),
        ),
    ];
    for (name, kind, help, value) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for target in &stats.targets {
            let _ = writeln!(out, "{name}{{{}}} {}", target.labels, value(target));
        }
    }
    let name = "icecore_scrape_failures_total";
    let _ = writeln!(
        out,
        "# HELP {name} Failed scrapes, by reason (connect, timeout, http_status, too_large, transport, not_pprof).\n# TYPE {name} counter"
    );
    for target in &stats.targets {
        for (reason, count) in ScrapeFailure::REASONS.iter().zip(&target.failures) {
            let _ = writeln!(
                out,
                "{name}{{{},reason=\"{reason}\"}} {}",
                target.labels,
                count.load(Relaxed)
            );
        }
    }
}

/// A Prometheus label value: `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_each_target_with_escaped_labels() {
        let target = std::sync::Arc::new(TargetStats::new("a\"b", "h:1", "memory"));
        target.record_duration(Duration::from_millis(1500));
        target.record_failure("connect");
        let stats = ScrapeStats {
            targets: vec![target],
        };
        let mut out = String::new();
        render(&mut out, &stats);
        let labels = "job=\"a\\\"b\",instance=\"h:1\",profile=\"memory\"";
        assert!(
            out.contains(&format!("icecore_scrape_up{{{labels}}} 0")),
            "{out}"
        );
        assert!(out.contains(&format!("icecore_scrape_attempts_total{{{labels}}} 1")));
        assert!(out.contains(&format!(
            "icecore_scrape_failures_total{{{labels},reason=\"connect\"}} 1"
        )));
        assert!(out.contains(&format!(
            "icecore_scrape_duration_seconds{{{labels}}} 1.500000"
        )));
    }
}
