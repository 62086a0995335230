//! Settings written by mistake or by an attacker: files that never end or
//! nest without end, credentials inside URLs, negative numbers, and the
//! receiver and pprof-retention bounds.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::Write;
use std::time::{Duration, Instant};

use icecore_config::{Config, ConfigError};
use tempfile::NamedTempFile;

fn parse(args: &[&str]) -> Result<Config, ConfigError> {
    Config::from_args_and_env(
        std::iter::once("icecore").chain(args.iter().copied()),
        &|_| None,
    )
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

#[test]
fn endless_files_are_refused_after_a_mebibyte() {
    for device in ["/dev/zero", "/dev/urandom"] {
        let started = Instant::now();
        let message = err(&["--config", device]);
        assert!(
            message.contains(device) && message.contains("over 1024 KiB"),
            "{device}: {message}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{device} read for long"
        );
    }
    let big = yaml(&format!(
        "# {}\nsampling_frequency: 97\n",
        "x".repeat(1 << 20)
    ));
    let message = err(&["--config", big.path().to_str().unwrap()]);
    assert!(message.contains("over 1024 KiB"), "{message}");
}

#[test]
fn deep_nesting_is_refused_before_parsing() {
    let flow = yaml(&format!(
        "resource_attributes: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    ));
    let message = err(&["--config", flow.path().to_str().unwrap()]);
    assert!(message.contains("nested 100001 deep"), "{message}");
    let mut block = String::from("otlp_headers:\n");
    for level in 1..40 {
        block.push_str(&format!("{}k{level}:\n", " ".repeat(level)));
    }
    let block = yaml(&block);
    let message = err(&["--config", block.path().to_str().unwrap()]);
    assert!(message.contains("deep"), "{message}");
    // Quoted brackets and the settings' own nesting are fine.
    let fine = yaml(
        "service_name: \"[[[[[[[[[[[[[[[[[[[[\"\notlp_headers:\n  x-scope-orgid: '{{{{{{{{{{{{{{{{{{{'\npids: [1, 2]\n",
    );
    parse(&["--config", fine.path().to_str().unwrap()]).unwrap();
}

#[test]
fn credentials_in_an_endpoint_url_become_basic_auth_and_are_never_shown() {
    let config = parse(&["--otlp-endpoint", "http://alice:s3cr%40t@collector:4317"]).unwrap();
    let endpoint = config.otlp.as_ref().unwrap();
    assert_eq!(endpoint.url, "http://collector:4317");
    assert_eq!(
        endpoint.basic_auth.as_ref().unwrap().expose(),
        // base64("alice:s3cr@t")
        "Basic YWxpY2U6czNjckB0"
    );
    assert!(!format!("{config:?}").contains("s3cr"), "{config:?}");
    let message = err(&["--otlp-endpoint", "http://alice:s3cret@bad host:4317"]);
    assert!(!message.contains("s3cret"), "{message}");
    let file = yaml("parca_endpoint: \"ftp://bob:hunter2@parca:7070\"\n");
    let message = err(&["--config", file.path().to_str().unwrap()]);
    assert!(!message.contains("hunter2"), "{message}");
    let message = err(&[
        "--otlp-endpoint",
        "http://alice:s3cret@collector:4317",
        "--otlp-header",
        "Authorization=Bearer x",
    ]);
    assert!(message.contains("use one"), "{message}");
}

#[test]
fn negative_numbers_are_refused_naming_the_flag() {
    for (flag, value) in [
        ("--duration", "-5s"),
        ("--reporter-interval", "-10s"),
        ("--debug-info-memory", "-1MiB"),
        ("--otlp-listen-memory", "-1"),
        ("--pprof-max-files", "-3"),
        ("--pprof-max-bytes", "-3"),
        ("--export-queue-bytes", "-3"),
        ("--flamegraph-history", "-15m"),
        ("--flamegraph-max-bytes", "-1MiB"),
    ] {
        let message = err(&[flag, value]);
        assert!(
            message.starts_with(&format!("invalid {flag} \"{value}\"")),
            "{flag}: {message}"
        );
    }
}

#[test]
fn receiver_memory_and_pprof_retention() {
    let config = parse(&[]).unwrap();
    assert_eq!(config.otlp_listen_memory_bytes, 128 << 20);
    assert_eq!(config.pprof_max_files, 8640);
    assert_eq!(config.pprof_max_bytes, 1 << 30);
    let config = parse(&[
        "--otlp-listen-memory",
        "1GiB",
        "--pprof-max-files",
        "0",
        "--pprof-max-bytes",
        "64MiB",
    ])
    .unwrap();
    assert_eq!(config.otlp_listen_memory_bytes, 1 << 30);
    assert_eq!(config.pprof_max_files, 0);
    assert_eq!(config.pprof_max_bytes, 64 << 20);
    let file = yaml("otlp_listen_memory: 256MiB\npprof_max_files: 10\npprof_max_bytes: 1048576\n");
    let config = parse(&["--config", file.path().to_str().unwrap()]).unwrap();
    assert_eq!(config.otlp_listen_memory_bytes, 256 << 20);
    assert_eq!(config.pprof_max_files, 10);
    assert_eq!(config.pprof_max_bytes, 1 << 20);
    let message = err(&["--otlp-listen-memory", "4KiB"]);
    assert!(message.contains("from 1MiB"), "{message}");
}

#[test]
fn export_queue_bound() {
    let config = parse(&[]).unwrap();
    assert_eq!(config.export_queue_bytes, 320 << 20);
    let config = parse(&["--export-queue-bytes", "8KiB"]).unwrap();
    assert_eq!(config.export_queue_bytes, 8 << 10);
    let file = yaml("export_queue_bytes: 64MiB\n");
    let path = file.path().to_str().unwrap();
    let config = parse(&["--config", path]).unwrap();
    assert_eq!(config.export_queue_bytes, 64 << 20);
    // The flag wins over the file.
    let config = parse(&["--config", path, "--export-queue-bytes", "1GiB"]).unwrap();
    assert_eq!(config.export_queue_bytes, 1 << 30);
    let message = err(&["--export-queue-bytes", "lots"]);
    assert!(
        message.starts_with("invalid --export-queue-bytes \"lots\""),
        "{message}"
    );
    // A queue of nothing would drop every request.
    let message = err(&["--export-queue-bytes", "0"]);
    assert!(message.contains("0 would drop every request"), "{message}");
    let file = yaml("export_queue_bytes: 0\n");
    let message = err(&["--config", file.path().to_str().unwrap()]);
    assert!(message.contains("export_queue_bytes"), "{message}");
}
