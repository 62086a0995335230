// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of the CPython unwinder: a fixture with a known split
//! between Python functions (`fixtures/python_split.py`) runs under every
//! CPython of the machine (pyenv's 3.8–3.13, Debian's python3.11, and Debian
//! sid's 3.13–3.15 running in a chroot, like a container), each
//! started after the agent, and icecore's shares must be within 5 percentage
//! points of the built-in split and of py-spy's shares for the same process.
//! Threads must each get their own Python stack, and C code called from
//! Python (zlib) must appear under the Python function that called it.
//!
//! Every test loads BPF programs and needs root; without root it prints why it
//! is skipped and passes.
//!
//!     sudo -E cargo test --release --test integration -- python:: --test-threads=1 --nocapture

use crate::support;

use std::process::Child;
use std::thread::sleep;
use std::time::Duration;

use support::python::{Interpreter, PySpyRecord, interpreters, py_spy, spawn_fixture};
use support::run::SystemWideRun;
use support::summary::{DecodedSample, count_where, inclusive, of_pid_since, pct, total};
use support::{now_unix_nanos, require_root, serial, tmp, wait_fixtures};

/// High enough for about a thousand samples per fixture with nine sharing two CPUs.
const HZ: u32 = 499;
/// Fixture lifetime.
const FIXTURE_SECS: u32 = 14;
/// Samples before this are not evaluated: icecore describes a process to BPF
/// on its first sample, so its first stacks have no Python frames yet.
const WARM_UP: Duration = Duration::from_secs(3);
/// py-spy records from the end of the warm-up for this long.
const PY_SPY_SECS: u32 = 9;
const PY_SPY_HZ: u32 = 250;
/// hot_alpha's share of the split, in percent.
const ALPHA_PCT: f64 = 75.0;
const TOLERANCE_PP: f64 = 5.0;

/// hot_alpha's share of the samples in hot_alpha or warm_beta, and their number.
fn alpha_share(samples: &[DecodedSample]) -> (f64, u64) {
    let alpha = inclusive(samples, "hot_alpha");
    let beta = inclusive(samples, "warm_beta");
    (pct(alpha, alpha + beta), alpha + beta)
}

fn py_spy_share(stacks: &[(Vec<String>, u64)]) -> (f64, u64) {
    let with = |name: &str| -> u64 {
        stacks
            .iter()
            .filter(|(frames, _)| frames.iter().any(|f| f == name))
            .map(|(_, n)| n)
            .sum()
    };
    let (alpha, beta) = (with("hot_alpha"), with("warm_beta"));
    (pct(alpha, alpha + beta), alpha + beta)
}

#[test]
fn every_cpython_matches_its_split_and_py_spy() {
    const TEST: &str = "every_cpython_matches_its_split_and_py_spy";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let found = interpreters();
    assert!(
        !found.is_empty(),
        "{TEST}: no CPython 3.8–3.15 on this machine"
    );
    let py_spy_dir = tmp();
    py_spy();

    let mut run = SystemWideRun::spawn(tmp(), HZ, &[]);
    // Every fixture starts after the agent.
    let mut fixtures: Vec<(Interpreter, Child)> = found
        .iter()
        .map(|i| (i.clone(), spawn_fixture(i, "split", FIXTURE_SECS)))
        .collect();
    sleep(WARM_UP);
    let from = now_unix_nanos();
    let spies: Vec<PySpyRecord> = fixtures
        .iter()
        .map(|(_, child)| PySpyRecord::start(child.id(), PY_SPY_HZ, PY_SPY_SECS, py_spy_dir.path()))
        .collect();
    let pids: Vec<u32> = fixtures.iter().map(|(_, c)| c.id()).collect();
    let spied: Vec<_> = spies.into_iter().map(PySpyRecord::finish).collect();
    wait_fixtures(&mut fixtures, |x| &x.label);
    run.finish_after_fixtures();
    let received = run.otlp_of(pids[0]);

    println!(
        "{TEST}: {:<16} {:>7} {:>9} {:>9} {:>8} {:>9} {:>8}",
        "interpreter", "samples", "in_python", "icecore", "py-spy", "py-spy_n", "warm-up"
    );
    let mut failures = Vec::new();
    for ((interpreter, _), (&pid, spy)) in fixtures.iter().zip(pids.iter().zip(&spied)) {
        let (samples, excluded) = of_pid_since(&received.samples, pid, from);
        let all = total(&samples);
        let in_python = pct(count_where(&samples, |s| s.contains("split_main")), all);
        let (share, n) = alpha_share(&samples);
        let (spy_share, spy_n) = py_spy_share(spy);
        println!(
            "{TEST}: {:<16} {all:>7} {in_python:>8.1}% {share:>8.1}% {spy_share:>7.1}% {spy_n:>9} {excluded:>8}",
            interpreter.label
        );
        let label = &interpreter.label;
        if n < 200 {
            failures.push(format!(
                "{label}: only {n} samples in the split's functions"
            ));
        }
        if in_python < 95.0 {
            failures.push(format!(
                "{label}: {in_python:.1}% of samples have Python frames (expected ≥ 95%)"
            ));
        }
        if (share - ALPHA_PCT).abs() > TOLERANCE_PP {
            failures.push(format!(
                "{label}: hot_alpha {share:.1}%, built-in split {ALPHA_PCT}%"
            ));
        }
        if spy_n < 100 || (share - spy_share).abs() > TOLERANCE_PP {
            failures.push(format!(
                "{label}: hot_alpha {share:.1}% vs py-spy's {spy_share:.1}% ({spy_n} samples)"
            ));
        }
        let wrong_kind: Vec<_> = samples
            .iter()
            .flat_map(|s| &s.stack)
            .filter(|f| f.function == "hot_alpha" && f.kind.as_deref() != Some("cpython"))
            .collect();
        if !wrong_kind.is_empty() {
            failures.push(format!(
                "{label}: hot_alpha frames without frame type cpython: {:?}",
                &wrong_kind[..wrong_kind.len().min(3)]
            ));
        }
        // The Python frames sit where the interpreter loop ran: under main's
        // native frames, above the C code the interpreter calls.
        if let Some(s) = samples.iter().find(|s| s.contains("hot_alpha")) {
            let names = s
                .stack
                .iter()
                .map(|f| f.function.as_str())
                .collect::<Vec<_>>();
            let alpha = names.iter().position(|&n| n == "hot_alpha").unwrap();
            let main = names.iter().position(|&n| n == "split_main");
            let native_root = names.iter().rposition(|&n| n == "main" || n == "_start");
            if !(main.is_some_and(|m| m > alpha) && native_root.is_some_and(|r| Some(r) > main)) {
                failures.push(format!("{label}: frames out of place: {names:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}

#[test]
fn threads_and_c_extensions_are_attributed() {
    const TEST: &str = "threads_and_c_extensions_are_attributed";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let found = interpreters();
    // The oldest and newest layouts, and Debian's static, non-PIE build.
    let mut chosen: Vec<Interpreter> = Vec::new();
    for i in [
        found.first(),
        found.iter().rfind(|i| i.label.contains("pyenv")),
        found.last(),
    ]
    .into_iter()
    .flatten()
    {
        if !chosen.iter().any(|c| c.label == i.label) {
            chosen.push(i.clone());
        }
    }
    assert!(!chosen.is_empty(), "{TEST}: no CPython on this machine");

    let mut run = SystemWideRun::spawn(tmp(), HZ, &[]);
    let mut threads: Vec<(Interpreter, Child)> = chosen
        .iter()
        .map(|i| (i.clone(), spawn_fixture(i, "threads", FIXTURE_SECS)))
        .collect();
    let mut native: Vec<(Interpreter, Child)> = chosen
        .iter()
        .map(|i| (i.clone(), spawn_fixture(i, "native", FIXTURE_SECS)))
        .collect();
    sleep(WARM_UP);
    let from = now_unix_nanos();
    let thread_pids: Vec<u32> = threads.iter().map(|(_, c)| c.id()).collect();
    let native_pids: Vec<u32> = native.iter().map(|(_, c)| c.id()).collect();
    wait_fixtures(&mut threads, |x| &x.label);
    wait_fixtures(&mut native, |x| &x.label);
    run.finish_after_fixtures();
    let received = run.otlp_of(thread_pids[0]);

    let mut failures = Vec::new();
    for (interpreter, pid) in chosen.iter().zip(&thread_pids) {
        let label = &interpreter.label;
        let (samples, _) = of_pid_since(&received.samples, *pid, from);
        let tids = |name: &str| -> std::collections::BTreeSet<i64> {
            samples
                .iter()
                .filter(|s| s.contains(name))
                .filter_map(|s| s.thread_id)
                .collect()
        };
        let (alpha, beta) = (tids("thread_alpha"), tids("thread_beta"));
        let both = count_where(&samples, |s| {
            s.contains("thread_alpha") && s.contains("thread_beta")
        });
        let (n_alpha, n_beta) = (
            inclusive(&samples, "thread_alpha"),
            inclusive(&samples, "thread_beta"),
        );
        println!(
            "{TEST}: {label}: thread_alpha {n_alpha} samples on threads {alpha:?}, \
             thread_beta {n_beta} on {beta:?}, {both} mixing both"
        );
        if alpha.len() != 1 || beta.len() != 1 || alpha == beta || both > 0 {
            failures.push(format!(
                "{label}: threads not attributed: alpha on {alpha:?}, beta on {beta:?}, {both} mixed"
            ));
        }
        if alpha.contains(&i64::from(*pid)) || n_alpha < 100 || n_beta < 100 {
            failures.push(format!(
                "{label}: expected both worker threads (not the main thread {pid}) \
                 with ≥ 100 samples each: {n_alpha} and {n_beta}"
            ));
        }
    }
    for (interpreter, pid) in chosen.iter().zip(&native_pids) {
        let label = &interpreter.label;
        let (samples, _) = of_pid_since(&received.samples, *pid, from);
        let caller = inclusive(&samples, "compress_work");
        let is_zlib = |f: &support::summary::Frame| {
            f.kind.as_deref() == Some("native")
                && (f.mapping.as_deref().is_some_and(|m| m.contains("libz.so"))
                    || f.function.starts_with("deflate")
                    || f.function.starts_with("zlib_compress"))
        };
        let under = count_where(&samples, |s| {
            let python = s.stack.iter().position(|f| f.function == "compress_work");
            let c_code = s.stack.iter().position(is_zlib);
            matches!((c_code, python), (Some(c), Some(p)) if c < p)
        });
        let above = count_where(&samples, |s| {
            let python = s.stack.iter().position(|f| f.function == "compress_work");
            let c_code = s.stack.iter().rposition(is_zlib);
            matches!((c_code, python), (Some(c), Some(p)) if c > p)
        });
        println!(
            "{TEST}: {label}: compress_work {caller} samples, {under} with zlib's C code under it \
             ({:.1}%), {above} with it above",
            pct(under, caller)
        );
        if caller < 200 || pct(under, caller) < 50.0 || above > 0 {
            failures.push(format!(
                "{label}: zlib's native frames must sit under compress_work: \
                 {under} of {caller} under, {above} above"
            ));
        }
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}

#[test]
fn a_runtime_program_the_kernel_rejects_is_off_and_the_rest_runs() {
    const TEST: &str = "a_runtime_program_the_kernel_rejects_is_off_and_the_rest_runs";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let python = interpreters()
        .into_iter()
        .rfind(|i| i.label.contains("pyenv"))
        .expect("a pyenv CPython");
    // The test switch makes CPython's BPF program fail verification: the
    // path a kernel that rejects a runtime's program takes.
    let mut run = SystemWideRun::spawn_wrapped(
        tmp(),
        HZ,
        &["env", "ICECORE_TEST_REJECT_RUNTIME=cpython"],
        &[],
    );
    let mut fixture = vec![(
        python.clone(),
        spawn_fixture(&python, "split", FIXTURE_SECS / 2),
    )];
    let pid = fixture[0].1.id();
    // Another runtime beside it: Node.js named through its perf map.
    let node = support::jit_runtimes::node();
    if node.is_none() {
        support::prerequisite(TEST, false, "needs Node.js 20 or newer");
    }
    let mut node_child = node.as_ref().map(|node| {
        support::jit_runtimes::node_command(node, "split", FIXTURE_SECS / 2)
            .spawn()
            .expect("start node")
    });
    sleep(WARM_UP);
    let from = now_unix_nanos();
    let metrics = run
        .icecore
        .metrics_after_next_batch(Duration::from_secs(30));
    wait_fixtures(&mut fixture, |x| &x.label);
    if let Some(child) = node_child.as_mut() {
        let status = child.wait().expect("wait for node");
        assert!(status.success(), "{TEST}: node failed: {status}");
    }
    run.finish_after_fixtures();
    let logs = run.icecore.logs();
    assert!(
        logs.contains("the kernel rejected the runtime's BPF program") && logs.contains("cpython"),
        "{TEST}: no log line says CPython is off\n{logs}"
    );
    let up = |runtime: &str, state: &str| {
        metrics.value(&format!(
            "icecore_runtime_up{{runtime=\"{runtime}\",state=\"{state}\"}}"
        ))
    };
    assert_eq!(up("cpython", "failed"), 0.0, "{TEST}");
    assert_eq!(up("perf-map", "running"), 1.0, "{TEST}");
    assert_eq!(metrics.bpf_event("runtime_program_missing"), 0, "{TEST}");

    // The Python process is still profiled, with its native frames named.
    let received = run.otlp_of(pid);
    let (samples, _) = of_pid_since(&received.samples, pid, from);
    let n = total(&samples);
    let python_frames = count_where(&samples, |s| {
        s.stack.iter().any(|f| f.kind.as_deref() == Some("cpython"))
    });
    let eval_loop = count_where(&samples, |s| {
        s.stack
            .iter()
            .any(|f| f.function.starts_with("_PyEval_EvalFrameDefault"))
    });
    println!(
        "{TEST}: {} with CPython off: {n} samples, {eval_loop} through the eval loop, \
         {python_frames} with Python frames",
        python.label
    );
    assert!(n >= 200, "{TEST}: the Python process got {n} samples");
    assert_eq!(
        python_frames, 0,
        "{TEST}: Python frames without CPython's program"
    );
    assert!(
        pct(eval_loop, n) >= 80.0,
        "{TEST}: native frames unnamed: {eval_loop} of {n} through _PyEval_EvalFrameDefault"
    );

    // The perf-map runtime still names the JavaScript of the Node.js process.
    if let Some(child) = &node_child {
        let node_pid = child.id();
        let received = run.otlp_of(node_pid);
        let (samples, _) = of_pid_since(&received.samples, node_pid, from);
        let n = total(&samples);
        let javascript = count_where(&samples, |s| {
            s.stack
                .iter()
                .any(|f| f.kind.as_deref() == Some("v8js") && f.function == "alpha")
        });
        println!(
            "{TEST}: Node.js beside it: {javascript} of {n} samples through a named v8js alpha"
        );
        assert!(
            n >= 200 && pct(javascript, n) >= 30.0,
            "{TEST}: Node.js frames unnamed with CPython off: {javascript} of {n}"
        );
    }
}

/// A copy of sid's python3.14 whose `_Py_DebugOffsets` says "free-threaded"
/// (the flag is informational to the interpreter, which runs as before):
/// icecore must refuse it with one log line and the attach-failure metric,
/// and keep profiling the process natively.
#[test]
fn a_free_threaded_cpython_is_refused_with_a_log_line_and_a_metric() {
    use object::{Object, ObjectSection, ObjectSymbol};

    const TEST: &str = "a_free_threaded_cpython_is_refused_with_a_log_line_and_a_metric";
    if !require_root(TEST) {
        return;
    }
    let Some(root) = support::python::sid_root() else {
        return;
    };
    let _serial = serial();
    let original = root.join("usr/bin/python3.14");
    let mut bytes = std::fs::read(&original).expect("read python3.14");
    let file_offset = {
        let elf = object::File::parse(&*bytes).expect("parse python3.14");
        let runtime = elf
            .dynamic_symbols()
            .find(|s| s.name() == Ok("_PyRuntime"))
            .expect("_PyRuntime")
            .address();
        elf.sections()
            .find_map(|s| {
                let (offset, size) = s.file_range()?;
                (s.address() <= runtime && runtime < s.address() + size)
                    .then(|| offset + (runtime - s.address()))
            })
            .expect("_PyRuntime's section")
    };
    let at = usize::try_from(file_offset).unwrap();
    assert_eq!(&bytes[at..at + 8], b"xdebugpy");
    bytes[at + 16] = 1; // free_threaded
    let dir = root.join("tmp/icecore-free-threaded");
    std::fs::create_dir_all(&dir).unwrap();
    let patched = dir.join("python3.14");
    std::fs::write(&patched, &bytes).unwrap();
    std::fs::set_permissions(
        &patched,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let interpreter = Interpreter {
        label: "3.14 marked free-threaded (sid chroot)".into(),
        python: std::path::PathBuf::from("/tmp/icecore-free-threaded/python3.14"),
        root: Some(root),
    };

    let mut run = SystemWideRun::spawn(tmp(), HZ, &[]);
    let mut fixture = vec![(
        interpreter.clone(),
        spawn_fixture(&interpreter, "split", FIXTURE_SECS / 2),
    )];
    let pid = fixture[0].1.id();
    sleep(WARM_UP);
    let from = now_unix_nanos();
    wait_fixtures(&mut fixture, |x| &x.label);
    let metrics = run
        .icecore
        .metrics_after_next_batch(Duration::from_secs(30));
    run.finish_after_fixtures();
    let logs = run.icecore.logs();
    let refusals = logs
        .lines()
        .filter(|l| l.contains("free-threaded CPython 3.14t is not supported"))
        .count();
    assert_eq!(refusals, 1, "{TEST}: one log line expected\n{logs}");
    let failures = metrics.value("icecore_runtime_attach_failures_total{runtime=\"cpython\"}");
    assert!(failures >= 1.0, "{TEST}: attach failures {failures}");

    let received = run.otlp_of(pid);
    let (samples, _) = of_pid_since(&received.samples, pid, from);
    let n = total(&samples);
    let python_frames = count_where(&samples, |s| {
        s.stack.iter().any(|f| f.kind.as_deref() == Some("cpython"))
    });
    println!("{TEST}: {n} samples, {python_frames} with Python frames, {refusals} log line");
    assert!(n >= 200, "{TEST}: the process got {n} samples");
    assert_eq!(
        python_frames, 0,
        "{TEST}: a refused CPython has no Python frames"
    );
}
