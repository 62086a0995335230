//! OTLP Profiles gRPC exporter: one `ProfilesService/Export` call per request.
//!
//! This is the single attempt; [`super::OtlpPipeline`] adds the queue and
//! the retries around it.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use prost::Message;

use super::ExportError;
use super::grpc_client::GrpcTarget;
use super::pipeline::RequestSender;
use super::tls::TlsOptions;
use crate::model::ProfileBatch;
use crate::otlp_encode::{ResourceAttributes, encode_request_with};

const EXPORT_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// How request bodies are compressed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// gzip (`grpc-encoding: gzip`), which every collector accepts.
    #[default]
    Gzip,
    /// No compression.
    None,
}

/// How to reach an OTLP endpoint and what to send with every request.
#[derive(Debug, Clone)]
pub struct OtlpExporterOptions {
    /// `http://host:port` for plaintext, `https://…` for TLS verified against
    /// the system's root certificates.
    pub endpoint: String,
    /// Bounds connecting and each export call.
    pub timeout: Duration,
    /// gRPC metadata sent with every request (`authorization`, tenant IDs…).
    pub headers: Vec<(String, String)>,
    /// Wire compression.
    pub compression: Compression,
    /// Instrumentation scope version sent (default: this crate's version).
    pub scope_version: String,
    /// Resource attributes added to every profile's resource.
    pub resource: ResourceAttributes,
    /// Certificate checks and client certificate for `https://` endpoints.
    pub tls: TlsOptions,
    /// File holding a bearer token, sent as `authorization: Bearer …` and
    /// re-read every [`super::TOKEN_REFRESH`] to follow rotation.
    pub bearer_token_file: Option<std::path::PathBuf>,
}

impl OtlpExporterOptions {
    /// Options for `endpoint` with the defaults: 10 s timeout, gzip, no
    /// headers.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            timeout: Duration::from_secs(10),
            headers: Vec::new(),
            compression: Compression::Gzip,
            scope_version: env!("CARGO_PKG_VERSION").to_owned(),
            resource: ResourceAttributes::default(),
            tls: TlsOptions::default(),
            bearer_token_file: None,
        }
    }
}

/// What became of one batch handed to [`OtlpExporter::export`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportOutcome {
    /// The batch had no samples, so nothing was sent.
    Empty,
    /// The collector answered OK; it may still have rejected part of the request.
    Sent {
        /// Profiles (one per process) in the request.
        profiles: usize,
        /// Samples in the request.
        samples: u64,
        /// Size of the request before compression.
        encoded_bytes: usize,
        /// `partial_success.rejected_profiles` from the collector; 0 when all were accepted.
        rejected_profiles: i64,
        /// `partial_success.error_message`, when the collector gave one.
        message: Option<String>,
    },
}

/// The collector's answer to one accepted request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Accepted {
    /// `partial_success.rejected_profiles`; 0 when all were accepted.
    pub rejected_profiles: i64,
    /// `partial_success.error_message`, when the collector gave one.
    pub message: Option<String>,
}

/// Sends requests to an OTLP Profiles gRPC endpoint.
///
/// The connection is made lazily on the first export (and re-made by tonic
/// after failures), so the collector need not be up when this is created.
#[derive(Debug)]
pub struct OtlpExporter {
    options: OtlpExporterOptions,
    target: GrpcTarget,
}

impl OtlpExporter {
    /// An exporter with the given options; checks the endpoint and headers.
    pub fn new(options: OtlpExporterOptions) -> Result<Self, ExportError> {
        let target = GrpcTarget::new(
            &options.endpoint,
            options.timeout,
            &options.headers,
            options.bearer_token_file.as_deref(),
            options.compression,
            &options.tls,
        )?;
        Ok(Self { options, target })
    }

    /// The endpoint as configured.
    pub fn endpoint(&self) -> &str {
        self.target.url()
    }

    /// The options this exporter was made with.
    pub fn options(&self) -> &OtlpExporterOptions {
        &self.options
    }

    /// Encodes `batch` as an `ExportProfilesServiceRequest` with this
    /// exporter's scope version and resource attributes.
    pub fn encode(&self, batch: &ProfileBatch) -> ExportProfilesServiceRequest {
        encode_request_with(batch, &self.options.scope_version, &self.options.resource)
    }

    /// Encodes `batch` and sends it in one `Export` call, without retrying.
    /// A batch without samples is not sent ([`ExportOutcome::Empty`]).
    /// Must be called within a tokio runtime.
    pub async fn export(&self, batch: &ProfileBatch) -> Result<ExportOutcome, ExportError> {
        let samples = batch.sample_count();
        if samples == 0 {
            return Ok(ExportOutcome::Empty);
        }
        let request = self.encode(batch);
        let profiles = request.resource_profiles.len();
        let body = Bytes::from(request.encode_to_vec());
        let encoded_bytes = body.len();
        let accepted = self.send(body).await?;
        Ok(ExportOutcome::Sent {
            profiles,
            samples,
            encoded_bytes,
            rejected_profiles: accepted.rejected_profiles,
            message: accepted.message,
        })
    }

    /// Sends one encoded `ExportProfilesServiceRequest`. Must be called
    /// within a tokio runtime.
    pub async fn send(&self, body: Bytes) -> Result<Accepted, ExportError> {
        let response: ExportProfilesServiceResponse = self.target.unary(EXPORT_PATH, body).await?;
        let accepted = response
            .partial_success
            .map(|p| Accepted {
                rejected_profiles: p.rejected_profiles,
                message: (!p.error_message.is_empty()).then_some(p.error_message),
            })
            .unwrap_or_default();
        if accepted.rejected_profiles != 0 || accepted.message.is_some() {
            tracing::warn!(
                endpoint = %self.endpoint(),
                rejected_profiles = accepted.rejected_profiles,
                message = accepted.message.as_deref().unwrap_or(""),
                "OTLP collector rejected part of a profiles export"
            );
        }
        Ok(accepted)
    }
}

impl RequestSender for OtlpExporter {
    fn encode_batch(&self, batch: &ProfileBatch) -> Bytes {
        Bytes::from(self.encode(batch).encode_to_vec())
    }

    fn send_body(
        &self,
        body: Bytes,
    ) -> Pin<Box<dyn Future<Output = Result<u64, ExportError>> + Send + '_>> {
        Box::pin(async move {
            let accepted = self.send(body).await?;
            Ok(u64::try_from(accepted.rejected_profiles).unwrap_or(0))
        })
    }

    fn endpoint(&self) -> &str {
        self.target.url()
    }
}
