//! Pull-based ingestion: fetching applications' pprof profiles over HTTP
//! (Go's `net/http/pprof` and everything that serves its format), decoding
//! them within fixed bounds, and turning cumulative profiles into deltas.
//!
//! The scrape schedule, targets and metrics belong to the binary; this
//! module knows one request and one profile at a time.

mod delta;
#[cfg(test)]
mod tests;

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use flate2::read::GzDecoder;
use prost::Message;

use crate::export::{ExportError, HttpFailure, HttpTarget, TlsOptions};
use crate::pprof::Profile;
pub use delta::{CumulativeDelta, DeltaOutcome, is_cumulative};

/// Largest answer read from a target (compressed, as sent): a Go heap
/// profile of a large service is a few MiB.
pub const MAX_RESPONSE_BYTES: usize = 32 << 20;
/// Largest profile decompressed: bounds the memory of one scrape whatever
/// the target sends (a gzip bomb stops here).
pub const MAX_PROFILE_BYTES: usize = 128 << 20;

/// Why a scrape produced no profile. Each variant is one `reason` of the
/// failure counter.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeFailure {
    /// No TCP or TLS connection to the target.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// No whole answer within the scrape timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The target answered with an error status.
    #[error("HTTP {status}: {body}")]
    HttpStatus {
        /// The status code.
        status: u16,
        /// The start of the answer, for the log.
        body: String,
    },
    /// The answer or the profile in it is over the size limit.
    #[error("the profile is over {0} bytes")]
    TooLarge(usize),
    /// The HTTP exchange broke off.
    #[error("{0}")]
    Transport(String),
    /// The answer is not a pprof profile.
    #[error("not a pprof profile: {0}")]
    NotPprof(String),
}

impl ScrapeFailure {
    /// The failure's `reason` label.
    pub fn reason(&self) -> &'static str {
        match self {
            ScrapeFailure::Connect(_) => "connect",
            ScrapeFailure::Timeout(_) => "timeout",
            ScrapeFailure::HttpStatus { .. } => "http_status",
            ScrapeFailure::TooLarge(_) => "too_large",
            ScrapeFailure::Transport(_) => "transport",
            ScrapeFailure::NotPprof(_) => "not_pprof",
        }
    }

    /// Every reason, for metrics that list each one from the start.
    pub const REASONS: [&'static str; 6] = [
        "connect",
        "timeout",
        "http_status",
        "too_large",
        "transport",
        "not_pprof",
    ];
}

impl From<HttpFailure> for ScrapeFailure {
    fn from(failure: HttpFailure) -> Self {
        match failure {
            HttpFailure::Connect(e) => ScrapeFailure::Connect(e),
            HttpFailure::Timeout(t) => ScrapeFailure::Timeout(t),
            HttpFailure::TooLarge(n) => ScrapeFailure::TooLarge(n),
            HttpFailure::Status(status, body) => ScrapeFailure::HttpStatus {
                status: status.as_u16(),
                body: String::from_utf8_lossy(&body[..body.len().min(200)])
                    .trim()
                    .to_owned(),
            },
            HttpFailure::Exchange(e) => ScrapeFailure::Transport(e),
        }
    }
}

/// How to reach one target's profile.
#[derive(Debug, Clone)]
pub struct PprofEndpointOptions {
    /// `http://host:port` or `https://host:port`.
    pub base_url: String,
    /// The path and query (`/debug/pprof/profile?seconds=10`).
    pub path_and_query: String,
    /// Bounds the whole request, the profile's own duration included.
    pub timeout: Duration,
    /// CA file for `https`, if not the system's roots.
    pub ca_file: Option<PathBuf>,
    /// Whether an `https` target's certificate goes unchecked.
    pub insecure_skip_verify: bool,
}

/// One target's profile endpoint, checked once.
#[derive(Debug)]
pub struct PprofEndpoint {
    target: HttpTarget,
    path_and_query: String,
}

impl PprofEndpoint {
    /// Checks the URL and TLS options.
    pub fn new(options: &PprofEndpointOptions) -> Result<Self, ExportError> {
        let tls = TlsOptions {
            ca_file: options.ca_file.clone(),
            insecure_skip_verify: options.insecure_skip_verify,
            ..TlsOptions::default()
        };
        let target = HttpTarget::new(&options.base_url, options.timeout, &[], None, &tls)?;
        Ok(Self {
            target,
            path_and_query: options.path_and_query.clone(),
        })
    }

    /// The URL scraped.
    pub fn url(&self) -> String {
        format!("{}{}", self.target.url(), self.path_and_query)
    }

    /// Fetches and decodes the profile.
    pub async fn scrape(&self) -> Result<Scraped, ScrapeFailure> {
        let body = self
            .target
            .get(&self.path_and_query, MAX_RESPONSE_BYTES)
            .await?;
        let compressed_bytes = body.len();
        // Decoding a large profile takes milliseconds: off the runtime's threads.
        tokio::task::spawn_blocking(move || decode(&body))
            .await
            .map_err(|e| ScrapeFailure::Transport(format!("decoding task failed: {e}")))?
            .map(|profile| Scraped {
                profile,
                compressed_bytes,
            })
    }
}

/// A decoded profile and the size it came in.
#[derive(Debug)]
pub struct Scraped {
    /// The profile.
    pub profile: Profile,
    /// Bytes on the wire.
    pub compressed_bytes: usize,
}

/// Decodes a pprof profile, gzipped (as Go serves it) or not, within
/// [`MAX_PROFILE_BYTES`], and checks that it is one: every sample has one
/// value per sample type, and every string index is in the table.
pub fn decode(body: &[u8]) -> Result<Profile, ScrapeFailure> {
    if body.is_empty() {
        return Err(ScrapeFailure::NotPprof("the answer is empty".to_owned()));
    }
    let raw: Bytes = if body.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        GzDecoder::new(body)
            .take(MAX_PROFILE_BYTES as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| ScrapeFailure::NotPprof(format!("bad gzip data: {e}")))?;
        if out.len() > MAX_PROFILE_BYTES {
            return Err(ScrapeFailure::TooLarge(MAX_PROFILE_BYTES));
        }
        out.into()
    } else {
        Bytes::copy_from_slice(body)
    };
    let profile =
        Profile::decode(raw).map_err(|e| ScrapeFailure::NotPprof(format!("bad protobuf: {e}")))?;
    check(&profile).map_err(ScrapeFailure::NotPprof)?;
    Ok(profile)
}

/// The structural checks [`decode`] makes.
fn check(profile: &Profile) -> Result<(), String> {
    if profile.sample_type.is_empty() {
        return Err("no sample types".to_owned());
    }
    if profile.string_table.first().is_none_or(|s| !s.is_empty()) {
        return Err("the string table does not start with \"\"".to_owned());
    }
    let strings = profile.string_table.len() as i64;
    let in_table = |i: i64| (0..strings).contains(&i);
    let types = profile.sample_type.len();
    if let Some(bad) = profile.sample.iter().find(|s| s.value.len() != types) {
        return Err(format!(
            "a sample has {} values for {types} sample types",
            bad.value.len()
        ));
    }
    let value_types = profile
        .sample_type
        .iter()
        .chain(profile.period_type.as_ref());
    let function_strings = profile
        .function
        .iter()
        .flat_map(|f| [f.name, f.system_name, f.filename]);
    let mapping_strings = profile
        .mapping
        .iter()
        .flat_map(|m| [m.filename, m.build_id]);
    let label_strings = profile
        .sample
        .iter()
        .flat_map(|s| &s.label)
        .flat_map(|l| [l.key, l.str, l.num_unit]);
    if !value_types
        .flat_map(|t| [t.r#type, t.unit])
        .chain(function_strings)
        .chain(mapping_strings)
        .chain(label_strings)
        .all(in_table)
    {
        return Err("a string index is outside the string table".to_owned());
    }
    Ok(())
}

/// The name of sample type `index` as `type/unit`.
pub fn sample_type_name(profile: &Profile, index: usize) -> (String, String) {
    let string = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| profile.string_table.get(i))
            .cloned()
            .unwrap_or_default()
    };
    profile
        .sample_type
        .get(index)
        .map(|t| (string(t.r#type), string(t.unit)))
        .unwrap_or_default()
}

/// A scraped profile on its way to the sinks.
#[derive(Debug, Clone)]
pub struct ScrapedProfile {
    /// The profile name (`process_cpu`, `memory`...): Parca's and
    /// Pyroscope's `__name__`, OTLP's instrumentation scope.
    pub name: String,
    /// `job`, `instance` and the target's labels (no `__name__`).
    pub labels: Vec<(String, String)>,
    /// The profile, a delta where the target's was cumulative.
    pub profile: Profile,
    /// The same, encoded and gzipped, for the pprof sinks.
    pub gzipped: Bytes,
}

impl ScrapedProfile {
    /// Encodes `profile` for the pprof sinks.
    pub fn new(name: String, labels: Vec<(String, String)>, profile: Profile) -> Self {
        // Into a Vec, gzip cannot fail.
        let gzipped = crate::pprof::gzip_encoded(&profile)
            .unwrap_or_default()
            .into();
        Self {
            name,
            labels,
            profile,
            gzipped,
        }
    }

    /// The profile's samples, for the sinks' counters.
    pub fn sample_count(&self) -> u64 {
        self.profile.sample.len() as u64
    }

    /// The profile's time, in Unix nanoseconds (now if it has none).
    pub fn time_unix_nanos(&self) -> u64 {
        u64::try_from(self.profile.time_nanos)
            .ok()
            .filter(|&t| t > 0)
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64)
            })
    }

    /// The value of label `name`, if set.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Adds `extra` labels the profile lacks.
    pub fn add_missing_labels(&mut self, extra: &[(impl AsRef<str>, impl AsRef<str>)]) {
        for (name, value) in extra {
            if self.label(name.as_ref()).is_none() {
                self.labels
                    .push((name.as_ref().to_owned(), value.as_ref().to_owned()));
            }
        }
    }
}
