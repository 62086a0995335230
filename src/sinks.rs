//! The configured sinks, fed every batch the source produces.

use std::{
    sync::{Arc, atomic::Ordering::Relaxed},
    time::Duration,
};

use anyhow::Context;
use icecore_config::{BearerToken, Config, OtlpCompression};
use icecore_otlp::{
    Compression, ExportPipeline, ExportStats, OtlpExporter, OtlpExporterOptions, OtlpPipeline,
    ParcaExporter, ParcaOptions, PprofDirStats, PprofDirWriter, PprofRetention, PyroscopeExporter,
    PyroscopeOptions, QueueLimits, ResourceAttributes, RetryPolicy, TlsOptions,
    model::ProfileBatch,
    receive::{ReceivedProfiles, Reservation},
    scrape::ScrapedProfile,
};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::flame_page::FlameHistory;
use crate::pull::PullHub;

mod scraped;

/// How long the queued OTLP requests may still be retried at shutdown:
/// inside Kubernetes' default 30 s termination grace period.
const OTLP_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
/// Longest accepted bearer token file.
const MAX_TOKEN_BYTES: u64 = 64 << 10;

/// Every configured sink.
pub struct Sinks {
    otlp: Option<OtlpPipeline>,
    parca: Option<ExportPipeline<ParcaExporter>>,
    pyroscope: Option<ExportPipeline<PyroscopeExporter>>,
    pprof: Option<Arc<PprofDirWriter>>,
    pprof_is_default: bool,
    pull: Arc<PullHub>,
    /// The flame graph page's history (off when its limits are 0).
    flame: Option<Arc<FlameHistory>>,
    /// `--external-label`s, added to every process of every batch.
    external_labels: Vec<(Arc<str>, Arc<str>)>,
    /// The configured resource attributes, for OTLP requests built here.
    otlp_resource: ResourceAttributes,
}

/// What the sinks did over the run.
#[derive(Debug, Default, Clone, Copy)]
pub struct SinkReport {
    /// Deliveries that succeeded (pprof files written, OTLP and Parca
    /// requests accepted).
    pub batches_ok: u64,
    /// Deliveries that failed (pprof files not written, OTLP and Parca
    /// requests dropped).
    pub batches_failed: u64,
    /// Samples the OTLP exporter could not deliver.
    pub otlp_samples_dropped: u64,
    /// Samples the Parca exporter could not deliver.
    pub parca_samples_dropped: u64,
    /// Samples the Pyroscope exporter could not deliver.
    pub pyroscope_samples_dropped: u64,
    /// Whether some push sink delivered nothing at all while dropping
    /// samples: the run's profiles never reached it.
    pub a_sink_got_nothing: bool,
}

impl SinkReport {
    /// Adds a push pipeline's final counts; `dropped` stores its dropped samples.
    fn add_pipeline(&mut self, stats: &ExportStats, dropped: impl Fn(&mut Self, u64)) {
        let sent = stats.sent_requests.load(Relaxed);
        let samples = stats.dropped_samples();
        self.batches_ok += sent;
        self.batches_failed += stats.dropped_requests.load(Relaxed);
        dropped(self, samples);
        if sent == 0 && samples > 0 {
            self.a_sink_got_nothing = true;
        }
    }
}

/// The exporter options the settings describe.
fn otlp_options(config: &Config, url: &str) -> OtlpExporterOptions {
    let mut headers = config.otlp_headers.clone();
    // Config refuses URL credentials together with another authorization.
    if let Some(basic) = config.otlp.as_ref().and_then(|o| o.basic_auth.as_ref()) {
        headers.push(("authorization".to_owned(), basic.expose().to_owned()));
    }
    let mut bearer_token_file = None;
    match &config.otlp_bearer_token {
        // Re-read by the exporter, so a rotated token is followed.
        Some(BearerToken::File(path)) => bearer_token_file = Some(path.clone()),
        Some(BearerToken::Value(secret)) => {
            headers.retain(|(name, _)| !name.eq_ignore_ascii_case("authorization"));
            headers.push((
                "authorization".to_owned(),
                format!("Bearer {}", secret.expose()),
            ));
        }
        None => {}
    }
    OtlpExporterOptions {
        timeout: config.otlp_timeout,
        headers,
        bearer_token_file,
        compression: match config.otlp_compression {
            OtlpCompression::Gzip => Compression::Gzip,
            OtlpCompression::None => Compression::None,
        },
        scope_version: env!("CARGO_PKG_VERSION").to_owned(),
        resource: ResourceAttributes {
            service_name: config.service_name.clone(),
            extra: config.resource_attributes.clone(),
        },
        tls: TlsOptions {
            ca_file: config.otlp_tls.ca_file.clone(),
            // Config checks that both or neither are set.
            client_identity: config
                .otlp_tls
                .client_cert
                .clone()
                .zip(config.otlp_tls.client_key.clone()),
            insecure_skip_verify: config.otlp_tls.insecure_skip_verify,
        },
        ..OtlpExporterOptions::new(url)
    }
}

/// Reads a bearer token file: at most 64 KiB, printable ASCII, trimmed.
pub fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .context("cannot open the token file")?
        .take(MAX_TOKEN_BYTES + 1)
        .read_to_string(&mut text)
        .context("cannot read the token file as UTF-8 text")?;
    if text.len() as u64 > MAX_TOKEN_BYTES {
        anyhow::bail!("the token file is over {MAX_TOKEN_BYTES} bytes");
    }
    let token = text.trim();
    if token.is_empty() {
        anyhow::bail!("the token file is empty");
    }
    if !token.chars().all(|c| c.is_ascii_graphic()) {
        anyhow::bail!("the token holds characters other than printable ASCII");
    }
    Ok(token.to_owned())
}

/// The exporters the settings name, built but not started.
struct Exporters {
    otlp: Option<OtlpExporter>,
    parca: Option<ParcaExporter>,
    pyroscope: Option<PyroscopeExporter>,
}

impl Exporters {
    fn build(config: &Config) -> anyhow::Result<Self> {
        let otlp = match &config.otlp {
            Some(endpoint) => {
                let options = otlp_options(config, &endpoint.url);
                let insecure = options.tls.insecure_skip_verify;
                let exporter = OtlpExporter::new(options)
                    .with_context(|| format!("--otlp-endpoint {}", endpoint.url))?;
                if insecure {
                    warn!(
                        "--otlp-insecure-skip-verify: the OTLP endpoint's certificate is not checked"
                    );
                }
                Some(exporter)
            }
            None => None,
        };
        let parca = match &config.parca {
            Some(endpoint) => {
                let mut headers = Vec::new();
                if let Some(basic) = &endpoint.basic_auth {
                    headers.push(("authorization".to_owned(), basic.expose().to_owned()));
                }
                if let Some(path) = &config.parca_bearer_token_file {
                    let token = read_token(path)
                        .with_context(|| format!("--parca-bearer-token-file {}", path.display()))?;
                    headers.push(("authorization".to_owned(), format!("Bearer {token}")));
                }
                Some(
                    ParcaExporter::new(&ParcaOptions {
                        headers,
                        timeout: config.parca_timeout,
                        ..ParcaOptions::new(endpoint.url.clone())
                    })
                    .with_context(|| format!("--parca-endpoint {}", endpoint.url))?,
                )
            }
            None => None,
        };
        let pyroscope = match &config.pyroscope {
            Some(endpoint) => Some(
                PyroscopeExporter::new(&PyroscopeOptions {
                    basic_auth: endpoint.basic_auth.as_ref().map(|b| b.expose().to_owned()),
                    bearer_token_file: config.pyroscope_bearer_token_file.clone(),
                    tenant_id: config.pyroscope_tenant_id.clone(),
                    timeout: config.pyroscope_timeout,
                    ..PyroscopeOptions::new(endpoint.url.clone())
                })
                .with_context(|| format!("--pyroscope-endpoint {}", endpoint.url))?,
            ),
            None => None,
        };
        Ok(Exporters {
            otlp,
            parca,
            pyroscope,
        })
    }
}

impl Sinks {
    /// Creates the sinks named in the settings.
    pub fn from_config(config: &Config) -> anyhow::Result<Self> {
        let exporters = Exporters::build(config)?;
        // Each sink has a queue of its own: one endpoint down does not take
        // room from the others.
        let limits = QueueLimits {
            max_bytes: usize::try_from(config.export_queue_bytes).unwrap_or(usize::MAX),
            ..QueueLimits::default()
        };
        let otlp = exporters
            .otlp
            .map(|exporter| OtlpPipeline::start(exporter, RetryPolicy::default(), limits));
        let parca = exporters
            .parca
            .map(|exporter| ExportPipeline::start(exporter, RetryPolicy::default(), limits));
        let pyroscope = exporters
            .pyroscope
            .map(|exporter| ExportPipeline::start(exporter, RetryPolicy::default(), limits));
        let pprof = match &config.pprof_dir {
            Some(dir) => Some(Arc::new(
                PprofDirWriter::new(
                    dir.clone(),
                    PprofRetention {
                        max_files: config.pprof_max_files,
                        max_bytes: config.pprof_max_bytes,
                    },
                )
                .with_context(|| format!("--pprof-dir {}", dir.display()))?,
            )),
            None => None,
        };
        Ok(Sinks {
            external_labels: config
                .external_labels
                .iter()
                .map(|(name, value)| (Arc::from(name.as_str()), Arc::from(value.as_str())))
                .collect(),
            otlp,
            parca,
            pyroscope,
            pull: Arc::new(PullHub::new(config.reporter_interval)),
            flame: FlameHistory::new(config.flamegraph_history, config.flamegraph_max_bytes),
            pprof,
            pprof_is_default: config.pprof_dir_is_default,
            otlp_resource: ResourceAttributes {
                service_name: config.service_name.clone(),
                extra: config.resource_attributes.clone(),
            },
        })
    }

    /// What `--check-config` checks of the sinks, without starting them or
    /// touching the disk: the exporters build (URLs, TLS files, tokens),
    /// and the pprof directory is one, or can be made under an existing
    /// one. One line per sink on success.
    pub fn check(config: &Config) -> anyhow::Result<Vec<String>> {
        let exporters = Exporters::build(config)?;
        let mut lines = Vec::new();
        if let Some(otlp) = &config.otlp {
            lines.push(format!("OTLP profiles to {}", otlp.url));
        }
        if let Some(parca) = &config.parca {
            lines.push(format!("pprof to Parca at {}", parca.url));
        }
        if let Some(pyroscope) = &config.pyroscope {
            lines.push(format!("pprof to Pyroscope at {}", pyroscope.url));
        }
        drop(exporters);
        if let Some(dir) = &config.pprof_dir {
            let usable = match std::fs::metadata(dir) {
                Ok(meta) => meta.is_dir(),
                Err(_) => dir
                    .ancestors()
                    .skip(1)
                    .find(|a| !a.as_os_str().is_empty() && a.exists())
                    .is_some_and(|a| a.is_dir()),
            };
            if !usable {
                anyhow::bail!("--pprof-dir {}: not a directory", dir.display());
            }
            lines.push(format!("pprof files in {}", dir.display()));
        }
        Ok(lines)
    }

    /// One log line per sink, saying where profiles go.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(otlp) = &self.otlp {
            lines.push(format!("sending OTLP profiles to {}", otlp.endpoint()));
        }
        if let Some(parca) = &self.parca {
            lines.push(format!("sending pprof to Parca at {}", parca.endpoint()));
        }
        if let Some(pyroscope) = &self.pyroscope {
            lines.push(format!(
                "sending pprof to Pyroscope at {}",
                pyroscope.endpoint()
            ));
        }
        if let Some(pprof) = &self.pprof {
            if self.pprof_is_default {
                lines.push(format!(
                    "no sink configured; writing pprof files to {} (set --otlp-endpoint or --pprof-dir)",
                    pprof.dir().display()
                ));
            } else {
                lines.push(format!("writing pprof files to {}", pprof.dir().display()));
            }
        }
        lines
    }

    /// The OTLP exporter's counters, when there is one.
    pub fn otlp_stats(&self) -> Option<Arc<ExportStats>> {
        self.otlp.as_ref().map(OtlpPipeline::stats)
    }

    /// The flame graph page's history, when it is on.
    pub fn flame_history(&self) -> Option<Arc<FlameHistory>> {
        self.flame.clone()
    }

    /// Where `/debug/pprof/profile` pulls batches from.
    pub fn pull_hub(&self) -> Arc<PullHub> {
        self.pull.clone()
    }

    /// The Parca exporter's counters, when there is one.
    pub fn parca_stats(&self) -> Option<Arc<ExportStats>> {
        self.parca.as_ref().map(ExportPipeline::stats)
    }

    /// The Pyroscope exporter's counters, when there is one.
    pub fn pyroscope_stats(&self) -> Option<Arc<ExportStats>> {
        self.pyroscope.as_ref().map(ExportPipeline::stats)
    }

    /// The pprof directory's retention counters, when there is one.
    pub fn pprof_stats(&self) -> Option<Arc<PprofDirStats>> {
        self.pprof.as_ref().map(|w| w.stats())
    }

    /// Delivers batches until the source closes the channel, then sends
    /// what the OTLP queue still holds.
    ///
    /// Received profiles are forwarded to OTLP as they come; for the
    /// model's sinks (pprof, Parca, pulls) they are merged per sending host
    /// and delivered with each local batch, so a busy relay writes a few
    /// files per interval rather than one per request.
    pub async fn run(
        self,
        mut batches: mpsc::Receiver<ProfileBatch>,
        mut received: Option<mpsc::Receiver<ReceivedProfiles>>,
        mut scraped: mpsc::Receiver<ScrapedProfile>,
    ) -> SinkReport {
        let mut report = SinkReport::default();
        let mut pending = ReceivedBatches::default();
        let merge_received =
            self.pprof.is_some() || self.parca.is_some() || self.pyroscope.is_some();
        loop {
            // Local batches until the source stops; received OTLP meanwhile.
            tokio::select! {
                batch = batches.recv() => match batch {
                    Some(mut batch) => {
                        self.label(&mut batch);
                        // The page shows this host: local batches only.
                        if let Some(flame) = &self.flame {
                            // Up to ~150 ms for 100k new stacks (benches/
                            // flamegraph_history): off the async workers'
                            // duty while it runs.
                            if tokio::runtime::Handle::current().runtime_flavor()
                                == tokio::runtime::RuntimeFlavor::MultiThread
                            {
                                tokio::task::block_in_place(|| flame.ingest(&batch));
                            } else {
                                flame.ingest(&batch);
                            }
                        }
                        if let Some(otlp) = &self.otlp {
                            // Queued; the pipeline sends, retries and counts.
                            otlp.submit(&batch);
                        }
                        self.deliver(batch, &mut report).await;
                        for (batch, _held) in pending.take() {
                            self.deliver(batch, &mut report).await;
                        }
                    }
                    None => break,
                },
                Some(profiles) = async {
                    match received.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if let Some(otlp) = &self.otlp {
                        // Forwarded as received: its resources are the sender's.
                        otlp.submit_encoded(profiles.body.clone(), profiles.samples);
                    }
                    if merge_received {
                        pending.add(profiles);
                    }
                }
                Some(profile) = scraped.recv() => {
                    self.deliver_scraped(profile, &mut report).await;
                }
            }
        }
        // Scrapers are stopped by now; what they handed over still goes out.
        while let Ok(profile) = scraped.try_recv() {
            self.deliver_scraped(profile, &mut report).await;
        }
        for (batch, _held) in pending.take() {
            self.deliver(batch, &mut report).await;
        }
        // The pipelines flush at once, within one grace period.
        let otlp = async {
            match self.otlp {
                Some(p) => Some(p.shutdown(OTLP_SHUTDOWN_GRACE).await),
                None => None,
            }
        };
        let parca = async {
            match self.parca {
                Some(p) => Some(p.shutdown(OTLP_SHUTDOWN_GRACE).await),
                None => None,
            }
        };
        let pyroscope = async {
            match self.pyroscope {
                Some(p) => Some(p.shutdown(OTLP_SHUTDOWN_GRACE).await),
                None => None,
            }
        };
        let (otlp, parca, pyroscope) = tokio::join!(otlp, parca, pyroscope);
        if let Some(stats) = otlp {
            report.add_pipeline(&stats, |r, dropped| r.otlp_samples_dropped = dropped);
        }
        if let Some(stats) = parca {
            report.add_pipeline(&stats, |r, dropped| r.parca_samples_dropped = dropped);
        }
        if let Some(stats) = pyroscope {
            report.add_pipeline(&stats, |r, dropped| {
                r.pyroscope_samples_dropped = dropped;
            });
        }
        report
    }

    /// Hands a batch of the model to Parca, Pyroscope, the pulls and the pprof directory.
    /// Adds the external labels to every process of `batch` that lacks one.
    /// (Received OTLP forwarded to OTLP keeps the sender's resources as sent.)
    fn label(&self, batch: &mut ProfileBatch) {
        if self.external_labels.is_empty() {
            return;
        }
        for process in &mut batch.processes {
            process.process.add_missing_labels(&self.external_labels);
        }
    }

    async fn deliver(&self, mut batch: ProfileBatch, report: &mut SinkReport) {
        self.label(&mut batch);
        if let Some(parca) = &self.parca {
            parca.submit(&batch);
        }
        if let Some(pyroscope) = &self.pyroscope {
            pyroscope.submit(&batch);
        }
        let batch = Arc::new(batch);
        self.pull.publish(batch.clone());
        self.write_pprof(batch, report).await;
    }

    async fn write_pprof(&self, batch: Arc<ProfileBatch>, report: &mut SinkReport) {
        let Some(writer) = self.pprof.clone() else {
            return;
        };
        let samples = batch.sample_count();
        let task = tokio::task::spawn_blocking(move || writer.write(&batch));
        match task.await {
            Ok(Ok(Some(path))) => {
                report.batches_ok += 1;
                debug!(samples, path = %path.display(), "pprof written");
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                report.batches_failed += 1;
                warn!("writing pprof failed: {}", error_chain(&e));
            }
            Err(e) => {
                report.batches_failed += 1;
                warn!("pprof writer task failed: {e}");
            }
        }
    }
}

/// `error: cause: cause…`, so the OS error behind a failure is never lost.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Received profiles waiting for the next local batch, merged per sending
/// host, with the receiver memory they hold.
#[derive(Default)]
struct ReceivedBatches {
    by_host: Vec<(ProfileBatch, Vec<Reservation>)>,
}

impl ReceivedBatches {
    fn add(&mut self, profiles: ReceivedProfiles) {
        let batch = profiles.converted.batch;
        if batch.processes.is_empty() {
            return;
        }
        let reservation = profiles.reservation;
        match self
            .by_host
            .iter_mut()
            .find(|(merged, _)| merged.host_name == batch.host_name)
        {
            Some((merged, held)) => {
                merged.merge(batch);
                held.extend(reservation);
            }
            None => self
                .by_host
                .push((batch, reservation.into_iter().collect())),
        }
    }

    /// The merged batches, each with the receiver memory it holds until
    /// it has been delivered.
    fn take(&mut self) -> Vec<(ProfileBatch, Vec<Reservation>)> {
        std::mem::take(&mut self.by_host)
    }
}
