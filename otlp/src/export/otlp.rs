//! OTLP Profiles gRPC exporter (`ProfilesService/Export`, gzip-compressed).

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use prost::Message;
use tonic::codec::CompressionEncoding;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::ExportError;
use crate::model::ProfileBatch;
use crate::otlp_encode::encode_request;

/// Largest request sent, the usual collector receive limit (32 MiB).
pub const MAX_MESSAGE_BYTES: usize = 32 << 20;

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
        samples: usize,
        /// Size of the request before gzip.
        encoded_bytes: usize,
        /// `partial_success.rejected_profiles` from the collector; 0 when all were accepted.
        rejected_profiles: i64,
        /// `partial_success.error_message`, when the collector gave one.
        message: Option<String>,
    },
}

/// Sends batches to an OTLP Profiles gRPC endpoint.
///
/// The connection is made lazily on the first export (and re-made by tonic
/// after failures), so the collector need not be up when this is created.
#[derive(Debug)]
pub struct OtlpExporter {
    endpoint: String,
    config: Endpoint,
    // Created on first export: tonic's channel spawns a task, which needs a runtime.
    channel: OnceLock<Channel>,
    scope_version: String,
}

impl OtlpExporter {
    /// An exporter for `endpoint` (`http://host:4317` for plaintext,
    /// `https://…` for TLS verified against the system's root certificates).
    /// `timeout` bounds both connecting and each export call.
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Self, ExportError> {
        let scheme = endpoint
            .split_once("://")
            .map(|(scheme, _)| scheme.to_ascii_lowercase());
        let tls = match scheme.as_deref() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(ExportError::UnsupportedScheme {
                    endpoint: endpoint.to_owned(),
                });
            }
        };
        let mut config = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|source| ExportError::InvalidEndpoint {
                endpoint: endpoint.to_owned(),
                source,
            })?
            .timeout(timeout)
            .connect_timeout(timeout);
        if tls {
            config = config
                .tls_config(ClientTlsConfig::new().with_native_roots())
                .map_err(|source| ExportError::Tls {
                    endpoint: endpoint.to_owned(),
                    source,
                })?;
        }
        Ok(Self {
            endpoint: endpoint.to_owned(),
            config,
            channel: OnceLock::new(),
            scope_version: env!("CARGO_PKG_VERSION").to_owned(),
        })
    }

    /// Replaces the instrumentation scope version sent (default: this crate's version).
    pub fn with_scope_version(mut self, version: impl Into<String>) -> Self {
        self.scope_version = version.into();
        self
    }

    /// The endpoint as given to [`OtlpExporter::new`].
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Encodes `batch` and sends it in one gzip-compressed `Export` call.
    /// A batch without samples is not sent ([`ExportOutcome::Empty`]).
    /// Must be called within a tokio runtime.
    pub async fn export(&self, batch: &ProfileBatch) -> Result<ExportOutcome, ExportError> {
        let samples = batch.sample_count();
        if samples == 0 {
            return Ok(ExportOutcome::Empty);
        }
        let request = encode_request(batch, &self.scope_version);
        let encoded_bytes = request.encoded_len();
        if encoded_bytes > MAX_MESSAGE_BYTES {
            return Err(ExportError::MessageTooLarge {
                size: encoded_bytes,
                limit: MAX_MESSAGE_BYTES,
            });
        }
        let profiles = request.resource_profiles.len();
        let channel = self
            .channel
            .get_or_init(|| self.config.connect_lazy())
            .clone();
        let mut client = ProfilesServiceClient::new(channel)
            .send_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Gzip)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let response = client
            .export(request)
            .await
            .map_err(|status| ExportError::Rpc {
                endpoint: self.endpoint.clone(),
                status: Box::new(status),
            })?
            .into_inner();
        let (rejected_profiles, message) = response.partial_success.map_or((0, None), |p| {
            let message = (!p.error_message.is_empty()).then_some(p.error_message);
            (p.rejected_profiles, message)
        });
        if rejected_profiles != 0 || message.is_some() {
            tracing::warn!(
                endpoint = %self.endpoint,
                rejected_profiles,
                message = message.as_deref().unwrap_or(""),
                "OTLP collector rejected part of a profiles export"
            );
        }
        Ok(ExportOutcome::Sent {
            profiles,
            samples,
            encoded_bytes,
            rejected_profiles,
            message,
        })
    }
}
