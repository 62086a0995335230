// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of JIT code named from perf maps: Node.js 20 with
//! `--perf-basic-prof` and .NET Core 3.1 with its perf map, each running a
//! workload that splits its time 50/30/20 between three functions calling
//! one shared leaf (`fixtures/jit_split.js`, `fixtures/jit_split.cs`).
//! icecore's shares must be within 5 percentage points of the built-in split
//! (and, for Node, of `node --cpu-prof`'s), with names and files from the
//! perf map and the runtime's frame type; functions compiled after
//! profiling started must be named too. The V8 unwinder, which names Node
//! frames without a perf map (`integration/v8.rs`), is off here: these
//! tests are the perf map's.
//!
//!     sudo -E cargo test --release --test integration -- jit:: --test-threads=1 --nocapture

use crate::support;

use std::collections::BTreeMap;
use std::process::Child;
use std::thread::sleep;
use std::time::Duration;

use support::jit_runtimes::{dotnet, node, node_command, node_reference_split};
use support::run::SystemWideRun;
use support::summary::{DecodedSample, count_where, inclusive, of_pid_since, pct};
use support::{now_unix_nanos, prerequisite, require_root, serial, tmp};

const HZ: u32 = 499;
/// Workload lifetime.
const SECONDS: u32 = 12;
/// Samples before this are not evaluated: the process is described and its
/// perf map read on its first samples.
const WARM_UP: Duration = Duration::from_secs(3);
const TOLERANCE_PP: f64 = 5.0;
/// Every runtime but V8, whose unwinder would name Node's frames first.
const PERF_MAP_RUNTIMES: &str = "cpython,cruby,hotspot,perf-map";
/// The built-in split.
const SPLIT: [(&str, f64); 3] = [("alpha", 50.0), ("beta", 30.0), ("gamma", 20.0)];

fn perf_map_only() -> [String; 2] {
    ["--runtimes".to_owned(), PERF_MAP_RUNTIMES.to_owned()]
}

fn wait_ok(child: &mut Child, what: &str) {
    let status = child.wait().expect("wait for the workload");
    assert!(status.success(), "{what}: workload failed: {status}");
}

/// Each function's share of the samples in any of them, by `name_of` (the
/// function's name as the runtime writes it).
fn shares(
    samples: &[DecodedSample],
    name_of: impl Fn(&str) -> String,
) -> (BTreeMap<String, f64>, u64) {
    let counts: Vec<(&str, u64)> = SPLIT
        .iter()
        .map(|(f, _)| (*f, inclusive(samples, &name_of(f))))
        .collect();
    let all: u64 = counts.iter().map(|(_, n)| n).sum();
    let shares = counts
        .into_iter()
        .map(|(f, n)| (f.to_string(), pct(n, all)))
        .collect();
    (shares, all)
}

/// The functions whose share is off the split by more than the tolerance.
fn off_split(shares: &BTreeMap<String, f64>) -> Vec<String> {
    SPLIT
        .iter()
        .filter(|(f, want)| (shares.get(*f).copied().unwrap_or(0.0) - want).abs() > TOLERANCE_PP)
        .map(|(f, want)| {
            format!(
                "{f}: {:.1} % (split {want} %)",
                shares.get(*f).copied().unwrap_or(0.0)
            )
        })
        .collect()
}

/// Frames named `function` and what they say of their type and file.
fn frames_of<'a>(samples: &'a [DecodedSample], function: &str) -> Vec<&'a support::summary::Frame> {
    samples
        .iter()
        .flat_map(|s| s.stack.iter())
        .filter(|f| f.function == function)
        .collect()
}

#[test]
fn node_perf_map_names_javascript_with_its_split() {
    const TEST: &str = "node_perf_map_names_javascript_with_its_split";
    if !require_root(TEST) {
        return;
    }
    let Some(node) = node() else {
        prerequisite(TEST, false, "needs Node.js 20 or newer at /usr/bin/node");
        return;
    };
    let _serial = serial();
    let reference = node_reference_split(&node, 6, &["alpha", "beta", "gamma"])
        .unwrap_or_else(|e| panic!("{TEST}: node --cpu-prof: {e}"));
    let mut run = SystemWideRun::spawn(tmp(), HZ, &perf_map_only());
    let mut child = node_command(&node, "split", SECONDS)
        .spawn()
        .expect("start node");
    let pid = child.id();
    sleep(WARM_UP);
    let from = now_unix_nanos();
    wait_ok(&mut child, "node");
    run.finish_after_fixtures();
    let received = run.otlp_of(pid);
    let (samples, _) = of_pid_since(&received.samples, pid, from);
    let (shares, n) = shares(&samples, str::to_owned);
    println!("{TEST}: icecore {shares:.1?} of {n} samples; node --cpu-prof {reference:.1?}");
    assert!(n >= 500, "{TEST}: only {n} samples in the three functions");
    let off = off_split(&shares);
    assert!(off.is_empty(), "{TEST}: off the built-in split: {off:?}");
    for (f, want) in &reference {
        let got = shares.get(f).copied().unwrap_or(0.0);
        assert!(
            (got - want).abs() <= TOLERANCE_PP,
            "{TEST}: {f}: icecore {got:.1} %, node --cpu-prof {want:.1} %"
        );
    }
    let alpha = frames_of(&samples, "alpha");
    assert!(
        alpha.iter().all(|f| f.kind.as_deref() == Some("v8js")),
        "{TEST}: alpha frames not typed v8js: {:?}",
        alpha
            .iter()
            .map(|f| f.kind.clone())
            .collect::<std::collections::BTreeSet<_>>()
    );
    let leaf_under_alpha = count_where(&samples, |s| {
        let leaf = s.stack.iter().position(|f| f.function == "leaf");
        let alpha = s.stack.iter().position(|f| f.function == "alpha");
        matches!((leaf, alpha), (Some(l), Some(a)) if l < a)
    });
    assert!(
        leaf_under_alpha > 0,
        "{TEST}: leaf never appears called from alpha: the JIT frames do not chain"
    );
    let files: std::collections::BTreeSet<String> =
        alpha.iter().filter_map(|f| f.filename.clone()).collect();
    assert!(
        files.iter().any(|f| f.ends_with("jit_split.js")),
        "{TEST}: alpha's file is not the script: {files:?}"
    );
}

#[test]
fn functions_compiled_while_profiled_are_named() {
    const TEST: &str = "functions_compiled_while_profiled_are_named";
    if !require_root(TEST) {
        return;
    }
    let Some(node) = node() else {
        prerequisite(TEST, false, "needs Node.js 20 or newer at /usr/bin/node");
        return;
    };
    let _serial = serial();
    let mut run = SystemWideRun::spawn(tmp(), HZ, &perf_map_only());
    // `grow` compiles new functions (late_0, late_1, …) after a few seconds
    // and spends most of its time in them.
    let mut child = node_command(&node, "grow", SECONDS)
        .spawn()
        .expect("start node");
    let pid = child.id();
    wait_ok(&mut child, "node grow");
    run.finish_after_fixtures();
    let received = run.otlp_of(pid);
    let (samples, _) = of_pid_since(&received.samples, pid, 0);
    let late = count_where(&samples, |s| {
        s.stack.iter().any(|f| f.function.starts_with("late_"))
    });
    let unnamed_jit = count_where(&samples, |s| {
        s.stack
            .first()
            .is_some_and(|f| f.kind.as_deref() == Some("native") && f.function.is_empty())
    });
    let total = support::summary::total(&samples);
    println!(
        "{TEST}: {late} of {total} samples in late_* functions, {unnamed_jit} with an unnamed leaf"
    );
    assert!(
        pct(late, total) >= 30.0,
        "{TEST}: functions compiled while profiled are not named: {late} of {total} samples"
    );
}

#[test]
fn dotnet_perf_map_names_methods_with_their_split() {
    const TEST: &str = "dotnet_perf_map_names_methods_with_their_split";
    if !require_root(TEST) {
        return;
    }
    let dotnet = match dotnet() {
        Ok(d) => d,
        Err(e) => {
            prerequisite(TEST, false, &format!(".NET Core 3.1 and mcs: {e}"));
            return;
        }
    };
    let _serial = serial();
    let mut run = SystemWideRun::spawn(tmp(), HZ, &[]);
    let mut child = dotnet.command(SECONDS).spawn().expect("start dotnet");
    let pid = child.id();
    sleep(WARM_UP);
    let from = now_unix_nanos();
    wait_ok(&mut child, "dotnet");
    run.finish_after_fixtures();
    let received = run.otlp_of(pid);
    let (samples, _) = of_pid_since(&received.samples, pid, from);
    // The perf map names methods `[jit_split] P::Alpha()[Optimized]`.
    let method = |f: &str| {
        let mut name = f.to_owned();
        if let Some(first) = name.get_mut(0..1) {
            first.make_ascii_uppercase();
        }
        format!("P::{name}()")
    };
    let (shares, n) = shares(&samples, method);
    println!("{TEST}: icecore {shares:.1?} of {n} samples");
    assert!(n >= 500, "{TEST}: only {n} samples in the three methods");
    let off = off_split(&shares);
    assert!(off.is_empty(), "{TEST}: off the built-in split: {off:?}");
    let alpha = frames_of(&samples, &method("alpha"));
    assert!(
        alpha.iter().all(|f| f.kind.as_deref() == Some("dotnet")),
        "{TEST}: P::Alpha frames not typed dotnet"
    );
    // The JIT code's frame pointers chain: Leaf, then its caller, then Main.
    let in_alpha = inclusive(&samples, &method("alpha"));
    let under_main = count_where(&samples, |s| {
        let alpha = s.stack.iter().position(|f| f.function == method("alpha"));
        let main = s
            .stack
            .iter()
            .position(|f| f.function == "P::Main(string[])");
        matches!((alpha, main), (Some(a), Some(m)) if a < m)
    });
    println!("{TEST}: {under_main} of {in_alpha} P::Alpha samples under P::Main");
    assert!(
        pct(under_main, in_alpha) >= 90.0,
        "{TEST}: P::Alpha under P::Main in {under_main} of {in_alpha} samples"
    );
}
