//! `scrape_configs`: one task per (target, profile) pulls the target's
//! pprof endpoint every interval and hands the profile, as a delta where
//! the target's is cumulative, to the sinks. A failed scrape is counted
//! per target and logged when the target's state changes; it never stops
//! the agent or the other targets.

mod metrics;

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use icecore_config::scrape::{PprofEndpoint as ProfileConfig, ScrapeConfig, ScrapeTarget};
use icecore_otlp::scrape::{
    CumulativeDelta, DeltaOutcome, PprofEndpoint, PprofEndpointOptions, ScrapedProfile,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use metrics::TargetStats;
pub use metrics::{ScrapeStats, render};

/// Scraped profiles waiting for the sinks; a scrape waits when it is full.
pub const SCRAPED_QUEUE: usize = 16;

/// The running scrape tasks.
pub struct Scrapers {
    tasks: Vec<JoinHandle<()>>,
    stats: Arc<ScrapeStats>,
}

impl Scrapers {
    /// Checks every endpoint and starts one task per (target, profile),
    /// each sending to `to_sinks`.
    pub fn start(
        jobs: &[ScrapeConfig],
        to_sinks: &mpsc::Sender<ScrapedProfile>,
    ) -> anyhow::Result<Self> {
        let mut tasks = Vec::new();
        let mut all = Vec::new();
        for (job, target, profile) in scrapes(jobs) {
            let scrape = Scrape::new(job, target, profile)?;
            all.push(scrape.stats.clone());
            tasks.push(tokio::spawn(scrape.run(to_sinks.clone())));
        }
        if !tasks.is_empty() {
            info!(
                jobs = jobs.len(),
                scrapes = tasks.len(),
                "scraping applications' pprof endpoints"
            );
        }
        Ok(Self {
            tasks,
            stats: Arc::new(ScrapeStats { targets: all }),
        })
    }

    /// Checks every endpoint, for `--check-config`; one line per job.
    pub fn check(jobs: &[ScrapeConfig]) -> anyhow::Result<Vec<String>> {
        for (job, target, profile) in scrapes(jobs) {
            endpoint(job, target, profile)?;
        }
        Ok(jobs
            .iter()
            .map(|job| {
                let plural =
                    |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
                format!(
                    "scrape job {}: {}, {} every {:?}",
                    job.job_name,
                    plural(job.targets.len(), "target"),
                    plural(job.profiles.len(), "profile"),
                    job.scrape_interval
                )
            })
            .collect())
    }

    /// The per-target counters, live.
    pub fn stats(&self) -> Arc<ScrapeStats> {
        self.stats.clone()
    }

    /// Stops every scrape (one under way is abandoned).
    pub fn stop(self) {
        for task in self.tasks {
            task.abort();
        }
    }
}

fn scrapes(
    jobs: &[ScrapeConfig],
) -> impl Iterator<Item = (&ScrapeConfig, &ScrapeTarget, &ProfileConfig)> {
    jobs.iter().flat_map(|job| {
        job.targets.iter().flat_map(move |target| {
            job.profiles
                .iter()
                .map(move |profile| (job, target, profile))
        })
    })
}

fn endpoint(
    job: &ScrapeConfig,
    target: &ScrapeTarget,
    profile: &ProfileConfig,
) -> anyhow::Result<PprofEndpoint> {
    let path_and_query = match profile.seconds {
        Some(seconds) => format!("{}?seconds={seconds}", profile.path),
        None => profile.path.clone(),
    };
    PprofEndpoint::new(&PprofEndpointOptions {
        base_url: format!("{}://{}", job.scheme.as_str(), target.address),
        path_and_query,
        timeout: job.scrape_timeout,
        ca_file: job.ca_file.clone(),
        insecure_skip_verify: job.insecure_skip_verify,
    })
    .with_context(|| {
        format!(
            "scrape job {}: target {} profile {}",
            job.job_name, target.address, profile.name
        )
    })
}

/// One (target, profile).
struct Scrape {
    endpoint: PprofEndpoint,
    interval: Duration,
    name: String,
    labels: Vec<(String, String)>,
    delta: CumulativeDelta,
    stats: Arc<TargetStats>,
}

impl Scrape {
    fn new(
        job: &ScrapeConfig,
        target: &ScrapeTarget,
        profile: &ProfileConfig,
    ) -> anyhow::Result<Self> {
        let endpoint = endpoint(job, target, profile)?;
        let mut labels = vec![
            ("job".to_owned(), job.job_name.clone()),
            ("instance".to_owned(), target.address.clone()),
        ];
        for (name, value) in &target.labels {
            match labels.iter_mut().find(|(n, _)| n == name) {
                Some(existing) => existing.1.clone_from(value),
                None => labels.push((name.clone(), value.clone())),
            }
        }
        Ok(Self {
            endpoint,
            interval: job.scrape_interval,
            name: profile.name.clone(),
            labels,
            delta: CumulativeDelta::default(),
            stats: Arc::new(TargetStats::new(
                &job.job_name,
                &target.address,
                &profile.name,
            )),
        })
    }

    /// Scrapes every interval until aborted or the sinks are gone. The
    /// first scrape waits a fixed share of the interval derived from the
    /// target and profile, as Prometheus spreads its scrapes, so a job's
    /// targets are not all pulled at the same instant.
    async fn run(mut self, to_sinks: mpsc::Sender<ScrapedProfile>) {
        let url = self.endpoint.url();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        url.hash(&mut hasher);
        let interval_ms = u64::try_from(self.interval.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let offset = Duration::from_millis(hasher.finish() % interval_ms);
        let mut ticks =
            tokio::time::interval_at(tokio::time::Instant::now() + offset, self.interval);
        // A scrape longer than the interval (a CPU profile of `seconds` =
        // interval, plus transfer) delays the next one rather than
        // bunching the missed ones.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut was_up: Option<bool> = None;
        loop {
            ticks.tick().await;
            let started = Instant::now();
            let result = self.endpoint.scrape().await;
            self.stats.record_duration(started.elapsed());
            match result {
                Ok(scraped) => {
                    if was_up != Some(true) {
                        info!(%url, "scrape target up");
                    }
                    was_up = Some(true);
                    self.stats.record_success(scraped.compressed_bytes);
                    let profile = match self.delta.apply(scraped.profile) {
                        DeltaOutcome::Ready(profile) => *profile,
                        DeltaOutcome::Baseline => {
                            debug!(%url, "first cumulative profile kept as the baseline");
                            continue;
                        }
                        DeltaOutcome::Reset => {
                            self.stats.record_reset();
                            info!(%url, "a cumulative count went down (the target restarted?); new baseline");
                            continue;
                        }
                    };
                    self.stats.record_samples(profile.sample.len() as u64);
                    let name = self.name.clone();
                    let labels = self.labels.clone();
                    let ready = tokio::task::spawn_blocking(move || {
                        ScrapedProfile::new(name, labels, profile)
                    })
                    .await;
                    let Ok(ready) = ready else {
                        continue;
                    };
                    if to_sinks.send(ready).await.is_err() {
                        return;
                    }
                }
                Err(failure) => {
                    self.stats.record_failure(failure.reason());
                    if was_up != Some(false) {
                        warn!(%url, reason = failure.reason(), "scrape failed: {failure}");
                    } else {
                        debug!(%url, "scrape failed: {failure}");
                    }
                    was_up = Some(false);
                }
            }
        }
    }
}
