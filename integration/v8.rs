// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of the V8 unwinder on Node 18, 20, 22 and 24, with no
//! Node flag (`fixtures/v8_split.js`): the 50/30/20 split through a leaf
//! TurboFan inlines, against the built-in split and `node --cpu-prof`;
//! names, scripts and lines; the inlined leaf under its callers; native
//! code under its JavaScript caller; an async function; a worker thread.
//!
//!     sudo -E cargo test --release --test integration -- v8:: --test-threads=1 --nocapture

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::thread::sleep;
use std::time::Duration;

use support::jit_runtimes::cpuprofile_shares;
use support::node::{nodes, read_cpu_prof, v8_split};
use support::run::{REPORTER_INTERVAL, SystemWideRun};
use support::summary::{DecodedSample, count_where, inclusive, of_pid_since, pct, top_stacks};
use support::{now_unix_nanos, require_root, serial, tmp};

const HZ: u32 = 499;
/// Workload lifetime.
const SECONDS: u32 = 10;
/// Samples before this are not evaluated: the process is described at its
/// first samples, and TurboFan optimizes the split after a few rounds.
const WARM_UP: Duration = Duration::from_secs(3);
const TOLERANCE_PP: f64 = 5.0;
/// The built-in split.
const SPLIT: [(&str, f64); 3] = [("alpha", 50.0), ("beta", 30.0), ("gamma", 20.0)];
/// Functions whose lines are checked: frames of each must be on a line
/// of its body.
const CHECKED: [&str; 4] = ["alpha", "beta", "gamma", "leaf"];

/// The fixture's source.
fn fixture_source() -> String {
    std::fs::read_to_string(support::package_dir().join("integration/fixtures/v8_split.js"))
        .expect("the fixture")
}

/// The lines (1-based) of `function`'s body in the fixture: from its
/// `function` line to its closing brace.
fn body_lines(function: &str) -> std::ops::RangeInclusive<i64> {
    let source = fixture_source();
    let lines: Vec<&str> = source.lines().collect();
    let first = lines
        .iter()
        .position(|l| l.starts_with(&format!("function {function}(")))
        .expect("the function in the fixture");
    let last = first
        + lines[first..]
            .iter()
            .position(|l| *l == "}")
            .expect("its end");
    (first as i64 + 1)..=(last as i64 + 1)
}

/// Profiles the fixture in `mode` on `node` and returns the samples of its
/// process after the warm-up, and with `cpu_prof`, the `.cpuprofile` Node's
/// own profiler wrote of the same run.
fn profile(node: &Path, mode: &str, cpu_prof: bool) -> (Vec<DecodedSample>, Option<String>) {
    let dir = tmp();
    let mut run = SystemWideRun::spawn(tmp(), HZ, &[]);
    let mut child = v8_split(node, mode, SECONDS, cpu_prof.then_some(dir.path()))
        .spawn()
        .expect("start node");
    let pid = child.id();
    sleep(WARM_UP);
    let from = now_unix_nanos();
    let status = child.wait().expect("wait for node");
    assert!(status.success(), "node {mode}: {status}");
    sleep(2 * REPORTER_INTERVAL + Duration::from_millis(500));
    let _ = run
        .icecore
        .metrics_after_next_batch(Duration::from_secs(30));
    run.icecore.stop();
    let received = run.otlp_of(pid);
    let reference =
        cpu_prof.then(|| read_cpu_prof(dir.path()).unwrap_or_else(|e| panic!("node {mode}: {e}")));
    (of_pid_since(&received.samples, pid, from).0, reference)
}

/// Each function's share of the samples in any of them.
fn shares(samples: &[DecodedSample]) -> (BTreeMap<String, f64>, u64) {
    let counts: Vec<(&str, u64)> = SPLIT
        .iter()
        .map(|(f, _)| (*f, inclusive(samples, f)))
        .collect();
    let all: u64 = counts.iter().map(|(_, n)| n).sum();
    let shares = counts
        .into_iter()
        .map(|(f, n)| (f.to_owned(), pct(n, all)))
        .collect();
    (shares, all)
}

/// Whether `inner` appears directly above `outer` (leafward) in a sample.
fn calls(sample: &DecodedSample, outer: &str, inner: &str) -> bool {
    sample
        .stack
        .windows(2)
        .any(|w| w[0].function == inner && w[1].function == outer)
}

#[test]
fn every_node_splits_as_built_and_as_cpu_prof_with_names_lines_and_inlining() {
    const TEST: &str = "every_node_splits_as_built_and_as_cpu_prof_with_names_lines_and_inlining";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    for (major, node) in nodes(TEST) {
        let functions: Vec<&str> = SPLIT.iter().map(|(f, _)| *f).collect();
        // Node's profiler runs in the same process: the same run seen twice.
        let (samples, reference) = profile(&node, "split", true);
        let reference = reference
            .ok_or_else(|| "no profile".to_owned())
            .and_then(|text| cpuprofile_shares(&text, &functions))
            .unwrap_or_else(|e| panic!("{TEST}: Node {major}: node --cpu-prof: {e}"));
        let (shares, n) = shares(&samples);
        println!(
            "{TEST}: Node {major}: icecore {shares:.1?} of {n} samples; \
             node --cpu-prof {reference:.1?}\n{}",
            top_stacks(&samples, 4)
        );
        assert!(n >= 1000, "Node {major}: only {n} samples in the split");
        for (f, want) in SPLIT {
            let got = shares[f];
            assert!(
                (got - want).abs() <= TOLERANCE_PP,
                "Node {major}: {f}: {got:.1} %, built-in split {want} %"
            );
            let prof = reference[f];
            assert!(
                (got - prof).abs() <= TOLERANCE_PP,
                "Node {major}: {f}: icecore {got:.1} %, node --cpu-prof {prof:.1} %"
            );
        }
        // Names, the script, lines, the frame type.
        for function in CHECKED {
            let lines = body_lines(function);
            // (frame, samples it stands for)
            let frames: Vec<_> = samples
                .iter()
                .flat_map(|s| s.stack.iter().map(move |f| (f, s.count)))
                .filter(|(f, _)| f.function == function)
                .collect();
            assert!(!frames.is_empty(), "Node {major}: no {function} frame");
            let kinds: BTreeSet<_> = frames.iter().map(|(f, _)| f.kind.clone()).collect();
            assert_eq!(
                kinds,
                BTreeSet::from([Some("v8js".to_owned())]),
                "Node {major}: {function}'s frame types"
            );
            let files: BTreeSet<_> = frames.iter().map(|(f, _)| f.filename.clone()).collect();
            assert!(
                files
                    .iter()
                    .all(|f| f.as_deref().is_some_and(|f| f.ends_with("v8_split.js"))),
                "Node {major}: {function}'s files: {files:?}"
            );
            let all: u64 = frames.iter().map(|(_, n)| n).sum();
            let outside: u64 = frames
                .iter()
                .filter(|(f, _)| !lines.contains(&f.line))
                .map(|(_, n)| n)
                .sum();
            assert!(
                pct(outside, all) <= 1.0,
                "Node {major}: {outside} of {all} {function} samples outside lines {lines:?}: {:?}",
                frames.iter().map(|(f, _)| f.line).collect::<BTreeSet<_>>()
            );
            // Columns: 1-based, within the line's text.
            let source = fixture_source();
            let text: Vec<&str> = source.lines().collect();
            let off_column: u64 = frames
                .iter()
                .filter(|(f, _)| {
                    let width = usize::try_from(f.line - 1)
                        .ok()
                        .and_then(|l| text.get(l))
                        .map_or(0, |t| t.len() as i64);
                    !(1..=width).contains(&f.column)
                })
                .map(|(_, n)| n)
                .sum();
            assert!(
                pct(off_column, all) <= 1.0,
                "Node {major}: {off_column} of {all} {function} samples without a column in \
                 their line: {:?}",
                frames
                    .iter()
                    .map(|(f, _)| (f.line, f.column))
                    .collect::<BTreeSet<_>>()
            );
        }
        // TurboFan inlined the leaf into each caller: reported under each,
        // as an inlined frame at the caller's call line.
        for (caller, _) in SPLIT {
            let under = count_where(&samples, |s| calls(s, caller, "leaf"));
            let of = inclusive(&samples, caller);
            println!("Node {major}: leaf under {caller} in {under} of {of} samples");
            assert!(under > 0, "Node {major}: leaf never under {caller}");
        }
        // JavaScript sits among native frames: node's C++ called the
        // script, through the entry frame the walk hands back at.
        let rooted = count_where(&samples, |s| {
            s.contains("alpha")
                && s.stack
                    .iter()
                    .any(|f| f.kind.as_deref() == Some("native") && f.function.contains("node::"))
        });
        let alpha = inclusive(&samples, "alpha");
        assert!(
            pct(rooted, alpha) >= 95.0,
            "Node {major}: alpha under node's C++ in {rooted} of {alpha} samples"
        );
    }
}

#[test]
fn native_code_async_functions_and_workers_are_attributed() {
    const TEST: &str = "native_code_async_functions_and_workers_are_attributed";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    for (major, node) in nodes(TEST) {
        // crypto.pbkdf2Sync: OpenSSL's C under the JavaScript that called it.
        let (samples, _) = profile(&node, "native", false);
        let hashing = inclusive(&samples, "hashing");
        let native_under = count_where(&samples, |s| {
            let Some(caller) = s.stack.iter().position(|f| f.function == "hashing") else {
                return false;
            };
            s.stack[..caller].iter().any(|f| {
                f.kind.as_deref() == Some("native") && f.function.to_lowercase().contains("pbkdf2")
            })
        });
        println!(
            "{TEST}: Node {major}: hashing in {hashing} samples, PBKDF2 under it in {native_under}\n{}",
            top_stacks(&samples, 3)
        );
        assert!(hashing >= 200, "Node {major}: hashing in {hashing} samples");
        assert!(
            pct(native_under, hashing) >= 80.0,
            "Node {major}: native PBKDF2 frames under hashing in {native_under} of {hashing}"
        );
        // An async function resumed from the event loop.
        let (samples, _) = profile(&node, "async", false);
        let spinning = inclusive(&samples, "spinning");
        let under_async = count_where(&samples, |s| calls(s, "asyncWork", "spinning"));
        println!("{TEST}: Node {major}: spinning in {spinning}, under asyncWork in {under_async}");
        assert!(
            spinning >= 500,
            "Node {major}: spinning in {spinning} samples"
        );
        assert!(
            pct(under_async, spinning) >= 95.0,
            "Node {major}: spinning under asyncWork in {under_async} of {spinning}"
        );
        // A worker thread: its isolate's JavaScript on its own thread.
        let (samples, _) = profile(&node, "worker", false);
        let threads = |function: &str| -> BTreeSet<Option<i64>> {
            samples
                .iter()
                .filter(|s| s.contains(function))
                .map(|s| s.thread_id)
                .collect()
        };
        let (main, worker) = (threads("mainLoop"), threads("workerLoop"));
        let both = count_where(&samples, |s| {
            s.contains("mainLoop") && s.contains("workerLoop")
        });
        println!("{TEST}: Node {major}: mainLoop on {main:?}, workerLoop on {worker:?}");
        assert!(
            inclusive(&samples, "workerLoop") >= 500 && inclusive(&samples, "mainLoop") >= 500,
            "Node {major}: worker {} and main {} samples",
            inclusive(&samples, "workerLoop"),
            inclusive(&samples, "mainLoop")
        );
        assert_eq!(main.len(), 1, "Node {major}: mainLoop on threads {main:?}");
        assert_eq!(
            worker.len(),
            1,
            "Node {major}: workerLoop on threads {worker:?}"
        );
        assert_ne!(main, worker, "Node {major}: one thread for both loops");
        assert_eq!(both, 0, "Node {major}: {both} samples mix the two isolates");
    }
}
