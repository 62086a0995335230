//! Scraped applications' profiles to every sink: OTLP as one profile per
//! sample type, Parca and Pyroscope as the pprof it is, the pprof directory
//! as a file of its own. (The pull endpoint serves icecore's own samples only.)

use std::sync::Arc;

use bytes::Bytes;
use icecore_otlp::otlp_encode::encode_pprof_request;
use icecore_otlp::prost::Message;
use icecore_otlp::scrape::ScrapedProfile;
use icecore_otlp::{ParcaExporter, PyroscopeExporter};
use tracing::{debug, warn};

use super::{SinkReport, Sinks, error_chain};

impl Sinks {
    pub(super) async fn deliver_scraped(
        &self,
        mut scraped: ScrapedProfile,
        report: &mut SinkReport,
    ) {
        scraped.add_missing_labels(&self.external_labels);
        let samples = scraped.sample_count();
        if samples == 0 {
            return;
        }
        if let Some(otlp) = &self.otlp {
            let request = encode_pprof_request(
                &scraped.profile,
                &scraped.name,
                &scraped.labels,
                env!("CARGO_PKG_VERSION"),
                &self.otlp_resource,
            );
            if !request.resource_profiles.is_empty() {
                otlp.submit_encoded(Bytes::from(request.encode_to_vec()), samples);
            }
        }
        if let Some(parca) = &self.parca {
            let request = ParcaExporter::encode_scraped(&scraped);
            parca.submit_encoded(Bytes::from(request.encode_to_vec()), samples);
        }
        if let Some(pyroscope) = &self.pyroscope {
            let request = PyroscopeExporter::encode_scraped(&scraped);
            pyroscope.submit_encoded(Bytes::from(request.encode_to_vec()), samples);
        }
        let Some(writer) = self.pprof.clone() else {
            return;
        };
        let scraped = Arc::new(scraped);
        let source = format!(
            "{}-{}",
            scraped.label("job").unwrap_or("scrape"),
            scraped.name
        );
        let task = tokio::task::spawn_blocking(move || {
            writer.write_gzipped(scraped.time_unix_nanos(), &source, &scraped.gzipped)
        });
        match task.await {
            Ok(Ok(path)) => {
                report.batches_ok += 1;
                debug!(samples, path = %path.display(), "scraped pprof written");
            }
            Ok(Err(e)) => {
                report.batches_failed += 1;
                warn!("writing a scraped pprof failed: {}", error_chain(&e));
            }
            Err(e) => {
                report.batches_failed += 1;
                warn!("pprof writer task failed: {e}");
            }
        }
    }
}
