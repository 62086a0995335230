// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of the Perl unwinder: a fixture with a known split
//! between Perl subs (`fixtures/perl_split.pl`: 50/30/20 % of the thread's
//! CPU time through one leaf sub) runs under every Perl of the machine
//! (Debian 12's 5.36, and trixie's 5.40, sid's 5.42 and experimental's 5.44
//! in a chroot, like a container), each started after the agent. icecore's
//! shares must be within 5 percentage points of the built-in split and of
//! Devel::NYTProf's on the same script; names, packages, files and lines
//! must be the script's, anonymous subs and evals named as `caller` names
//! them, and an XS function's native frames must sit under the Perl sub
//! calling it.
//!
//! Every test loads BPF programs and needs root; without root it prints why it
//! is skipped and passes.
//!
//!     sudo -E cargo test --release --test integration -- perl:: --test-threads=1 --nocapture

use crate::support;

use std::process::Child;
use std::thread::sleep;
use std::time::Duration;

use support::perl::{
    Perl, fixture_script, interpreters, nytprof, nytprof_inclusive, spawn_fixture,
};
use support::run::SystemWideRun;
use support::summary::{DecodedSample, Frame, count_where, of_pid_since, pct, total};
use support::{now_unix_nanos, require_root, serial, tmp, wait_fixtures};

/// About a thousand samples per fixture with four sharing two CPUs.
const HZ: u32 = 499;
/// Fixture lifetime.
const FIXTURE_SECS: u32 = 12;
/// Shares are measured from here on.
const WARM_UP: Duration = Duration::from_secs(2);
/// NYTProf runs the split this long.
const NYTPROF_SECS: u32 = 6;
/// The built-in split: Split::alpha, ::beta and ::gamma, in percent.
const SPLIT: [(&str, f64); 3] = [
    ("Split::alpha", 50.0),
    ("Split::beta", 30.0),
    ("Split::gamma", 20.0),
];
const TOLERANCE_PP: f64 = 5.0;
/// The first samples of a process that must all have their Perl frames.
const FIRST_SAMPLES: usize = 20;

fn is_perl(frame: &Frame) -> bool {
    frame.kind.as_deref() == Some("perl")
}

/// The fixture's line holding `text`.
fn line_of(text: &str) -> i64 {
    let script = std::fs::read_to_string(fixture_script()).unwrap();
    let index = script
        .lines()
        .position(|l| l.contains(text))
        .unwrap_or_else(|| panic!("no {text:?} in the fixture"));
    index as i64 + 1
}

/// Shares of the split's subs among the samples in `Split::leaf`, and their number.
fn split_shares(samples: &[DecodedSample]) -> ([f64; 3], u64) {
    let in_leaf: Vec<&DecodedSample> = samples
        .iter()
        .filter(|s| s.contains("Split::leaf"))
        .collect();
    let n: u64 = in_leaf.iter().map(|s| s.count).sum();
    let shares = SPLIT.map(|(sub, _)| {
        let part: u64 = in_leaf
            .iter()
            .filter(|s| s.contains(sub))
            .map(|s| s.count)
            .sum();
        pct(part, n)
    });
    (shares, n)
}

/// Position of the named frame in `sample`'s stack (leaf first).
fn position(sample: &DecodedSample, name: &str) -> Option<usize> {
    sample.stack.iter().position(|f| f.function == name)
}

/// Whether the named frames are all in `sample`, leaf first in this order.
fn in_order(sample: &DecodedSample, names: &[&str]) -> bool {
    let at: Vec<Option<usize>> = names.iter().map(|n| position(sample, n)).collect();
    at.windows(2)
        .all(|w| matches!(w, [Some(a), Some(b)] if a < b))
}

#[test]
fn every_perl_matches_its_split_and_nytprof() {
    const TEST: &str = "every_perl_matches_its_split_and_nytprof";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let found = interpreters();
    assert!(!found.is_empty(), "{TEST}: no Perl on this machine");
    let has_nytprof = nytprof();

    let mut run = SystemWideRun::spawn(tmp(), HZ, &[]);
    // Every fixture starts after the agent.
    let mut fixtures: Vec<(Perl, Child)> = found
        .iter()
        .map(|p| (p.clone(), spawn_fixture(p, "split", FIXTURE_SECS)))
        .collect();
    sleep(WARM_UP);
    let from = now_unix_nanos();
    let pids: Vec<u32> = fixtures.iter().map(|(_, c)| c.id()).collect();
    wait_fixtures(&mut fixtures, |x| &x.label);
    run.finish_after_fixtures();
    let received = run.otlp_of(pids[0]);

    // NYTProf on Debian's perl, the same script, alone on the machine.
    let reference = (has_nytprof && found[0].root.is_none()).then(|| {
        let dir = tmp();
        let times = nytprof_inclusive(&found[0], NYTPROF_SECS, dir.path(), &SPLIT.map(|s| s.0));
        let sum: f64 = times.iter().sum();
        [0, 1, 2].map(|i| 100.0 * times[i] / sum)
    });

    let leaf_lines = line_of("sub leaf {")..=line_of("return $x;");
    println!(
        "{TEST}: {:<34} {:>7} {:>8} {:>20} {:>20} {:>9}",
        "interpreter", "samples", "in_perl", "icecore a/b/g %", "NYTProf a/b/g %", "first_ok"
    );
    let mut failures = Vec::new();
    for (i, ((perl, _), &pid)) in fixtures.iter().zip(&pids).enumerate() {
        let label = &perl.label;
        let (samples, _) = of_pid_since(&received.samples, pid, from);
        let all = total(&samples);
        let in_perl = pct(
            count_where(&samples, |s| s.contains("main::split_main")),
            all,
        );
        let (shares, n) = split_shares(&samples);
        // Complete from the process's first sample: every sample taken
        // while the script ran (under `perl_run`) has its Perl frames.
        let (whole, _) = of_pid_since(&received.samples, pid, 0);
        let mut running: Vec<(u64, bool)> = whole
            .iter()
            .filter(|s| s.contains("perl_run"))
            .flat_map(|s| {
                let perl = s.stack.iter().any(is_perl);
                s.timestamps.iter().map(move |&t| (t, perl))
            })
            .collect();
        running.sort_unstable();
        let with_perl = running.iter().filter(|(_, perl)| *perl).count();
        let first_complete = running.iter().take(FIRST_SAMPLES).all(|(_, perl)| *perl);
        let running = running.len();
        let nytprof = reference.filter(|_| i == 0);
        let fmt = |s: [f64; 3]| format!("{:.1}/{:.1}/{:.1}", s[0], s[1], s[2]);
        println!(
            "{TEST}: {label:<34} {all:>7} {in_perl:>7.1}% {:>20} {:>20} {with_perl:>4}/{running}",
            fmt(shares),
            nytprof.map_or("-".into(), fmt),
        );
        if n < 300 {
            failures.push(format!("{label}: only {n} samples in Split::leaf"));
        }
        if in_perl < 95.0 {
            failures.push(format!(
                "{label}: {in_perl:.1}% of samples have the script's Perl frames (expected ≥ 95%)"
            ));
        }
        for (j, (sub, expected)) in SPLIT.iter().enumerate() {
            if (shares[j] - expected).abs() > TOLERANCE_PP {
                failures.push(format!(
                    "{label}: {sub} {:.1}%, built-in split {expected}%",
                    shares[j]
                ));
            }
            if let Some(nytprof) = nytprof
                && (shares[j] - nytprof[j]).abs() > TOLERANCE_PP
            {
                failures.push(format!(
                    "{label}: {sub} {:.1}% vs NYTProf's {:.1}%",
                    shares[j], nytprof[j]
                ));
            }
        }
        if running < 100 || !first_complete || running - with_perl > 3 {
            let without: Vec<Vec<&str>> = whole
                .iter()
                .filter(|s| s.contains("perl_run") && !s.stack.iter().any(is_perl))
                .take(3)
                .map(|s| s.names())
                .collect();
            failures.push(format!(
                "{label}: {with_perl} of {running} samples under perl_run have Perl frames \
                 (the first {FIRST_SAMPLES} and all but 3 expected); without: {without:?}"
            ));
        }
        // Names, frame type, file and line of the leaf.
        let leaves: Vec<&Frame> = samples
            .iter()
            .flat_map(|s| &s.stack)
            .filter(|f| f.function == "Split::leaf")
            .collect();
        let wrong: Vec<&&Frame> = leaves
            .iter()
            .filter(|f| {
                !is_perl(f)
                    || !f
                        .filename
                        .as_deref()
                        .is_some_and(|p| p.ends_with("perl_split.pl"))
                    || !leaf_lines.contains(&f.line)
            })
            .collect();
        if leaves.is_empty() || !wrong.is_empty() {
            failures.push(format!(
                "{label}: Split::leaf frames not of type perl at perl_split.pl:{leaf_lines:?}: {:?}",
                &wrong[..wrong.len().min(3)]
            ));
        }
        // The Perl frames in order, and under the interpreter's native
        // frames (`perl_run`) where the run loop stood.
        let leaf_samples: Vec<&DecodedSample> = samples
            .iter()
            .filter(|s| s.contains("Split::leaf"))
            .collect();
        let ordered = leaf_samples
            .iter()
            .filter(|s| {
                let sub = SPLIT.iter().find(|(sub, _)| s.contains(sub)).map(|s| s.0);
                sub.is_some_and(|sub| {
                    in_order(
                        s,
                        &["Split::leaf", sub, "main::split_main", "main", "perl_run"],
                    )
                })
            })
            .count();
        if pct(ordered as u64, leaf_samples.len() as u64) < 99.0 {
            let example = leaf_samples.first().map(|s| s.names()).unwrap_or_default();
            failures.push(format!(
                "{label}: {ordered} of {} stacks through Split::leaf in order (leaf, \
                 alpha/beta/gamma, main::split_main, main, perl_run): {example:?}",
                leaf_samples.len()
            ));
        }
    }
    if has_nytprof && reference.is_none() {
        failures.push("NYTProf did not run on Debian's perl".into());
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}

#[test]
fn anonymous_subs_evals_and_xs_are_named_in_place() {
    const TEST: &str = "anonymous_subs_evals_and_xs_are_named_in_place";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    // The oldest and the newest Perl.
    let found = interpreters();
    let chosen: Vec<Perl> = [found.first(), found.last()]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    assert!(!chosen.is_empty(), "{TEST}: no Perl on this machine");

    let mut run = SystemWideRun::spawn(tmp(), HZ, &[]);
    let mut fixtures: Vec<(Perl, Child)> = chosen
        .iter()
        .map(|p| (p.clone(), spawn_fixture(p, "names", FIXTURE_SECS / 2)))
        .collect();
    let pids: Vec<u32> = fixtures.iter().map(|(_, c)| c.id()).collect();
    wait_fixtures(&mut fixtures, |x| &x.label);
    run.finish_after_fixtures();
    let received = run.otlp_of(pids[0]);

    let anon_line = line_of("my $anon = sub");
    let mut failures = Vec::new();
    for ((perl, _), &pid) in fixtures.iter().zip(&pids) {
        let label = &perl.label;
        let (samples, _) = of_pid_since(&received.samples, pid, 0);
        let count = |pred: &dyn Fn(&DecodedSample) -> bool| {
            samples
                .iter()
                .filter(|s| pred(s))
                .map(|s| s.count)
                .sum::<u64>()
        };
        let anon = count(&|s| {
            in_order(
                s,
                &["Split::leaf", "main::__ANON__", "main::names_main", "main"],
            )
        });
        let helper = count(&|s| {
            in_order(
                s,
                &["Split::leaf", "Other::Place::helper", "main::names_main"],
            )
        });
        let eval = count(&|s| in_order(s, &["Split::leaf", "(eval)", "main::names_main"]));
        // The XS function's frames (List::Util's Util.so) above the sub
        // that called it, with no Perl frame between.
        let in_xs = |s: &DecodedSample| {
            let Some(caller) = position(s, "main::summed") else {
                return false;
            };
            let xs = s.stack.iter().position(|f| {
                f.mapping
                    .as_deref()
                    .is_some_and(|m| m.ends_with("/Util.so"))
            });
            xs.is_some_and(|xs| xs < caller && s.stack[xs..caller].iter().all(|f| !is_perl(f)))
        };
        let xs = count(&in_xs);
        let summed = count(&|s| s.contains("main::summed"));
        // The anonymous sub's frame is at its call in the sub's body.
        let anon_frames: Vec<&Frame> = samples
            .iter()
            .flat_map(|s| &s.stack)
            .filter(|f| f.function == "main::__ANON__")
            .collect();
        let anon_at_body = anon_frames.iter().filter(|f| f.line == anon_line).count();
        println!(
            "{TEST}: {label}: anon {anon}, helper {helper}, eval {eval}, xs {xs} of {summed} \
             under main::summed, anon frames at line {anon_line}: {anon_at_body}/{}",
            anon_frames.len()
        );
        for (what, n) in [
            ("main::__ANON__", anon),
            ("Other::Place::helper", helper),
            ("(eval)", eval),
        ] {
            if n < 50 {
                failures.push(format!("{label}: only {n} samples through {what} in place"));
            }
        }
        if xs < 50 || pct(xs, summed) < 50.0 {
            let example = samples
                .iter()
                .find(|s| s.contains("main::summed"))
                .map(|s| s.names())
                .unwrap_or_default();
            failures.push(format!(
                "{label}: {xs} of {summed} samples under main::summed have Util.so's XS frames \
                 above it: {example:?}"
            ));
        }
        // Line 0 is "unknown", not a wrong line: CI run 8 (2026-11-27) had
        // 1 of 265 on 5.44, not yet explained. At most 1 % may be; any
        // other line fails.
        let unknown = anon_frames.iter().filter(|f| f.line == 0).count();
        if anon_frames.is_empty()
            || anon_at_body + unknown != anon_frames.len()
            || pct(unknown as u64, anon_frames.len() as u64) > 1.0
        {
            let odd: Vec<Vec<String>> = samples
                .iter()
                .filter(|s| {
                    s.stack
                        .iter()
                        .any(|f| f.function == "main::__ANON__" && f.line != anon_line)
                })
                .take(3)
                .map(|s| {
                    s.stack
                        .iter()
                        .map(|f| format!("{}:{}", f.function, f.line))
                        .collect()
                })
                .collect();
            failures.push(format!(
                "{label}: main::__ANON__ frames not at line {anon_line}: {:?}; stacks: {odd:?}",
                anon_frames
                    .iter()
                    .map(|f| f.line)
                    .collect::<std::collections::BTreeSet<_>>()
            ));
        }
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}
