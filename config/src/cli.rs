//! The command line: clap definitions and their check into [`Settings`].

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{CommandFactory, Parser};

use crate::export::{self, BearerToken};
use crate::targets::{EXPECTED_TARGET, Target, TargetError, Targets};
use crate::validate::{self, Invalid};
use crate::{ConfigError, Settings};

/// The one-line description `icecore --help` starts with.
pub const ABOUT: &str =
    "Continuous eBPF CPU profiler exporting OpenTelemetry OTLP Profiles and pprof";

/// icecore's flags, every one optional so that the config file and the
/// defaults can fill in what the command line leaves out.
#[derive(Debug, Parser)]
#[command(name = "icecore", bin_name = "icecore", version, about = ABOUT)]
pub(crate) struct Cli {
    /// OTLP gRPC collector to send profiles to: http://HOST:PORT (plaintext) or https://HOST:PORT (TLS) [default: OTEL_EXPORTER_OTLP_ENDPOINT, else none]
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,

    /// gRPC header sent with every OTLP request, KEY=VALUE; repeat for more [default: OTEL_EXPORTER_OTLP_HEADERS]
    #[arg(long = "otlp-header", value_name = "KEY=VALUE")]
    otlp_headers: Vec<String>,

    /// Kubernetes API server to read this node's pods from (their names and labels), or `off` [default: in a pod, the service account's API server]
    #[arg(long, value_name = "URL")]
    kubernetes_api: Option<String>,

    /// Read this node's pods from its kubelet instead of the API server, polled every 10 s (`http://HOST:10255` for the read-only port) [default: the API server]
    #[arg(long, value_name = "URL", conflicts_with = "kubernetes_api")]
    kubelet_url: Option<String>,

    /// This node's name, whose pods are read [default: NODE_NAME, else the host name]
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,

    /// File holding the bearer token for the Kubernetes API [default: the service account's]
    #[arg(long, value_name = "FILE")]
    kubernetes_token_file: Option<String>,

    /// PEM file of the CA that signs the Kubernetes API server's certificate [default: the service account's]
    #[arg(long, value_name = "FILE")]
    kubernetes_ca_file: Option<String>,

    /// The Docker Engine's Unix socket, to name Docker containers, or `off` [default: /var/run/docker.sock if it exists]
    #[arg(long, value_name = "PATH")]
    docker_socket: Option<String>,

    /// Send each process's arguments as `process.command_line` on OTLP (off by default: arguments may hold secrets)
    #[arg(long)]
    command_line_attribute: bool,

    /// Label added to every profile (OTLP resource attribute, Parca and pprof label), NAME=VALUE; repeat for more [default: none]
    #[arg(long = "external-label", value_name = "NAME=VALUE")]
    external_labels: Vec<String>,

    /// Profile only processes matching a target, KEY=VALUE with KEY one of pid, executable (glob; with a `/` over the path), cgroup (glob), container_id, kubernetes_namespace (glob), kubernetes_pod_label (NAME=GLOB); repeat for more, any matching [default: every process]
    #[arg(long = "target", value_name = "KEY=VALUE")]
    targets: Vec<String>,

    /// File holding a bearer token sent as `authorization: Bearer TOKEN` [default: ICECORE_OTLP_BEARER_TOKEN, else none]
    #[arg(long, value_name = "FILE")]
    otlp_bearer_token_file: Option<String>,

    /// PEM file of the CA certificates that sign the endpoint's certificate, instead of the system's [default: OTEL_EXPORTER_OTLP_CERTIFICATE, else none]
    #[arg(long, value_name = "FILE")]
    otlp_ca_file: Option<String>,

    /// PEM file of a client certificate, for endpoints requiring mutual TLS [default: OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, else none]
    #[arg(long, value_name = "FILE")]
    otlp_client_cert: Option<String>,

    /// PEM file of the client certificate's private key [default: OTEL_EXPORTER_OTLP_CLIENT_KEY, else none]
    #[arg(long, value_name = "FILE")]
    otlp_client_key: Option<String>,

    /// Accept any server certificate; for tests against self-signed endpoints only
    #[arg(long)]
    otlp_insecure_skip_verify: bool,

    /// Timeout of one OTLP export call, like 10s or 500ms [default: OTEL_EXPORTER_OTLP_TIMEOUT, else 10s]
    #[arg(long, value_name = "DURATION")]
    otlp_timeout: Option<String>,

    /// Compression of OTLP requests: gzip or none [default: OTEL_EXPORTER_OTLP_COMPRESSION, else gzip]
    #[arg(long, value_name = "ALGORITHM")]
    otlp_compression: Option<String>,

    /// service.name of every exported profile [default: OTEL_SERVICE_NAME, else each process's executable name]
    #[arg(long, value_name = "NAME")]
    service_name: Option<String>,

    /// Parca server to push gzipped pprof to with WriteRaw: http://HOST:7070 or https://… [default: none]
    #[arg(long, value_name = "URL")]
    parca_endpoint: Option<String>,

    /// File holding a bearer token for the Parca server [default: none]
    #[arg(long, value_name = "FILE")]
    parca_bearer_token_file: Option<String>,

    /// Timeout of one call to the Parca server, like 10s or 500ms [default: 10s]
    #[arg(long, value_name = "DURATION")]
    parca_timeout: Option<String>,

    /// Grafana Pyroscope server to push pprof to (push.v1.PusherService/Push, Connect protocol): http://HOST:4040 or https://…; user:password@ in the URL is sent as basic auth [default: none]
    #[arg(long, value_name = "URL")]
    pyroscope_endpoint: Option<String>,

    /// File holding a bearer token for the Pyroscope server [default: none]
    #[arg(long, value_name = "FILE")]
    pyroscope_bearer_token_file: Option<String>,

    /// Tenant sent to the Pyroscope server as X-Scope-OrgID [default: none]
    #[arg(long, value_name = "ID")]
    pyroscope_tenant_id: Option<String>,

    /// Timeout of one call to the Pyroscope server, like 10s or 500ms [default: 10s]
    #[arg(long, value_name = "DURATION")]
    pyroscope_timeout: Option<String>,

    /// Serve an OTLP Profiles receiver (gRPC and HTTP /v1development/profiles) on IP:PORT, or PORT on 127.0.0.1, and forward what it gets to the sinks [default: off]
    #[arg(long, value_name = "ADDR")]
    otlp_listen: Option<String>,

    /// File holding the bearer token the receiver requires from its clients [default: none]
    #[arg(long, value_name = "FILE")]
    otlp_listen_bearer_token_file: Option<String>,

    /// Memory the receiver's requests may hold at once (read, decoded, waiting for the sinks), like 256MiB; a request that does not fit now is refused with RESOURCE_EXHAUSTED [default: 128MiB]
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    otlp_listen_memory: Option<String>,

    /// Directory to write gzipped pprof files to [default: /var/lib/icecore/pprof if no sink is set, else none]
    #[arg(long, value_name = "DIR")]
    pprof_dir: Option<OsString>,

    /// Most pprof files kept in the directory, oldest removed first; 0 keeps every file [default: 8640, a day at 10s]
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pprof_max_files: Option<String>,

    /// Most bytes of pprof files kept in the directory, oldest removed first, like 512MiB; 0 means no limit [default: 1GiB]
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pprof_max_bytes: Option<String>,

    /// Most encoded bytes each push sink (OTLP, Parca, Pyroscope) queues while its endpoint is down or slow, like 256MiB; beyond it the oldest requests are dropped and counted [default: 320MiB, ten minutes of a busy host]
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    export_queue_bytes: Option<String>,

    /// Samples per second on each CPU, an integer from 1 to 10000 [default: 19]
    #[arg(long, value_name = "HZ", allow_negative_numbers = true)]
    sampling_frequency: Option<String>,

    /// How often to export collected profiles, from 1s to 1h, like 10s or 1m [default: 10s]
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    reporter_interval: Option<String>,

    /// Memory for the DWARF (line tables, inlined functions) of profiled binaries, like 256MiB; a binary needing more is symbolized from its symbol tables, and 0 turns DWARF off [default: 16MiB]
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    debug_info_memory: Option<String>,

    /// Kernel memory for the DWARF unwind tables of mapped executables and libraries, like 256MiB; over it, the tables of the files least recently sampled leave BPF (their frames use frame pointers) and come back when sampled again [default: 128MiB]
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    unwind_table_memory: Option<String>,

    /// Stop after this long (like 30s or 5m), flush and exit 0 [default: run until stopped]
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    duration: Option<String>,

    /// Record this share of context switches of profiled threads with the stack they waited in, from 0 (off) to 1 (every switch); each recorded wait counts 1/P times, so totals stay unbiased [default: 0]
    #[arg(long, value_name = "P", allow_hyphen_values = true)]
    off_cpu_threshold: Option<String>,

    /// Shorter waits off CPU are not recorded (they cost only the filter), up to 1m [default: 1us]
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    off_cpu_min_duration: Option<String>,

    /// Also send a wall-clock profile: per thread, its CPU samples and its off-CPU waits in one profile in nanoseconds (needs --off-cpu-threshold)
    #[arg(long)]
    wall_clock: bool,

    /// Profile only this process; repeat for more (comma-separated also works) [default: every process]
    #[arg(
        long = "pid",
        value_name = "PID",
        value_delimiter = ',',
        allow_negative_numbers = true
    )]
    pids: Vec<String>,

    /// Runtimes whose frames are unwound or named: all, none, or a comma-separated list of cpython, cruby, hotspot, v8, php, perl, perf-map [default: all]
    #[arg(long, value_name = "LIST")]
    runtimes: Option<String>,

    /// Address of the HTTP server for health and metrics, IP:PORT [default: 127.0.0.1:7071]
    #[arg(long, value_name = "ADDR")]
    http_address: Option<String>,

    /// File holding the bearer token required on --http-address (every path but /healthz and /readyz) [default: none]
    #[arg(long, value_name = "FILE")]
    http_bearer_token_file: Option<String>,

    /// PEM file of the certificate (chain) --http-address serves HTTPS with; needs --http-tls-key [default: none, plain HTTP]
    #[arg(long, value_name = "FILE")]
    http_tls_cert: Option<String>,

    /// PEM file of --http-tls-cert's private key [default: none]
    #[arg(long, value_name = "FILE")]
    http_tls_key: Option<String>,

    /// Run as this user (name or UID) and its groups once the BPF programs are loaded, keeping only the capabilities profiling still needs [default: the starting user]
    #[arg(long, value_name = "NAME|UID")]
    user: Option<String>,

    /// Keep every capability after start-up instead of only those profiling needs; for debugging
    #[arg(long)]
    keep_capabilities: bool,

    /// How long the flame graph page at / on --http-address keeps aggregated profiles, from 1m to 24h, like 15m or 2h; 0 turns the history (and the page's data) off [default: 15m]
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    flamegraph_history: Option<String>,

    /// Memory cap of the flame graph page's history, like 64MiB; the oldest intervals are dropped first when over it, and 0 turns the history off [default: 64MiB]
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    flamegraph_max_bytes: Option<String>,

    /// YAML file with the same settings in snake_case; flags override it [default: none]
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Log level (error, warn, info, debug, trace) or filter like info,icecore_receiver=debug [default: info]
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,

    /// Log line format on stderr: text, json (one object per line) or logfmt [default: text]
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<String>,

    /// Send icecore's own spans (start-up, process descriptions, table builds, exports) as OTLP traces to the OTLP endpoint, or to OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; also turned on by OTEL_TRACES_EXPORTER=otlp [default: off]
    #[arg(long)]
    self_traces: bool,

    /// Check the settings (flags, config file, environment) and the files they name, say where profiles would go, and exit without sampling
    #[arg(long)]
    check_config: bool,
}

/// The clap command behind [`Cli`], for help text and shell completions.
pub(crate) fn command() -> clap::Command {
    Cli::command()
}

/// Parses the arguments (argv\[0\] first) without checking values.
pub(crate) fn parse<I, T>(args: I) -> Result<Cli, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    Cli::try_parse_from(args).map_err(ConfigError::Cli)
}

impl Cli {
    /// The config file named by `--config`, if any.
    pub(crate) fn config_path(&self) -> Option<&PathBuf> {
        self.config.as_ref()
    }

    /// Whether `--check-config` asks for a dry run.
    pub(crate) fn check_only(&self) -> bool {
        self.check_config
    }

    /// Checks every flag's value, returning the settings the flags give.
    pub(crate) fn settings(&self) -> Result<Settings, ConfigError> {
        let otlp = check(
            "otlp-endpoint",
            self.otlp_endpoint.as_deref(),
            validate::otlp_endpoint,
        )?;
        let otlp_headers = if self.otlp_headers.is_empty() {
            None
        } else {
            let checked: Result<Vec<(String, String)>, ConfigError> = self
                .otlp_headers
                .iter()
                .map(|h| {
                    // Only the name: the value may be a credential.
                    let name = h.split('=').next().unwrap_or_default();
                    export::otlp_header(h).map_err(|e| invalid_flag("otlp-header", name, &e))
                })
                .collect();
            Some(checked?)
        };
        let external_labels = if self.external_labels.is_empty() {
            None
        } else {
            let checked: Result<Vec<(String, String)>, ConfigError> = self
                .external_labels
                .iter()
                .map(|l| {
                    validate::external_label(l).map_err(|e| invalid_flag("external-label", l, &e))
                })
                .collect();
            Some(checked?)
        };
        let targets = if self.targets.is_empty() {
            None
        } else {
            let checked: Result<Vec<Target>, ConfigError> = self
                .targets
                .iter()
                .map(|text| {
                    let mut target = Target::default();
                    let set = match text.split_once('=') {
                        Some((key, value)) => target.set(key, value),
                        None => Err(TargetError::UnknownKey(text.clone())),
                    };
                    set.map(|()| target).map_err(|e| {
                        invalid_flag(
                            "target",
                            text,
                            &Invalid::because(EXPECTED_TARGET, e.to_string()),
                        )
                    })
                })
                .collect();
            // Every flag sets a field, so no target is empty.
            Targets::new(checked?).ok()
        };
        let otlp_bearer_token = check(
            "otlp-bearer-token-file",
            self.otlp_bearer_token_file.as_deref(),
            export::token_file,
        )?
        .map(BearerToken::File);
        let otlp_ca_file = check(
            "otlp-ca-file",
            self.otlp_ca_file.as_deref(),
            export::pem_file,
        )?;
        let otlp_client_cert = check(
            "otlp-client-cert",
            self.otlp_client_cert.as_deref(),
            export::pem_file,
        )?;
        let otlp_client_key = check(
            "otlp-client-key",
            self.otlp_client_key.as_deref(),
            export::pem_file,
        )?;
        let otlp_timeout = check(
            "otlp-timeout",
            self.otlp_timeout.as_deref(),
            export::otlp_timeout,
        )?;
        let otlp_compression = check(
            "otlp-compression",
            self.otlp_compression.as_deref(),
            export::compression,
        )?;
        let service_name = check(
            "service-name",
            self.service_name.as_deref(),
            export::service_name,
        )?;
        let parca = check(
            "parca-endpoint",
            self.parca_endpoint.as_deref(),
            validate::otlp_endpoint,
        )?;
        let parca_bearer_token_file = check(
            "parca-bearer-token-file",
            self.parca_bearer_token_file.as_deref(),
            export::token_file,
        )?;
        let parca_timeout = check(
            "parca-timeout",
            self.parca_timeout.as_deref(),
            export::otlp_timeout,
        )?;
        let pyroscope_timeout = check(
            "pyroscope-timeout",
            self.pyroscope_timeout.as_deref(),
            export::otlp_timeout,
        )?;
        let pyroscope = check(
            "pyroscope-endpoint",
            self.pyroscope_endpoint.as_deref(),
            validate::otlp_endpoint,
        )?;
        let pyroscope_bearer_token_file = check(
            "pyroscope-bearer-token-file",
            self.pyroscope_bearer_token_file.as_deref(),
            export::token_file,
        )?;
        let pyroscope_tenant_id = check(
            "pyroscope-tenant-id",
            self.pyroscope_tenant_id.as_deref(),
            export::tenant_id,
        )?;
        let otlp_listen = check(
            "otlp-listen",
            self.otlp_listen.as_deref(),
            export::listen_address,
        )?;
        let otlp_listen_bearer_token_file = check(
            "otlp-listen-bearer-token-file",
            self.otlp_listen_bearer_token_file.as_deref(),
            export::token_file,
        )?;
        let otlp_listen_memory_bytes = check(
            "otlp-listen-memory",
            self.otlp_listen_memory.as_deref(),
            validate::memory_budget,
        )?;
        let pprof_max_files = check(
            "pprof-max-files",
            self.pprof_max_files.as_deref(),
            validate::file_count,
        )?;
        let pprof_max_bytes = check(
            "pprof-max-bytes",
            self.pprof_max_bytes.as_deref(),
            validate::memory_size,
        )?;
        let export_queue_bytes = check(
            "export-queue-bytes",
            self.export_queue_bytes.as_deref(),
            validate::queue_bound,
        )?;
        let pprof_dir = match &self.pprof_dir {
            Some(dir) => Some(
                validate::pprof_dir(PathBuf::from(dir))
                    .map_err(|e| invalid_flag("pprof-dir", &dir.to_string_lossy(), &e))?,
            ),
            None => None,
        };
        let sampling_frequency_hz = check(
            "sampling-frequency",
            self.sampling_frequency.as_deref(),
            validate::sampling_frequency,
        )?;
        let reporter_interval = check(
            "reporter-interval",
            self.reporter_interval.as_deref(),
            validate::reporter_interval,
        )?;
        let debug_info_memory_bytes = check(
            "debug-info-memory",
            self.debug_info_memory.as_deref(),
            validate::memory_size,
        )?;
        let unwind_table_memory_bytes = check(
            "unwind-table-memory",
            self.unwind_table_memory.as_deref(),
            validate::memory_budget,
        )?;
        let duration = check("duration", self.duration.as_deref(), validate::run_duration)?;
        let off_cpu_threshold = check(
            "off-cpu-threshold",
            self.off_cpu_threshold.as_deref(),
            crate::off_cpu::threshold,
        )?;
        let off_cpu_min_duration = check(
            "off-cpu-min-duration",
            self.off_cpu_min_duration.as_deref(),
            crate::off_cpu::min_duration,
        )?;
        let pids = if self.pids.is_empty() {
            None
        } else {
            let checked: Result<Vec<u32>, ConfigError> = self
                .pids
                .iter()
                .map(|pid| validate::pid(pid).map_err(|e| invalid_flag("pid", pid, &e)))
                .collect();
            Some(checked?)
        };
        let runtimes = check("runtimes", self.runtimes.as_deref(), validate::runtimes)?;
        let http_address = check(
            "http-address",
            self.http_address.as_deref(),
            validate::http_address,
        )?;
        let http_bearer_token_file = check(
            "http-bearer-token-file",
            self.http_bearer_token_file.as_deref(),
            export::token_file,
        )?;
        let http_tls_cert = check(
            "http-tls-cert",
            self.http_tls_cert.as_deref(),
            export::pem_file,
        )?;
        let http_tls_key = check(
            "http-tls-key",
            self.http_tls_key.as_deref(),
            export::pem_file,
        )?;
        let user = check("user", self.user.as_deref(), validate::user)?;
        let flamegraph_history = check(
            "flamegraph-history",
            self.flamegraph_history.as_deref(),
            validate::flamegraph_history,
        )?;
        let flamegraph_max_bytes = check(
            "flamegraph-max-bytes",
            self.flamegraph_max_bytes.as_deref(),
            validate::memory_size,
        )?;
        let log_level = check("log-level", self.log_level.as_deref(), validate::log_level)?;
        let log_format = check(
            "log-format",
            self.log_format.as_deref(),
            validate::log_format,
        )?;
        Ok(Settings {
            otlp,
            otlp_headers,
            otlp_timeout,
            otlp_compression,
            otlp_bearer_token,
            otlp_ca_file,
            otlp_client_cert,
            otlp_client_key,
            otlp_insecure_skip_verify: self.otlp_insecure_skip_verify.then_some(true),
            service_name,
            resource_attributes: None,
            external_labels,
            // Rules are long: only the config file holds them.
            relabel_configs: None,
            targets,
            scrape_configs: None,
            kubernetes_api: match check(
                "kubelet-url",
                self.kubelet_url.as_deref(),
                validate::kubelet_url,
            )? {
                Some(kubelet) => Some(kubelet),
                None => check(
                    "kubernetes-api",
                    self.kubernetes_api.as_deref(),
                    validate::kubernetes_api,
                )?,
            },
            node_name: check("node-name", self.node_name.as_deref(), validate::node_name)?,
            kubernetes_token_file: check(
                "kubernetes-token-file",
                self.kubernetes_token_file.as_deref(),
                export::token_file,
            )?,
            command_line_attribute: self.command_line_attribute.then_some(true),
            docker_socket: check(
                "docker-socket",
                self.docker_socket.as_deref(),
                validate::docker_socket,
            )?,
            kubernetes_ca_file: check(
                "kubernetes-ca-file",
                self.kubernetes_ca_file.as_deref(),
                export::pem_file,
            )?,
            otlp_listen,
            otlp_listen_bearer_token_file,
            otlp_listen_memory_bytes,
            parca,
            parca_bearer_token_file,
            parca_timeout,
            pyroscope,
            pyroscope_bearer_token_file,
            pyroscope_tenant_id,
            pyroscope_timeout,
            pprof_dir,
            pprof_max_files,
            pprof_max_bytes,
            export_queue_bytes,
            sampling_frequency_hz,
            reporter_interval,
            debug_info_memory_bytes,
            unwind_table_memory_bytes,
            duration,
            off_cpu_threshold,
            off_cpu_min_duration,
            wall_clock: self.wall_clock.then_some(true),
            pids,
            runtimes,
            http_address,
            http_bearer_token_file,
            http_tls_cert,
            http_tls_key,
            user,
            keep_capabilities: self.keep_capabilities.then_some(true),
            flamegraph_history,
            flamegraph_max_bytes,
            log_level,
            log_format,
            self_traces: self.self_traces.then_some(true),
            traces_endpoint: None,
        })
    }
}

/// Runs `parse` on a flag's value when the flag was given.
fn check<T>(
    flag: &'static str,
    value: Option<&str>,
    parse: impl Fn(&str) -> Result<T, Invalid>,
) -> Result<Option<T>, ConfigError> {
    value
        .map(|text| parse(text).map_err(|e| invalid_flag(flag, text, &e)))
        .transpose()
}

fn invalid_flag(flag: &'static str, value: &str, invalid: &Invalid) -> ConfigError {
    ConfigError::InvalidFlag {
        flag,
        value: validate::redact_userinfo(value),
        message: invalid.flag_message(),
    }
}
