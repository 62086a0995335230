//! The configured sinks, fed every batch the source produces.

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use icecore_config::Config;
use icecore_otlp::{ExportOutcome, OtlpExporter, PprofDirWriter, model::ProfileBatch};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// How long one OTLP export may take.
const OTLP_TIMEOUT: Duration = Duration::from_secs(10);

/// Every configured sink.
pub struct Sinks {
    otlp: Option<OtlpExporter>,
    pprof: Option<Arc<PprofDirWriter>>,
    pprof_is_default: bool,
}

/// What the sinks did over the run.
#[derive(Debug, Default, Clone, Copy)]
pub struct SinkReport {
    /// Batch deliveries that succeeded (one per sink per batch).
    pub batches_ok: u64,
    /// Batch deliveries that failed.
    pub batches_failed: u64,
}

impl Sinks {
    /// Creates the sinks named in the settings.
    pub fn from_config(config: &Config) -> anyhow::Result<Self> {
        let otlp = match &config.otlp {
            Some(endpoint) => Some(
                OtlpExporter::new(&endpoint.url, OTLP_TIMEOUT)
                    .with_context(|| format!("--otlp-endpoint {}", endpoint.url))?
                    .with_scope_version(env!("CARGO_PKG_VERSION")),
            ),
            None => None,
        };
        let pprof = match &config.pprof_dir {
            Some(dir) => Some(Arc::new(
                PprofDirWriter::new(dir.clone())
                    .with_context(|| format!("--pprof-dir {}", dir.display()))?,
            )),
            None => None,
        };
        Ok(Sinks {
            otlp,
            pprof,
            pprof_is_default: config.pprof_dir_is_default,
        })
    }

    /// One log line per sink, saying where profiles go.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(otlp) = &self.otlp {
            lines.push(format!("sending OTLP profiles to {}", otlp.endpoint()));
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

    /// Delivers batches until the source closes the channel.
    pub async fn run(self, mut batches: mpsc::Receiver<ProfileBatch>) -> SinkReport {
        let mut report = SinkReport::default();
        while let Some(batch) = batches.recv().await {
            let batch = Arc::new(batch);
            let samples = batch.sample_count();
            let pprof = self.pprof.clone().map(|writer| {
                let batch = batch.clone();
                tokio::task::spawn_blocking(move || writer.write(&batch))
            });
            if let Some(otlp) = &self.otlp {
                match otlp.export(&batch).await {
                    Ok(ExportOutcome::Empty) => {}
                    Ok(ExportOutcome::Sent {
                        rejected_profiles,
                        message,
                        encoded_bytes,
                        ..
                    }) => {
                        report.batches_ok += 1;
                        if rejected_profiles > 0 {
                            warn!(
                                rejected_profiles,
                                message = message.unwrap_or_default(),
                                "OTLP endpoint rejected profiles"
                            );
                        }
                        debug!(samples, encoded_bytes, "OTLP batch sent");
                    }
                    Err(e) => {
                        report.batches_failed += 1;
                        warn!(samples, "OTLP export failed: {e}");
                    }
                }
            }
            if let Some(task) = pprof {
                match task.await {
                    Ok(Ok(Some(path))) => {
                        report.batches_ok += 1;
                        debug!(samples, path = %path.display(), "pprof written");
                    }
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => {
                        report.batches_failed += 1;
                        warn!("writing pprof failed: {e}");
                    }
                    Err(e) => {
                        report.batches_failed += 1;
                        warn!("pprof writer task failed: {e}");
                    }
                }
            }
            if samples > 0 {
                debug!(
                    samples,
                    processes = batch.processes.len(),
                    "batch delivered"
                );
            }
        }
        report
    }
}
