// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of the exporters: the real `icecore` binary profiles a
//! fixture while its OTLP endpoint misbehaves, and what arrives is decoded
//! by the in-test receiver and compared with the pprof files written in the
//! same run. Outages of the endpoints are `outage.rs`'s.
//!
//! Needs root (it loads BPF programs); without root it prints why it is
//! skipped and passes.
//!
//!     sudo -E cargo test --release --test integration -- export:: --nocapture

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::fixture::Mode;
use support::python_otlp::PythonReceiver;
use support::receiver::OtlpReceiver;
use support::run::{EXIT_GRACE, Target, base_args_at, duration_args, s};
use support::summary::{inclusive, pct, total};
use support::{HZ, Icecore, pprof, require_root, serial};

/// The official Python bindings (PyPI `opentelemetry-proto`) receive the
/// export over gRPC and decode the same samples the pprof sink wrote.
#[test]
fn the_official_python_bindings_decode_the_export() {
    const TEST: &str = "the_official_python_bindings_decode_the_export";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    const RUN: Duration = Duration::from_secs(6);
    let target = Target::start(Mode::Cycle);
    let receiver = PythonReceiver::start(target.dir());
    let pprof_dir = target.make_subdir("pprof");
    let mut args = base_args_at(target.pid(), HZ);
    args.extend([
        s("--otlp-endpoint"),
        format!("http://127.0.0.1:{}", receiver.port),
        s("--service-name"),
        s("checkout"),
        s("--pprof-dir"),
        s(pprof_dir.display()),
    ]);
    args.extend(duration_args(RUN));
    let mut icecore = Icecore::spawn(&args, target.dir());
    icecore.wait_success(RUN + EXIT_GRACE);

    let written = pprof::read_valid(&pprof_dir, HZ);
    let summary = receiver.summary();
    println!("Python receiver decoded: {summary}");
    assert_eq!(summary["problems"], serde_json::json!([]));
    let samples = summary["samples"].as_u64().unwrap();
    assert_eq!(samples, total(&written.samples), "Python vs pprof totals");
    assert_eq!(
        summary["requests"].as_u64().unwrap(),
        written.profiles.len() as u64
    );
    let python = |f: &str| summary["inclusive"][f].as_u64().unwrap_or(0);
    for function in ["main", "hot_alpha", "warm_beta"] {
        assert_eq!(
            python(function),
            inclusive(&written.samples, function),
            "{function}: Python vs pprof"
        );
    }
    let alpha = pct(
        python("hot_alpha"),
        python("hot_alpha") + python("warm_beta"),
    );
    assert!((alpha - 75.0).abs() <= 5.0, "hot_alpha share {alpha:.1}%");
    let resources = summary["resources"].as_array().unwrap();
    assert!(!resources.is_empty());
    for resource in resources {
        assert_eq!(resource["service.name"], "checkout");
        assert_eq!(resource["process.pid"], i64::from(target.pid()));
    }
}

/// `--parca-endpoint`: a WriteRaw server built from Parca's proto receives
/// one labelled series per process per batch, holding the same samples as
/// the pprof files of the same run.
#[test]
fn parca_write_raw_receives_labelled_series() {
    const TEST: &str = "parca_write_raw_receives_labelled_series";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    const RUN: Duration = Duration::from_secs(6);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = support::parca::ParcaStore::default();
    let port = support::parca::serve(store.clone(), &runtime);
    let target = Target::start(Mode::Cycle);
    let pprof_dir = target.make_subdir("pprof");
    let mut args = base_args_at(target.pid(), HZ);
    args.extend([
        s("--parca-endpoint"),
        format!("http://127.0.0.1:{port}"),
        s("--pprof-dir"),
        s(pprof_dir.display()),
    ]);
    args.extend(duration_args(RUN));
    let mut icecore = Icecore::spawn(&args, target.dir());
    icecore.wait_success(RUN + EXIT_GRACE);

    let written = pprof::read_valid(&pprof_dir, HZ);
    let requests = store.requests.lock().unwrap().clone();
    let mut series = 0;
    for request in &requests {
        assert!(!request.normalized);
        for s in &request.series {
            series += 1;
            let labels = &s.labels.as_ref().unwrap().labels;
            let label = |name: &str| {
                labels
                    .iter()
                    .find(|l| l.name == name)
                    .map(|l| l.value.clone())
            };
            assert_eq!(label("__name__").as_deref(), Some("process_cpu"));
            assert_eq!(label("pid"), Some(target.pid().to_string()));
            assert_eq!(label("comm").as_deref(), Some("busy"));
        }
    }
    let parca_samples = total(&support::parca::samples(&requests));
    println!(
        "Parca got {series} series in {} requests, {parca_samples} samples; pprof files {}",
        requests.len(),
        total(&written.samples)
    );
    assert!(series >= 2);
    assert_eq!(parca_samples, total(&written.samples));
}

/// `GET /debug/pprof/profile?seconds=N` answers with a gzipped pprof of the
/// next N seconds, decodable by an independent pprof reader.
#[test]
fn pull_endpoint_serves_the_next_seconds_as_pprof() {
    const TEST: &str = "pull_endpoint_serves_the_next_seconds_as_pprof";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    const RUN: Duration = Duration::from_secs(14);
    const PULL_SECONDS: u64 = 4;
    let target = Target::start(Mode::Cycle);
    let pprof_dir = target.make_subdir("pprof");
    let mut args = base_args_at(target.pid(), HZ);
    args.extend([s("--pprof-dir"), s(pprof_dir.display())]);
    args.extend(duration_args(RUN));
    let mut icecore = Icecore::spawn(&args, target.dir());
    let addr = icecore.http_address(Duration::from_secs(20));
    let get = |query: &str, out: &Path| {
        let result = std::process::Command::new("curl")
            .args(["-s", "-o"])
            .arg(out)
            .args(["-w", "%{http_code}", "--max-time", "60"])
            .arg(format!("http://{addr}/debug/pprof/profile{query}"))
            .output()
            .expect("run curl");
        String::from_utf8_lossy(&result.stdout).to_string()
    };
    let bad = target.dir().join("bad");
    assert_eq!(get("?seconds=0", &bad), "400");
    assert_eq!(get("?seconds=ten", &bad), "400");
    let pulled = target.dir().join("pulled.pb.gz");
    let started = Instant::now();
    assert_eq!(get(&format!("?seconds={PULL_SECONDS}"), &pulled), "200");
    let took = started.elapsed();
    icecore.wait_success(RUN + EXIT_GRACE);

    let gz = std::fs::read(&pulled).unwrap();
    assert_eq!(gz[..2], [0x1f, 0x8b], "gzipped");
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gz.as_slice()), &mut raw).unwrap();
    let profile = pprof::decode_bytes(&raw, &pulled);
    pprof::assert_valid(std::slice::from_ref(&profile), HZ);
    let samples = pprof::all_samples(std::slice::from_ref(&profile));
    let n = total(&samples);
    let expected = PULL_SECONDS * u64::from(HZ);
    println!(
        "pulled {PULL_SECONDS} s in {took:?}: {n} samples (a busy CPU at {HZ} Hz: {expected})"
    );
    assert!(
        took >= Duration::from_secs(PULL_SECONDS),
        "answered before the window closed"
    );
    assert!(
        n as f64 >= expected as f64 * 0.8 && n as f64 <= expected as f64 * 1.1,
        "{n} samples for {expected} expected"
    );
    assert!(inclusive(&samples, "hot_alpha") > 0);
    assert!(
        samples
            .iter()
            .all(|s| s.pid == Some(i64::from(target.pid())))
    );
}

/// `go tool pprof -top` against the pull URL, as a user would run it: every
/// pull succeeds (symbol look-ups answered, the answer within the client's
/// 1.5 x seconds), the fixture's functions are named, and the `File:`
/// header is the profiled program.
#[test]
fn go_tool_pprof_reads_the_pull_endpoint() {
    const TEST: &str = "go_tool_pprof_reads_the_pull_endpoint";
    if !require_root(TEST) {
        return;
    }
    let Some(go) = support::required_go(TEST) else {
        return;
    };
    let _serial = serial();
    const RUN: Duration = Duration::from_secs(30);
    let target = Target::start(Mode::Cycle);
    let mut args = base_args_at(target.pid(), HZ);
    // The default 10 s interval: the pull must not wait for it.
    args.retain(|a| a != "--reporter-interval" && a != "2s");
    args.extend(duration_args(RUN));
    let mut icecore = Icecore::spawn(&args, target.dir());
    let addr = icecore.http_address(Duration::from_secs(20));
    let exe_name = target
        .exe
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    for attempt in 0..3 {
        let started = Instant::now();
        let out = support::go_command(&go, target.dir())
            .args(["tool", "pprof", "-top"])
            .arg(format!("http://{addr}/debug/pprof/profile?seconds=3"))
            .output()
            .expect("run go tool pprof");
        let took = started.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!(
            "pull {attempt}: exit {:?} in {took:?}\n{stdout}",
            out.status.code()
        );
        assert!(out.status.success(), "go tool pprof failed:\n{stderr}");
        assert!(
            stdout.contains("hot_alpha"),
            "the fixture's functions are named:\n{stdout}"
        );
        assert!(
            stdout.contains(&format!("File: {exe_name}")),
            "the File: header is the profiled program:\n{stdout}"
        );
        assert!(
            took < Duration::from_secs(4) + Duration::from_millis(500),
            "took {took:?}"
        );
    }
    icecore.signal(libc::SIGTERM);
    icecore.wait_success(EXIT_GRACE);
}

/// Credentials written into the endpoint URL are sent as basic auth and
/// appear in no log line, INFO or WARN (an unreachable endpoint logs it).
#[test]
fn credentials_in_the_endpoint_url_are_sent_and_never_logged() {
    const TEST: &str = "credentials_in_the_endpoint_url_are_sent_and_never_logged";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    const RUN: Duration = Duration::from_secs(6);
    let target = Target::start(Mode::Cycle);
    let receiver = OtlpReceiver::start();
    let with_credentials = receiver
        .endpoint()
        .replacen("http://", "http://alice:s3cr%40t@", 1);
    // A second run against a closed port, so the WARN path logs the URL too.
    let closed_port = support::net::HeldPort::hold();
    let closed = closed_port.address;
    for endpoint in [with_credentials, format!("http://alice:s3cr%40t@{closed}")] {
        let mut args = base_args_at(target.pid(), HZ);
        args.extend([s("--otlp-endpoint"), endpoint.clone()]);
        args.extend(duration_args(RUN));
        let mut icecore = Icecore::spawn(&args, target.dir());
        let status = icecore.wait_exit(RUN + EXIT_GRACE);
        let logs = icecore.logs();
        assert!(!logs.contains("s3cr"), "the password was logged:\n{logs}");
        assert!(!logs.contains("alice"), "the user name was logged:\n{logs}");
        if endpoint.contains(&closed.to_string()) {
            assert!(
                logs.contains("WARN"),
                "the unreachable endpoint was reported:\n{logs}"
            );
            assert!(
                !status.success(),
                "nothing reached the endpoint: exit 1\n{logs}"
            );
        } else {
            assert!(status.success(), "{logs}");
        }
    }
    let requests = receiver.requests();
    assert!(!requests.is_empty());
    for request in &requests {
        let auth = request
            .headers
            .iter()
            .find(|(k, _)| k == "authorization")
            .map(|(_, v)| v.as_str());
        // base64("alice:s3cr@t")
        assert_eq!(auth, Some("Basic YWxpY2U6czNjckB0"));
    }
}

/// `relabel_configs` and `external_labels` from a YAML config (and
/// `--command-line-attribute`): of two
/// programs running before the agent starts, a `drop` rule removes one and a
/// `keep` rule every other process on the host, in BPF (their samples never
/// reach the ring); `replace` and `labelmap` rules and the external label
/// name the kept one on OTLP (decoded by the official Python bindings) and
/// on Parca series.
#[test]
fn relabeling_names_kept_processes_and_drops_the_rest_in_bpf() {
    const TEST: &str = "relabeling_names_kept_processes_and_drops_the_rest_in_bpf";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    const RUN: Duration = Duration::from_secs(6);
    let tmp = support::native::temp_dir();
    let keep = support::native::compile_native_c(support::native::C_FLAGS, tmp.path(), "keepme");
    let drop_exe = tmp.path().join("dropme");
    std::fs::copy(&keep, &drop_exe).unwrap();
    let kept = support::fixture::Fixture::spawn_args(&keep, &["cycle", "60"]);
    // Runs (and is killed) with the test.
    let _dropped = support::fixture::Fixture::spawn_args(&drop_exe, &["cycle", "60"]);
    let config = tmp.path().join("icecore.yaml");
    std::fs::write(
        &config,
        "relabel_configs:\n\
         - source_labels: [__meta_process_executable_name]\n\
         \x20 regex: dropme\n\
         \x20 action: drop\n\
         - source_labels: [__meta_process_executable_name]\n\
         \x20 regex: (keep|drop)me\n\
         \x20 action: keep\n\
         - source_labels: [__meta_process_executable_name]\n\
         \x20 regex: (.*)me\n\
         \x20 target_label: service_name\n\
         \x20 replacement: svc-$1\n\
         - source_labels: [__meta_process_pid]\n\
         \x20 target_label: worker_pid\n\
         - action: labelmap\n\
         \x20 regex: __meta_system_(kernel_machine)\n\
         \x20 replacement: arch_$1\n\
         external_labels:\n\
         \x20 cluster: test-east\n",
    )
    .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = support::parca::ParcaStore::default();
    let port = support::parca::serve(store.clone(), &runtime);
    let receiver = PythonReceiver::start(tmp.path());
    let mut args = support::run::system_wide_args(HZ);
    args.extend([
        s("--config"),
        s(config.display()),
        s("--otlp-endpoint"),
        format!("http://127.0.0.1:{}", receiver.port),
        s("--parca-endpoint"),
        format!("http://127.0.0.1:{port}"),
        s("--command-line-attribute"),
    ]);
    args.extend(duration_args(RUN));
    let mut icecore = Icecore::spawn(&args, tmp.path());
    let metrics = icecore.metrics_after_next_batch(RUN);
    icecore.wait_success(RUN + EXIT_GRACE);
    let kept_pid = i64::from(kept.pid());
    let machine = std::env::consts::ARCH;

    let summary = receiver.summary();
    println!("{TEST}: Python receiver decoded: {summary}");
    assert_eq!(summary["problems"], serde_json::json!([]));
    let resources = summary["resources"].as_array().unwrap();
    assert!(!resources.is_empty(), "{TEST}: no OTLP resources");
    for resource in resources {
        assert_eq!(resource["process.pid"], kept_pid, "{TEST}: {resource}");
        assert_eq!(resource["service.name"], "svc-keep", "{TEST}: {resource}");
        assert_eq!(
            resource["worker_pid"],
            kept_pid.to_string(),
            "{TEST}: {resource}"
        );
        assert_eq!(
            resource["arch_kernel_machine"], machine,
            "{TEST}: {resource}"
        );
        assert_eq!(resource["cluster"], "test-east", "{TEST}: {resource}");
        assert_eq!(
            resource["process.command_line"],
            format!("{} cycle 60", keep.display()),
            "{TEST}: {resource}"
        );
        assert_eq!(resource["os.type"], "linux", "{TEST}: {resource}");
        let arch = if machine == "x86_64" {
            "amd64"
        } else {
            "arm64"
        };
        assert_eq!(resource["host.arch"], arch, "{TEST}: {resource}");
        assert!(
            resource.get("__meta_process_pid").is_none(),
            "{TEST}: meta labels leak: {resource}"
        );
    }
    let requests = store.requests.lock().unwrap().clone();
    let mut series = 0;
    for request in &requests {
        for series_ in &request.series {
            series += 1;
            let labels = &series_.labels.as_ref().unwrap().labels;
            let label = |name: &str| {
                labels
                    .iter()
                    .find(|l| l.name == name)
                    .map(|l| l.value.clone())
            };
            assert_eq!(label("pid"), Some(kept_pid.to_string()), "{labels:?}");
            assert_eq!(label("service_name").as_deref(), Some("svc-keep"));
            assert_eq!(label("worker_pid"), Some(kept_pid.to_string()));
            assert_eq!(label("arch_kernel_machine").as_deref(), Some(machine));
            assert_eq!(label("cluster").as_deref(), Some("test-east"));
        }
    }
    let filtered = metrics.bpf_event("filtered_out");
    let excluded_late = metrics.value("icecore_samples_excluded_total");
    println!(
        "{TEST}: {series} Parca series; BPF filtered out {filtered} samples of excluded \
         processes; {excluded_late} reached user space before their exclusion"
    );
    assert!(series >= 1, "{TEST}: no Parca series");
    // The dropped program alone burns a CPU at HZ for the whole run.
    assert!(
        filtered >= u64::from(HZ),
        "{TEST}: BPF filtered out {filtered} samples, the dropped program alone takes more"
    );
    assert_eq!(
        excluded_late, 0.0,
        "{TEST}: both programs ran before the start: none of their samples may reach the ring"
    );
}
