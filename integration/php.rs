// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of the PHP unwinder: a fixture with a known split
//! between PHP methods (`fixtures/php_split.php`: 50/30/20 % of the CPU
//! time through one leaf function, the last share through a closure) runs
//! under every PHP of the machine (Debian's 8.2, sid's 8.4 and
//! experimental's 8.5 in a chroot, like a container), with opcache's JIT
//! off and on, and a thread-safe (ZTS) 8.2 built from Debian's source,
//! each started after the agent. icecore's shares must be
//! within 5 percentage points of the built-in split and of php-excimer's
//! (Debian's for 8.2 and 8.4, built from Debian's source for 8.5), sampling
//! the same run; a fixture whose excimer misses the built-in split by more
//! than 4 points runs again alone, for a reference.
//! Names, classes, closures, files and lines must be the script's; an
//! internal function must sit between its PHP caller and its C code; the
//! workers of a php-fpm pool sharing one opcache must each be profiled.
//!
//! Every test loads BPF programs and needs root; without root it prints why
//! it is skipped and passes.
//!
//!     sudo -E cargo test --release --test integration -- php:: --test-threads=1 --nocapture

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::thread::sleep;
use std::time::Duration;

use support::php::{Fpm, Php, fixture_script, interpreters, read_collapsed, spawn_fixture};
use support::run::SystemWideRun;
use support::summary::{DecodedSample, Frame, count_where, of_pid_since, pct, total};
use support::{now_unix_nanos, require_root, serial, tmp, wait_fixtures};

/// Several hundred samples per fixture with six sharing two CPUs.
const HZ: u32 = 499;
/// Fixture lifetime.
const FIXTURE_SECS: u32 = 14;
/// Lifetime of the fixtures excimer samples too: longer, as excimer's
/// shares vary by 2-4 percentage points between runs of 14 s.
const EXCIMER_FIXTURE_SECS: u32 = 20;
/// Shares are measured from here on.
const WARM_UP: Duration = Duration::from_secs(3);
/// The built-in split: Split::alpha, ::beta and ::gamma, in percent.
const SPLIT: [(&str, f64); 3] = [
    ("Split::alpha", 50.0),
    ("Split::beta", 30.0),
    ("Split::gamma", 20.0),
];
const TOLERANCE_PP: f64 = 5.0;

fn is_php(frame: &Frame) -> bool {
    frame.kind.as_deref() == Some("php")
}

/// Positions of the named frame in `sample`'s stack (leaf first).
fn position(sample: &DecodedSample, name: &str) -> Option<usize> {
    sample.stack.iter().position(|f| f.function == name)
}

/// The line of the first line of the fixture containing `text` (1-based).
fn fixture_line(text: &str) -> i64 {
    let source = std::fs::read_to_string(fixture_script()).unwrap();
    source
        .lines()
        .position(|l| l.contains(text))
        .map(|i| i as i64 + 1)
        .unwrap_or_else(|| panic!("no {text:?} in the fixture"))
}

/// The name PHP gives the closure in `Split::gamma`: `{closure}` before
/// 8.4, `{closure:Split::gamma():LINE}` since, prefixed by its class.
fn closure_name(php: &Php) -> String {
    if php.minor >= 4 {
        format!(
            "Split::{{closure:Split::gamma():{}}}",
            fixture_line("$spin = function")
        )
    } else {
        "Split::{closure}".into()
    }
}

/// Shares of the split's methods among the samples in `leaf`, and their number.
fn split_shares(samples: &[DecodedSample]) -> ([f64; 3], u64) {
    let in_leaf: Vec<&DecodedSample> = samples.iter().filter(|s| s.contains("leaf")).collect();
    let n: u64 = in_leaf.iter().map(|s| s.count).sum();
    let shares = SPLIT.map(|(method, _)| {
        let part: u64 = in_leaf
            .iter()
            .filter(|s| s.contains(method))
            .map(|s| s.count)
            .sum();
        pct(part, n)
    });
    (shares, n)
}

/// The same shares in php-excimer's collapsed stacks.
fn excimer_shares(stacks: &[(Vec<String>, u64)]) -> ([f64; 3], u64) {
    let parts = SPLIT.map(|(method, _)| {
        stacks
            .iter()
            .filter(|(frames, _)| frames.last().is_some_and(|f| f == "leaf"))
            .filter(|(frames, _)| frames.iter().any(|f| f == method))
            .map(|(_, n)| n)
            .sum::<u64>()
    });
    let n: u64 = parts.iter().sum();
    (parts.map(|p| pct(p, n)), n)
}

/// How far excimer's shares may be from the built-in split for its run
/// to serve as a reference (its shares vary by 2-4 points between runs).
const EXCIMER_REFERENCE_PP: f64 = 4.0;

/// One run of the split fixture under one PHP.
struct Fixture {
    php: Php,
    child: Child,
    /// Shares are measured from here on (Unix nanoseconds).
    from: u64,
    /// Excimer's shares of the same run and its sample count, if it ran.
    excimer: Option<([f64; 3], u64)>,
    /// A second run, alone, as the first one's excimer missed the split.
    rerun: bool,
}

impl Fixture {
    fn excimer_misses_split(&self) -> bool {
        self.excimer.is_some_and(|(shares, _)| {
            SPLIT
                .iter()
                .zip(shares)
                .any(|((_, expected), share)| (share - expected).abs() > EXCIMER_REFERENCE_PP)
        })
    }
}

/// Runs the split fixture under each of `phase` at once (with excimer where
/// installed) and waits for them.
fn run_phase(phase: &[&Php], rerun: bool) -> Vec<Fixture> {
    let started: Vec<(&Php, Child, Option<PathBuf>)> = phase
        .iter()
        .enumerate()
        .map(|(i, &php)| {
            // Read when the phase ends, so a file per position is enough.
            let out = php
                .excimer
                .then(|| Path::new("/tmp").join(format!("icecore-excimer-{i}.txt")));
            let extra: Vec<String> = out.iter().map(|p| p.display().to_string()).collect();
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            let seconds = if php.excimer {
                EXCIMER_FIXTURE_SECS
            } else {
                FIXTURE_SECS
            };
            (php, spawn_fixture(php, "split", seconds, &extra), out)
        })
        .collect();
    sleep(WARM_UP);
    let from = now_unix_nanos();
    started
        .into_iter()
        .map(|(php, mut child, out)| {
            let status = child.wait().expect("wait for the fixture");
            assert!(status.success(), "{}: fixture failed: {status}", php.label);
            let excimer = out.map(|out| excimer_shares(&read_collapsed(&php.host_path(&out))));
            Fixture {
                php: php.clone(),
                child,
                from,
                excimer,
                rerun,
            }
        })
        .collect()
}

#[test]
fn every_php_matches_its_split_and_excimer() {
    const TEST: &str = "every_php_matches_its_split_and_excimer";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let found = interpreters();
    assert!(!found.is_empty(), "{TEST}: no PHP 8.2-8.5 on this machine");
    let leaf_lines = fixture_line("function leaf(")..=fixture_line("return $x;");
    let closure_line = fixture_line("return leaf($m);");
    let closure_lines = fixture_line("$spin = function")..=closure_line + 1;

    let mut run = SystemWideRun::spawn(tmp(), HZ, &[]);
    // Every fixture starts after the agent; excimer samples the same run.
    // Two phases, 8.2 and 8.4 then 8.5 and the ZTS build, so that both
    // profilers get enough samples of each (four fixtures on two CPUs).
    let mut fixtures: Vec<Fixture> = Vec::new();
    for first_phase in [true, false] {
        let phase: Vec<&Php> = found
            .iter()
            .filter(|php| (php.minor <= 4 && php.program.is_none()) == first_phase)
            .collect();
        fixtures.extend(run_phase(&phase, false));
    }
    // Excimer is a reference only where it finds the built-in split: with
    // four fixtures on two CPUs its shares vary by 2-4 points between runs,
    // and once missed the split by 6 (8.4 with the JIT: 43.9/32.7/23.3,
    // icecore 51.8/28.3/19.8). Such a fixture runs again, alone, and icecore
    // is compared with that run's excimer, whatever it finds; the first run
    // is still held to the built-in split.
    let rerun: Vec<Php> = fixtures
        .iter()
        .filter(|f| f.excimer_misses_split())
        .map(|f| f.php.clone())
        .collect();
    for php in &rerun {
        fixtures.extend(run_phase(&[php], true));
    }
    let pids: Vec<u32> = fixtures.iter().map(|f| f.child.id()).collect();
    run.finish_after_fixtures();
    let received = run.otlp_of(pids[0]);

    println!(
        "{TEST}: {:<36} {:>7} {:>7} {:>20} {:>20} {:>9} {:>9} {:>13}",
        "php",
        "samples",
        "in_php",
        "icecore a/b/g %",
        "excimer a/b/g %",
        "excimer_n",
        "ordered",
        "other threads"
    );
    let mut failures = Vec::new();
    for (fixture, &pid) in fixtures.iter().zip(&pids) {
        let php = &fixture.php;
        let label = if fixture.rerun {
            format!("{} (run again)", php.label)
        } else {
            php.label.clone()
        };
        let (samples, _) = of_pid_since(&received.samples, pid, fixture.from);
        let all = total(&samples);
        let in_php = pct(count_where(&samples, |s| s.contains("split_main")), all);
        let (shares, n) = split_shares(&samples);
        let excimer = fixture.excimer.as_ref();
        let (excimer_shares, excimer_n) = excimer.copied().unwrap_or(([0.0; 3], 0));
        // A run whose excimer missed the split ran again: its excimer is no reference.
        let compare_excimer =
            excimer.is_some() && (fixture.rerun || !fixture.excimer_misses_split());
        // The closure's stacks in order, down to the native code running the script.
        let closure = closure_name(php);
        let through_gamma: Vec<&DecodedSample> = samples
            .iter()
            .filter(|s| s.contains("Split::gamma"))
            .collect();
        let ordered = count_where(&samples, |s| {
            let order = [
                "leaf",
                closure.as_str(),
                "Split::gamma",
                "split_main",
                "<main>",
                "php_execute_script",
            ]
            .map(|name| {
                position(s, name).or_else(|| {
                    // 8.5 renamed the function running the script.
                    (name == "php_execute_script")
                        .then(|| position(s, "php_execute_script_ex"))
                        .flatten()
                })
            });
            s.contains("Split::gamma")
                && order
                    .windows(2)
                    .all(|w| matches!(w, [Some(a), Some(b)] if a < b))
        });
        let gamma_n: u64 = through_gamma.iter().map(|s| s.count).sum();
        // Excimer's timer threads run no PHP: the main thread's frames on
        // them (an NTS build's globals are the process's) would be wrong.
        let other_thread = |s: &DecodedSample| s.thread_id.is_some_and(|t| t != i64::from(pid));
        let others = count_where(&samples, other_thread);
        let others_in_php = count_where(&samples, |s| other_thread(s) && s.contains("split_main"));
        let fmt = |s: [f64; 3]| format!("{:.1}/{:.1}/{:.1}", s[0], s[1], s[2]);
        println!(
            "{TEST}: {label:<36} {all:>7} {in_php:>6.1}% {:>20} {:>20} {excimer_n:>9} {ordered:>4}/{gamma_n} {others:>13}",
            fmt(shares),
            match (excimer.is_some(), compare_excimer) {
                (false, _) => "-".into(),
                (true, true) => fmt(excimer_shares),
                (true, false) => format!("({}) missed", fmt(excimer_shares)),
            },
        );
        if others_in_php != 0 {
            failures.push(format!(
                "{label}: {others_in_php} of {others} samples of threads other than the main one \
                 have the script's PHP frames"
            ));
        }
        if n < 300 {
            failures.push(format!("{label}: only {n} samples in leaf"));
        }
        if in_php < 95.0 {
            failures.push(format!(
                "{label}: {in_php:.1}% of samples have the script's PHP frames (expected ≥ 95%)"
            ));
        }
        for (i, (method, expected)) in SPLIT.iter().enumerate() {
            if (shares[i] - expected).abs() > TOLERANCE_PP {
                failures.push(format!(
                    "{label}: {method} {:.1}%, built-in split {expected}%",
                    shares[i]
                ));
            }
            if compare_excimer
                && (excimer_n < 1000 || (shares[i] - excimer_shares[i]).abs() > TOLERANCE_PP)
            {
                failures.push(format!(
                    "{label}: {method} {:.1}% vs excimer's {:.1}% ({excimer_n} samples)",
                    shares[i], excimer_shares[i]
                ));
            }
        }
        if gamma_n < 50 || pct(ordered, gamma_n) < 95.0 {
            let example = through_gamma.first().map(|s| s.names()).unwrap_or_default();
            failures.push(format!(
                "{label}: {ordered} of {gamma_n} stacks through Split::gamma in order \
                 (leaf, {closure}, Split::gamma, split_main, <main>, php_execute_script): {example:?}"
            ));
        }
        // The leaf's and the closure's frame type, file and lines, with the
        // number of samples of each.
        let frames_of = |name: &str| -> Vec<(&Frame, u64)> {
            samples
                .iter()
                .flat_map(|s| s.stack.iter().map(|f| (f, s.count)))
                .filter(|(f, _)| f.function == name)
                .collect()
        };
        let in_fixture = |f: &Frame| {
            f.filename
                .as_deref()
                .is_some_and(|p| p.ends_with("php_split.php"))
        };
        let leaves = frames_of("leaf");
        let wrong: Vec<&Frame> = leaves
            .iter()
            .map(|&(f, _)| f)
            .filter(|f| !is_php(f) || !in_fixture(f) || !leaf_lines.contains(&f.line))
            .collect();
        if leaves.is_empty() || !wrong.is_empty() {
            failures.push(format!(
                "{label}: leaf frames not of type php at php_split.php:{leaf_lines:?}: {:?}",
                &wrong[..wrong.len().min(3)]
            ));
        }
        // At its call of leaf, or in its own first opcodes when sampled there:
        // by samples, since a stack sampled in those opcodes once is as
        // distinct as one sampled at the call a thousand times (8.2's JIT:
        // 13 of 15 distinct stacks at the call).
        let closures = frames_of(&closure);
        let wrong: Vec<&Frame> = closures
            .iter()
            .map(|&(f, _)| f)
            .filter(|f| !is_php(f) || !in_fixture(f) || !closure_lines.contains(&f.line))
            .collect();
        let closure_n: u64 = closures.iter().map(|&(_, n)| n).sum();
        let at_call: u64 = closures
            .iter()
            .filter(|(f, _)| f.line == closure_line)
            .map(|&(_, n)| n)
            .sum();
        if closures.is_empty() || !wrong.is_empty() || pct(at_call, closure_n) < 90.0 {
            failures.push(format!(
                "{label}: {closure} frames not at php_split.php:{closure_lines:?} \
                 ({at_call} of {closure_n} samples at {closure_line}): {:?}",
                &wrong[..wrong.len().min(3)]
            ));
        }
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}

#[test]
fn internal_functions_and_fpm_workers_are_attributed() {
    const TEST: &str = "internal_functions_and_fpm_workers_are_attributed";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    // The oldest and the newest Debian engine, without the JIT (php-fpm's
    // opcache is on: its workers share their functions).
    let found: Vec<Php> = interpreters()
        .into_iter()
        .filter(|p| !p.jit && p.program.is_none())
        .collect();
    let chosen: Vec<Php> = [found.first(), found.last()]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    assert!(!chosen.is_empty(), "{TEST}: no PHP on this machine");

    let mut run = SystemWideRun::spawn(tmp(), HZ, &[]);
    let mut digests: Vec<(Php, Child)> = chosen
        .iter()
        .map(|p| (p.clone(), spawn_fixture(p, "digest", FIXTURE_SECS / 2, &[])))
        .collect();
    let pools: Vec<Fpm> = chosen.iter().map(|p| Fpm::start(p, 3)).collect();
    sleep(WARM_UP);
    let from = now_unix_nanos();
    let digest_pids: Vec<u32> = digests.iter().map(|(_, c)| c.id()).collect();
    let workers: Vec<Vec<u32>> = pools.iter().map(Fpm::workers).collect();
    let answered: Vec<u64> = std::thread::scope(|scope| {
        let drivers: Vec<_> = pools
            .iter()
            .map(|pool| scope.spawn(|| pool.drive(3, 50, Duration::from_secs(8))))
            .collect();
        drivers.into_iter().map(|d| d.join().unwrap()).collect()
    });
    wait_fixtures(&mut digests, |x| &x.label);
    run.finish_after_fixtures();
    let received = run.otlp_of(digest_pids[0]);

    let mut failures = Vec::new();
    for (php, pid) in chosen.iter().zip(&digest_pids) {
        let label = &php.label;
        let (samples, _) = of_pid_since(&received.samples, *pid, from);
        let caller = count_where(&samples, |s| s.contains("digest_loop"));
        // hash (PHP's frame for the C function) right under its C code,
        // right above its PHP caller.
        let in_place = count_where(&samples, |s| {
            let hash = position(s, "hash");
            let caller = position(s, "digest_loop");
            let native_above = hash.is_some_and(|h| {
                s.stack[..h]
                    .iter()
                    .any(|f| f.kind.as_deref() == Some("native"))
            });
            matches!((hash, caller), (Some(h), Some(c)) if h + 1 == c) && native_above
        });
        let hash_frames: Vec<&Frame> = samples
            .iter()
            .flat_map(|s| &s.stack)
            .filter(|f| f.function == "hash")
            .collect();
        println!(
            "{TEST}: {label}: digest_loop {caller} samples, {in_place} ({:.1}%) with hash's C \
             code over hash over digest_loop",
            pct(in_place, caller)
        );
        if caller < 200 || pct(in_place, caller) < 80.0 {
            let example = samples
                .iter()
                .find(|s| s.contains("digest_loop"))
                .map(|s| s.names());
            failures.push(format!(
                "{label}: hash not in place: {in_place} of {caller}; e.g. {example:?}"
            ));
        }
        if hash_frames
            .iter()
            .any(|f| !is_php(f) || f.filename.is_some() || f.line != 0)
        {
            failures.push(format!(
                "{label}: hash's frames are not PHP frames without a file: {:?}",
                &hash_frames[..hash_frames.len().min(2)]
            ));
        }
    }
    for ((php, pool_workers), answered) in chosen.iter().zip(&workers).zip(&answered) {
        let label = &php.label;
        let per_worker: Vec<(u32, u64, u64)> = pool_workers
            .iter()
            .map(|&pid| {
                let (samples, _) = of_pid_since(&received.samples, pid, from);
                let named = count_where(&samples, |s| {
                    ["leaf", "split_main", "fpm_request", "<main>"]
                        .map(|name| position(s, name))
                        .windows(2)
                        .all(|w| matches!(w, [Some(a), Some(b)] if a < b))
                });
                (pid, named, total(&samples))
            })
            .collect();
        println!(
            "{TEST}: {label}: php-fpm answered {answered} requests; per worker (pid, named, \
             samples): {per_worker:?}"
        );
        if pool_workers.len() != 3 || per_worker.iter().any(|&(_, named, _)| named < 100) {
            failures.push(format!(
                "{label}: each of php-fpm's 3 workers needs ≥ 100 samples through \
                 leaf, split_main, fpm_request, <main>: {per_worker:?}"
            ));
        }
    }
    drop(pools);
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}

#[test]
fn a_rejected_php_program_leaves_php_profiled_natively() {
    const TEST: &str = "a_rejected_php_program_leaves_php_profiled_natively";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let php = interpreters().into_iter().next().expect("Debian's PHP 8.2");
    // The test switch makes the PHP program fail verification: the path a
    // kernel that rejects it takes.
    let mut run =
        SystemWideRun::spawn_wrapped(tmp(), HZ, &["env", "ICECORE_TEST_REJECT_RUNTIME=php"], &[]);
    let mut fixture = vec![(
        php.clone(),
        spawn_fixture(&php, "split", FIXTURE_SECS / 2, &[]),
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
        logs.contains("the kernel rejected the runtime's BPF program") && logs.contains("php"),
        "{TEST}: no log line says PHP is off\n{logs}"
    );
    assert_eq!(metrics.bpf_event("runtime_program_missing"), 0, "{TEST}");
    let received = run.otlp_of(pid);
    let (samples, _) = of_pid_since(&received.samples, pid, from);
    let n = total(&samples);
    let php_frames = count_where(&samples, |s| s.stack.iter().any(is_php));
    let native = count_where(&samples, |s| s.contains("execute_ex"));
    println!("{TEST}: {n} samples, {native} through execute_ex, {php_frames} with PHP frames");
    assert!(n >= 200, "{TEST}: the PHP process got {n} samples");
    assert_eq!(php_frames, 0, "{TEST}: PHP frames without PHP's program");
    assert!(
        pct(native, n) >= 80.0,
        "{TEST}: native frames lost: {native} of {n} through execute_ex"
    );
}
