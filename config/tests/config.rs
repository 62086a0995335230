//! `Config::from_args` as the icecore binary calls it: flags, config files,
//! precedence, defaults and error messages.
#![allow(clippy::expect_used)] // helpers outside #[test] fns

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use icecore_config::{
    Config, ConfigError, DEFAULT_FLAMEGRAPH_HISTORY, DEFAULT_FLAMEGRAPH_MAX_BYTES,
    DEFAULT_PPROF_DIR, OtlpEndpoint,
};
use tempfile::NamedTempFile;

fn parse(args: &[&str]) -> Result<Config, ConfigError> {
    parse_with_env(args, &[])
}

/// Parses with exactly the given environment variables set.
fn parse_with_env(args: &[&str], vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Config::from_args_and_env(
        std::iter::once("icecore").chain(args.iter().copied()),
        &move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
    )
}

fn ok(args: &[&str]) -> Config {
    match parse(args) {
        Ok(config) => config,
        Err(e) => panic!("{args:?}: {e}"),
    }
}

fn err(args: &[&str]) -> String {
    match parse(args) {
        Ok(config) => panic!("{args:?} was accepted as {config:?}"),
        Err(ConfigError::Cli(e)) => panic!("{args:?}: clap error, not a value error: {e}"),
        Err(e) => e.to_string(),
    }
}

fn yaml(text: &str) -> NamedTempFile {
    let mut file = NamedTempFile::new().expect("temp file");
    file.write_all(text.as_bytes()).expect("write temp file");
    file
}

fn path_of(file: &NamedTempFile) -> &str {
    file.path().to_str().expect("utf-8 temp path")
}

#[test]
fn defaults() {
    let config = ok(&[]);
    assert_eq!(config, Config::default());
    assert_eq!(config.otlp, None);
    assert_eq!(config.pprof_dir, Some(PathBuf::from(DEFAULT_PPROF_DIR)));
    assert_eq!(
        config.pprof_dir,
        Some(PathBuf::from("/var/lib/icecore/pprof"))
    );
    assert!(config.pprof_dir_is_default);
    assert_eq!(config.sampling_frequency_hz, 19);
    assert_eq!(config.period_nanos(), 1_000_000_000 / 19);
    assert_eq!(config.reporter_interval, Duration::from_secs(10));
    assert_eq!(config.duration, None);
    assert!(config.pids.is_empty());
    assert_eq!(config.http_address.to_string(), "127.0.0.1:7071");
    assert_eq!(config.flamegraph_history, Duration::from_secs(15 * 60));
    assert_eq!(config.flamegraph_history, DEFAULT_FLAMEGRAPH_HISTORY);
    assert_eq!(config.flamegraph_max_bytes, 64 << 20);
    assert_eq!(config.flamegraph_max_bytes, DEFAULT_FLAMEGRAPH_MAX_BYTES);
    assert_eq!(config.log_level, "info");
    assert_eq!(config.parca_timeout, Duration::from_secs(10));
    assert_eq!(config.pyroscope_timeout, Duration::from_secs(10));
}

#[test]
fn parca_and_pyroscope_timeouts() {
    let config = ok(&["--parca-timeout", "2500ms", "--pyroscope-timeout", "30s"]);
    assert_eq!(config.parca_timeout, Duration::from_millis(2500));
    assert_eq!(config.pyroscope_timeout, Duration::from_secs(30));
    let file = yaml("parca_timeout: 3s\npyroscope_timeout: 1m\n");
    let config = ok(&["--config", path_of(&file)]);
    assert_eq!(config.parca_timeout, Duration::from_secs(3));
    assert_eq!(config.pyroscope_timeout, Duration::from_secs(60));
    assert_eq!(
        err(&["--parca-timeout", "0s"]),
        "invalid --parca-timeout \"0s\": expected a duration from 1ms to 10m, like 10s or \
         500ms (out of range)"
    );
    assert!(err(&["--pyroscope-timeout", "11m"]).contains("from 1ms to 10m"));
}

#[test]
fn each_flag() {
    let config = ok(&[
        "--otlp-endpoint",
        "https://collector:4317",
        "--sampling-frequency",
        "99",
        "--reporter-interval",
        "1m",
        "--duration",
        "1500ms",
        "--pid",
        "42",
        "--http-address",
        "[::1]:9000",
        "--log-level",
        "info,icecore_receiver=debug",
    ]);
    assert_eq!(
        config.otlp,
        Some(OtlpEndpoint {
            url: "https://collector:4317".into(),
            basic_auth: None,
            tls: true
        })
    );
    assert_eq!(config.pprof_dir, None);
    assert!(!config.pprof_dir_is_default);
    assert_eq!(config.sampling_frequency_hz, 99);
    assert_eq!(config.period_nanos(), 10_101_010);
    assert_eq!(config.reporter_interval, Duration::from_secs(60));
    assert_eq!(config.duration, Some(Duration::from_millis(1500)));
    assert_eq!(config.pids, vec![42]);
    assert_eq!(config.http_address.to_string(), "[::1]:9000");
    assert_eq!(config.log_level, "info,icecore_receiver=debug");

    let config = ok(&["--pprof-dir", "/tmp/out", "--otlp-endpoint=http://h:1"]);
    assert_eq!(config.pprof_dir, Some(PathBuf::from("/tmp/out")));
    assert!(!config.pprof_dir_is_default);
    assert_eq!(config.otlp.map(|o| o.tls), Some(false));
    assert_eq!(
        ok(&["--sampling-frequency", "10000"]).period_nanos(),
        100_000
    );
    assert_eq!(ok(&["--log-level", "trace"]).log_level, "trace");
    let labels = ok(&[
        "--external-label",
        "cluster=east",
        "--external-label",
        "zone = b",
    ])
    .external_labels;
    assert_eq!(
        labels,
        vec![
            ("cluster".to_owned(), "east".to_owned()),
            ("zone".to_owned(), "b".to_owned())
        ]
    );
    let bad = err(&["--external-label", "no-equals"]);
    assert!(bad.contains("--external-label"), "{bad}");
    assert!(err(&["--external-label", "9x=1"]).contains("is not such a name"));

    let targets = ok(&[
        "--target",
        "executable=/usr/bin/python3*",
        "--target=kubernetes_pod_label=app=web*",
    ])
    .targets;
    let [python, pod] = targets.as_slice() else {
        panic!("{targets:?}");
    };
    assert_eq!(
        python.executable.as_ref().map(|g| g.as_str()),
        Some("/usr/bin/python3*")
    );
    assert_eq!(pod.kubernetes_pod_labels[0].0, "app");
    assert_eq!(pod.kubernetes_pod_labels[0].1.as_str(), "web*");
    let bad = err(&["--target", "cgroup=[x"]);
    assert!(
        bad.contains("--target") && bad.contains("is not a glob"),
        "{bad}"
    );
    assert!(err(&["--target", "nginx"]).contains("unknown key"));
}

#[test]
fn pods_come_from_the_api_server_or_the_kubelet() {
    use icecore_config::KubernetesApi;
    assert_eq!(
        ok(&["--kubernetes-api", "https://10.0.0.1:443/"]).kubernetes_api,
        Some(KubernetesApi::Url("https://10.0.0.1:443".into()))
    );
    assert_eq!(
        ok(&["--kubernetes-api", "off"]).kubernetes_api,
        Some(KubernetesApi::Off)
    );
    assert_eq!(
        ok(&["--kubelet-url", "http://127.0.0.1:10255"]).kubernetes_api,
        Some(KubernetesApi::Kubelet("http://127.0.0.1:10255".into()))
    );
    let bad = err(&["--kubelet-url", "127.0.0.1:10255"]);
    assert!(
        bad.contains("--kubelet-url") && bad.contains("10255"),
        "{bad}"
    );
    let both = parse(&[
        "--kubelet-url",
        "http://127.0.0.1:10255",
        "--kubernetes-api",
        "http://127.0.0.1:8001",
    ]);
    assert!(
        matches!(&both, Err(ConfigError::Cli(e)) if e.to_string().contains("cannot be used with")),
        "{both:?}"
    );
}

#[test]
fn repeated_pid() {
    assert_eq!(
        ok(&["--pid", "1", "--pid", "200", "--pid=3000"]).pids,
        vec![1, 200, 3000]
    );
    assert_eq!(ok(&["--pid", "7,8"]).pids, vec![7, 8]);
}

#[test]
fn both_sinks() {
    let config = ok(&[
        "--otlp-endpoint",
        "http://localhost:4317",
        "--pprof-dir",
        "out",
    ]);
    assert_eq!(
        config.otlp.map(|o| o.url).as_deref(),
        Some("http://localhost:4317")
    );
    assert_eq!(config.pprof_dir, Some(PathBuf::from("out")));
    assert!(!config.pprof_dir_is_default);
}

#[test]
fn default_pprof_dir_only_without_sink() {
    let config = ok(&["--otlp-endpoint", "http://localhost:4317"]);
    assert_eq!(config.pprof_dir, None);
    assert!(!config.pprof_dir_is_default);
    let config = ok(&["--pprof-dir", DEFAULT_PPROF_DIR]);
    assert!(
        !config.pprof_dir_is_default,
        "set explicitly, not defaulted"
    );
    let file = yaml("sampling_frequency: 50\n");
    let config = ok(&["--config", path_of(&file)]);
    assert!(config.pprof_dir_is_default);
    assert_eq!(config.pprof_dir, Some(PathBuf::from(DEFAULT_PPROF_DIR)));
}

const FULL_YAML: &str = "\
# icecore settings
otlp_endpoint: https://otel.example.com:4317
pprof_dir: /srv/pprof
sampling_frequency: 97
reporter_interval: 30s
duration: 2m
pids: [10, 20]
http_address: 0.0.0.0:8080
flamegraph_history: 1h
flamegraph_max_bytes: 32MiB
log_level: debug
";

#[test]
fn yaml_file() {
    let file = yaml(FULL_YAML);
    let config = ok(&["--config", path_of(&file)]);
    assert_eq!(
        config,
        Config {
            otlp: Some(OtlpEndpoint {
                url: "https://otel.example.com:4317".into(),
                basic_auth: None,
                tls: true
            }),
            pprof_dir: Some(PathBuf::from("/srv/pprof")),
            pprof_dir_is_default: false,
            sampling_frequency_hz: 97,
            reporter_interval: Duration::from_secs(30),
            duration: Some(Duration::from_secs(120)),
            pids: vec![10, 20],
            http_address: "0.0.0.0:8080".parse().expect("literal"),
            flamegraph_history: Duration::from_secs(3600),
            flamegraph_max_bytes: 32 << 20,
            log_level: "debug".into(),
            ..Config::default()
        }
    );
    assert_eq!(Config::from_file(file.path()).expect("from_file"), config);

    let block_list = yaml("pids:\n  - 5\n  - 6\n");
    assert_eq!(ok(&["--config", path_of(&block_list)]).pids, vec![5, 6]);
    let empty = yaml("");
    assert_eq!(ok(&["--config", path_of(&empty)]), Config::default());
}

#[test]
fn flag_overrides_file() {
    let file = yaml(FULL_YAML);
    let config = ok(&[
        "--sampling-frequency",
        "11",
        "--config",
        path_of(&file),
        "--pid",
        "99",
        "--log-level",
        "warn",
        "--otlp-endpoint",
        "http://other:4317",
        "--flamegraph-history",
        "0",
    ]);
    assert_eq!(config.sampling_frequency_hz, 11);
    assert_eq!(config.flamegraph_history, Duration::ZERO, "0 overrides 1h");
    assert_eq!(config.pids, vec![99], "--pid replaces the file's list");
    assert_eq!(config.log_level, "warn");
    assert_eq!(config.otlp.as_ref().map(|o| o.tls), Some(false));
    // What no flag sets still comes from the file.
    assert_eq!(config.pprof_dir, Some(PathBuf::from("/srv/pprof")));
    assert_eq!(config.reporter_interval, Duration::from_secs(30));
    assert_eq!(config.duration, Some(Duration::from_secs(120)));
    assert_eq!(config.http_address.to_string(), "0.0.0.0:8080");
    assert_eq!(config.flamegraph_max_bytes, 32 << 20);
}

#[test]
fn unknown_yaml_key_is_named() {
    let file = yaml("log_level: info\nsample_rate: 100\n");
    let message = err(&["--config", path_of(&file)]);
    assert!(message.contains(path_of(&file)), "{message}");
    assert!(
        message.contains("unknown key \"sample_rate\" at line 2"),
        "{message}"
    );
    assert!(
        message.contains("sampling_frequency"),
        "lists accepted keys: {message}"
    );
}

#[test]
fn missing_and_malformed_files_name_the_path() {
    let message = err(&["--config", "/nonexistent/icecore.yaml"]);
    assert!(
        message.starts_with("config file /nonexistent/icecore.yaml: cannot read it:"),
        "{message}"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let dir_path = dir.path().to_str().expect("utf-8").to_owned();
    assert!(err(&["--config", &dir_path]).contains(&dir_path));

    let file = yaml("log_level: info\npids: [1, 2\n");
    let message = err(&["--config", path_of(&file)]);
    assert!(message.contains(path_of(&file)), "{message}");
    assert!(message.contains("invalid YAML"), "{message}");
    assert!(message.contains("line"), "{message}");
    assert!(message.contains("column"), "{message}");

    let list = yaml("- pprof_dir\n");
    let message = err(&["--config", path_of(&list)]);
    assert!(
        message.contains("expected a mapping of settings"),
        "{message}"
    );
}

#[test]
fn bad_flag_values_name_flag_and_form() {
    assert_eq!(
        err(&["--sampling-frequency", "abc"]),
        "invalid --sampling-frequency \"abc\": \
         expected an integer number of samples per second from 1 to 10000"
    );
    let cases: &[(&str, &str, &str)] = &[
        (
            "--otlp-endpoint",
            "localhost:4317",
            "http:// (plaintext) or https:// (TLS) URL",
        ),
        ("--otlp-endpoint", "ftp://host", "unsupported scheme"),
        ("--otlp-endpoint", "http://", "no host"),
        ("--pprof-dir", "", "non-empty directory path"),
        ("--sampling-frequency", "0", "from 1 to 10000"),
        ("--sampling-frequency", "10001", "from 1 to 10000"),
        ("--sampling-frequency", "1.5", "integer"),
        ("--reporter-interval", "500ms", "from 1s to 1h"),
        ("--reporter-interval", "2h", "above the maximum of 1h"),
        ("--reporter-interval", "ten", "like 10s"),
        ("--flamegraph-history", "30s", "below the minimum of 1m"),
        ("--flamegraph-history", "2d", "above the maximum of 24h"),
        ("--flamegraph-history", "15", "from 1m to 24h"),
        (
            "--flamegraph-history",
            "soon",
            "or 0 to turn the flame graph history off",
        ),
        ("--flamegraph-max-bytes", "64MB", "up to 16GiB"),
        ("--flamegraph-max-bytes", "lots", "like 64MiB"),
        ("--duration", "0s", "greater than zero"),
        ("--duration", "5", "like 30s"),
        ("--pid", "0", "integer from 1"),
        ("--pid", "-4", "integer from 1"),
        ("--sampling-frequency", "-19", "from 1 to 10000"),
        ("--pid", "x", "process ID"),
        (
            "--http-address",
            "localhost",
            "IP socket address like 127.0.0.1:7071",
        ),
        ("--log-level", "loud", "error, warn, info, debug or trace"),
        ("--log-level", "", "the filter is empty"),
        ("--log-level", "info,=debug", "no target"),
    ];
    for (flag, value, form) in cases {
        let message = err(&[flag, value]);
        let prefix = format!("invalid {flag} {value:?}: expected ");
        assert!(message.starts_with(&prefix), "{message}");
        assert!(message.contains(form), "{flag} {value}: {message}");
    }
}

#[test]
fn bad_file_values_name_key_and_form() {
    let cases: &[(&str, &str)] = &[
        (
            "otlp_endpoint: grpc://x",
            "otlp_endpoint: expected an http://",
        ),
        (
            "pprof_dir: ''",
            "pprof_dir: expected a non-empty directory path, got \"\"",
        ),
        (
            "sampling_frequency: 0",
            "sampling_frequency: expected an integer number of samples per second \
             from 1 to 10000, got 0",
        ),
        (
            "sampling_frequency: abc",
            "sampling_frequency: expected an integer",
        ),
        (
            "reporter_interval: 100ms",
            "reporter_interval: expected a duration from 1s to 1h",
        ),
        (
            "duration: 0s",
            "duration: expected a duration greater than zero, like 30s, 5m or 1h30m, got \"0s\" (the duration is zero)",
        ),
        ("pids: [0]", "pids: expected a list of process IDs"),
        ("pids: 12", "pids: expected a list of process IDs"),
        (
            "http_address: nowhere",
            "http_address: expected an IP socket address",
        ),
        ("log_level: [info]", "log_level: expected a level"),
        (
            "flamegraph_history: 10s",
            "flamegraph_history: expected a duration from 1m to 24h, like 15m or 2h, \
             or 0 to turn the flame graph history off, got \"10s\" (below the minimum of 1m)",
        ),
        (
            "flamegraph_max_bytes: 1.5MiB",
            "flamegraph_max_bytes: expected a size in bytes up to 16GiB",
        ),
    ];
    for (text, expected) in cases {
        let file = yaml(text);
        let message = err(&["--config", path_of(&file)]);
        let prefix = format!("config file {}: ", path_of(&file));
        assert!(message.starts_with(&prefix), "{message}");
        assert!(message.contains(expected), "{text}: {message}");
    }
}

#[test]
fn flag_values_are_checked_even_when_file_is_fine() {
    let file = yaml("sampling_frequency: 50\n");
    let message = err(&["--config", path_of(&file), "--sampling-frequency", "0"]);
    assert!(
        message.starts_with("invalid --sampling-frequency \"0\""),
        "{message}"
    );
}

#[test]
fn clap_errors_help_and_version() {
    let cli = |args: &[&str]| match parse(args) {
        Err(ConfigError::Cli(e)) => e,
        other => panic!("{args:?}: expected a clap error, got {other:?}"),
    };
    let unknown = cli(&["--frequency", "5"]);
    assert_eq!(unknown.kind(), clap::error::ErrorKind::UnknownArgument);
    assert_eq!(ConfigError::Cli(unknown).exit_code(), 2);
    assert_eq!(cli(&["--pid"]).kind(), clap::error::ErrorKind::InvalidValue);
    assert_eq!(
        cli(&["stray"]).kind(),
        clap::error::ErrorKind::UnknownArgument
    );

    let help = cli(&["--help"]);
    assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
    assert_eq!(help.exit_code(), 0);
    let text = help.render().to_string();
    assert!(text.contains(icecore_config::ABOUT), "{text}");
    assert!(text.contains("Usage: icecore"), "{text}");
    for (flag, default) in [
        (
            "--otlp-endpoint <URL>",
            "[default: OTEL_EXPORTER_OTLP_ENDPOINT, else none]",
        ),
        ("--otlp-timeout <DURATION>", "else 10s]"),
        ("--otlp-compression <ALGORITHM>", "else gzip]"),
        ("--pprof-dir <DIR>", "[default: /var/lib/icecore/pprof"),
        ("--sampling-frequency <HZ>", "[default: 19]"),
        ("--reporter-interval <DURATION>", "[default: 10s]"),
        ("--duration <DURATION>", "[default: run until stopped]"),
        ("--pid <PID>", "[default: every process]"),
        ("--http-address <ADDR>", "[default: 127.0.0.1:7071]"),
        ("--flamegraph-history <DURATION>", "[default: 15m]"),
        ("--flamegraph-max-bytes <SIZE>", "[default: 64MiB]"),
        ("--config <FILE>", "[default: none]"),
        ("--log-level <LEVEL>", "[default: info]"),
    ] {
        // The flag's entry: its line and the description lines under it
        // (clap puts long descriptions on their own lines).
        let start = text
            .find(flag)
            .unwrap_or_else(|| panic!("no {flag} in {text}"));
        let rest = &text[start + flag.len()..];
        let entry = &rest[..rest.find("\n  -").unwrap_or(rest.len())];
        let entry: String = entry.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(entry.contains(default), "{flag}: {entry}");
    }
    assert_eq!(
        cli(&["--version"]).kind(),
        clap::error::ErrorKind::DisplayVersion
    );
    Config::command().debug_assert();
}

#[test]
fn error_exit_codes() {
    let value_error = parse(&["--pid", "0"]).expect_err("pid 0");
    assert_eq!(value_error.exit_code(), 2);
}

#[test]
fn exporter_settings_from_flags_file_and_environment() {
    use icecore_config::{BearerToken, OtlpCompression};
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://from-env:4317"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-env=1"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "1500"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
        ("OTEL_SERVICE_NAME", "env-service"),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment.name=prod",
        ),
        ("ICECORE_OTLP_BEARER_TOKEN", "env-token"),
    ];
    // The environment alone.
    let config = parse_with_env(&[], &env).expect("env");
    assert_eq!(
        config.otlp.map(|o| o.url).as_deref(),
        Some("http://from-env:4317")
    );
    assert_eq!(config.otlp_headers, [("x-env".to_owned(), "1".to_owned())]);
    assert_eq!(config.otlp_timeout, Duration::from_millis(1500));
    assert_eq!(config.otlp_compression, OtlpCompression::None);
    assert_eq!(config.service_name.as_deref(), Some("env-service"));
    assert_eq!(
        config.resource_attributes,
        [("deployment.environment.name".to_owned(), "prod".to_owned())]
    );
    assert!(
        matches!(config.otlp_bearer_token, Some(BearerToken::Value(ref s)) if s.expose() == "env-token")
    );
    // A config file wins over the environment...
    let file = yaml(
        "otlp_endpoint: http://from-file:4317\n\
         otlp_headers: {x-file: \"2\"}\n\
         otlp_timeout: 3s\n\
         otlp_bearer_token_file: /run/secrets/token\n\
         resource_attributes: {k8s.cluster.name: c1}\n",
    );
    let config = parse_with_env(&["--config", path_of(&file)], &env).expect("file");
    assert_eq!(
        config.otlp.map(|o| o.url).as_deref(),
        Some("http://from-file:4317")
    );
    assert_eq!(config.otlp_headers, [("x-file".to_owned(), "2".to_owned())]);
    assert_eq!(config.otlp_timeout, Duration::from_secs(3));
    assert_eq!(config.otlp_compression, OtlpCompression::None, "from env");
    assert_eq!(
        config.otlp_bearer_token,
        Some(BearerToken::File(PathBuf::from("/run/secrets/token")))
    );
    assert_eq!(
        config.resource_attributes,
        [("k8s.cluster.name".to_owned(), "c1".to_owned())]
    );
    // ...and flags over both.
    let config = parse_with_env(
        &[
            "--config",
            path_of(&file),
            "--otlp-endpoint",
            "https://from-flag:4317",
            "--otlp-header",
            "X-Scope-OrgID=a",
            "--otlp-header=x-other = b c",
            "--otlp-timeout",
            "250ms",
            "--otlp-compression",
            "gzip",
            "--service-name",
            "flag-service",
        ],
        &env,
    )
    .expect("flags");
    assert_eq!(
        config.otlp.map(|o| o.url).as_deref(),
        Some("https://from-flag:4317")
    );
    assert_eq!(
        config.otlp_headers,
        [
            ("X-Scope-OrgID".to_owned(), "a".to_owned()),
            ("x-other".to_owned(), "b c".to_owned())
        ]
    );
    assert_eq!(config.otlp_timeout, Duration::from_millis(250));
    assert_eq!(config.otlp_compression, OtlpCompression::Gzip);
    assert_eq!(config.service_name.as_deref(), Some("flag-service"));
}

#[test]
fn exporter_setting_errors_name_the_source_and_hide_secrets() {
    let message = err(&["--otlp-header", "bad name=s3cret"]);
    assert!(message.contains("--otlp-header"), "{message}");
    assert!(!message.contains("s3cret"), "{message}");
    let message = err(&["--otlp-compression", "zstd"]);
    assert!(message.contains("gzip or none"), "{message}");
    let file = yaml("otlp_headers: [a, b]\n");
    let message = err(&["--config", path_of(&file)]);
    assert!(message.contains("otlp_headers"), "{message}");
    let message = parse_with_env(&[], &[("OTEL_EXPORTER_OTLP_COMPRESSION", "br")])
        .expect_err("bad env value")
        .to_string();
    assert!(
        message.contains("OTEL_EXPORTER_OTLP_COMPRESSION=\"br\""),
        "{message}"
    );
}

#[test]
fn tls_settings_and_their_conflicts() {
    let config = parse_with_env(
        &[
            "--otlp-endpoint",
            "https://collector:4317",
            "--otlp-client-cert",
            "/etc/icecore/client.pem",
        ],
        &[(
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            "/etc/icecore/client-key.pem",
        )],
    )
    .expect("cert from a flag, key from the environment");
    assert_eq!(
        config.otlp_tls.client_key,
        Some(PathBuf::from("/etc/icecore/client-key.pem"))
    );
    let file = yaml("otlp_endpoint: https://c:4317\notlp_insecure_skip_verify: true\n");
    assert!(
        ok(&["--config", path_of(&file)])
            .otlp_tls
            .insecure_skip_verify
    );
    for (args, needle) in [
        (
            &[
                "--otlp-endpoint",
                "https://c:4317",
                "--otlp-client-key",
                "/k.pem",
            ][..],
            "client certificate",
        ),
        (
            &[
                "--otlp-endpoint",
                "https://c:4317",
                "--otlp-ca-file",
                "/ca.pem",
                "--otlp-insecure-skip-verify",
            ][..],
            "contradict",
        ),
        (
            &[
                "--otlp-endpoint",
                "http://c:4317",
                "--otlp-ca-file",
                "/ca.pem",
            ][..],
            "use https://",
        ),
    ] {
        let message = err(args);
        assert!(message.contains(needle), "{args:?}: {message}");
    }
    let file = yaml("otlp_insecure_skip_verify: yes please\n");
    assert!(err(&["--config", path_of(&file)]).contains("true or false"));
}

#[test]
fn off_cpu_settings_from_flags_and_file() {
    let config = ok(&[
        "--off-cpu-threshold",
        "0.01",
        "--off-cpu-min-duration",
        "5us",
    ]);
    let off_cpu = config.off_cpu.expect("on");
    assert_eq!(off_cpu.probability.get(), 0.01);
    assert_eq!(off_cpu.min_duration, Duration::from_micros(5));
    assert!(!config.wall_clock);
    assert_eq!(ok(&[]).off_cpu, None);
    assert_eq!(ok(&["--off-cpu-threshold", "0"]).off_cpu, None);

    let file = yaml("off_cpu_threshold: 1\nwall_clock: true\n");
    let config = ok(&["--config", path_of(&file)]);
    assert_eq!(config.off_cpu.expect("on").probability.get(), 1.0);
    assert!(config.wall_clock);

    assert!(err(&["--off-cpu-threshold", "2"]).contains("--off-cpu-threshold"));
    assert!(err(&["--wall-clock"]).contains("wall_clock needs off-CPU sampling"));
}

#[test]
fn flamegraph_history_from_flags_and_file() {
    let config = ok(&[
        "--flamegraph-history",
        "2h30m",
        "--flamegraph-max-bytes",
        "256MiB",
    ]);
    assert_eq!(config.flamegraph_history, Duration::from_secs(9000));
    assert_eq!(config.flamegraph_max_bytes, 256 << 20);
    let config = ok(&["--flamegraph-history=0", "--flamegraph-max-bytes=0"]);
    assert_eq!(config.flamegraph_history, Duration::ZERO);
    assert_eq!(config.flamegraph_max_bytes, 0);
    let config = ok(&[
        "--flamegraph-history",
        "24h",
        "--flamegraph-max-bytes",
        "1M",
    ]);
    assert_eq!(config.flamegraph_history, Duration::from_secs(86_400));
    assert_eq!(config.flamegraph_max_bytes, 1 << 20);

    let file = yaml("flamegraph_history: 0\nflamegraph_max_bytes: 1048576\n");
    let config = ok(&["--config", path_of(&file)]);
    assert_eq!(config.flamegraph_history, Duration::ZERO);
    assert_eq!(config.flamegraph_max_bytes, 1 << 20);
    // A flag wins over the file, one setting at a time.
    let config = ok(&["--config", path_of(&file), "--flamegraph-history", "5m"]);
    assert_eq!(config.flamegraph_history, Duration::from_secs(300));
    assert_eq!(config.flamegraph_max_bytes, 1 << 20);
    let config = ok(&["--flamegraph-max-bytes", "0", "--config", path_of(&file)]);
    assert_eq!(config.flamegraph_history, Duration::ZERO);
    assert_eq!(config.flamegraph_max_bytes, 0);
    // A bad flag is refused even when the file is fine.
    let message = err(&["--config", path_of(&file), "--flamegraph-history", "59s"]);
    assert_eq!(
        message,
        "invalid --flamegraph-history \"59s\": expected a duration from 1m to 24h, \
         like 15m or 2h, or 0 to turn the flame graph history off (below the minimum of 1m)"
    );
}

#[test]
fn listeners_default_to_loopback() {
    let config = ok(&[]);
    assert!(config.http_address.ip().is_loopback(), "{config:?}");
    assert!(config.otlp_listen.is_none());
    // A port alone listens on loopback too; another host is only ever
    // reached by writing its address.
    let config = ok(&["--otlp-listen", "4317"]);
    assert!(config.otlp_listen.is_some_and(|a| a.ip().is_loopback()));
    let file = yaml("otlp_listen: 4317\n");
    let config = ok(&["--config", path_of(&file)]);
    assert!(config.otlp_listen.is_some_and(|a| a.ip().is_loopback()));
    assert!(
        !ok(&["--http-address", "0.0.0.0:7071"])
            .http_address
            .ip()
            .is_loopback()
    );
}

#[test]
fn privileges_and_the_http_endpoint() {
    let config = ok(&[]);
    assert_eq!(config.user, None);
    assert!(!config.keep_capabilities);
    assert_eq!(config.http_bearer_token_file, None);
    assert_eq!(config.http_tls, None);
    let config = ok(&[
        "--user",
        "nobody",
        "--keep-capabilities",
        "--http-bearer-token-file",
        "/etc/icecore/http-token",
        "--http-tls-cert",
        "/etc/icecore/cert.pem",
        "--http-tls-key",
        "/etc/icecore/key.pem",
    ]);
    assert_eq!(config.user.as_deref(), Some("nobody"));
    assert!(config.keep_capabilities);
    assert_eq!(
        config.http_bearer_token_file,
        Some(PathBuf::from("/etc/icecore/http-token"))
    );
    let tls = config.http_tls.expect("TLS");
    assert_eq!(
        (tls.cert, tls.key),
        (
            PathBuf::from("/etc/icecore/cert.pem"),
            PathBuf::from("/etc/icecore/key.pem")
        )
    );
    let file = yaml(
        "user: 65534\nkeep_capabilities: true\nhttp_bearer_token_file: /t\nhttp_tls_cert: /c\nhttp_tls_key: /k\n",
    );
    let config = ok(&["--config", path_of(&file)]);
    assert_eq!(config.user.as_deref(), Some("65534"));
    assert!(config.keep_capabilities);
    assert!(config.http_tls.is_some());
    // A flag wins over the file.
    assert_eq!(
        ok(&["--config", path_of(&file), "--user", "daemon"])
            .user
            .as_deref(),
        Some("daemon")
    );
    assert!(err(&["--http-tls-cert", "/c"]).contains("http_tls_cert and http_tls_key go together"));
    assert!(err(&["--http-tls-key", "/k"]).contains("go together"));
    assert!(err(&["--user", "a b"]).contains("a user name or a numeric user ID"));
    assert!(err(&["--user", ""]).contains("--user"));
}
