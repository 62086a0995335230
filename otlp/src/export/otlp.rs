//! OTLP Profiles gRPC exporter: one `ProfilesService/Export` call per request.
//!
//! This is the single attempt; [`super::OtlpPipeline`] adds the queue and
//! the retries around it.

use std::sync::OnceLock;
use std::time::Duration;

use bytes::{BufMut, Bytes};
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use prost::Message;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::transport::{Channel, Endpoint};

use super::ExportError;
use super::tls::TlsOptions;
use crate::model::ProfileBatch;
use crate::otlp_encode::{ResourceAttributes, encode_request_with};

/// Largest request sent, the usual collector receive limit (32 MiB).
pub const MAX_MESSAGE_BYTES: usize = 32 << 20;

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
        samples: usize,
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
    config: Endpoint,
    metadata: MetadataMap,
    // Created on first export: tonic's channel spawns a task, which needs a runtime.
    channel: OnceLock<Channel>,
}

impl OtlpExporter {
    /// An exporter with the given options; checks the endpoint and headers.
    pub fn new(options: OtlpExporterOptions) -> Result<Self, ExportError> {
        let endpoint = &options.endpoint;
        let scheme = endpoint
            .split_once("://")
            .map(|(scheme, _)| scheme.to_ascii_lowercase());
        let tls = match scheme.as_deref() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(ExportError::UnsupportedScheme {
                    endpoint: endpoint.clone(),
                });
            }
        };
        let mut config = Endpoint::from_shared(endpoint.clone())
            .map_err(|source| ExportError::InvalidEndpoint {
                endpoint: endpoint.clone(),
                source,
            })?
            .timeout(options.timeout)
            .connect_timeout(options.timeout);
        if tls {
            config = super::tls::configure(endpoint, config, &options.tls)?;
        } else if options.tls.is_customised() {
            return Err(ExportError::TlsOptionsWithoutTls {
                endpoint: endpoint.clone(),
            });
        }
        let metadata = metadata(&options.headers)?;
        Ok(Self {
            options,
            config,
            metadata,
            channel: OnceLock::new(),
        })
    }

    /// The endpoint as configured.
    pub fn endpoint(&self) -> &str {
        &self.options.endpoint
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
        if body.len() > MAX_MESSAGE_BYTES {
            return Err(ExportError::MessageTooLarge {
                size: body.len(),
                limit: MAX_MESSAGE_BYTES,
            });
        }
        let channel = self
            .channel
            .get_or_init(|| self.config.connect_lazy())
            .clone();
        let mut grpc =
            tonic::client::Grpc::new(channel).max_encoding_message_size(MAX_MESSAGE_BYTES);
        if self.options.compression == Compression::Gzip {
            grpc = grpc
                .send_compressed(CompressionEncoding::Gzip)
                .accept_compressed(CompressionEncoding::Gzip);
        }
        let rpc_error = |status: tonic::Status| ExportError::Rpc {
            endpoint: self.options.endpoint.clone(),
            status: Box::new(status),
        };
        grpc.ready().await.map_err(|e| {
            // Not ready means not connected: worth retrying, like a refused connection.
            rpc_error(tonic::Status::unavailable(format!(
                "connection not ready: {e}"
            )))
        })?;
        let mut request = tonic::Request::new(body);
        *request.metadata_mut() = self.metadata.clone();
        let response = grpc
            .unary(request, PathAndQuery::from_static(EXPORT_PATH), RawCodec)
            .await
            .map_err(rpc_error)?
            .into_inner();
        let accepted = response
            .partial_success
            .map(|p| Accepted {
                rejected_profiles: p.rejected_profiles,
                message: (!p.error_message.is_empty()).then_some(p.error_message),
            })
            .unwrap_or_default();
        if accepted.rejected_profiles != 0 || accepted.message.is_some() {
            tracing::warn!(
                endpoint = %self.options.endpoint,
                rejected_profiles = accepted.rejected_profiles,
                message = accepted.message.as_deref().unwrap_or(""),
                "OTLP collector rejected part of a profiles export"
            );
        }
        Ok(accepted)
    }
}

/// The headers as gRPC metadata; names are lower-cased, as HTTP/2 requires.
fn metadata(headers: &[(String, String)]) -> Result<MetadataMap, ExportError> {
    let mut map = MetadataMap::new();
    for (name, value) in headers {
        let key: AsciiMetadataKey =
            name.to_ascii_lowercase()
                .parse()
                .map_err(|_| ExportError::InvalidHeader {
                    name: name.clone(),
                    reason: "not a valid gRPC metadata name",
                })?;
        if key.as_str().ends_with("-bin") {
            return Err(ExportError::InvalidHeader {
                name: name.clone(),
                reason: "binary (-bin) metadata is not supported",
            });
        }
        let value: AsciiMetadataValue = value.parse().map_err(|_| ExportError::InvalidHeader {
            name: name.clone(),
            reason: "the value is not printable ASCII",
        })?;
        map.append(key, value);
    }
    Ok(map)
}

/// Sends already-encoded request bytes as they are and decodes the response,
/// so requests wait in the queue as compact bytes, not as message trees.
#[derive(Debug, Clone, Copy)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = ExportProfilesServiceResponse;
    type Encoder = RawEncoder;
    type Decoder = ResponseDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ResponseDecoder
    }
}

#[derive(Debug)]
struct RawEncoder;

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.put_slice(&item);
        Ok(())
    }
}

#[derive(Debug)]
struct ResponseDecoder;

impl Decoder for ResponseDecoder {
    type Item = ExportProfilesServiceResponse;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        ExportProfilesServiceResponse::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(format!("undecodable export response: {e}")))
    }
}
