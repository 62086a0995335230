// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of native unwinding without frame pointers: icecore unwinds
//! user stacks in BPF from the `.eh_frame` tables it builds per executable file.
//! C, C++ and Rust fixtures built at -O2 without frame pointers must unwind to
//! `main` with the split built into them, C++ and Rust names must be demangled,
//! a 300-deep recursion must be unwound whole, frames in the vDSO and in
//! signal handlers must be unwound through them, a binary without debug info
//! (`.symtab` kept) must still unwind and be named, a library loaded with
//! dlopen after start and a process started after the agent must be unwound.
//! (Short-lived processes are `integration/short_lived.rs`'s.)
//!
//! A process is unwound with frame pointers only until icecore has described
//! it to BPF (before sampling starts for the processes already running, at
//! its exec for the others, and the tables of its files are built); most
//! tests therefore wait until the fixture is described and evaluate only
//! samples taken from `WARM_UP` after that moment (the number excluded is
//! printed). `samples_are_complete_from_the_first` excludes nothing.
//!
//! Every test loads BPF programs and needs root; without root it prints why it
//! is skipped and passes. The tests run one at a time (`support::serial()`).
//!
//!     sudo -E cargo test --release --test integration -- native:: --test-threads=1 --nocapture
//!
//! prints the measured numbers of each test.

use crate::support;

use std::time::Duration;

use support::bpf_maps::UnwinderMaps;
use support::build;
use support::fixture::MAX_LIFETIME_SECS;
use support::native::analysis::{
    LeafIn, assert_enough, assert_reach_c_main, assert_reach_main, assert_split, depth_histograms,
    evaluated, failing_stacks, has_rust_hash, is_mangled_rust, leaf_breakdown, leaf_in,
    user_function_names, with_leaf_in, with_user_leaf_named,
};
use support::native::measure::{
    measure_fixture, print_metrics_at_end, sleep_through_window, wait_described_in_bpf,
    wait_dlopened_described,
};
use support::native::{
    BATCH_TIMEOUT, C_FLAGS, C_FLAGS_NO_SIBLING, NATIVE_HZ, REACH_MAIN_PCT, compile_native_c,
    compile_native_lib, compile_native_rust, min_samples, temp_dir,
};
use support::run::{ProfiledRun, SystemWideRun, Target};
use support::summary::{self, DecodedSample, count_where, inclusive, of_pid_since, pct, total};
use support::{now_unix_nanos, require_root, serial};

// ---- tests -----------------------------------------------------------------------

/// C, gcc -O2 -fomit-frame-pointer: the 3:1 split and complete stacks.
#[test]
fn c_without_frame_pointers_unwinds_to_main() {
    const TEST: &str = "c_without_frame_pointers_unwinds_to_main";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir();
    let exe = compile_native_c(C_FLAGS, tmp.path(), "native");
    let (m, samples) = measure_fixture(TEST, tmp, &exe, &["cycle", MAX_LIFETIME_SECS]);
    assert_enough(TEST, &samples, min_samples());
    assert_reach_c_main(TEST, &samples, &exe);
    assert_split(TEST, &samples, ("hot_alpha", 75.0), ("warm_beta", 25.0));
    m.assert_dwarf_used(TEST);
    // Below main: a local function of the stripped libc, named by
    // libc6-dbg's symbol table although its DWARF is over the budget.
    let under_main = samples.iter().filter(|s| s.contains("main")).count();
    let named = samples
        .iter()
        .filter(|s| s.contains("__libc_start_call_main"))
        .count();
    println!("{TEST}: {named} of {under_main} stacks through main name __libc_start_call_main");
    assert!(
        named * 10 >= under_main * 9,
        "{TEST}: __libc_start_call_main named in {named} of {under_main} stacks"
    );
}

/// C++ templates: demangled names, the split, complete stacks.
#[test]
fn cpp_templates_are_unwound_and_demangled() {
    const TEST: &str = "cpp_templates_are_unwound_and_demangled";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir();
    let exe = build::compile("c++", C_FLAGS, "native.cpp", &[], tmp.path(), "native_cpp");
    let (m, samples) = measure_fixture(TEST, tmp, &exe, &[MAX_LIFETIME_SECS]);
    assert_enough(TEST, &samples, min_samples());

    assert_reach_c_main(TEST, &samples, &exe);
    let (int_run, double_run) = ("Worker<int>::run(int)", "Worker<double>::run(int)");
    let names = user_function_names(&samples);
    println!("{TEST}: user function names seen: {names:?}");
    let mangled: Vec<&&str> = names.iter().filter(|n| n.starts_with("_Z")).collect();
    assert!(
        mangled.is_empty(),
        "{TEST}: mangled C++ names in the profile: {mangled:?}"
    );
    for name in [
        int_run,
        double_run,
        "spin_cpu(unsigned long)",
        "run_cycle(double)",
    ] {
        assert!(
            names.contains(name),
            "{TEST}: no frame named {name:?} (demangled); names seen: {names:?}"
        );
    }
    assert_split(TEST, &samples, (int_run, 75.0), (double_run, 25.0));
    m.assert_dwarf_used(TEST);
}

/// Rust at opt-level=2 without frame pointers: demangled names without hashes,
/// the split, complete stacks.
///
/// "Reaching main" accepts either the C `main` that rustc emits (the stack was
/// unwound through std's `lang_start`) or the crate's own `fixture::main`; the
/// test prints both shares.
#[test]
fn rust_is_unwound_and_demangled() {
    const TEST: &str = "rust_is_unwound_and_demangled";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir();
    let exe = compile_native_rust(tmp.path());
    let (m, samples) = measure_fixture(TEST, tmp, &exe, &[MAX_LIFETIME_SECS]);
    assert_enough(TEST, &samples, min_samples());

    let all = total(&samples);
    let c_main = count_where(&samples, |s| s.contains("main"));
    let crate_main = count_where(&samples, |s| s.contains("fixture::main"));
    println!(
        "{TEST}: {:.2}% of samples reach the C main (through std's lang_start), {:.2}% reach \
         fixture::main",
        pct(c_main, all),
        pct(crate_main, all)
    );
    assert_reach_main(
        TEST,
        &samples,
        &[&exe],
        |s| s.contains("main") || s.contains("fixture::main"),
        REACH_MAIN_PCT,
    );
    let names = user_function_names(&samples);
    println!("{TEST}: user function names seen: {names:?}");
    let hashed: Vec<&&str> = names.iter().filter(|n| has_rust_hash(n)).collect();
    assert!(
        hashed.is_empty(),
        "{TEST}: Rust names with their hash: {hashed:?}"
    );
    let mangled: Vec<&&str> = names.iter().filter(|n| is_mangled_rust(n)).collect();
    assert!(mangled.is_empty(), "{TEST}: mangled names: {mangled:?}");
    for name in [
        "fixture::hot_alpha",
        "fixture::warm_beta",
        "fixture::spin_cpu",
        "fixture::main",
    ] {
        assert!(
            names.contains(name),
            "{TEST}: no frame named {name:?}; names seen: {names:?}"
        );
    }
    assert_split(
        TEST,
        &samples,
        ("fixture::hot_alpha", 75.0),
        ("fixture::warm_beta", 25.0),
    );
    m.assert_dwarf_used(TEST);
}

/// A 300-deep non-tail recursion is unwound whole, without truncation.
#[test]
fn deep_recursion_is_fully_unwound() {
    const TEST: &str = "deep_recursion_is_fully_unwound";
    const DEPTH: usize = 300;
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir();
    let exe = compile_native_c(C_FLAGS_NO_SIBLING, tmp.path(), "native");
    let depth = DEPTH.to_string();
    let (m, samples) = measure_fixture(TEST, tmp, &exe, &["recurse", &depth, MAX_LIFETIME_SECS]);
    assert_enough(TEST, &samples, min_samples());

    // Samples in the spin at the bottom of the recursion.
    let spin = with_user_leaf_named(&samples, "spin_bottom");
    let n = total(&spin);
    let (depths, user_frames) = depth_histograms(&spin, "recurse");
    println!(
        "{TEST}: {n} of {} evaluated samples have the leaf spin_bottom; frames of recurse per \
         stack: {depths:?}; user frames per stack: {user_frames:?}",
        total(&samples)
    );
    assert!(
        n as f64 >= 0.9 * total(&samples) as f64,
        "{TEST}: only {n} of {} samples have the leaf spin_bottom",
        total(&samples)
    );
    let full = |s: &DecodedSample| s.frames_named("recurse") >= DEPTH && s.contains("main");
    let ok = count_where(&spin, full);
    println!(
        "{TEST}: {ok} of {n} spin samples ({:.2}%) have >= {DEPTH} recurse frames and reach main",
        pct(ok, n)
    );
    assert!(
        pct(ok, n) >= REACH_MAIN_PCT,
        "{TEST}: only {ok} of {n} samples in spin_bottom have >= {DEPTH} recurse frames and \
         main; recurse frames per stack {depths:?}\n{}",
        failing_stacks(&spin, full, 3)
    );
    let truncated = m.at_end.bpf_event("user_stack_truncated");
    println!("{TEST}: user_stack_truncated = {truncated}");
    assert_eq!(
        truncated, 0,
        "{TEST}: the BPF unwinder truncated {truncated} user stacks of the recursion"
    );
    m.assert_dwarf_used(TEST);
}

/// Samples taken inside the vDSO (clock_gettime without a system call) are
/// unwound through its `.eh_frame`, read from icecore's own copy of the image.
#[test]
fn vdso_frames_are_unwound() {
    // Every vDSO sample, exactly: frame pointers alone get about 98.5% here.
    const VDSO_EXACT_PCT: f64 = 99.5;
    const TEST: &str = "vdso_frames_are_unwound";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir();
    let exe = compile_native_c(C_FLAGS, tmp.path(), "native");
    let (m, samples) = measure_fixture(TEST, tmp, &exe, &["vdso", MAX_LIFETIME_SECS]);
    assert_enough(TEST, &samples, min_samples());
    let in_vdso: Vec<DecodedSample> = samples
        .iter()
        .filter(|s| leaf_in(s, &[&exe]) == LeafIn::Vdso)
        .cloned()
        .collect();
    let n = total(&in_vdso);
    println!(
        "{TEST}: {n} of {} evaluated samples ({:.1}%) have their user leaf in the vDSO",
        total(&samples),
        pct(n, total(&samples))
    );
    // clock_gettime is most of the loop: at least a fifth of the samples.
    assert!(
        n as f64 >= 0.2 * total(&samples) as f64,
        "{TEST}: only {n} of {} samples have their leaf in the vDSO",
        total(&samples)
    );
    // Exact: below the vDSO (and libc's clock_gettime) the next frame is
    // read_clocks (or wall_ns, which it calls). The vDSO keeps frame pointers in most places, so a walk
    // falling back to them usually reaches main too, but skips read_clocks
    // when the sample is in a vDSO prologue or epilogue.
    let full = |s: &DecodedSample| {
        let caller = s.stack.iter().filter(|f| !f.is_kernel()).find(|f| {
            let file = f.mapping.as_deref().unwrap_or("");
            file != "[vdso]" && !file.contains("/libc.so")
        });
        caller.is_some_and(|f| f.function == "read_clocks" || f.function == "wall_ns")
            && s.contains("read_clocks")
            && s.contains("main")
    };
    let ok = count_where(&in_vdso, full);
    println!(
        "{TEST}: {ok} of {n} vDSO samples ({:.2}%) have read_clocks (or wall_ns) as their \
         first frame outside the vDSO and libc, and reach main",
        pct(ok, n)
    );
    println!(
        "{TEST}: top vDSO stacks:\n{}",
        summary::top_stacks(&in_vdso, 4)
    );
    assert!(
        pct(ok, n) >= VDSO_EXACT_PCT,
        "{TEST}: only {ok} of {n} samples in the vDSO reach read_clocks directly and main \
         (expected >= {VDSO_EXACT_PCT}%)\n{}",
        failing_stacks(&in_vdso, full, 6)
    );
    assert_reach_c_main(TEST, &samples, &exe);
    m.assert_dwarf_used(TEST);
}

/// Samples in a signal handler are unwound through the kernel's signal frame
/// (glibc's `__restore_rt`) into the code the signal interrupted.
#[test]
fn signal_handler_frames_reach_the_interrupted_code() {
    const TEST: &str = "signal_handler_frames_reach_the_interrupted_code";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir();
    let exe = compile_native_c(C_FLAGS, tmp.path(), "native");
    let (m, samples) = measure_fixture(TEST, tmp, &exe, &["signal", MAX_LIFETIME_SECS]);
    assert_enough(TEST, &samples, min_samples());
    let in_handler: Vec<DecodedSample> = samples
        .iter()
        .filter(|s| s.contains("in_handler"))
        .cloned()
        .collect();
    let n = total(&in_handler);
    println!(
        "{TEST}: {n} of {} evaluated samples ({:.1}%) are in the signal handler",
        total(&samples),
        pct(n, total(&samples))
    );
    println!(
        "{TEST}: top handler stacks:\n{}",
        summary::top_stacks(&in_handler, 4)
    );
    // The handler burns 2 ms of every 6 ms of CPU.
    assert!(
        n as f64 >= 0.2 * total(&samples) as f64,
        "{TEST}: only {n} of {} samples are in the handler",
        total(&samples)
    );
    let full = |s: &DecodedSample| {
        s.contains("on_sigprof") && s.contains("signal_target") && s.contains("main")
    };
    let ok = count_where(&in_handler, full);
    println!(
        "{TEST}: {ok} of {n} handler samples ({:.2}%) reach on_sigprof, the interrupted \
         signal_target and main",
        pct(ok, n)
    );
    assert!(
        pct(ok, n) >= REACH_MAIN_PCT,
        "{TEST}: only {ok} of {n} handler samples reach signal_target and main\n{}",
        failing_stacks(&in_handler, full, 6)
    );
    m.assert_dwarf_used(TEST);
}

/// `strip --strip-debug`: no .debug_* sections, .symtab kept; still unwound from
/// .eh_frame and named from .symtab.
#[test]
fn stripped_binary_unwinds_with_symtab_names() {
    const TEST: &str = "stripped_binary_unwinds_with_symtab_names";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir();
    let full = compile_native_c(C_FLAGS, tmp.path(), "native-debug");
    let exe = build::strip_debug(&full, tmp.path(), "native");
    let (before, after) = (build::elf_sections(&full), build::elf_sections(&exe));
    println!("{TEST}: sections before strip {before:?}\n{TEST}: after {after:?}");
    assert!(
        before.iter().any(|s| s == ".debug_info"),
        "the unstripped build has no .debug_info: the test would prove nothing"
    );
    let debug_left: Vec<&String> = after.iter().filter(|s| s.starts_with(".debug")).collect();
    assert!(debug_left.is_empty(), "strip left {debug_left:?}");
    for kept in [".symtab", ".eh_frame"] {
        assert!(after.iter().any(|s| s == kept), "strip removed {kept}");
    }
    let (m, samples) = measure_fixture(TEST, tmp, &exe, &["cycle", MAX_LIFETIME_SECS]);
    assert_enough(TEST, &samples, min_samples());
    for name in [
        "spin_cpu",
        "alpha_inner",
        "hot_alpha",
        "beta_inner",
        "warm_beta",
        "run_cycle",
    ] {
        let n = inclusive(&samples, name);
        println!("{TEST}: {n} samples contain {name}");
        assert!(n > 0, "{TEST}: no frame named {name} (from .symtab)");
    }
    assert_reach_c_main(TEST, &samples, &exe);
    assert_split(TEST, &samples, ("hot_alpha", 75.0), ("warm_beta", 25.0));
    m.assert_dwarf_used(TEST);
}

/// A library dlopen()ed 2 s after start, without frame pointers, called through
/// a function pointer: unwound through it to main once icecore has its table.
#[test]
fn dlopened_library_is_unwound() {
    const TEST: &str = "dlopened_library_is_unwound";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir();
    let exe = compile_native_c(C_FLAGS_NO_SIBLING, tmp.path(), "native");
    let lib = compile_native_lib(C_FLAGS_NO_SIBLING, tmp.path(), "libnative_work.so");
    let lib_arg = lib.display().to_string();
    let target = Target::start_exe(tmp, &exe, &["dlopen", &lib_arg, "2", MAX_LIFETIME_SECS]);
    let mut run = ProfiledRun::spawn_on(target, NATIVE_HZ, &[]);
    let pid = run.pid();
    let maps = UnwinderMaps::wait_for(run.icecore.pid() as u32, Duration::from_secs(30));

    let described_at = wait_dlopened_described(TEST, &mut run, &maps, &lib);
    let from = sleep_through_window(described_at);
    let at_end = run.icecore.metrics_after_next_batch(BATCH_TIMEOUT);
    run.stop();
    print_metrics_at_end(TEST, &at_end);

    let received = run.otlp();
    let samples = evaluated(&received.samples, pid, from, TEST);
    assert_enough(TEST, &samples, min_samples());
    let in_lib = with_leaf_in(&samples, &lib);
    let n = total(&in_lib);
    println!(
        "{TEST}: {n} of {} evaluated samples have their leaf in {}",
        total(&samples),
        lib.display()
    );
    assert!(
        n as f64 >= 0.8 * total(&samples) as f64,
        "{TEST}: only {n} of {} samples have their leaf in the library, which the fixture \
         spends its time in; leaves by file: {:?}",
        total(&samples),
        leaf_breakdown(&samples, &[&lib, &exe])
    );
    let good = |s: &DecodedSample| {
        s.contains("lib_work") && s.contains("call_through") && s.contains("main")
    };
    let named = count_where(&in_lib, |s| s.contains("lib_work"));
    let ok = count_where(&in_lib, good);
    println!(
        "{TEST}: of the samples in the library {:.2}% name lib_work, {:.2}% have lib_work <- \
         call_through <- ... main\n{}",
        pct(named, n),
        pct(ok, n),
        summary::top_stacks(&in_lib, 5)
    );
    assert!(
        pct(ok, n) >= 95.0,
        "{TEST}: only {ok} of {n} samples in the library ({:.2}%) name lib_work and reach \
         call_through and main\n{}",
        pct(ok, n),
        failing_stacks(&in_lib, good, 10)
    );
    assert!(
        at_end.bpf_event("dwarf_frames") > 0,
        "{TEST}: no DWARF frames"
    );
}

/// A process started 2 s after a system-wide icecore: found, described and
/// unwound like any other.
#[test]
fn process_started_after_the_agent_is_unwound() {
    const TEST: &str = "process_started_after_the_agent_is_unwound";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir();
    let exe = compile_native_c(C_FLAGS, tmp.path(), "native");
    let mut run = SystemWideRun::spawn(tmp, NATIVE_HZ, &[]);
    let maps = UnwinderMaps::wait_for(run.icecore.pid() as u32, Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(2));
    let described_before = maps.pids().len();
    let started_at = now_unix_nanos();
    let mut fixture = support::fixture::Fixture::spawn_args(&exe, &["cycle", MAX_LIFETIME_SECS]);
    let pid = fixture.pid();
    let described_at = wait_described_in_bpf(&maps, pid, &exe, Duration::from_secs(20), || {
        run.icecore.logs()
    });
    println!(
        "{TEST}: fixture started {:.2} s after icecore, described to BPF {:.3} s after its \
         start (BPF described {described_before} other processes when it started)",
        (started_at - run.icecore.started_unix_nanos) as f64 / 1e9,
        (described_at - started_at) as f64 / 1e9,
    );
    let from = sleep_through_window(described_at);
    let at_end = run.icecore.metrics_after_next_batch(BATCH_TIMEOUT);
    run.icecore.stop();
    assert!(fixture.is_running(), "the fixture died during the test");
    print_metrics_at_end(TEST, &at_end);

    let received = run.otlp_of(pid);
    let pids = summary::by_pid(&received.samples).len();
    println!(
        "{TEST}: {} samples of {pids} processes received",
        total(&received.samples)
    );
    let samples = evaluated(&received.samples, pid, from, TEST);
    assert_enough(TEST, &samples, min_samples());
    assert_reach_c_main(TEST, &samples, &exe);
    assert_split(TEST, &samples, ("hot_alpha", 75.0), ("warm_beta", 25.0));
    assert!(
        at_end.bpf_event("dwarf_frames") > 0,
        "{TEST}: no DWARF frames"
    );
}

/// Processes that ran before icecore started and processes exec'd while it
/// runs (from a file no other process maps): their samples, from the very
/// first (no warm-up excluded), reach `main`. The running ones are
/// described before sampling starts, the new ones at their exec.
///
/// A new process's samples taken before BPF knows it, or before its file's
/// unwind table is built (tens of milliseconds after its exec), are dropped
/// and counted rather than reported cut short: the test bounds how many.
#[test]
fn samples_are_complete_from_the_first() {
    const TEST: &str = "samples_are_complete_from_the_first";
    const MIN_COMPLETE_PCT: f64 = 99.0;
    const MIN_COMPLETE_EXECED_PCT: f64 = 99.0;
    // Samples dropped for want of a process's mappings or a file's table,
    // as a share of those emitted: the first tens of milliseconds of two
    // new processes (and of the test's own helpers) out of five seconds.
    const MAX_DROPPED_PCT: f64 = 5.0;
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir();
    let exe = compile_native_c(C_FLAGS, tmp.path(), "native");
    // A second file: the processes exec'd later need a table built for it.
    let late_exe = tmp.path().join("native_late");
    std::fs::copy(&exe, &late_exe).expect("copy the fixture");
    let mut before: Vec<support::fixture::Fixture> = (0..2)
        .map(|_| support::fixture::Fixture::spawn_args(&exe, &["cycle", MAX_LIFETIME_SECS]))
        .collect();
    let mut run = SystemWideRun::spawn(tmp, NATIVE_HZ, &[]);
    let started = now_unix_nanos();
    let mut after: Vec<(support::fixture::Fixture, u64)> = (0..2)
        .map(|_| {
            let at = now_unix_nanos();
            let fixture =
                support::fixture::Fixture::spawn_args(&late_exe, &["cycle", MAX_LIFETIME_SECS]);
            (fixture, at)
        })
        .collect();
    std::thread::sleep(Duration::from_secs(5));
    let at_end = run.icecore.metrics_after_next_batch(BATCH_TIMEOUT);
    run.icecore.stop();
    print_metrics_at_end(TEST, &at_end);
    let logs = run.icecore.output();
    let startup = logs
        .lines()
        .find(|l| l.contains("described the running processes before sampling"))
        .unwrap_or("(no start-up line)");
    println!("{TEST}: {startup}");
    let received = run.otlp_of(before[0].pid());

    let mut failures = Vec::new();
    let fixtures = before
        .iter_mut()
        .map(|f| (f, None))
        .chain(after.iter_mut().map(|(f, at)| (f, Some(*at))));
    for (fixture, spawned_at) in fixtures {
        assert!(fixture.is_running(), "{TEST}: a fixture died");
        let pid = fixture.pid();
        let (samples, _) = of_pid_since(&received.samples, pid, 0);
        let n = total(&samples);
        let complete = count_where(&samples, |s| s.contains("main"));
        let share = pct(complete, n);
        let kind = if spawned_at.is_some() {
            "exec'd during the run"
        } else {
            "running before"
        };
        // From the exec to the first sample that reaches main.
        let first_complete = samples
            .iter()
            .filter(|s| s.contains("main"))
            .flat_map(|s| s.timestamps.iter().copied())
            .min();
        let first_any = samples
            .iter()
            .flat_map(|s| s.timestamps.iter().copied())
            .min();
        let since = |t: Option<u64>, from: u64| {
            t.map_or("-".to_owned(), |t| {
                format!("{:.1} ms", (t as f64 - from as f64) / 1e6)
            })
        };
        println!(
            "{TEST}: pid {pid} ({kind}): {complete} of {n} samples reach main ({share:.2}%); \
             first sample {} and first complete one {} after {}",
            since(first_any, spawned_at.unwrap_or(started)),
            since(first_complete, spawned_at.unwrap_or(started)),
            if spawned_at.is_some() {
                "its spawn"
            } else {
                "sampling started"
            },
        );
        let min_pct = if spawned_at.is_some() {
            MIN_COMPLETE_EXECED_PCT
        } else {
            MIN_COMPLETE_PCT
        };
        if n < min_samples() || share < min_pct {
            failures.push(format!(
                "pid {pid} ({kind}): {complete} of {n} samples reach main ({share:.2}%, \
                 at least {min_pct}% of at least {} expected)",
                min_samples()
            ));
        }
    }
    let dropped = at_end.bpf_event("unknown_process") + at_end.bpf_event("unwind_table_pending");
    let emitted = at_end.bpf_event("emitted");
    let dropped_pct = pct(dropped, dropped + emitted);
    println!(
        "{TEST}: {dropped} samples dropped before their process or file was ready \
         ({dropped_pct:.2}% of {} taken)",
        dropped + emitted
    );
    if dropped_pct > MAX_DROPPED_PCT {
        failures.push(format!(
            "{dropped_pct:.2}% of samples dropped as not ready, at most {MAX_DROPPED_PCT}% expected"
        ));
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}
