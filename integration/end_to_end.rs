// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests: drive the real `icecore` binary against a C fixture with a
//! known CPU profile, receive its OTLP output with an in-test gRPC receiver, read
//! its pprof files with an independent decoder, and assert on the decoded content.
//!
//! Every test except `bad_flag_names_the_setting` loads BPF programs and therefore
//! needs root; without root it prints why it is skipped and passes. The root tests
//! run one at a time (they hold `support::serial()`), as each burns a CPU and
//! measures sample rates.
//!
//!     sudo -E cargo test --test end_to_end -- --nocapture
//!
//! prints the measured numbers of each test.

// Test code: a panic is how a helper reports a failed expectation.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::fixture::{self, CpuTracker, FIXTURE_FUNCTIONS, Fixture, Mode};
use support::receiver::OtlpReceiver;
use support::summary::{self, DecodedSample, count_where, inclusive, pct, total};
use support::{HZ, Icecore, otlp, pprof, require_root, serial};

/// Slack on top of `--duration` for BPF loading, symbolization and the final flush.
const EXIT_GRACE: Duration = Duration::from_secs(40);

fn s(x: impl ToString) -> String {
    x.to_string()
}

/// Common flags: the fixture's pid, 97 Hz, 2 s intervals, no HTTP port clash.
fn base_args(pid: u32) -> Vec<String> {
    vec![
        s("--pid"),
        s(pid),
        s("--sampling-frequency"),
        s(HZ),
        s("--reporter-interval"),
        s("2s"),
        s("--http-address"),
        s("127.0.0.1:0"),
    ]
}

fn make_dir(path: &Path) {
    std::fs::create_dir_all(path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
}

/// Frames that are not kernel frames (the user-space part of a stack), leaf first.
fn user_names(sample: &DecodedSample) -> Vec<&str> {
    sample
        .stack
        .iter()
        .filter(|f| !f.is_kernel())
        .map(|f| f.function.as_str())
        .collect()
}

/// True when no kernel frame follows (is rootward of) a user frame.
fn kernel_frames_are_leafward(sample: &DecodedSample) -> bool {
    let mut seen_user = false;
    for f in &sample.stack {
        if f.is_kernel() {
            if seen_user {
                return false;
            }
        } else {
            seen_user = true;
        }
    }
    true
}

fn looks_like_kernel_syscall_path(name: &str) -> bool {
    name.contains("sys_") || name.contains("entry_SYSCALL") || name.contains("do_syscall")
}

/// A kernel symbol: non-empty, not a raw address, identifier-like characters.
fn looks_like_symbol(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with("0x")
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '@'))
}

/// Every file in the pprof dir must be a finished `*.pb.gz` (they are written to a
/// temporary name and renamed, so no partial file may remain after exit).
fn assert_only_pprof_files(dir: &Path) {
    let strays: Vec<_> = pprof::dir_entries(dir)
        .into_iter()
        .filter(|p| !p.to_string_lossy().ends_with(".pb.gz"))
        .collect();
    assert!(
        strays.is_empty(),
        "unexpected files left in the pprof dir: {strays:?}"
    );
}

/// Share of `hot_alpha` and `warm_beta` among samples containing either.
fn alpha_beta_shares(samples: &[DecodedSample]) -> (u64, f64, f64) {
    let alpha = inclusive(samples, "hot_alpha");
    let beta = inclusive(samples, "warm_beta");
    let either = count_where(samples, |s| {
        s.contains("hot_alpha") || s.contains("warm_beta")
    });
    (either, pct(alpha, either), pct(beta, either))
}

#[test]
fn profiles_fixture_by_pid_to_otlp_and_pprof() {
    const TEST: &str = "profiles_fixture_by_pid_to_otlp_and_pprof";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = tempfile::tempdir().expect("tempdir");
    let exe = fixture::build(tmp.path());
    let mut fx = Fixture::spawn(&exe, Mode::Cycle);
    let pid = fx.pid();
    let mut cpu = CpuTracker::start(pid);
    let receiver = OtlpReceiver::start();
    let pprof_dir = tmp.path().join("pprof");
    make_dir(&pprof_dir);

    let mut args = base_args(pid);
    args.extend([
        s("--otlp-endpoint"),
        receiver.endpoint(),
        s("--pprof-dir"),
        s(pprof_dir.display()),
        s("--duration"),
        s("8s"),
    ]);
    let mut ice = Icecore::spawn(&args, tmp.path());
    ice.wait_exit(Duration::from_secs(8) + EXIT_GRACE);
    println!("{}", ice.logs());
    ice.assert_success();
    assert!(fx.is_running(), "the fixture died during the test");
    assert!(
        receiver.errors().is_empty(),
        "receiver errors: {:?}",
        receiver.errors()
    );

    // ---- OTLP ----
    let requests = receiver.requests();
    otlp::assert_valid(&requests, HZ);
    let otlp_samples = otlp::samples(&requests);
    println!(
        "OTLP: {} requests, top stacks:\n{}",
        requests.len(),
        summary::top_stacks(&otlp_samples, 12)
    );

    // Only the fixture, with the right identity.
    let pids = summary::by_pid(&otlp_samples);
    assert_eq!(
        pids.keys().copied().collect::<Vec<_>>(),
        vec![Some(pid as i64)],
        "OTLP samples of other processes (counts by pid): {pids:?}"
    );
    let host = support::host_name();
    for r in otlp::resources(&requests) {
        let get = |k: &str| r.attributes.get(k).and_then(|v| v.as_str()).unwrap_or("");
        assert_eq!(get("process.executable.name"), fixture::EXE_NAME, "{r:?}");
        assert_eq!(
            get("process.executable.path"),
            exe.to_string_lossy(),
            "{r:?}"
        );
        assert_eq!(get("host.name"), host, "{r:?}");
        println!("resource: service.name={:?}", get("service.name"));
    }
    for smp in &otlp_samples {
        assert_eq!(
            smp.thread_name.as_deref(),
            Some(fixture::EXE_NAME),
            "{smp:?}"
        );
        assert_eq!(smp.thread_id, Some(pid as i64), "{smp:?}");
    }

    // Sample rate: the fixture's single thread gets HZ samples per second it spends
    // on a CPU. Between the first and the last sample that is (nearly) every
    // second on an idle machine; its measured CPU time keeps this exact under load.
    let timestamps: Vec<u64> = otlp_samples
        .iter()
        .flat_map(|s| s.timestamps.iter().copied())
        .collect();
    let first = *timestamps.iter().min().expect("no timestamps");
    let last = *timestamps.iter().max().expect("no timestamps");
    let span = (last - first) as f64 / 1e9;
    let received = timestamps.len() as f64;
    cpu.stop();
    let cpu_seconds = cpu.cpu_seconds_between(first, last);
    let expected = HZ as f64 * cpu_seconds;
    let run = ice.run_seconds();
    println!(
        "samples received {received} vs expected {expected:.0} ({HZ} Hz x {cpu_seconds:.2} CPU-s the fixture ran \
         during the {span:.2} s sampled; {:.0} for the whole wall span; icecore ran {run:.2} s)",
        HZ as f64 * span
    );
    let slack = 1_000_000_000;
    assert!(
        first + slack >= ice.started_unix_nanos && last <= ice.exited_unix_nanos() + slack,
        "timestamps [{first}, {last}] are outside icecore's run [{}, {}] (not Unix epoch ns?)",
        ice.started_unix_nanos,
        ice.exited_unix_nanos()
    );
    assert!(
        span >= 4.0,
        "samples span only {span:.2} s of an 8 s run: intervals lost or sampling stopped early"
    );
    assert!(
        (received - expected).abs() <= 0.25 * expected,
        "received {received} samples, expected {expected:.0} +-25% ({HZ} Hz x {cpu_seconds:.2} CPU-s)"
    );
    assert!(
        received <= 1.25 * HZ as f64 * run,
        "more samples than {HZ} Hz x {run:.2} s"
    );

    // The built-in 3:1 split.
    let (either, alpha, beta) = alpha_beta_shares(&otlp_samples);
    println!(
        "OTLP shares: hot_alpha {alpha:.1}%, warm_beta {beta:.1}% of {either} samples (expected 75/25)"
    );
    assert!(
        either as f64 >= 0.8 * received,
        "only {either} of {received} samples contain hot_alpha or warm_beta: symbolization or unwinding is broken"
    );
    assert!(
        (alpha - 75.0).abs() <= 5.0,
        "hot_alpha share {alpha:.1}%, expected 75 +-5"
    );
    assert!(
        (beta - 25.0).abs() <= 5.0,
        "warm_beta share {beta:.1}%, expected 25 +-5"
    );

    // Complete, leaf-first stacks.
    let in_fixture = |smp: &DecodedSample| {
        user_names(smp)
            .first()
            .is_some_and(|leaf| FIXTURE_FUNCTIONS.contains(leaf))
    };
    let leaf_in_fixture = count_where(&otlp_samples, in_fixture);
    let with_main = count_where(&otlp_samples, |smp| in_fixture(smp) && smp.contains("main"));
    println!(
        "leaf in fixture: {leaf_in_fixture} samples, {:.1}% of them reach main",
        pct(with_main, leaf_in_fixture)
    );
    assert!(
        leaf_in_fixture as f64 >= 0.5 * received,
        "only {leaf_in_fixture} of {received} samples have a fixture function as leaf"
    );
    assert!(
        pct(with_main, leaf_in_fixture) >= 95.0,
        "only {with_main} of {leaf_in_fixture} fixture-leaf samples have main in the stack"
    );
    let spin_leaf = count_where(&otlp_samples, |smp| {
        user_names(smp).first() == Some(&"spin_cpu")
    });
    let exact = count_where(&otlp_samples, |smp| {
        let names = user_names(smp);
        names.starts_with(&["spin_cpu", "alpha_inner", "hot_alpha", "run_cycle", "main"])
            || names.starts_with(&["spin_cpu", "beta_inner", "warm_beta", "run_cycle", "main"])
    });
    println!(
        "spin_cpu leaf: {spin_leaf} samples, {:.1}% with the exact call chain",
        pct(exact, spin_leaf)
    );
    assert!(
        spin_leaf > 0 && pct(exact, spin_leaf) >= 90.0,
        "of {spin_leaf} samples with leaf spin_cpu only {exact} have the stack spin_cpu <- *_inner <- hot_alpha|warm_beta <- run_cycle <- main (leaf first)"
    );

    // Frame types.
    let mut kinds: BTreeMap<Option<String>, u64> = BTreeMap::new();
    for smp in &otlp_samples {
        for f in &smp.stack {
            *kinds.entry(f.kind.clone()).or_default() += smp.count;
            if FIXTURE_FUNCTIONS.contains(&f.function.as_str()) {
                assert_eq!(f.kind.as_deref(), Some("native"), "fixture frame {f:?}");
            }
            assert!(
                matches!(f.kind.as_deref(), Some("native" | "kernel")),
                "frame {f:?} is neither native nor kernel"
            );
        }
        assert!(
            kernel_frames_are_leafward(smp),
            "kernel frame rootward of a user frame: {}",
            smp.folded()
        );
    }
    println!("frame types (weighted by samples): {kinds:?}");

    // ---- pprof ----
    assert_only_pprof_files(&pprof_dir);
    let profiles = pprof::decode_dir(&pprof_dir);
    assert!(
        !profiles.is_empty(),
        "no *.pb.gz in {}",
        pprof_dir.display()
    );
    pprof::assert_valid(&profiles, HZ);
    let pprof_samples = pprof::all_samples(&profiles);
    println!(
        "pprof: {} files, top stacks:\n{}",
        profiles.len(),
        summary::top_stacks(&pprof_samples, 8)
    );
    let ppids = summary::by_pid(&pprof_samples);
    assert_eq!(
        ppids.keys().copied().collect::<Vec<_>>(),
        vec![Some(pid as i64)],
        "pprof samples of other processes (counts by pid): {ppids:?}"
    );
    for smp in &pprof_samples {
        assert_eq!(
            smp.comm.as_deref(),
            Some(fixture::EXE_NAME),
            "pprof comm label: {smp:?}"
        );
        assert_eq!(
            smp.thread_name.as_deref(),
            Some(fixture::EXE_NAME),
            "pprof thread label: {smp:?}"
        );
    }
    let (p_either, p_alpha, p_beta) = alpha_beta_shares(&pprof_samples);
    println!("pprof shares: hot_alpha {p_alpha:.1}%, warm_beta {p_beta:.1}% of {p_either} samples");
    assert!(
        (p_alpha - 75.0).abs() <= 5.0,
        "pprof hot_alpha share {p_alpha:.1}%"
    );
    assert!(
        (p_beta - 25.0).abs() <= 5.0,
        "pprof warm_beta share {p_beta:.1}%"
    );
    let p_with_main = count_where(&pprof_samples, |smp| {
        smp.leaf()
            .is_some_and(|f| FIXTURE_FUNCTIONS.contains(&f.function.as_str()))
            && smp.contains("main")
    });
    let p_leaf_in_fixture = count_where(&pprof_samples, |smp| {
        smp.leaf()
            .is_some_and(|f| FIXTURE_FUNCTIONS.contains(&f.function.as_str()))
    });
    assert!(
        pct(p_with_main, p_leaf_in_fixture) >= 95.0,
        "pprof: only {p_with_main} of {p_leaf_in_fixture} fixture-leaf samples reach main"
    );

    // ---- both sinks saw the same batches ----
    let (t_otlp, t_pprof) = (total(&otlp_samples), total(&pprof_samples));
    let (a_otlp, a_pprof) = (
        inclusive(&otlp_samples, "hot_alpha"),
        inclusive(&pprof_samples, "hot_alpha"),
    );
    println!(
        "totals: OTLP {t_otlp} vs pprof {t_pprof}; hot_alpha OTLP {a_otlp} vs pprof {a_pprof}; {} requests vs {} files",
        requests.len(),
        profiles.len()
    );
    assert!(
        t_otlp.abs_diff(t_pprof) <= 3,
        "OTLP total {t_otlp} != pprof total {t_pprof}"
    );
    assert!(
        a_otlp.abs_diff(a_pprof) <= 3,
        "hot_alpha: OTLP {a_otlp} != pprof {a_pprof}"
    );
}

#[test]
fn threads_are_attributed() {
    const TEST: &str = "threads_are_attributed";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = tempfile::tempdir().expect("tempdir");
    let exe = fixture::build(tmp.path());
    let mut fx = Fixture::spawn(&exe, Mode::Threads);
    let pid = fx.pid();
    let receiver = OtlpReceiver::start();
    let pprof_dir = tmp.path().join("pprof");
    make_dir(&pprof_dir);
    let mut args = base_args(pid);
    args.extend([
        s("--otlp-endpoint"),
        receiver.endpoint(),
        s("--pprof-dir"),
        s(pprof_dir.display()),
        s("--duration"),
        s("6s"),
    ]);
    let mut ice = Icecore::spawn(&args, tmp.path());
    ice.wait_exit(Duration::from_secs(6) + EXIT_GRACE);
    println!("{}", ice.logs());
    ice.assert_success();
    assert!(fx.is_running(), "the fixture died during the test");

    let requests = receiver.requests();
    otlp::assert_valid(&requests, HZ);
    let samples = otlp::samples(&requests);
    println!("OTLP top stacks:\n{}", summary::top_stacks(&samples, 10));
    let all = total(&samples);
    assert!(all > 0, "no samples");

    let mut tids: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for smp in &samples {
        assert_eq!(
            smp.pid,
            Some(pid as i64),
            "sample of another process: {smp:?}"
        );
        let name = smp.thread_name.clone().unwrap_or_default();
        tids.entry(name.clone()).or_default().extend(smp.thread_id);
        *counts.entry(name).or_default() += smp.count;
    }
    println!("samples by thread name: {counts:?}; thread ids: {tids:?}");
    for (thread, own, other) in [
        ("worker-a", "worker_a_main", "worker_b_main"),
        ("worker-b", "worker_b_main", "worker_a_main"),
    ] {
        let n = counts.get(thread).copied().unwrap_or(0);
        assert!(
            pct(n, all) >= 25.0,
            "{thread} has {n} of {all} samples; both workers burn a CPU each"
        );
        let ids = tids.get(thread).cloned().unwrap_or_default();
        assert_eq!(
            ids.len(),
            1,
            "{thread} samples carry thread ids {ids:?}, expected exactly one"
        );
        assert!(
            !ids.contains(&(pid as i64)),
            "{thread} has the main thread's id {pid}"
        );
        let mine: Vec<DecodedSample> = samples
            .iter()
            .filter(|smp| smp.thread_name.as_deref() == Some(thread))
            .cloned()
            .collect();
        let with_own = inclusive(&mine, own);
        let with_other = inclusive(&mine, other);
        println!(
            "{thread}: {n} samples, {:.1}% contain {own}, {with_other} contain {other}",
            pct(with_own, n)
        );
        assert!(
            pct(with_own, n) >= 90.0,
            "only {with_own} of {n} {thread} samples contain {own}"
        );
        assert_eq!(
            with_other, 0,
            "{thread} samples contain the other thread's function {other}"
        );
    }
    assert_ne!(
        tids.get("worker-a"),
        tids.get("worker-b"),
        "worker-a and worker-b share a thread id"
    );

    // pprof carries the same attribution in its `thread` label.
    assert_only_pprof_files(&pprof_dir);
    let profiles = pprof::decode_dir(&pprof_dir);
    pprof::assert_valid(&profiles, HZ);
    let psamples = pprof::all_samples(&profiles);
    let pall = total(&psamples);
    for (thread, own) in [("worker-a", "worker_a_main"), ("worker-b", "worker_b_main")] {
        let mine: Vec<DecodedSample> = psamples
            .iter()
            .filter(|smp| smp.thread_name.as_deref() == Some(thread))
            .cloned()
            .collect();
        let n = total(&mine);
        let with_own = inclusive(&mine, own);
        println!("pprof {thread}: {n} of {pall} samples, {with_own} contain {own}");
        assert!(
            pct(n, pall) >= 25.0,
            "pprof: {thread} has {n} of {pall} samples"
        );
        assert!(
            pct(with_own, n) >= 90.0,
            "pprof: only {with_own} of {n} {thread} samples contain {own}"
        );
    }
    assert!(
        all.abs_diff(pall) <= 3,
        "OTLP total {all} != pprof total {pall}"
    );
}

#[test]
fn sigterm_flushes_and_exits_zero() {
    const TEST: &str = "sigterm_flushes_and_exits_zero";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = tempfile::tempdir().expect("tempdir");
    let exe = fixture::build(tmp.path());
    let mut fx = Fixture::spawn(&exe, Mode::Cycle);
    let pid = fx.pid();
    let mut cpu = CpuTracker::start(pid);
    let receiver = OtlpReceiver::start();
    let pprof_dir = tmp.path().join("pprof");
    make_dir(&pprof_dir);
    let mut args = base_args(pid);
    args.extend([
        s("--otlp-endpoint"),
        receiver.endpoint(),
        s("--pprof-dir"),
        s(pprof_dir.display()),
    ]);
    let mut ice = Icecore::spawn(&args, tmp.path());

    // Wait for a regular interval to be exported, then signal about 1 s after the
    // latest export: the next regular export is then still ~1 s away, so samples
    // taken after that latest export can only arrive through the shutdown flush.
    assert!(
        receiver.wait_for_requests(1, Duration::from_secs(30)),
        "no OTLP request within 30 s\n{}",
        ice.logs()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let last_regular = loop {
        let last = receiver
            .requests()
            .last()
            .map(|r| (r.arrived, r.arrived_unix_nanos))
            .expect("a request");
        if ice.started.elapsed() >= Duration::from_secs(4)
            && last.0.elapsed() >= Duration::from_millis(1000)
        {
            break last.1;
        }
        assert!(
            Instant::now() < deadline,
            "could not find a quiet moment between exports"
        );
        assert!(
            ice.wait_timeout(Duration::ZERO).is_none(),
            "icecore exited on its own\n{}",
            ice.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let requests_before = receiver.request_count();
    let signalled = support::now_unix_nanos();
    ice.signal(libc::SIGTERM);
    let status = ice.wait_exit(Duration::from_secs(30));
    println!("{}", ice.logs());
    println!(
        "SIGTERM after {:.2} s ({:.2} s after the latest regular export); exit status {status}",
        (signalled - ice.started_unix_nanos) as f64 / 1e9,
        (signalled - last_regular) as f64 / 1e9
    );
    ice.assert_success();
    assert!(fx.is_running(), "the fixture died during the test");

    let requests = receiver.requests();
    otlp::assert_valid(&requests, HZ);
    assert!(
        requests.len() > requests_before,
        "no OTLP export after SIGTERM ({} requests before, {} after)",
        requests_before,
        requests.len()
    );
    let samples = otlp::samples(&requests);
    let late: u64 = samples
        .iter()
        .flat_map(|smp| &smp.timestamps)
        .filter(|&&ts| ts > last_regular)
        .count() as u64;
    let window = (signalled - last_regular) as f64 / 1e9;
    cpu.stop();
    let expected = HZ as f64 * cpu.cpu_seconds_between(last_regular, signalled);
    println!(
        "samples after the latest regular export: {late} (window {window:.2} s, {expected:.0} expected)"
    );
    assert!(
        late > 0 && late as f64 >= 0.5 * expected,
        "only {late} samples from the last {window:.2} s before SIGTERM arrived: the final interval was not flushed"
    );

    assert_only_pprof_files(&pprof_dir);
    let profiles = pprof::decode_dir(&pprof_dir);
    pprof::assert_valid(&profiles, HZ);
    let newest = profiles.last().expect("no pprof files written");
    println!(
        "pprof: {} files; newest {} has {} samples",
        profiles.len(),
        newest.path.display(),
        total(&newest.samples)
    );
    assert!(
        total(&newest.samples) > 0,
        "the newest pprof file has no samples"
    );
    let (t_otlp, t_pprof) = (total(&samples), total(&pprof::all_samples(&profiles)));
    println!("totals: OTLP {t_otlp} vs pprof {t_pprof}");
    assert!(
        t_otlp.abs_diff(t_pprof) <= 3,
        "OTLP total {t_otlp} != pprof total {t_pprof}: the pprof sink missed the shutdown flush?"
    );
}

#[test]
fn yaml_config_file_drives_a_run() {
    const TEST: &str = "yaml_config_file_drives_a_run";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = tempfile::tempdir().expect("tempdir");
    let exe = fixture::build(tmp.path());
    let mut fx = Fixture::spawn(&exe, Mode::Cycle);
    let pid = fx.pid();
    let mut cpu = CpuTracker::start(pid);
    let pprof_dir = tmp.path().join("pprof-from-config");
    make_dir(&pprof_dir);
    let config = tmp.path().join("icecore.yaml");
    std::fs::write(
        &config,
        format!(
            "# icecore end-to-end test configuration\n\
             pids:\n  - {pid}\n\
             sampling_frequency: {HZ}\n\
             reporter_interval: 2s\n\
             duration: 7s\n\
             pprof_dir: \"{}\"\n\
             http_address: \"127.0.0.1:0\"\n\
             log_level: info\n",
            pprof_dir.display()
        ),
    )
    .expect("write config");
    println!(
        "config:\n{}",
        std::fs::read_to_string(&config).unwrap_or_default()
    );

    let mut ice = Icecore::spawn(&[s("--config"), s(config.display())], tmp.path());
    ice.wait_exit(Duration::from_secs(7) + EXIT_GRACE);
    println!("{}", ice.logs());
    ice.assert_success();
    assert!(fx.is_running(), "the fixture died during the test");
    let run = ice.run_seconds();

    assert_only_pprof_files(&pprof_dir);
    let profiles = pprof::decode_dir(&pprof_dir);
    pprof::assert_valid(&profiles, HZ);
    let samples = pprof::all_samples(&profiles);
    let n = total(&samples);
    cpu.stop();
    let expected =
        HZ as f64 * cpu.cpu_seconds_between(ice.started_unix_nanos, ice.exited_unix_nanos());
    println!(
        "icecore ran {run:.2} s; {} pprof files; {n} samples ({expected:.0} at {HZ} Hz over the fixture's CPU time in the run)",
        profiles.len(),
    );
    // duration: 7s
    assert!(
        run >= 6.5,
        "icecore stopped after {run:.2} s, config says duration 7s"
    );
    // reporter_interval: 2s -> about 4 files in 7 s (a 5 s default would give 2)
    assert!(
        profiles.len() >= 3,
        "{} pprof files in a 7 s run with reporter_interval 2s",
        profiles.len()
    );
    // sampling_frequency: 97
    let period = (1e9 / HZ as f64).round() as i64;
    for p in &profiles {
        assert!(
            (p.period - period).abs() <= 1,
            "{}: period {} ns, config says {HZ} Hz ({period} ns)",
            p.path.display(),
            p.period
        );
    }
    // (a lower bound of 50 %: the run includes BPF loading before sampling starts;
    // the 19 Hz default would give 20 %)
    assert!(
        n as f64 >= 0.5 * expected && n as f64 <= 1.25 * expected,
        "{n} samples does not match {HZ} Hz ({expected:.0} expected)"
    );
    // pids: [fixture]
    let pids = summary::by_pid(&samples);
    assert_eq!(
        pids.keys().copied().collect::<Vec<_>>(),
        vec![Some(pid as i64)],
        "samples of other processes (config pids lists only the fixture): {pids:?}"
    );
    assert!(inclusive(&samples, "hot_alpha") > 0, "no hot_alpha samples");
    let logs = format!("{}{}", ice.stdout(), ice.stderr());
    println!(
        "logs mention the pprof dir: {}",
        logs.contains(&pprof_dir.display().to_string())
    );
}

/// The pprof directory icecore falls back to when no sink is configured.
const DEFAULT_PPROF_DIR: &str = "/var/lib/icecore/pprof";

/// Runs its arguments (`OUT icecore ARGS…`) with a tmpfs over /var/lib, then copies
/// whatever icecore wrote to the default pprof dir into OUT. Used under
/// `unshare --mount`, so the machine's /var/lib is never touched.
const PRIVATE_VAR_LIB: &str = r#"mount -t tmpfs -o size=64m,mode=0755 icecore-e2e /var/lib || exit 97
out=$1
shift
"$@"
rc=$?
if [ -d /var/lib/icecore/pprof ]; then cp -a /var/lib/icecore/pprof/. "$out"/ || exit 98; fi
exit $rc"#;

fn dir_listing(path: &str) -> Option<Vec<String>> {
    std::fs::read_dir(path).ok().map(|rd| {
        let mut v: Vec<String> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    })
}

#[test]
fn default_sink_writes_pprof_and_says_where() {
    const TEST: &str = "default_sink_writes_pprof_and_says_where";
    if !require_root(TEST) {
        return;
    }
    if std::process::Command::new("unshare")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("skipping {TEST}: needs unshare (util-linux) to hide /var/lib");
        return;
    }
    let _serial = serial();
    let tmp = tempfile::tempdir().expect("tempdir");
    let exe = fixture::build(tmp.path());
    let mut fx = Fixture::spawn(&exe, Mode::Cycle);
    let pid = fx.pid();
    let out = tmp.path().join("copied-default-pprof");
    make_dir(&out);
    let host_before = dir_listing(DEFAULT_PPROF_DIR);

    // No --otlp-endpoint, no --pprof-dir: the default sink.
    let mut args = base_args(pid);
    args.extend([s("--duration"), s("4s")]);
    let wrapper = [
        s("unshare"),
        s("--mount"),
        s("--propagation"),
        s("private"),
        s("--"),
        s("sh"),
        s("-c"),
        s(PRIVATE_VAR_LIB),
        s("sh"),
        s(out.display()),
    ];
    let mut ice = Icecore::spawn_wrapped(&wrapper, &args, tmp.path());
    let status = ice.wait_exit(Duration::from_secs(4) + EXIT_GRACE);
    println!("{}", ice.logs());
    assert_ne!(
        status.code(),
        Some(97),
        "could not mount a tmpfs over /var/lib in a private mount namespace"
    );
    assert_ne!(
        status.code(),
        Some(98),
        "could not copy the default pprof dir out"
    );
    ice.assert_success();
    assert!(fx.is_running(), "the fixture died during the test");

    let logs = format!("{}{}", ice.stdout(), ice.stderr());
    assert!(
        logs.contains(DEFAULT_PPROF_DIR),
        "icecore does not say that it writes to {DEFAULT_PPROF_DIR}"
    );
    let profiles = pprof::decode_dir(&out);
    pprof::assert_valid(&profiles, HZ);
    let samples = pprof::all_samples(&profiles);
    println!(
        "{} pprof files in the default dir, {} samples",
        profiles.len(),
        total(&samples)
    );
    assert!(
        !profiles.is_empty(),
        "no *.pb.gz written to {DEFAULT_PPROF_DIR}"
    );
    let pids = summary::by_pid(&samples);
    assert_eq!(
        pids.keys().copied().collect::<Vec<_>>(),
        vec![Some(pid as i64)],
        "samples of other processes: {pids:?}"
    );
    assert!(inclusive(&samples, "hot_alpha") > 0, "no hot_alpha samples");
    assert_eq!(
        dir_listing(DEFAULT_PPROF_DIR),
        host_before,
        "the machine's {DEFAULT_PPROF_DIR} changed: the test leaked out of its mount namespace"
    );
}

/// Runs icecore with arguments that must be rejected; returns its stderr.
fn rejected(args: &[String], dir: &Path) -> String {
    let mut ice = Icecore::spawn(args, dir);
    let status = ice.wait_exit(Duration::from_secs(30));
    let stderr = ice.stderr();
    println!("icecore {args:?} -> {status}\nstderr:\n{stderr}");
    assert!(
        status.code().is_some_and(|c| c != 0),
        "icecore {args:?} should fail with a non-zero exit code, got {status}\n{}",
        ice.logs()
    );
    stderr
}

#[test]
fn bad_flag_names_the_setting() {
    // Needs no root: icecore must reject the settings before loading anything.
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("pprof");
    make_dir(&out);
    // Valid companions, so that a binary that wrongly accepts the bad value stops
    // soon and writes only into the temp dir.
    let companions = [
        s("--pprof-dir"),
        s(out.display()),
        s("--duration"),
        s("2s"),
        s("--http-address"),
        s("127.0.0.1:0"),
    ];

    let mut args = companions.to_vec();
    args.extend([s("--sampling-frequency"), s("abc")]);
    let stderr = rejected(&args, tmp.path());
    assert!(
        stderr.contains("--sampling-frequency"),
        "stderr does not name --sampling-frequency:\n{stderr}"
    );

    let mut args = companions.to_vec();
    args.extend([s("--reporter-interval"), s("5parsecs")]);
    let stderr = rejected(&args, tmp.path());
    assert!(
        stderr.contains("--reporter-interval"),
        "stderr does not name --reporter-interval:\n{stderr}"
    );

    let config = tmp.path().join("typo.yaml");
    std::fs::write(
        &config,
        format!(
            "pprof_dir: \"{}\"\nduration: 2s\nhttp_address: \"127.0.0.1:0\"\nsamplng_frequency: 97\n",
            out.display()
        ),
    )
    .expect("write config");
    let stderr = rejected(&[s("--config"), s(config.display())], tmp.path());
    assert!(
        stderr.contains("samplng_frequency"),
        "stderr does not name the unknown config key samplng_frequency:\n{stderr}"
    );
}

#[test]
fn kernel_stacks_are_symbolized() {
    const TEST: &str = "kernel_stacks_are_symbolized";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = tempfile::tempdir().expect("tempdir");
    let exe = fixture::build(tmp.path());
    let mut fx = Fixture::spawn(&exe, Mode::Syscalls);
    let pid = fx.pid();
    let receiver = OtlpReceiver::start();
    let pprof_dir = tmp.path().join("pprof");
    make_dir(&pprof_dir);
    let mut args = base_args(pid);
    args.extend([
        s("--otlp-endpoint"),
        receiver.endpoint(),
        s("--pprof-dir"),
        s(pprof_dir.display()),
        s("--duration"),
        s("6s"),
    ]);
    let mut ice = Icecore::spawn(&args, tmp.path());
    ice.wait_exit(Duration::from_secs(6) + EXIT_GRACE);
    println!("{}", ice.logs());
    ice.assert_success();
    assert!(fx.is_running(), "the fixture died during the test");

    let requests = receiver.requests();
    otlp::assert_valid(&requests, HZ);
    let samples = otlp::samples(&requests);
    println!("OTLP top stacks:\n{}", summary::top_stacks(&samples, 12));
    let all = total(&samples);
    let kernel: Vec<DecodedSample> = samples
        .iter()
        .filter(|smp| smp.stack.iter().any(|f| f.is_kernel()))
        .cloned()
        .collect();
    let k = total(&kernel);
    println!(
        "{k} of {all} samples ({:.1}%) have kernel frames",
        pct(k, all)
    );
    // The fixture spends ~95 % of its time inside read(2) of /dev/zero.
    assert!(
        pct(k, all) >= 30.0,
        "only {k} of {all} samples have kernel frames"
    );

    for smp in &samples {
        assert!(
            kernel_frames_are_leafward(smp),
            "a kernel frame is rootward of a user frame (stacks are leaf first): {}",
            smp.folded()
        );
    }
    let (mut frames, mut named) = (0u64, 0u64);
    for smp in &kernel {
        for f in smp.stack.iter().filter(|f| f.is_kernel()) {
            frames += smp.count;
            if looks_like_symbol(&f.function) {
                named += smp.count;
            }
        }
    }
    println!(
        "kernel frames symbolized: {:.1}% of {frames}",
        pct(named, frames)
    );
    assert!(
        pct(named, frames) >= 95.0,
        "only {named} of {frames} kernel frames have symbol-like names"
    );

    let syscall_path = count_where(&kernel, |smp| {
        smp.stack
            .iter()
            .any(|f| f.is_kernel() && looks_like_kernel_syscall_path(&f.function))
    });
    let caller_ok = count_where(&kernel, |smp| {
        let user = user_names(smp);
        user.first() == Some(&"read_zero_syscall") && user.contains(&"main")
    });
    let read_zero = count_where(&kernel, |smp| smp.contains("read_zero"));
    println!(
        "kernel samples: {:.1}% through a syscall entry, {:.1}% below read_zero_syscall <- ... <- main, {read_zero} in read_zero",
        pct(syscall_path, k),
        pct(caller_ok, k)
    );
    assert!(
        pct(syscall_path, k) >= 80.0,
        "only {syscall_path} of {k} kernel samples show a *sys_*/entry_SYSCALL*/do_syscall* frame"
    );
    assert!(
        pct(caller_ok, k) >= 80.0,
        "only {caller_ok} of {k} kernel samples continue into read_zero_syscall ... main in user space"
    );

    // pprof has the same kernel frames, also leafward of the user frames.
    let profiles = pprof::decode_dir(&pprof_dir);
    pprof::assert_valid(&profiles, HZ);
    let psamples = pprof::all_samples(&profiles);
    let pall = total(&psamples);
    let p_ok = count_where(&psamples, |smp| {
        let names = smp.names();
        let sys = names.iter().position(|n| looks_like_kernel_syscall_path(n));
        let user = names.iter().position(|n| *n == "read_zero_syscall");
        matches!((sys, user), (Some(a), Some(b)) if a < b)
    });
    println!("pprof: {p_ok} of {pall} samples have a syscall frame leafward of read_zero_syscall");
    assert!(
        pct(p_ok, pall) >= 0.8 * pct(syscall_path, all),
        "pprof: only {p_ok} of {pall} samples have kernel syscall frames below read_zero_syscall"
    );
}

#[test]
fn unprivileged_run_says_what_it_needs() {
    const TEST: &str = "unprivileged_run_says_what_it_needs";
    // Root is needed to drop to an unprivileged user for the run.
    if !require_root(TEST) {
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        println!("skipping {TEST}: setpriv (util-linux) is not installed");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let drop_privileges = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
    ];
    let args = [
        s("--duration"),
        s("2s"),
        s("--http-address"),
        s("127.0.0.1:0"),
    ];
    let mut ice = Icecore::spawn_wrapped(&drop_privileges, &args, tmp.path());
    let status = ice.wait_exit(Duration::from_secs(10));
    let stderr = ice.stderr();
    assert!(
        !status.success(),
        "an unprivileged run must fail:\n{stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.ends_with("icecore needs root, or CAP_BPF + CAP_PERFMON + CAP_SYS_PTRACE")),
        "stderr lacks the privilege line:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "icecore panicked:\n{stderr}");
}
