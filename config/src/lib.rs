//! icecore's settings: the command line, an optional YAML config file, and
//! their validation into one [`Config`].
//!
//! Every setting can come from a flag (`--sampling-frequency 99`), from the
//! file named by `--config` (`sampling_frequency: 99`), for the exporter's
//! settings from the standard `OTEL_EXPORTER_OTLP_*` variables, or from its
//! default; a flag wins over the file, the file over the environment, and
//! the environment over the default. Values are
//! checked wherever they come from, and a bad one gives an error that names
//! the setting and the form it accepts.
//!
//! ```
//! use icecore_config::Config;
//!
//! let config = Config::from_args(["icecore", "--sampling-frequency", "99"]).unwrap();
//! assert_eq!(config.sampling_frequency_hz, 99);
//! // No sink set: pprof files go to the default directory.
//! assert!(config.pprof_dir_is_default);
//! ```
#![deny(missing_docs)]

mod cli;
mod env;
mod export;
mod file;
mod off_cpu;
pub mod relabel;
pub mod scrape;
pub mod targets;
mod validate;

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use cli::ABOUT;
pub use env::BEARER_TOKEN_VAR;
pub use export::{BearerToken, DEFAULT_OTLP_TIMEOUT, OtlpCompression, OtlpTls, Secret};
pub use file::KEYS as CONFIG_FILE_KEYS;
pub use off_cpu::{DEFAULT_OFF_CPU_MIN_DURATION, OffCpuConfig, Probability};
pub use validate::{
    MAX_FLAMEGRAPH_HISTORY, MAX_REPORTER_INTERVAL, MAX_SAMPLING_FREQUENCY_HZ,
    MIN_FLAMEGRAPH_HISTORY, MIN_REPORTER_INTERVAL, MIN_SAMPLING_FREQUENCY_HZ,
};

/// Where pprof files go when neither an OTLP endpoint nor a pprof directory
/// is configured.
pub const DEFAULT_PPROF_DIR: &str = "/var/lib/icecore/pprof";
/// The default sampling frequency, in samples per second on each CPU.
pub const DEFAULT_SAMPLING_FREQUENCY_HZ: u32 = 19;
/// The default period between exports.
pub const DEFAULT_REPORTER_INTERVAL: Duration = Duration::from_secs(10);
/// Default memory for the DWARF of profiled binaries (16 MiB): what keeps
/// the agent within 50 MB; libc's separate DWARF alone takes 38.5 MB parsed.
pub const DEFAULT_DEBUG_INFO_MEMORY: u64 = 16 << 20;
/// Default kernel memory for unwind tables (128 MiB): this host's running
/// programs need 20-30 MiB (the host_tables benchmark), a busy server a few
/// times that.
pub const DEFAULT_UNWIND_TABLE_MEMORY: u64 = 128 << 20;
/// Default memory budget of the OTLP receiver.
pub const DEFAULT_OTLP_LISTEN_MEMORY: u64 = 128 << 20;
/// Default number of pprof files kept in the directory: a day at 10 s.
pub const DEFAULT_PPROF_MAX_FILES: u64 = 8640;
/// Default bytes of pprof files kept in the directory.
pub const DEFAULT_PPROF_MAX_BYTES: u64 = 1 << 30;
/// Default bound of each push sink's export queue, in encoded bytes: ten
/// minutes of a busy host's batches at the default frequency and interval
/// fit. `benches/benches/encode.rs` measures 4.79 MB for the largest
/// request (Pyroscope's) of a batch with more samples than 10 s of a
/// 64-CPU host at 19 Hz; 60 of them are 274 MiB (README, "Outages").
pub const DEFAULT_EXPORT_QUEUE_BYTES: u64 = 320 << 20;
/// The default address of the HTTP server.
pub const DEFAULT_HTTP_ADDRESS: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), 7071);
/// How long the flame graph page's history keeps aggregated profiles by
/// default.
pub const DEFAULT_FLAMEGRAPH_HISTORY: Duration = Duration::from_secs(15 * 60);
/// Default memory cap of the flame graph page's history (64 MiB).
pub const DEFAULT_FLAMEGRAPH_MAX_BYTES: u64 = 64 << 20;
/// The default log level.
pub const DEFAULT_LOG_LEVEL: &str = "info";

/// Every runtime `runtimes` may name (the receiver's registry checks that it
/// has exactly these).
pub const RUNTIME_NAMES: [&str; 7] = [
    "cpython", "cruby", "hotspot", "v8", "php", "perl", "perf-map",
];

/// Where Docker container names are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DockerSocket {
    /// Not at all (`off`).
    Off,
    /// This Unix socket.
    Path(PathBuf),
}

/// Where the node's pods are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubernetesApi {
    /// Not at all (`off`).
    Off,
    /// This API server (`https://HOST:PORT`, or `http://` for a proxy).
    Url(String),
    /// This kubelet's pod list, polled (`http://HOST:10255` for the
    /// read-only port, or `https://HOST:10250` with a token).
    Kubelet(String),
}

/// An OTLP gRPC collector to export profiles to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpEndpoint {
    /// The URL as written, starting with `http://` or `https://`, without
    /// any `user:password@` it was written with.
    pub url: String,
    /// `authorization: Basic …` from the URL's credentials, if it had any.
    pub basic_auth: Option<Secret>,
    /// Whether the URL is `https://`, so the connection uses TLS.
    pub tls: bool,
}

/// icecore's resolved settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The OTLP collector to export to, if any.
    pub otlp: Option<OtlpEndpoint>,
    /// gRPC metadata sent with every OTLP request.
    pub otlp_headers: Vec<(String, String)>,
    /// Timeout of one OTLP export call.
    pub otlp_timeout: Duration,
    /// Compression of OTLP requests.
    pub otlp_compression: OtlpCompression,
    /// Bearer token sent as `authorization: Bearer …`, if any.
    pub otlp_bearer_token: Option<BearerToken>,
    /// TLS settings for an `https://` endpoint.
    pub otlp_tls: OtlpTls,
    /// `service.name` for every exported resource, replacing the
    /// executable name icecore uses by default.
    pub service_name: Option<String>,
    /// Attributes added to every exported resource.
    pub resource_attributes: Vec<(String, String)>,
    /// Labels added to every profile (OTLP resource attributes, Parca and
    /// pprof labels) where it has no label of that name: `--external-label`.
    pub external_labels: Vec<(String, String)>,
    /// Prometheus relabeling of each process's `__meta_*` labels: which
    /// processes are profiled, and their labels.
    pub relabel_configs: relabel::RelabelRules,
    /// The processes to profile; none means every process. Evaluated
    /// before relabeling: a process no target selects is not profiled.
    pub targets: targets::Targets,
    /// Applications' pprof endpoints to scrape (`scrape_configs`, file only).
    pub scrape_configs: Vec<scrape::ScrapeConfig>,
    /// Where to read this node's pods: `None` to find out (the service
    /// account's API server when running in a pod).
    pub kubernetes_api: Option<KubernetesApi>,
    /// The node whose pods are read: `--node-name`, else `NODE_NAME`, else
    /// the host name (resolved by the agent).
    pub node_name: Option<String>,
    /// Bearer token file for the Kubernetes API.
    pub kubernetes_token_file: Option<PathBuf>,
    /// CA file of the Kubernetes API server's certificate.
    pub kubernetes_ca_file: Option<PathBuf>,
    /// Whether OTLP resources carry `process.command_line`.
    pub command_line_attribute: bool,
    /// `--check-config`: check the settings and exit without sampling.
    pub check_only: bool,
    /// The Docker Engine socket to name containers by: `None` for the
    /// default one if it exists.
    pub docker_socket: Option<DockerSocket>,
    /// A Parca server to push pprof to with `WriteRaw`, if any.
    pub parca: Option<OtlpEndpoint>,
    /// Bearer token file for the Parca server, if any.
    pub parca_bearer_token_file: Option<PathBuf>,
    /// Timeout of one call to the Parca server.
    pub parca_timeout: Duration,
    /// A Grafana Pyroscope server to push pprof to, if any.
    pub pyroscope: Option<OtlpEndpoint>,
    /// Bearer token file for the Pyroscope server, if any.
    pub pyroscope_bearer_token_file: Option<PathBuf>,
    /// The tenant sent to Pyroscope as `X-Scope-OrgID`, if any.
    pub pyroscope_tenant_id: Option<String>,
    /// Timeout of one call to the Pyroscope server.
    pub pyroscope_timeout: Duration,
    /// Where to serve the OTLP Profiles receiver (gRPC and HTTP), if at all.
    pub otlp_listen: Option<SocketAddr>,
    /// Token file the receiver's clients must present as `Bearer`, if any.
    pub otlp_listen_bearer_token_file: Option<PathBuf>,
    /// Memory the receiver's requests may hold at once (read, decoded and
    /// waiting for the sinks).
    pub otlp_listen_memory_bytes: u64,
    /// The directory to write pprof files to, if any.
    pub pprof_dir: Option<PathBuf>,
    /// Most pprof files kept in `pprof_dir` (oldest removed first); 0: no limit.
    pub pprof_max_files: u64,
    /// Most bytes of pprof files kept in `pprof_dir`; 0: no limit.
    pub pprof_max_bytes: u64,
    /// Most encoded bytes each push sink (OTLP, Parca, Pyroscope) holds
    /// while its endpoint is down or slow; beyond it the oldest requests
    /// are dropped and counted.
    pub export_queue_bytes: u64,
    /// Whether `pprof_dir` is [`DEFAULT_PPROF_DIR`] because no sink was set.
    pub pprof_dir_is_default: bool,
    /// Samples per second on each CPU, from 1 to 10000.
    pub sampling_frequency_hz: u32,
    /// The period between exports, from 1s to 1h.
    pub reporter_interval: Duration,
    /// Bytes the DWARF of profiled binaries may take in memory, parsed; a
    /// file needing more is symbolized from its symbol tables. 0: no DWARF.
    pub debug_info_memory_bytes: u64,
    /// Bytes of unwind tables BPF holds at most; over it the least recently
    /// sampled files' tables leave, and come back when sampled again.
    pub unwind_table_memory_bytes: u64,
    /// How long to run before flushing and exiting; `None` runs until stopped.
    pub duration: Option<Duration>,
    /// Off-CPU profiling; `None` when off (the default).
    pub off_cpu: Option<OffCpuConfig>,
    /// Whether a wall-clock profile is cut too (needs `off_cpu`).
    pub wall_clock: bool,
    /// The processes to profile; empty profiles every process on the host.
    pub pids: Vec<u32>,
    /// The runtimes whose frames are unwound or named (of
    /// [`RUNTIME_NAMES`]); every one by default.
    pub runtimes: Vec<String>,
    /// The address of the HTTP server.
    pub http_address: SocketAddr,
    /// Token file the HTTP endpoints (but `/healthz` and `/readyz`) require
    /// as `Bearer`, if any.
    pub http_bearer_token_file: Option<PathBuf>,
    /// Certificate and key PEM files the HTTP endpoints serve HTTPS with.
    pub http_tls: Option<HttpTls>,
    /// The user (name or UID) to run as after start-up, if any.
    pub user: Option<String>,
    /// Keep every capability after start-up rather than only those
    /// profiling needs.
    pub keep_capabilities: bool,
    /// How long the aggregated profiles behind the flame graph page (`/` on
    /// `http_address`) are kept in memory, from 1m to 24h; zero turns the
    /// history, and the page's data, off.
    pub flamegraph_history: Duration,
    /// Most bytes of memory the flame graph history may take; over it, the
    /// oldest intervals are dropped first. 0 turns the history off.
    pub flamegraph_max_bytes: u64,
    /// A level or a tracing `EnvFilter` directive string.
    pub log_level: String,
    /// How log lines are written.
    pub log_format: LogFormat,
    /// Whether icecore's own spans go out as OTLP traces.
    pub self_traces: bool,
    /// Where they go when not to the profiles endpoint
    /// (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`).
    pub traces_endpoint: Option<OtlpEndpoint>,
}

/// The certificate and key of the HTTP endpoints' TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpTls {
    /// PEM file of the certificate chain, the server's first.
    pub cert: PathBuf,
    /// PEM file of its private key.
    pub key: PathBuf,
}

/// How log lines are written on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (colours on a terminal).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
    /// `key=value` pairs per line.
    Logfmt,
}

/// Why the settings could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// clap's own error (also --help/--version, which the binary prints and exits with).
    #[error("{0}")]
    Cli(clap::Error),
    /// A command-line flag's value is not in the form the flag accepts.
    #[error("invalid --{flag} {value:?}: {message}")]
    InvalidFlag {
        /// The flag's name without the leading `--`.
        flag: &'static str,
        /// The value as given.
        value: String,
        /// The accepted form and what is wrong, starting with "expected".
        message: String,
    },
    /// The config file could not be read.
    #[error("config file {}: cannot read it: {source}", path.display())]
    FileRead {
        /// The file's path as given.
        path: PathBuf,
        /// The failure to read it.
        source: std::io::Error,
    },
    /// The config file is not YAML, or not a mapping of settings.
    #[error("config file {}: {message}", path.display())]
    FileSyntax {
        /// The file's path as given.
        path: PathBuf,
        /// What is wrong, with the line and column when known.
        message: String,
    },
    /// The config file has a key that is not a setting.
    #[error(
        "config file {}: unknown key {key:?}{}; accepted keys: {}",
        path.display(),
        line.map(|l| format!(" at line {l}")).unwrap_or_default(),
        file::KEYS.join(", ")
    )]
    UnknownKey {
        /// The file's path as given.
        path: PathBuf,
        /// The unknown key.
        key: String,
        /// The 1-based line the key is on, when it could be found.
        line: Option<usize>,
    },
    /// Settings that are each valid contradict each other.
    #[error("conflicting settings: {message}")]
    Conflict {
        /// Which settings and why.
        message: &'static str,
    },
    /// An environment variable's value is not in the form it accepts.
    #[error(
        "invalid environment variable {var}{}: {message}",
        value.as_ref().map(|v| format!("={v:?}")).unwrap_or_default()
    )]
    InvalidEnv {
        /// The variable's name.
        var: String,
        /// The value, unless it may hold a secret.
        value: Option<String>,
        /// The accepted form and what is wrong, starting with "expected".
        message: String,
    },
    /// A config file value is not in the form its setting accepts.
    #[error("config file {}: {key}: {message}", path.display())]
    InvalidFileValue {
        /// The file's path as given.
        path: PathBuf,
        /// The setting's key.
        key: &'static str,
        /// The accepted form, the value found and what is wrong.
        message: String,
    },
}

impl ConfigError {
    /// The exit code for this error: clap's own for [`ConfigError::Cli`]
    /// (0 for --help and --version), 2 for every other.
    pub fn exit_code(&self) -> i32 {
        match self {
            ConfigError::Cli(e) => e.exit_code(),
            _ => 2,
        }
    }
}

/// Settings from one source, each `None` where that source leaves it unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Settings {
    pub otlp: Option<OtlpEndpoint>,
    pub otlp_headers: Option<Vec<(String, String)>>,
    pub otlp_timeout: Option<Duration>,
    pub otlp_compression: Option<OtlpCompression>,
    pub otlp_bearer_token: Option<BearerToken>,
    pub otlp_ca_file: Option<PathBuf>,
    pub otlp_client_cert: Option<PathBuf>,
    pub otlp_client_key: Option<PathBuf>,
    pub otlp_insecure_skip_verify: Option<bool>,
    pub service_name: Option<String>,
    pub resource_attributes: Option<Vec<(String, String)>>,
    pub external_labels: Option<Vec<(String, String)>>,
    pub relabel_configs: Option<relabel::RelabelRules>,
    pub targets: Option<targets::Targets>,
    pub scrape_configs: Option<Vec<scrape::ScrapeConfig>>,
    pub kubernetes_api: Option<KubernetesApi>,
    pub node_name: Option<String>,
    pub kubernetes_token_file: Option<PathBuf>,
    pub kubernetes_ca_file: Option<PathBuf>,
    pub command_line_attribute: Option<bool>,
    pub docker_socket: Option<DockerSocket>,
    pub otlp_listen: Option<SocketAddr>,
    pub otlp_listen_bearer_token_file: Option<PathBuf>,
    pub otlp_listen_memory_bytes: Option<u64>,
    pub parca: Option<OtlpEndpoint>,
    pub parca_bearer_token_file: Option<PathBuf>,
    pub parca_timeout: Option<Duration>,
    pub pyroscope: Option<OtlpEndpoint>,
    pub pyroscope_bearer_token_file: Option<PathBuf>,
    pub pyroscope_tenant_id: Option<String>,
    pub pyroscope_timeout: Option<Duration>,
    pub pprof_dir: Option<PathBuf>,
    pub pprof_max_files: Option<u64>,
    pub pprof_max_bytes: Option<u64>,
    pub export_queue_bytes: Option<u64>,
    pub sampling_frequency_hz: Option<u32>,
    pub reporter_interval: Option<Duration>,
    pub debug_info_memory_bytes: Option<u64>,
    pub unwind_table_memory_bytes: Option<u64>,
    pub duration: Option<Duration>,
    pub off_cpu_threshold: Option<Probability>,
    pub off_cpu_min_duration: Option<Duration>,
    pub wall_clock: Option<bool>,
    pub pids: Option<Vec<u32>>,
    pub runtimes: Option<Vec<String>>,
    pub http_address: Option<SocketAddr>,
    pub http_bearer_token_file: Option<PathBuf>,
    pub http_tls_cert: Option<PathBuf>,
    pub http_tls_key: Option<PathBuf>,
    pub user: Option<String>,
    pub keep_capabilities: Option<bool>,
    pub flamegraph_history: Option<Duration>,
    pub flamegraph_max_bytes: Option<u64>,
    pub log_level: Option<String>,
    pub log_format: Option<LogFormat>,
    pub self_traces: Option<bool>,
    pub traces_endpoint: Option<OtlpEndpoint>,
}

impl Settings {
    /// Each setting from `self` where set, else from `lower`.
    fn over(self, lower: Settings) -> Settings {
        Settings {
            otlp: self.otlp.or(lower.otlp),
            otlp_headers: self.otlp_headers.or(lower.otlp_headers),
            otlp_timeout: self.otlp_timeout.or(lower.otlp_timeout),
            otlp_compression: self.otlp_compression.or(lower.otlp_compression),
            otlp_bearer_token: self.otlp_bearer_token.or(lower.otlp_bearer_token),
            otlp_ca_file: self.otlp_ca_file.or(lower.otlp_ca_file),
            otlp_client_cert: self.otlp_client_cert.or(lower.otlp_client_cert),
            otlp_client_key: self.otlp_client_key.or(lower.otlp_client_key),
            otlp_insecure_skip_verify: self
                .otlp_insecure_skip_verify
                .or(lower.otlp_insecure_skip_verify),
            service_name: self.service_name.or(lower.service_name),
            resource_attributes: self.resource_attributes.or(lower.resource_attributes),
            external_labels: self.external_labels.or(lower.external_labels),
            relabel_configs: self.relabel_configs.or(lower.relabel_configs),
            targets: self.targets.or(lower.targets),
            scrape_configs: self.scrape_configs.or(lower.scrape_configs),
            kubernetes_api: self.kubernetes_api.or(lower.kubernetes_api),
            node_name: self.node_name.or(lower.node_name),
            kubernetes_token_file: self.kubernetes_token_file.or(lower.kubernetes_token_file),
            kubernetes_ca_file: self.kubernetes_ca_file.or(lower.kubernetes_ca_file),
            command_line_attribute: self.command_line_attribute.or(lower.command_line_attribute),
            docker_socket: self.docker_socket.or(lower.docker_socket),
            otlp_listen: self.otlp_listen.or(lower.otlp_listen),
            parca: self.parca.or(lower.parca),
            parca_bearer_token_file: self
                .parca_bearer_token_file
                .or(lower.parca_bearer_token_file),
            pyroscope: self.pyroscope.or(lower.pyroscope),
            pyroscope_bearer_token_file: self
                .pyroscope_bearer_token_file
                .or(lower.pyroscope_bearer_token_file),
            pyroscope_tenant_id: self.pyroscope_tenant_id.or(lower.pyroscope_tenant_id),
            parca_timeout: self.parca_timeout.or(lower.parca_timeout),
            pyroscope_timeout: self.pyroscope_timeout.or(lower.pyroscope_timeout),
            otlp_listen_bearer_token_file: self
                .otlp_listen_bearer_token_file
                .or(lower.otlp_listen_bearer_token_file),
            otlp_listen_memory_bytes: self
                .otlp_listen_memory_bytes
                .or(lower.otlp_listen_memory_bytes),
            pprof_dir: self.pprof_dir.or(lower.pprof_dir),
            pprof_max_files: self.pprof_max_files.or(lower.pprof_max_files),
            pprof_max_bytes: self.pprof_max_bytes.or(lower.pprof_max_bytes),
            export_queue_bytes: self.export_queue_bytes.or(lower.export_queue_bytes),
            sampling_frequency_hz: self.sampling_frequency_hz.or(lower.sampling_frequency_hz),
            reporter_interval: self.reporter_interval.or(lower.reporter_interval),
            debug_info_memory_bytes: self
                .debug_info_memory_bytes
                .or(lower.debug_info_memory_bytes),
            unwind_table_memory_bytes: self
                .unwind_table_memory_bytes
                .or(lower.unwind_table_memory_bytes),
            duration: self.duration.or(lower.duration),
            off_cpu_threshold: self.off_cpu_threshold.or(lower.off_cpu_threshold),
            off_cpu_min_duration: self.off_cpu_min_duration.or(lower.off_cpu_min_duration),
            wall_clock: self.wall_clock.or(lower.wall_clock),
            pids: self.pids.or(lower.pids),
            runtimes: self.runtimes.or(lower.runtimes),
            http_address: self.http_address.or(lower.http_address),
            http_bearer_token_file: self.http_bearer_token_file.or(lower.http_bearer_token_file),
            http_tls_cert: self.http_tls_cert.or(lower.http_tls_cert),
            http_tls_key: self.http_tls_key.or(lower.http_tls_key),
            user: self.user.or(lower.user),
            keep_capabilities: self.keep_capabilities.or(lower.keep_capabilities),
            flamegraph_history: self.flamegraph_history.or(lower.flamegraph_history),
            flamegraph_max_bytes: self.flamegraph_max_bytes.or(lower.flamegraph_max_bytes),
            log_level: self.log_level.or(lower.log_level),
            log_format: self.log_format.or(lower.log_format),
            self_traces: self.self_traces.or(lower.self_traces),
            traces_endpoint: self.traces_endpoint.or(lower.traces_endpoint),
        }
    }

    /// Fills what is unset with the defaults, after the checks only the
    /// unresolved settings allow (a half of a pair is lost by `resolve`).
    fn resolve_checked(self) -> Result<Config, ConfigError> {
        if self.http_tls_cert.is_some() != self.http_tls_key.is_some() {
            return Err(ConfigError::Conflict {
                message: "http_tls_cert and http_tls_key go together: give both or neither",
            });
        }
        self.resolve().checked()
    }

    /// Fills what is unset with the defaults.
    fn resolve(self) -> Config {
        let pprof_dir_is_default = self.otlp.is_none()
            && self.parca.is_none()
            && self.pyroscope.is_none()
            && self.pprof_dir.is_none();
        let pprof_dir = if pprof_dir_is_default {
            Some(PathBuf::from(DEFAULT_PPROF_DIR))
        } else {
            self.pprof_dir
        };
        Config {
            otlp: self.otlp,
            otlp_headers: self.otlp_headers.unwrap_or_default(),
            otlp_timeout: self.otlp_timeout.unwrap_or(DEFAULT_OTLP_TIMEOUT),
            otlp_compression: self.otlp_compression.unwrap_or_default(),
            otlp_bearer_token: self.otlp_bearer_token,
            otlp_tls: OtlpTls {
                ca_file: self.otlp_ca_file,
                client_cert: self.otlp_client_cert,
                client_key: self.otlp_client_key,
                insecure_skip_verify: self.otlp_insecure_skip_verify.unwrap_or(false),
            },
            service_name: self.service_name,
            resource_attributes: self.resource_attributes.unwrap_or_default(),
            external_labels: self.external_labels.unwrap_or_default(),
            relabel_configs: self.relabel_configs.unwrap_or_default(),
            targets: self.targets.unwrap_or_default(),
            scrape_configs: self.scrape_configs.unwrap_or_default(),
            kubernetes_api: self.kubernetes_api,
            node_name: self.node_name,
            kubernetes_token_file: self.kubernetes_token_file,
            kubernetes_ca_file: self.kubernetes_ca_file,
            command_line_attribute: self.command_line_attribute.unwrap_or(false),
            check_only: false,
            docker_socket: self.docker_socket,
            otlp_listen: self.otlp_listen,
            parca: self.parca,
            parca_bearer_token_file: self.parca_bearer_token_file,
            pyroscope: self.pyroscope,
            pyroscope_bearer_token_file: self.pyroscope_bearer_token_file,
            pyroscope_tenant_id: self.pyroscope_tenant_id,
            parca_timeout: self.parca_timeout.unwrap_or(DEFAULT_OTLP_TIMEOUT),
            pyroscope_timeout: self.pyroscope_timeout.unwrap_or(DEFAULT_OTLP_TIMEOUT),
            otlp_listen_bearer_token_file: self.otlp_listen_bearer_token_file,
            otlp_listen_memory_bytes: self
                .otlp_listen_memory_bytes
                .unwrap_or(DEFAULT_OTLP_LISTEN_MEMORY),
            pprof_dir,
            pprof_dir_is_default,
            pprof_max_files: self.pprof_max_files.unwrap_or(DEFAULT_PPROF_MAX_FILES),
            pprof_max_bytes: self.pprof_max_bytes.unwrap_or(DEFAULT_PPROF_MAX_BYTES),
            export_queue_bytes: self
                .export_queue_bytes
                .unwrap_or(DEFAULT_EXPORT_QUEUE_BYTES),
            sampling_frequency_hz: self
                .sampling_frequency_hz
                .unwrap_or(DEFAULT_SAMPLING_FREQUENCY_HZ),
            reporter_interval: self.reporter_interval.unwrap_or(DEFAULT_REPORTER_INTERVAL),
            debug_info_memory_bytes: self
                .debug_info_memory_bytes
                .unwrap_or(DEFAULT_DEBUG_INFO_MEMORY),
            unwind_table_memory_bytes: self
                .unwind_table_memory_bytes
                .unwrap_or(DEFAULT_UNWIND_TABLE_MEMORY),
            duration: self.duration,
            off_cpu: off_cpu::resolve(self.off_cpu_threshold, self.off_cpu_min_duration),
            wall_clock: self.wall_clock.unwrap_or(false),
            pids: self.pids.unwrap_or_default(),
            runtimes: self
                .runtimes
                .unwrap_or_else(|| RUNTIME_NAMES.iter().map(|&name| name.to_owned()).collect()),
            http_address: self.http_address.unwrap_or(DEFAULT_HTTP_ADDRESS),
            http_bearer_token_file: self.http_bearer_token_file,
            http_tls: self
                .http_tls_cert
                .zip(self.http_tls_key)
                .map(|(cert, key)| HttpTls { cert, key }),
            user: self.user,
            keep_capabilities: self.keep_capabilities.unwrap_or(false),
            flamegraph_history: self
                .flamegraph_history
                .unwrap_or(DEFAULT_FLAMEGRAPH_HISTORY),
            flamegraph_max_bytes: self
                .flamegraph_max_bytes
                .unwrap_or(DEFAULT_FLAMEGRAPH_MAX_BYTES),
            log_level: self
                .log_level
                .unwrap_or_else(|| DEFAULT_LOG_LEVEL.to_owned()),
            log_format: self.log_format.unwrap_or_default(),
            self_traces: self.self_traces.unwrap_or(false),
            traces_endpoint: self.traces_endpoint,
        }
    }
}

impl Default for Config {
    /// Every default: no OTLP endpoint, pprof files in [`DEFAULT_PPROF_DIR`].
    fn default() -> Self {
        Settings::default().resolve()
    }
}

impl Config {
    /// Parses the command line (args include `argv[0]`), the optional
    /// config file and the process's `OTEL_*` variables, then validates.
    ///
    /// A flag overrides the config file's value for the same setting, and
    /// the file the environment's; a list (`--pid`, `--otlp-header`)
    /// replaces a lower source's list rather than adding to it.
    pub fn from_args<I, T>(args: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        Self::from_args_and_env(args, &|name| std::env::var(name).ok())
    }

    /// [`Config::from_args`] with the environment read through `env`
    /// (a variable's value, `None` when unset).
    pub fn from_args_and_env<I, T>(
        args: I,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let cli = cli::parse(args)?;
        let flags = cli.settings()?;
        let file = match cli.config_path() {
            Some(path) => file::load(path)?,
            None => Settings::default(),
        };
        let env = env::settings(env)?;
        let config = flags.over(file).over(env).resolve_checked()?;
        Ok(Config {
            check_only: cli.check_only(),
            ..config
        })
    }

    /// Checks settings that must agree with each other.
    fn checked(self) -> Result<Config, ConfigError> {
        let tls = &self.otlp_tls;
        let problem = if tls.client_cert.is_some() != tls.client_key.is_some() {
            Some(
                "a client certificate needs its key and a key its certificate (otlp_client_cert, otlp_client_key)",
            )
        } else if tls.ca_file.is_some() && tls.insecure_skip_verify {
            Some("otlp_ca_file and otlp_insecure_skip_verify contradict each other")
        } else if self.otlp_listen_bearer_token_file.is_some() && self.otlp_listen.is_none() {
            Some("otlp_listen_bearer_token_file is set but otlp_listen is not")
        } else if self.parca_bearer_token_file.is_some() && self.parca.is_none() {
            Some("parca_bearer_token_file is set but parca_endpoint is not")
        } else if self.otlp.as_ref().is_some_and(|o| o.basic_auth.is_some())
            && (self.otlp_bearer_token.is_some()
                || self
                    .otlp_headers
                    .iter()
                    .any(|(k, _)| k.eq_ignore_ascii_case("authorization")))
        {
            Some(
                "the OTLP endpoint URL has credentials and an authorization header or bearer token is set too; use one",
            )
        } else if self.parca.as_ref().is_some_and(|p| p.basic_auth.is_some())
            && self.parca_bearer_token_file.is_some()
        {
            Some(
                "the Parca endpoint URL has credentials and parca_bearer_token_file is set too; use one",
            )
        } else if self.pyroscope.is_none()
            && (self.pyroscope_bearer_token_file.is_some() || self.pyroscope_tenant_id.is_some())
        {
            Some(
                "pyroscope_bearer_token_file or pyroscope_tenant_id is set but pyroscope_endpoint is not",
            )
        } else if self
            .pyroscope
            .as_ref()
            .is_some_and(|p| p.basic_auth.is_some())
            && self.pyroscope_bearer_token_file.is_some()
        {
            Some(
                "the Pyroscope endpoint URL has credentials and pyroscope_bearer_token_file is set too; use one",
            )
        } else if self.otlp_listen.is_some() && self.otlp_listen == Some(self.http_address) {
            Some("otlp_listen and http_address are the same address")
        } else if (tls.ca_file.is_some() || tls.client_cert.is_some() || tls.insecure_skip_verify)
            && self.otlp.as_ref().is_some_and(|o| !o.tls)
        {
            Some("TLS settings are given but the OTLP endpoint is http://; use https://")
        } else if self.wall_clock && self.off_cpu.is_none() {
            Some("wall_clock needs off-CPU sampling: set off_cpu_threshold above 0")
        } else {
            None
        };
        match problem {
            Some(message) => Err(ConfigError::Conflict { message }),
            None => Ok(self),
        }
    }

    /// Reads and validates a config file alone, with defaults for what it
    /// leaves out, as if it were given by `--config` with no other flags.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        file::load(path)?.resolve_checked()
    }

    /// The clap command behind [`Config::from_args`], e.g. to render help.
    pub fn command() -> clap::Command {
        cli::command()
    }

    /// The period between samples in nanoseconds (1e9 / frequency).
    ///
    /// A frequency of 0, which validation never yields, is taken as 1 Hz.
    pub fn period_nanos(&self) -> i64 {
        1_000_000_000 / i64::from(self.sampling_frequency_hz.max(1))
    }
}
