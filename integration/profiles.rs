// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of what the profiles contain: drive the real `icecore` binary
//! against a C fixture with a known CPU profile, receive its OTLP output with an
//! in-test gRPC receiver, read its pprof files with an independent decoder, and
//! assert on the decoded content (process identity, sample rate, the fixture's
//! call chains and shares, threads, kernel stacks).
//!
//! Every test loads BPF programs and therefore needs root; without root it prints
//! why it is skipped and passes. The tests run one at a time (they hold
//! `support::serial()`), as each burns a CPU and measures sample rates.
//!
//!     sudo -E cargo test --release --test integration -- profiles:: --nocapture
//!
//! prints the measured numbers of each test.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use support::fixture::{self, FIXTURE_FUNCTIONS, Mode};
use support::run::run_icecore_on;
use support::summary::{
    self, DecodedSample, assert_only_pid, count_where, filtered, inclusive,
    looks_like_kernel_syscall_path, looks_like_symbol, pct, total,
};
use support::{HZ, otlp, pprof, require_root, serial};

/// Share of `hot_alpha` and `warm_beta` among samples containing either.
fn alpha_beta_shares(samples: &[DecodedSample]) -> (u64, f64, f64) {
    let alpha = inclusive(samples, "hot_alpha");
    let beta = inclusive(samples, "warm_beta");
    let either = count_where(samples, |s| {
        s.contains("hot_alpha") || s.contains("warm_beta")
    });
    (either, pct(alpha, either), pct(beta, either))
}

/// The samples of the thread named `thread`.
fn of_thread(samples: &[DecodedSample], thread: &str) -> Vec<DecodedSample> {
    filtered(samples, |smp| smp.thread_name.as_deref() == Some(thread))
}

#[test]
fn profiles_fixture_by_pid_to_otlp_and_pprof() {
    const TEST: &str = "profiles_fixture_by_pid_to_otlp_and_pprof";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let mut run = run_icecore_on(Mode::Cycle, &[], Duration::from_secs(8));
    let pid = run.pid();
    assert!(
        run.receiver.errors().is_empty(),
        "receiver errors: {:?}",
        run.receiver.errors()
    );

    // ---- OTLP ----
    let otlp::Received {
        requests,
        samples: otlp_samples,
    } = run.otlp();
    println!(
        "OTLP: {} requests, top stacks:\n{}",
        requests.len(),
        summary::top_stacks(&otlp_samples, 12)
    );

    // Only the fixture, with the right identity.
    assert_only_pid(
        &otlp_samples,
        pid,
        "OTLP samples of other processes (counts by pid)",
    );
    let host = support::host_name();
    for r in otlp::decode::resources(&requests) {
        let get = |k: &str| r.attributes.get(k).and_then(|v| v.as_str()).unwrap_or("");
        assert_eq!(get("process.executable.name"), fixture::EXE_NAME, "{r:?}");
        assert_eq!(
            get("process.executable.path"),
            run.target.exe.to_string_lossy(),
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
    run.cpu.stop();
    let cpu_seconds = run.cpu.cpu_seconds_between(first, last);
    let expected = HZ as f64 * cpu_seconds;
    let ice = &run.icecore;
    let run_secs = ice.run_seconds();
    println!(
        "samples received {received} vs expected {expected:.0} ({HZ} Hz x {cpu_seconds:.2} CPU-s the fixture ran \
         during the {span:.2} s sampled; {:.0} for the whole wall span; icecore ran {run_secs:.2} s)",
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
        received <= 1.25 * HZ as f64 * run_secs,
        "more samples than {HZ} Hz x {run_secs:.2} s"
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
        smp.user_names()
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
        smp.user_names().first() == Some(&"spin_cpu")
    });
    let exact = count_where(&otlp_samples, |smp| {
        let names = smp.user_names();
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
            smp.kernel_frames_are_leafward(),
            "kernel frame rootward of a user frame: {}",
            smp.folded()
        );
    }
    println!("frame types (weighted by samples): {kinds:?}");

    // ---- pprof ----
    pprof::assert_only_pprof_files(&run.pprof_dir);
    let pprof::Written {
        profiles,
        samples: pprof_samples,
    } = run.pprof();
    assert!(
        !profiles.is_empty(),
        "no *.pb.gz in {}",
        run.pprof_dir.display()
    );
    println!(
        "pprof: {} files, top stacks:\n{}",
        profiles.len(),
        summary::top_stacks(&pprof_samples, 8)
    );
    assert_only_pid(
        &pprof_samples,
        pid,
        "pprof samples of other processes (counts by pid)",
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
    let p_in_fixture = |smp: &DecodedSample| {
        smp.leaf()
            .is_some_and(|f| FIXTURE_FUNCTIONS.contains(&f.function.as_str()))
    };
    let p_with_main = count_where(&pprof_samples, |smp| {
        p_in_fixture(smp) && smp.contains("main")
    });
    let p_leaf_in_fixture = count_where(&pprof_samples, p_in_fixture);
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
    let run = run_icecore_on(Mode::Threads, &[], Duration::from_secs(6));
    let pid = run.pid();

    let samples = run.otlp().samples;
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
        let mine = of_thread(&samples, thread);
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
    pprof::assert_only_pprof_files(&run.pprof_dir);
    let psamples = run.pprof().samples;
    let pall = total(&psamples);
    for (thread, own) in [("worker-a", "worker_a_main"), ("worker-b", "worker_b_main")] {
        let mine = of_thread(&psamples, thread);
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
fn kernel_stacks_are_symbolized() {
    const TEST: &str = "kernel_stacks_are_symbolized";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let run = run_icecore_on(Mode::Syscalls, &[], Duration::from_secs(6));

    let samples = run.otlp().samples;
    println!("OTLP top stacks:\n{}", summary::top_stacks(&samples, 12));
    let all = total(&samples);
    let kernel = filtered(&samples, |smp| smp.stack.iter().any(|f| f.is_kernel()));
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
            smp.kernel_frames_are_leafward(),
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
        let user = smp.user_names();
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
    let psamples = run.pprof().samples;
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
