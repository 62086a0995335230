//! Sinks that ship a [`crate::model::ProfileBatch`] somewhere: an OTLP
//! Profiles gRPC endpoint, or a directory of gzipped pprof files.

mod grpc_client;
mod http_client;
mod otlp;
pub mod parca;
mod pipeline;
mod pprof_dir;
pub mod pyroscope;
mod queue;
mod retry;
mod series;
mod tls;
mod token_file;

use std::path::PathBuf;

pub use grpc_client::MAX_MESSAGE_BYTES;
pub(crate) use http_client::{HttpFailure, HttpTarget};
pub use otlp::{Accepted, Compression, ExportOutcome, OtlpExporter, OtlpExporterOptions};
pub use parca::{PARCA_PROFILE_NAME, ParcaExporter, ParcaOptions};
pub use pipeline::{ExportPipeline, ExportStats, OtlpPipeline, RequestSender};
pub use pprof_dir::{PprofDirStats, PprofDirWriter, PprofRetention};
pub use pyroscope::{PyroscopeExporter, PyroscopeOptions};
pub use queue::{Dropped, ExportQueue, QueueLimits, QueuedRequest};
pub use retry::{RetryPolicy, is_retryable};
pub use tls::TlsOptions;
pub use token_file::TOKEN_REFRESH;

use crate::pprof::PprofError;

/// Why a sink could not be set up or could not ship a batch.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The OTLP endpoint's scheme is neither `http://` nor `https://`.
    #[error("unsupported OTLP endpoint {endpoint:?}: the scheme must be http:// or https://")]
    UnsupportedScheme {
        /// The endpoint as given.
        endpoint: String,
    },
    /// The OTLP endpoint is not a valid URI.
    #[error("invalid OTLP endpoint {endpoint:?}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What tonic reported.
        #[source]
        source: tonic::transport::Error,
    },
    /// TLS could not be set up for an `https://` endpoint (e.g. no native root certificates).
    #[error("cannot set up TLS for OTLP endpoint {endpoint:?}")]
    Tls {
        /// The endpoint as given.
        endpoint: String,
        /// What tonic reported.
        #[source]
        source: tonic::transport::Error,
    },
    /// TLS could not be set up for an `https://` endpoint of an HTTP exporter.
    #[error("cannot set up TLS for endpoint {endpoint:?}: {reason}")]
    TlsSetup {
        /// The endpoint as given.
        endpoint: String,
        /// What rustls reported, or which file was wrong.
        reason: String,
    },
    /// An HTTP exporter's endpoint is not a URL it can use.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidUrl {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configured header cannot be sent as gRPC metadata.
    #[error("invalid OTLP header {name:?}: {reason}")]
    InvalidHeader {
        /// The header's name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A bearer token file cannot be used.
    #[error("bearer token file {}: {reason}", path.display())]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A CA, certificate or key file for TLS cannot be read.
    #[error("cannot read TLS file {}", path.display())]
    TlsFile {
        /// The file.
        path: PathBuf,
        /// The OS error, or why the content is not PEM.
        #[source]
        source: std::io::Error,
    },
    /// A CA file was given together with skipping server verification.
    #[error(
        "OTLP endpoint {endpoint:?}: a CA file and skipping certificate verification contradict each other"
    )]
    TlsConflict {
        /// The endpoint as given.
        endpoint: String,
    },
    /// TLS options were given for an `http://` (plaintext) endpoint.
    #[error("TLS options are set but OTLP endpoint {endpoint:?} is plaintext; use https://")]
    TlsOptionsWithoutTls {
        /// The endpoint as given.
        endpoint: String,
    },
    /// The encoded request exceeds the gRPC message size limit.
    #[error("OTLP request is {size} bytes, over the {limit}-byte message limit")]
    MessageTooLarge {
        /// Encoded size of the request.
        size: usize,
        /// The limit it exceeds.
        limit: usize,
    },
    /// The export call failed: connection error, timeout or an error status from the collector.
    #[error("OTLP export to {endpoint} failed: {status}")]
    Rpc {
        /// The endpoint called.
        endpoint: String,
        /// The gRPC status (boxed: `Status` is large).
        status: Box<tonic::Status>,
    },
    /// The pprof output directory could not be created.
    #[error("cannot create pprof output directory {}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The pprof output directory exists but a file cannot be written in it.
    #[error("pprof output directory {} is not writable", path.display())]
    DirNotWritable {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Writing or renaming a pprof file failed.
    #[error("cannot write pprof file {}", path.display())]
    WriteFile {
        /// The file being written.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The batch could not be encoded as pprof.
    #[error(transparent)]
    Pprof(#[from] PprofError),
}

#[cfg(test)]
mod parca_tests;
#[cfg(test)]
mod pipeline_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;
