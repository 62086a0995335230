//! Profile model, OTLP Profiles and pprof encoding, and the exporters (sinks).
//!
//! - [`model`]: what sources hand to sinks ([`model::ProfileBatch`]).
//! - [`otlp_encode`]: OTLP Profiles v1.10 `ExportProfilesServiceRequest`.
//! - [`pprof`]: pprof `perftools.profiles.Profile`, plain or gzipped.
//! - [`history`]: the last minutes of profiles, aggregated, for the flame
//!   graph page.
//! - [`export`]: [`OtlpPipeline`] (queue and retries around [`OtlpExporter`],
//!   gRPC) and [`PprofDirWriter`] (files).
pub mod export;
pub mod history;
pub mod model;
pub mod otlp_encode;
pub mod pprof;
pub mod receive;
pub mod scrape;
#[cfg(test)]
mod test_fixtures;

pub use export::{
    Compression, ExportError, ExportOutcome, ExportPipeline, ExportStats, OtlpExporter,
    OtlpExporterOptions, OtlpPipeline, ParcaExporter, ParcaOptions, PprofDirStats, PprofDirWriter,
    PprofRetention, PyroscopeExporter, PyroscopeOptions, QueueLimits, RetryPolicy, TlsOptions,
};
pub use otlp_encode::{ResourceAttributes, encode_request, encode_request_with};
pub use pprof::{PprofError, encode_gzip, encode_profile};

// Re-exported so users (benchmarks, the binary) encode with the same versions.
pub use opentelemetry_proto;
pub use prost;
