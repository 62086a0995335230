// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of the HotSpot unwinder: a Java fixture with a known
//! split (`fixtures/JvmSplit.java`: 50/30/20 % of the thread's CPU time
//! through one leaf method, whose loop calls a tiny method C2 inlines) runs
//! under every JDK of the machine (8, 11, 17, 21, 25, 27; 8 and 27 are
//! Debian sid's, run in its chroot as in a container), each started after
//! the agent and without any JVM flag. icecore's shares must be within 5 percentage points of the
//! split and of the JVM's own Flight Recorder on the same run; inlined
//! frames must be reported as such; JNI code must sit under its Java
//! caller, a thread pool's threads must be named, a class loaded late
//! must be named, frames caught in prologues and epilogues must reach their
//! callers, and a frame pending deoptimization must keep the methods
//! inlined in it.
//!
//! Every test loads BPF programs and needs root; without root it prints why it
//! is skipped and passes.
//!
//!     sudo -E cargo test --release --test integration -- jvm:: --test-threads=1 --nocapture

use crate::support;

use std::collections::BTreeSet;
use std::process::Child;
use std::thread::sleep;
use std::time::Duration;

use support::jvm::{Jdk, compile_fixture, jdks, jfr_stacks, spawn_fixture};
use support::run::SystemWideRun;
use support::summary::{DecodedSample, Frame, count_where, of_pid_since, pct, total};
use support::{now_unix_nanos, require_root, serial, tmp, wait_fixtures};

#[path = "jvm/transitions.rs"]
mod transitions;

/// About a thousand samples per fixture with four sharing two CPUs.
const HZ: u32 = 499;
/// Fixture lifetime: long enough for C2 to compile and inline.
const FIXTURE_SECS: u32 = 14;
/// The split test's fixtures: their window starts once every JVM is
/// described, up to 8 s after they start.
const SPLIT_FIXTURE_SECS: u32 = FIXTURE_SECS + 8;
/// Shares are measured from here on (the JIT has warmed up).
const WARM_UP: Duration = Duration::from_secs(6);
/// The built-in split, in percent.
const SPLIT: [(&str, f64); 3] = [("alpha", 50.0), ("beta", 30.0), ("gamma", 20.0)];
const TOLERANCE_PP: f64 = 5.0;
/// The lines of `JvmSplit.leaf`'s body.
fn leaf_lines() -> std::ops::RangeInclusive<i64> {
    fixture_line("long stop = cpu() + budgetNanos;")..=fixture_line("return x;")
}
/// The line of `JvmSplit.step`'s body.
fn step_line() -> i64 {
    fixture_line("return x + ((i * 31) ^ (x >>> 7));")
}
/// The line of `JvmSplit.cpu`'s body (its call to the thread MX bean).
fn cpu_line() -> i64 {
    fixture_line("return THREADS.getCurrentThreadCpuTime();")
}

/// The line of the fixture's source that holds `text` (exactly once).
fn fixture_line(text: &str) -> i64 {
    let source =
        std::fs::read_to_string(support::package_dir().join("integration/fixtures/JvmSplit.java"))
            .expect("the fixture's source");
    let found: Vec<usize> = source
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(text))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(found.len(), 1, "{text:?} on lines {found:?} of the fixture");
    found[0] as i64
}

/// What every test here starts from: the test lock, the machine's JDKs
/// and the fixture compiled. `None` (the test is skipped) without root.
struct Setup {
    _serial: std::sync::MutexGuard<'static, ()>,
    jdks: Vec<Jdk>,
    _classes_dir: tempfile::TempDir,
    classes: std::path::PathBuf,
}

fn setup(test: &str) -> Option<Setup> {
    if !require_root(test) {
        return None;
    }
    let serial = serial();
    let jdks = jdks();
    assert!(!jdks.is_empty(), "{test}: no JDK on this machine");
    let classes_dir = tmp();
    let classes = compile_fixture(classes_dir.path());
    Some(Setup {
        _serial: serial,
        jdks,
        _classes_dir: classes_dir,
        classes,
    })
}

fn is_jvm(frame: &Frame) -> bool {
    frame.kind.as_deref() == Some("jvm")
}

/// Shares of alpha, beta and gamma among samples in `JvmSplit.leaf`.
fn split_shares<'a>(stacks: impl Iterator<Item = (Vec<&'a str>, u64)>) -> ([f64; 3], u64) {
    let mut parts = [0u64; 3];
    for (names, count) in stacks {
        if !names.contains(&"JvmSplit.leaf") {
            continue;
        }
        for (i, (method, _)) in SPLIT.iter().enumerate() {
            if names.contains(&format!("JvmSplit.{method}").as_str()) {
                parts[i] += count;
            }
        }
    }
    let n: u64 = parts.iter().sum();
    (parts.map(|p| pct(p, n)), n)
}

/// Whether `sample` has `inner` inlined into `outer`: two lines of one
/// compiled location (the same address).
fn inlined_into(sample: &DecodedSample, inner: &str, outer: &str) -> bool {
    sample.stack.windows(2).any(|w| {
        w[0].function == inner
            && w[0].address != 0
            && w[1].address == w[0].address
            && w[1].function == outer
    })
}

/// The JVM options of the split's run on `jdk`: 17 and 25 (one of each
/// UNSIGNED5 format) run with `DebugNonSafepoints`, which gives C2's code
/// debug information between safepoints, so that code inlined into a loop
/// is attributed exactly even where it calls nothing; 11 and 21 run without
/// any option, where inlining shows at call sites.
fn split_options(jdk: &Jdk) -> &'static [&'static str] {
    if matches!(jdk.major, 17 | 25) {
        &["-XX:+UnlockDiagnosticVMOptions", "-XX:+DebugNonSafepoints"]
    } else {
        &[]
    }
}

#[test]
fn every_jdk_matches_its_split_and_the_flight_recorder() {
    const TEST: &str = "every_jdk_matches_its_split_and_the_flight_recorder";
    let Some(setup) = setup(TEST) else {
        return;
    };
    let (found, classes) = (&setup.jdks, &setup.classes);
    let recordings = tmp();

    let mut run = SystemWideRun::spawn(tmp(), HZ, &[]);
    let mut fixtures: Vec<(Jdk, Child)> = found
        .iter()
        .map(|jdk| {
            let jfr = jdk.recording(recordings.path());
            (
                jdk.clone(),
                spawn_fixture(
                    jdk,
                    classes,
                    "split",
                    SPLIT_FIXTURE_SECS,
                    Some(&jfr),
                    split_options(jdk),
                    None,
                ),
            )
        })
        .collect();
    // Measured once icecore has described every JVM: six JVMs with the
    // Flight Recorder starting at once on two CPUs took up to 8 s to be
    // described on the CI machine of 2026-11-27, which cut into a window
    // measured from a fixed time.
    for (_, child) in &fixtures {
        let described = format!("HotSpot JVM pid={} ", child.id());
        run.icecore
            .wait_for_log(&described, Duration::from_secs(60));
    }
    sleep(WARM_UP);
    let from = now_unix_nanos();
    let pids: Vec<u32> = fixtures.iter().map(|(_, c)| c.id()).collect();
    wait_fixtures(&mut fixtures, |x| &x.label);
    run.finish_after_fixtures();
    let received = run.otlp_of(pids[0]);

    println!(
        "{TEST}: {:<20} {:>7} {:>7} {:>20} {:>20} {:>6} {:>9}",
        "jdk", "samples", "in_java", "icecore a/b/g %", "JFR a/b/g %", "jfr_n", "in/inlined"
    );
    println!(
        "{TEST}: (in_java: of the samples of the thread running JvmSplit.split, but the Flight Recorder's own work)"
    );
    let mut failures = Vec::new();
    for ((jdk, _), &pid) in fixtures.iter().zip(&pids) {
        let label = &jdk.label;
        let (samples, _) = of_pid_since(&received.samples, pid, from);
        let all = total(&samples);
        // The thread running the workload: every one of its samples should
        // reach `JvmSplit.split`. The process's other threads (JIT
        // compilers, GC) take what CPU they need, which varies with the
        // machine's load (JDK 8's took 12 % of a CI run with six JVMs
        // warming up on two CPUs), so they are reported, not judged.
        let workers: BTreeSet<i64> = samples
            .iter()
            .filter(|s| s.contains("JvmSplit.split"))
            .filter_map(|s| s.thread_id)
            .collect();
        let on_workers = |s: &DecodedSample| s.thread_id.is_some_and(|t| workers.contains(&t));
        // The Flight Recorder does some of its own start-up on that thread
        // (building its metadata, instrumenting event classes as they
        // load), late on a loaded machine: its Java and native frames, not
        // the fixture's, and rightly so.
        let in_jfr = |s: &DecodedSample| {
            s.stack
                .iter()
                .any(|f| f.function.starts_with("jdk.jfr.") || f.function.starts_with("Jfr"))
        };
        let worker_samples = count_where(&samples, on_workers);
        let jfr_on_workers = count_where(&samples, |s| on_workers(s) && in_jfr(s));
        let in_java = pct(
            count_where(&samples, |s| {
                on_workers(s) && !in_jfr(s) && s.contains("JvmSplit.split")
            }),
            worker_samples - jfr_on_workers,
        );
        let process_in_java = pct(count_where(&samples, |s| s.contains("JvmSplit.split")), all);
        let (shares, n) = split_shares(samples.iter().map(|s| (s.names(), s.count)));
        let jfr = jfr_stacks(&jdk.recording(recordings.path()));
        let (jfr_shares, jfr_n) = split_shares(
            jfr.iter()
                .map(|s| (s.iter().map(String::as_str).collect(), 1)),
        );
        let exact = !split_options(jdk).is_empty();
        // Exact: `step`, inlined into `leaf`'s loop, at its own line.
        // Without the option: `cpu`, inlined into `leaf`, at its call.
        let (inner, line) = if exact {
            ("JvmSplit.step", step_line())
        } else {
            ("JvmSplit.cpu", cpu_line())
        };
        let in_inner = count_where(&samples, |s| s.contains(inner));
        let inlined = count_where(&samples, |s| {
            inlined_into(s, inner, "JvmSplit.leaf")
                && s.stack
                    .iter()
                    .any(|f| f.function == inner && f.line == line)
        });
        let fmt = |s: [f64; 3]| format!("{:.1}/{:.1}/{:.1}", s[0], s[1], s[2]);
        println!(
            "{TEST}: {label:<20} {all:>7} {in_java:>6.1}% {:>20} {:>20} {jfr_n:>6} {in_inner:>4}/{inlined} ({inner})",
            fmt(shares),
            fmt(jfr_shares)
        );
        println!(
            "{TEST}: {label}: {worker_samples} samples on {} workload thread(s), {jfr_on_workers} \
             of them in the Flight Recorder's own work; {process_in_java:.1}% of the process's \
             samples reach JvmSplit.split",
            workers.len()
        );
        if n < 300 {
            failures.push(format!("{label}: only {n} samples in JvmSplit.leaf"));
        }
        if in_java < 98.0 {
            let example = samples
                .iter()
                .find(|s| on_workers(s) && !in_jfr(s) && !s.contains("JvmSplit.split"))
                .map(|s| {
                    s.stack
                        .iter()
                        .map(|f| format!("{}@{:#x}", f.function, f.address))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            failures.push(format!(
                "{label}: {in_java:.1}% of the workload thread's samples have the fixture's Java \
                 frames (expected ≥ 98%), e.g. {example:?}"
            ));
        }
        for (i, (method, expected)) in SPLIT.iter().enumerate() {
            if (shares[i] - expected).abs() > TOLERANCE_PP {
                failures.push(format!(
                    "{label}: JvmSplit.{method} {:.1}%, built-in split {expected}%",
                    shares[i]
                ));
            }
            if jfr_n < 200 || (shares[i] - jfr_shares[i]).abs() > TOLERANCE_PP {
                failures.push(format!(
                    "{label}: JvmSplit.{method} {:.1}% vs the Flight Recorder's {:.1}% ({jfr_n} samples)",
                    shares[i], jfr_shares[i]
                ));
            }
        }
        // C2 inlined `inner` into `leaf`: its frames are lines of their
        // caller's location, and it still gets its share.
        let enough = if exact {
            in_inner * 2 >= n
        } else {
            in_inner * 20 >= n
        };
        if !enough || inlined * 10 < in_inner * 9 {
            let example = samples
                .iter()
                .find(|s| s.contains(inner))
                .map(|s| {
                    s.stack
                        .iter()
                        .map(|f| format!("{}@{:#x}:{}", f.function, f.address, f.line))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            failures.push(format!(
                "{label}: {in_inner} of {n} samples in leaf are in {inner}, {inlined} of them \
                 inlined into leaf at line {line}; e.g. {example:?}"
            ));
        }
        let leaves: Vec<&Frame> = samples
            .iter()
            .flat_map(|s| &s.stack)
            .filter(|f| f.function == "JvmSplit.leaf")
            .collect();
        let wrong: Vec<&&Frame> = leaves
            .iter()
            .filter(|f| {
                !is_jvm(f)
                    || f.filename.as_deref() != Some("JvmSplit.java")
                    || !leaf_lines().contains(&f.line)
            })
            .collect();
        if leaves.is_empty() || !wrong.is_empty() {
            failures.push(format!(
                "{label}: leaf frames not of type jvm at JvmSplit.java:{:?}: {:?}",
                leaf_lines(),
                &wrong[..wrong.len().min(3)]
            ));
        }
        // The native frames that called Java stay under it.
        let through_java = count_where(&samples, |s| s.stack.iter().any(is_jvm));
        let under_native = count_where(&samples, reaches_below_java);
        let named = count_where(&samples, names_call_helper);
        println!(
            "{TEST}: {label}: {under_native} of {through_java} samples through Java ({:.1}%) reach \
             {NATIVE_FRAMES_UNDER_JAVA}+ native frames under their Java frames; {named} name \
             JavaCalls::call_helper there",
            pct(under_native, through_java)
        );
        // Named where libjvm names it (not Debian's JDK 8): samples of a
        // JVM that exits keep the mappings they were taken with.
        if jdk.major != 8 && pct(named, through_java) < 95.0 {
            failures.push(format!(
                "{label}: {named} of {through_java} samples name JavaCalls::call_helper"
            ));
        }
        // Some stacks end in Java code: sampled while the interpreter
        // builds a frame, or in a stub between frames.
        if pct(under_native, through_java) < 95.0 {
            let example = samples
                .iter()
                .find(|s| s.stack.iter().any(is_jvm) && !reaches_below_java(s))
                .map(|s| {
                    s.stack
                        .iter()
                        .map(|f| format!("{}@{:#x}", f.function, f.address))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            failures.push(format!(
                "{label}: {under_native} of {through_java} samples reach native frames under \
                 the Java frames: \
                 {example:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}

#[test]
fn jni_code_thread_pools_and_late_classes_are_attributed() {
    const TEST: &str = "jni_code_thread_pools_and_late_classes_are_attributed";
    let Some(setup) = setup(TEST) else {
        return;
    };
    let (found, classes) = (&setup.jdks, &setup.classes);
    // The oldest and the newest.
    let chosen: Vec<Jdk> = [found.first(), found.last()]
        .into_iter()
        .flatten()
        .cloned()
        .collect();

    let mut run = SystemWideRun::spawn(tmp(), HZ, &[]);
    let mut fixtures: Vec<(Jdk, Child, &str)> = Vec::new();
    for jdk in &chosen {
        for mode in ["threads", "native", "late"] {
            let child = spawn_fixture(jdk, classes, mode, FIXTURE_SECS / 2, None, &[], None);
            fixtures.push((jdk.clone(), child, mode));
        }
    }
    sleep(Duration::from_secs(2));
    let from = now_unix_nanos();
    for (jdk, child, mode) in &mut fixtures {
        let status = child.wait().expect("wait for the fixture");
        assert!(status.success(), "{} {mode}: {status}", jdk.label);
    }
    run.finish_after_fixtures();
    let received = run.otlp_of(fixtures[0].1.id());

    let mut failures = Vec::new();
    for (jdk, child, mode) in &fixtures {
        let label = format!("{} {mode}", jdk.label);
        let (samples, _) = of_pid_since(&received.samples, child.id(), from);
        match *mode {
            "threads" => {
                let names: BTreeSet<String> = samples
                    .iter()
                    .filter(|s| s.contains("JvmSplit.worker"))
                    .filter_map(|s| s.thread_name.clone())
                    .collect();
                let n = count_where(&samples, |s| s.contains("JvmSplit.worker"));
                println!("{TEST}: {label}: {n} samples in worker, on threads {names:?}");
                let expected: BTreeSet<String> = ["pool-1-thread-1", "pool-1-thread-2"]
                    .map(String::from)
                    .into();
                if n < 200 || names != expected {
                    failures.push(format!(
                        "{label}: worker's {n} samples on threads {names:?}, expected {expected:?}"
                    ));
                }
            }
            "native" => {
                let is_zlib = |f: &Frame| {
                    f.kind.as_deref() == Some("native")
                        && (f.mapping.as_deref().is_some_and(|m| m.contains("libz"))
                            || f.function.starts_with("deflate"))
                };
                let caller = count_where(&samples, |s| s.contains("JvmSplit.compress"));
                let under = count_where(&samples, |s| {
                    let c_code = s.stack.iter().position(is_zlib);
                    let deflater = s.stack.iter().position(|f| {
                        is_jvm(f) && f.function.starts_with("java.util.zip.Deflater.")
                    });
                    let compress = position(s, "JvmSplit.compress");
                    matches!((c_code, deflater, compress), (Some(c), Some(d), Some(p)) if c < d && d <= p)
                });
                println!(
                    "{TEST}: {label}: compress {caller} samples, {under} with zlib's C code under \
                     java.util.zip.Deflater under compress ({:.1}%)",
                    pct(under, caller)
                );
                if caller < 200 || pct(under, caller) < 50.0 {
                    let example = samples
                        .iter()
                        .find(|s| s.stack.iter().any(is_zlib))
                        .map(|s| s.names())
                        .unwrap_or_default();
                    failures.push(format!(
                        "{label}: zlib's frames must sit under Deflater and compress: \
                         {under} of {caller}; e.g. {example:?}"
                    ));
                }
            }
            _ => {
                let late = count_where(&samples, |s| s.contains("JvmSplit$Late.spin"));
                println!("{TEST}: {label}: {late} samples in JvmSplit$Late.spin");
                if late < 100 {
                    failures.push(format!(
                        "{label}: the late class's method got {late} samples"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}

/// Native frames under a Java thread's outermost Java frame, at least:
/// `JavaCalls::call_helper`, the JNI or thread-start function that called
/// it, and the thread's start in libc.
const NATIVE_FRAMES_UNDER_JAVA: usize = 4;

/// Whether `sample`'s stack goes on under its Java frames through the
/// native frames that called into Java. Counted rather than named: their
/// names are the symbolizer's business (Debian's JDK 8 `libjvm.so`, like
/// the sid chroot's libc, exports none for them).
fn reaches_below_java(sample: &DecodedSample) -> bool {
    sample.stack.iter().rposition(is_jvm).is_some_and(|j| {
        sample.stack[j + 1..]
            .iter()
            .filter(|f| !f.is_kernel() && !is_jvm(f))
            .count()
            >= NATIVE_FRAMES_UNDER_JAVA
    })
}

/// Whether `sample` names `JavaCalls::call_helper` under its Java frames.
fn names_call_helper(sample: &DecodedSample) -> bool {
    let java = sample.stack.iter().rposition(is_jvm);
    let helper = sample
        .stack
        .iter()
        .rposition(|f| f.function.starts_with("JavaCalls::call_helper"));
    matches!((java, helper), (Some(j), Some(h)) if j < h)
}

fn position(sample: &DecodedSample, name: &str) -> Option<usize> {
    sample.stack.iter().position(|f| f.function == name)
}
