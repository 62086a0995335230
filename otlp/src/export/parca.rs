//! Parca push: gzipped pprof through `ProfileStoreService/WriteRaw`, one
//! series per process, as Parca's own agent sends it.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use prost::Message;

use super::grpc_client::GrpcTarget;
use super::pipeline::RequestSender;
use super::series;
use super::tls::TlsOptions;
use super::{Compression, ExportError};
use crate::model::ProfileBatch;
use crate::scrape::ScrapedProfile;

/// Parca's profile store messages and (for tests and embedders) service,
/// generated from the vendored `proto/parca/profilestore/v1alpha1/profilestore.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/parca.profilestore.v1alpha1.rs"));
}

use proto::{Label, LabelSet, RawProfileSeries, RawSample, WriteRawRequest, WriteRawResponse};

const WRITE_RAW_PATH: &str = "/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw";

/// The `__name__` of icecore's series: Parca's name for on-CPU profiles.
pub const PARCA_PROFILE_NAME: &str = series::PROFILE_NAME;

/// How to reach a Parca server.
#[derive(Debug, Clone)]
pub struct ParcaOptions {
    /// `http://host:7070` or `https://…`.
    pub endpoint: String,
    /// Bounds connecting and each call.
    pub timeout: Duration,
    /// gRPC metadata sent with every request (e.g. `authorization`).
    pub headers: Vec<(String, String)>,
    /// Certificate checks and client certificate for `https://`.
    pub tls: TlsOptions,
    /// File holding a bearer token, sent as `authorization: Bearer …` and
    /// re-read every [`super::TOKEN_REFRESH`] to follow rotation.
    pub bearer_token_file: Option<std::path::PathBuf>,
}

impl ParcaOptions {
    /// Options for `endpoint` with a 10 s timeout.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            timeout: Duration::from_secs(10),
            headers: Vec::new(),
            tls: TlsOptions::default(),
            bearer_token_file: None,
        }
    }
}

/// Sends batches to Parca with `WriteRaw` (`normalized = false`: addresses
/// as the process saw them, mappings with their build IDs, so Parca
/// symbolizes what icecore could not).
#[derive(Debug)]
pub struct ParcaExporter {
    target: GrpcTarget,
}

impl ParcaExporter {
    /// An exporter with the given options; checks the endpoint and headers.
    pub fn new(options: &ParcaOptions) -> Result<Self, ExportError> {
        // The profiles are gzipped already; Parca's gRPC server need not
        // support a second compression.
        let target = GrpcTarget::new(
            &options.endpoint,
            options.timeout,
            &options.headers,
            options.bearer_token_file.as_deref(),
            Compression::None,
            &options.tls,
        )?;
        Ok(Self { target })
    }

    /// The request for `batch`: one series per process with samples.
    pub fn encode(&self, batch: &ProfileBatch) -> WriteRawRequest {
        let series = series::per_process(batch, |process, raw_profile| RawProfileSeries {
            labels: Some(LabelSet {
                labels: series::labels(batch, process)
                    .into_iter()
                    .map(|(name, value)| Label { name, value })
                    .collect(),
            }),
            samples: vec![RawSample {
                raw_profile,
                executable_info: Vec::new(),
            }],
        });
        WriteRawRequest {
            series,
            normalized: false,
            ..WriteRawRequest::default()
        }
    }

    /// The request for a scraped profile: one series named by the
    /// profile, labelled with `job`, `instance` and the target's labels,
    /// as Parca's own scraper stores it.
    pub fn encode_scraped(scraped: &ScrapedProfile) -> WriteRawRequest {
        let labels = series::scraped_labels(scraped)
            .into_iter()
            .map(|(name, value)| Label { name, value })
            .collect();
        WriteRawRequest {
            series: vec![RawProfileSeries {
                labels: Some(LabelSet { labels }),
                samples: vec![RawSample {
                    raw_profile: scraped.gzipped.to_vec(),
                    executable_info: Vec::new(),
                }],
            }],
            normalized: false,
            ..WriteRawRequest::default()
        }
    }
}

impl RequestSender for ParcaExporter {
    fn encode_batch(&self, batch: &ProfileBatch) -> Bytes {
        Bytes::from(self.encode(batch).encode_to_vec())
    }

    fn send_body(
        &self,
        body: Bytes,
    ) -> Pin<Box<dyn Future<Output = Result<u64, ExportError>> + Send + '_>> {
        Box::pin(async move {
            let _: WriteRawResponse = self.target.unary(WRITE_RAW_PATH, body).await?;
            Ok(0)
        })
    }

    fn endpoint(&self) -> &str {
        self.target.url()
    }
}
