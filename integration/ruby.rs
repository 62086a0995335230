// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of the CRuby unwinder: a fixture with a known split
//! between Ruby methods (`fixtures/ruby_split.rb`: 50/30/20 % of the thread's
//! CPU time through one leaf method) runs under every CRuby of the machine
//! (Debian's 3.1 with and without YJIT, sid's 3.3 and experimental's 3.4 in a
//! chroot, like a container), each started after the agent. icecore's shares
//! must be within 5 percentage points of the built-in split and, where rbspy
//! can attach (3.1: it cannot find the VM of Debian's stripped 3.3 and 3.4),
//! of rbspy's. Names, classes, files and lines must be the script's, C
//! functions must sit in place, threads must each get their own stack, and
//! a C extension's native frames must sit under the Ruby method calling it.
//!
//! Every test loads BPF programs and needs root; without root it prints why it
//! is skipped and passes.
//!
//!     sudo -E cargo test --release --test integration -- ruby:: --test-threads=1 --nocapture

use crate::support;

use std::collections::BTreeSet;
use std::process::Child;
use std::thread::sleep;
use std::time::Duration;

use support::ruby::{RbspyRecord, Ruby, Stacks, interpreters, rbspy, spawn_fixture};
use support::run::SystemWideRun;
use support::summary::{DecodedSample, Frame, count_where, of_pid_since, pct, total};
use support::{now_unix_nanos, require_root, serial, tmp, wait_fixtures};

/// About a thousand samples per fixture with four sharing two CPUs.
const HZ: u32 = 499;
/// Fixture lifetime.
const FIXTURE_SECS: u32 = 14;
/// Shares are measured from here on, when rbspy has attached.
const WARM_UP: Duration = Duration::from_secs(3);
/// rbspy records from the end of the warm-up for this long.
const RBSPY_SECS: u32 = 9;
const RBSPY_HZ: u32 = 250;
/// The built-in split: Split#alpha, #beta and #gamma, in percent.
const SPLIT: [(&str, f64); 3] = [("alpha", 50.0), ("beta", 30.0), ("gamma", 20.0)];
const TOLERANCE_PP: f64 = 5.0;
/// The first samples of a process that must all have their Ruby frames.
const FIRST_SAMPLES: usize = 20;
/// The lines of `Split#leaf`'s body in the fixture, through its `end`
/// (31), the line of the method's `leave` instruction: a sample taken as it
/// returns is there (CI run 7 on 2026-11-27: 1 of 2,624 on CRuby 3.3).
const LEAF_LINES: std::ops::RangeInclusive<i64> = 21..=31;
/// `def leaf`: the line a frame is reported at when its `pc` does not lie
/// in its iseq, as in a frame caught while CRuby's `vm_push_frame` is
/// still filling it in (the `iseq` stored, the `pc` still the slot's old
/// one). Rare: at most 1 % of the leaf frames may be there.
const LEAF_DEF_LINE: i64 = 20;

fn is_ruby(frame: &Frame) -> bool {
    frame.kind.as_deref() == Some("ruby")
}

/// Shares of `Split#alpha`, `#beta` and `#gamma` among the samples in
/// `Split#leaf`, and their number.
fn split_shares(samples: &[DecodedSample]) -> ([f64; 3], u64) {
    let in_leaf: Vec<&DecodedSample> = samples
        .iter()
        .filter(|s| s.contains("Split#leaf"))
        .collect();
    let n: u64 = in_leaf.iter().map(|s| s.count).sum();
    let shares = SPLIT.map(|(method, _)| {
        let name = format!("Split#{method}");
        let part: u64 = in_leaf
            .iter()
            .filter(|s| s.contains(&name))
            .map(|s| s.count)
            .sum();
        pct(part, n)
    });
    (shares, n)
}

/// The same shares in rbspy's stacks (which name methods without their class).
fn rbspy_shares(stacks: &[(Vec<String>, u64)]) -> ([f64; 3], u64) {
    let with = |name: &str| -> u64 {
        stacks
            .iter()
            .filter(|(frames, _)| frames.iter().any(|f| f == "leaf" || f == "Split#leaf"))
            .filter(|(frames, _)| {
                frames
                    .iter()
                    .any(|f| f == name || f.ends_with(&format!("#{name}")))
            })
            .map(|(_, n)| n)
            .sum()
    };
    let parts = SPLIT.map(|(method, _)| with(method));
    let n: u64 = parts.iter().sum();
    (parts.map(|p| pct(p, n)), n)
}

/// Positions of the named frames in `sample`'s stack (leaf first).
fn position(sample: &DecodedSample, name: &str) -> Option<usize> {
    sample.stack.iter().position(|f| f.function == name)
}

#[test]
fn every_cruby_matches_its_split_and_rbspy() {
    const TEST: &str = "every_cruby_matches_its_split_and_rbspy";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let found = interpreters();
    assert!(
        !found.is_empty(),
        "{TEST}: no CRuby 3.1-3.4 on this machine"
    );
    let rbspy_dir = tmp();
    rbspy();

    let mut run = SystemWideRun::spawn(tmp(), HZ, &[]);
    // Every fixture starts after the agent.
    let mut fixtures: Vec<(Ruby, Child)> = found
        .iter()
        .map(|r| (r.clone(), spawn_fixture(r, "split", FIXTURE_SECS)))
        .collect();
    sleep(WARM_UP);
    let from = now_unix_nanos();
    let pids: Vec<u32> = fixtures.iter().map(|(_, c)| c.id()).collect();
    // rbspy reads neither Debian's stripped 3.3 and 3.4 (no VM symbol) nor
    // a chroot's files: it records the host's 3.1.
    let spies: Vec<Option<RbspyRecord>> = fixtures
        .iter()
        .map(|(ruby, child)| {
            ruby.root.is_none().then(|| {
                RbspyRecord::start(ruby, child.id(), RBSPY_HZ, RBSPY_SECS, rbspy_dir.path())
            })
        })
        .collect();
    let spied: Vec<Option<Stacks>> = spies
        .into_iter()
        .map(|s| s.map(RbspyRecord::finish))
        .collect();
    wait_fixtures(&mut fixtures, |x| &x.label);
    run.finish_after_fixtures();
    let received = run.otlp_of(pids[0]);

    println!(
        "{TEST}: {:<34} {:>7} {:>8} {:>20} {:>20} {:>7} {:>9}",
        "interpreter",
        "samples",
        "in_ruby",
        "icecore a/b/g %",
        "rbspy a/b/g %",
        "rbspy_n",
        "first_ok"
    );
    let mut failures = Vec::new();
    for ((ruby, _), (&pid, spy)) in fixtures.iter().zip(pids.iter().zip(&spied)) {
        let label = &ruby.label;
        let (samples, _) = of_pid_since(&received.samples, pid, from);
        let all = total(&samples);
        let in_ruby = pct(
            count_where(&samples, |s| s.contains("Object#split_main")),
            all,
        );
        let (shares, n) = split_shares(&samples);
        let (spy_shares, spy_n) = spy.as_deref().map_or(([0.0; 3], 0), rbspy_shares);
        // Complete from the process's first sample: the samples taken while
        // the script ran (under `ruby_run_node`) have their Ruby frames, the
        // first ones above all. (With YJIT the native walk stops in JIT
        // code, above `ruby_run_node`. A sample may fall after `<main>`
        // returned, while the VM shuts down: a few may lack Ruby frames.)
        let (whole, _) = of_pid_since(&received.samples, pid, 0);
        let mut running: Vec<(u64, bool)> = whole
            .iter()
            .filter(|s| s.contains("ruby_run_node"))
            .flat_map(|s| {
                let ruby = s.stack.iter().any(is_ruby);
                s.timestamps.iter().map(move |&t| (t, ruby))
            })
            .collect();
        running.sort_unstable();
        let with_ruby = running.iter().filter(|(_, ruby)| *ruby).count();
        let first_complete = running.iter().take(FIRST_SAMPLES).all(|(_, ruby)| *ruby);
        let running = running.len();
        let fmt = |s: [f64; 3]| format!("{:.1}/{:.1}/{:.1}", s[0], s[1], s[2]);
        println!(
            "{TEST}: {label:<34} {all:>7} {in_ruby:>7.1}% {:>20} {:>20} {spy_n:>7} {with_ruby:>4}/{running}",
            fmt(shares),
            if spy.is_some() {
                fmt(spy_shares)
            } else {
                "-".into()
            },
        );
        if n < 300 {
            failures.push(format!("{label}: only {n} samples in Split#leaf"));
        }
        if in_ruby < 95.0 {
            failures.push(format!(
                "{label}: {in_ruby:.1}% of samples have the script's Ruby frames (expected ≥ 95%)"
            ));
        }
        for (i, (method, expected)) in SPLIT.iter().enumerate() {
            if (shares[i] - expected).abs() > TOLERANCE_PP {
                failures.push(format!(
                    "{label}: Split#{method} {:.1}%, built-in split {expected}%",
                    shares[i]
                ));
            }
            if spy.is_some() && (spy_n < 300 || (shares[i] - spy_shares[i]).abs() > TOLERANCE_PP) {
                failures.push(format!(
                    "{label}: Split#{method} {:.1}% vs rbspy's {:.1}% ({spy_n} samples)",
                    shares[i], spy_shares[i]
                ));
            }
        }
        if !ruby.yjit() && (running < 100 || !first_complete || running - with_ruby > 3) {
            let without: Vec<Vec<&str>> = whole
                .iter()
                .filter(|s| s.contains("ruby_run_node") && !s.stack.iter().any(is_ruby))
                .take(3)
                .map(|s| s.names())
                .collect();
            failures.push(format!(
                "{label}: {with_ruby} of {running} samples under ruby_run_node have Ruby frames \
                 (the first {FIRST_SAMPLES} and all but 3 expected); without: {without:?}"
            ));
        }
        // Names, frame type, file and line of the leaf.
        let leaves: Vec<&Frame> = samples
            .iter()
            .flat_map(|s| &s.stack)
            .filter(|f| f.function == "Split#leaf")
            .collect();
        let wrong: Vec<&&Frame> = leaves
            .iter()
            .filter(|f| {
                !is_ruby(f)
                    || !f
                        .filename
                        .as_deref()
                        .is_some_and(|p| p.ends_with("ruby_split.rb"))
                    || !(LEAF_LINES.contains(&f.line) || f.line == LEAF_DEF_LINE)
            })
            .collect();
        let at_def = leaves.iter().filter(|f| f.line == LEAF_DEF_LINE).count();
        if pct(at_def as u64, leaves.len() as u64) > 1.0 {
            failures.push(format!(
                "{label}: {at_def} of {} Split#leaf frames at its def line {LEAF_DEF_LINE}, \
                 not in its body",
                leaves.len()
            ));
        }
        if leaves.is_empty() || !wrong.is_empty() {
            failures.push(format!(
                "{label}: Split#leaf frames not of type ruby at ruby_split.rb:{LEAF_LINES:?} \
                 (or {LEAF_DEF_LINE}): {:?}",
                &wrong[..wrong.len().min(3)]
            ));
        }
        // `Integer#times` (C) between `Split#gamma` and its block; the Ruby
        // frames under the native root (without YJIT, whose JIT code ends
        // the native walk).
        let gamma: Vec<&DecodedSample> = samples
            .iter()
            .filter(|s| s.contains("block in Split#gamma"))
            .collect();
        let in_place = gamma
            .iter()
            .filter(|s| {
                let order = [
                    "Split#leaf",
                    "block in Split#gamma",
                    "Integer#times",
                    "Split#gamma",
                    "Object#split_main",
                    "<main>",
                ]
                .map(|name| position(s, name));
                let ruby_ordered = order
                    .windows(2)
                    .all(|w| matches!(w, [Some(a), Some(b)] if a < b));
                let native_root = position(s, "ruby_run_node");
                ruby_ordered && (ruby.yjit() || native_root.is_some_and(|r| Some(r) > order[5]))
            })
            .count();
        if gamma.len() < 20 || pct(in_place as u64, gamma.len() as u64) < 95.0 {
            let example = gamma.first().map(|s| s.names()).unwrap_or_default();
            failures.push(format!(
                "{label}: {in_place} of {} stacks through block in Split#gamma in order \
                 (leaf, block, Integer#times, gamma, split_main, <main>, ruby_run_node): {example:?}",
                gamma.len()
            ));
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
    // The oldest and the newest layout.
    let found = interpreters();
    let chosen: Vec<Ruby> = [found.first(), found.last()]
        .into_iter()
        .flatten()
        .cloned()
        .collect::<Vec<_>>();
    assert!(!chosen.is_empty(), "{TEST}: no CRuby on this machine");

    let mut run = SystemWideRun::spawn(tmp(), HZ, &[]);
    let mut threads: Vec<(Ruby, Child)> = chosen
        .iter()
        .map(|r| (r.clone(), spawn_fixture(r, "threads", FIXTURE_SECS / 2)))
        .collect();
    let mut native: Vec<(Ruby, Child)> = chosen
        .iter()
        .map(|r| (r.clone(), spawn_fixture(r, "native", FIXTURE_SECS / 2)))
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
    for (ruby, pid) in chosen.iter().zip(&thread_pids) {
        let label = &ruby.label;
        let (samples, _) = of_pid_since(&received.samples, *pid, from);
        let tids = |name: &str| -> BTreeSet<i64> {
            samples
                .iter()
                .filter(|s| s.contains(name))
                .filter_map(|s| s.thread_id)
                .collect()
        };
        let (alpha, beta) = (tids("Object#thread_alpha"), tids("Object#thread_beta"));
        let both = count_where(&samples, |s| {
            s.contains("Object#thread_alpha") && s.contains("Object#thread_beta")
        });
        let n = |name: &str| count_where(&samples, |s| s.contains(name));
        let (n_alpha, n_beta) = (n("Object#thread_alpha"), n("Object#thread_beta"));
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
    for (ruby, pid) in chosen.iter().zip(&native_pids) {
        let label = &ruby.label;
        let (samples, _) = of_pid_since(&received.samples, *pid, from);
        let caller = count_where(&samples, |s| s.contains("Object#compress_work"));
        let is_zlib = |f: &Frame| {
            f.kind.as_deref() == Some("native")
                && (f.mapping.as_deref().is_some_and(|m| m.contains("libz.so"))
                    || f.function.starts_with("deflate"))
        };
        // zlib's code under the C method, under the Ruby method calling it.
        let under = count_where(&samples, |s| {
            let c_code = s.stack.iter().position(is_zlib);
            let method = position(s, "Zlib::Deflate.deflate");
            let caller = position(s, "Object#compress_work");
            matches!((c_code, method, caller), (Some(c), Some(m), Some(r)) if c < m && m < r)
        });
        let above = count_where(&samples, |s| {
            let c_code = s.stack.iter().rposition(is_zlib);
            let caller = position(s, "Object#compress_work");
            matches!((c_code, caller), (Some(c), Some(r)) if c > r)
        });
        println!(
            "{TEST}: {label}: compress_work {caller} samples, {under} with zlib's C code under \
             Zlib::Deflate.deflate under it ({:.1}%), {above} with it above",
            pct(under, caller)
        );
        if caller < 200 || pct(under, caller) < 50.0 || above > 0 {
            failures.push(format!(
                "{label}: zlib's native frames must sit under Zlib::Deflate.deflate and \
                 compress_work: {under} of {caller} under, {above} above"
            ));
        }
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}

#[test]
fn a_rejected_cruby_program_leaves_ruby_profiled_natively() {
    const TEST: &str = "a_rejected_cruby_program_leaves_ruby_profiled_natively";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let ruby = interpreters()
        .into_iter()
        .next()
        .expect("Debian's CRuby 3.1");
    // The test switch makes the CRuby program fail verification: the path a
    // kernel that rejects it takes.
    let mut run = SystemWideRun::spawn_wrapped(
        tmp(),
        HZ,
        &["env", "ICECORE_TEST_REJECT_RUNTIME=cruby"],
        &[],
    );
    let mut fixture = vec![(
        ruby.clone(),
        spawn_fixture(&ruby, "split", FIXTURE_SECS / 2),
    )];
    let pid = fixture[0].1.id();
    sleep(WARM_UP);
    let from = now_unix_nanos();
    let metrics = run
        .icecore
        .metrics_after_next_batch(Duration::from_secs(30));
    wait_fixtures(&mut fixture, |x| &x.label);
    run.finish_after_fixtures();
    let logs = run.icecore.logs();
    assert!(
        logs.contains("the kernel rejected the runtime's BPF program") && logs.contains("cruby"),
        "{TEST}: no log line says CRuby is off\n{logs}"
    );
    let up = |state: &str| {
        metrics.value(&format!(
            "icecore_runtime_up{{runtime=\"cruby\",state=\"{state}\"}}"
        ))
    };
    assert_eq!(up("failed"), 0.0, "{TEST}");
    assert_eq!(metrics.bpf_event("runtime_program_missing"), 0, "{TEST}");

    let received = run.otlp_of(pid);
    let (samples, _) = of_pid_since(&received.samples, pid, from);
    let n = total(&samples);
    let ruby_frames = count_where(&samples, |s| s.stack.iter().any(is_ruby));
    let native = count_where(&samples, |s| s.contains("ruby_run_node"));
    println!("{TEST}: {n} samples, {native} through ruby_run_node, {ruby_frames} with Ruby frames");
    assert!(n >= 200, "{TEST}: the Ruby process got {n} samples");
    assert_eq!(
        ruby_frames, 0,
        "{TEST}: Ruby frames without CRuby's program"
    );
    assert!(
        pct(native, n) >= 80.0,
        "{TEST}: native frames lost: {native} of {n} through ruby_run_node"
    );
}
