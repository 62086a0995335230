// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of native unwinding without frame pointers: icecore unwinds
//! user stacks in BPF from the `.eh_frame` tables it builds per executable file.
//! C, C++ and Rust fixtures built at -O2 without frame pointers must unwind to
//! `main` with the split built into them, C++ and Rust names must be demangled,
//! a 300-deep recursion must be unwound whole, a binary without debug info
//! (`.symtab` kept) must still unwind and be named, a library loaded with
//! dlopen after start and a process started after the agent must be unwound,
//! and every BPF map must return to its baseline once 200 short-lived
//! processes have exited.
//!
//! A process is unwound with frame pointers only until icecore has described
//! it to BPF (its first sample triggers that); each test therefore waits until
//! the fixture is described and evaluates only samples taken from
//! `WARM_UP` after that moment (the number excluded is printed).
//!
//! Every test loads BPF programs and needs root; without root it prints why it
//! is skipped and passes. The tests run one at a time (`support::serial()`).
//!
//!     sudo -E cargo test --release --test native -- --test-threads=1 --nocapture
//!
//! prints the measured numbers of each test.

// Test code: a panic is how a helper reports a failed expectation.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[allow(
    dead_code,
    reason = "support/ serves several test targets; this one uses only part of it"
)]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use support::bpf_maps::{self, UnwinderMaps};
use support::build;
use support::fixture::MAX_LIFETIME_SECS;
use support::metrics::Metrics;
use support::run::{ProfiledRun, REPORTER_INTERVAL, SystemWideRun, Target};
use support::summary::{self, DecodedSample, count_where, inclusive, of_pid_since, pct, total};
use support::{now_unix_nanos, require_root, serial};

/// Sampling frequency of the unwinding tests: prime (no aliasing with the
/// fixtures' 40 ms cycle) and high enough for thousands of samples per test.
const NATIVE_HZ: u32 = 499;

/// Samples are evaluated from this long after the fixture was described to BPF.
const WARM_UP: Duration = Duration::from_millis(500);

/// How long samples are evaluated after the warm-up.
const MEASURE: Duration = Duration::from_secs(5);

/// Most distribution code: optimized, no frame pointers.
const C_FLAGS: &[&str] = &["-O2", "-fomit-frame-pointer", "-g"];

/// C_FLAGS plus no sibling calls: a non-tail recursion must keep every frame.
const C_FLAGS_NO_SIBLING: &[&str] = &[
    "-O2",
    "-fomit-frame-pointer",
    "-fno-optimize-sibling-calls",
    "-g",
];

/// Longest wait for icecore's next batch (its metrics are refreshed per batch).
const BATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Inclusive-share tolerance, in percentage points.
const SHARE_TOLERANCE: f64 = 4.0;

/// Minimum share of the evaluated samples that must reach `main`.
const REACH_MAIN_PCT: f64 = 97.0;

// ---- helpers ---------------------------------------------------------------------

/// Where a sample's user-space leaf is, by the file of its mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum LeafIn {
    /// The fixture's executable (or the library under test).
    Fixture,
    Libc,
    Vdso,
    /// Anything else (another library, no mapping, no user frame at all).
    Other,
}

fn leaf_in(sample: &DecodedSample, fixture_files: &[&Path]) -> LeafIn {
    let Some(leaf) = sample.user_leaf() else {
        return LeafIn::Other;
    };
    let file = leaf.mapping.as_deref().unwrap_or("");
    if fixture_files.iter().any(|f| Path::new(file) == *f) {
        LeafIn::Fixture
    } else if file.contains("/libc.so") || file.contains("/libc-") {
        LeafIn::Libc
    } else if file == "[vdso]" || file.ends_with("linux-vdso.so.1") {
        LeafIn::Vdso
    } else {
        LeafIn::Other
    }
}

/// Samples per leaf location, for printing.
fn leaf_breakdown(samples: &[DecodedSample], fixture_files: &[&Path]) -> BTreeMap<LeafIn, u64> {
    let mut m = BTreeMap::new();
    for s in samples {
        *m.entry(leaf_in(s, fixture_files)).or_default() += s.count;
    }
    m
}

/// The heaviest stacks among `samples` that fail `ok`, root first, with the
/// mapping of their rootmost user frame (where unwinding stopped).
fn failing_stacks(
    samples: &[DecodedSample],
    ok: impl Fn(&DecodedSample) -> bool,
    n: usize,
) -> String {
    let bad: Vec<DecodedSample> = samples.iter().filter(|s| !ok(s)).cloned().collect();
    if bad.is_empty() {
        return "  (none)\n".into();
    }
    let mut by_root: BTreeMap<String, u64> = BTreeMap::new();
    for s in &bad {
        let root = s
            .stack
            .iter()
            .rev()
            .find(|f| !f.is_kernel())
            .map(|f| {
                format!(
                    "{} in {}",
                    f.display_name(),
                    f.mapping.as_deref().unwrap_or("no mapping")
                )
            })
            .unwrap_or_else(|| "no user frame".into());
        *by_root.entry(root).or_default() += s.count;
    }
    format!(
        "  unwinding stopped at (rootmost user frame): {by_root:?}\n{}",
        summary::top_stacks(&bad, n)
    )
}

/// The fixture's samples from `from` on, printed with the number excluded before.
fn evaluated(samples: &[DecodedSample], pid: u32, from: u64, label: &str) -> Vec<DecodedSample> {
    let (kept, excluded) = of_pid_since(samples, pid, from);
    println!(
        "{label}: {} samples of pid {pid} evaluated (taken from {:.2} s after the fixture was \
         seen described to BPF); {excluded} earlier samples excluded as warm-up",
        total(&kept),
        WARM_UP.as_secs_f64()
    );
    kept
}

/// Asserts that at least `min_pct` % of `scope` reach main (`reaches`), printing
/// the leaf breakdown and the failing stacks. Returns the percentage.
fn assert_reach_main(
    label: &str,
    samples: &[DecodedSample],
    fixture_files: &[&Path],
    reaches: impl Fn(&DecodedSample) -> bool,
    min_pct: f64,
) -> f64 {
    let all = total(samples);
    let leaves = leaf_breakdown(samples, fixture_files);
    let in_scope = |s: &DecodedSample| {
        matches!(
            leaf_in(s, fixture_files),
            LeafIn::Fixture | LeafIn::Libc | LeafIn::Vdso
        )
    };
    let scope = count_where(samples, in_scope);
    let ok = count_where(samples, |s| in_scope(s) && reaches(s));
    let share = pct(ok, scope);
    println!(
        "{label}: user leaf by file {leaves:?}; {ok} of {scope} samples with the leaf in the \
         fixture/libc/vdso reach main ({share:.2}%); {all} samples in all"
    );
    println!("{label}: top stacks:\n{}", summary::top_stacks(samples, 6));
    println!(
        "{label}: samples not reaching main:\n{}",
        failing_stacks(
            &samples
                .iter()
                .filter(|s| in_scope(s))
                .cloned()
                .collect::<Vec<_>>(),
            &reaches,
            8
        )
    );
    assert!(
        scope as f64 >= 0.95 * all as f64,
        "{label}: only {scope} of {all} samples have their user leaf in the fixture, libc or \
         the vDSO ({leaves:?}): the fixture's frames are not attributed to its file"
    );
    assert!(
        share >= min_pct,
        "{label}: only {ok} of {scope} samples ({share:.2}%) reach main, expected >= {min_pct}%\n{}",
        failing_stacks(samples, &reaches, 12)
    );
    share
}

/// Asserts the inclusive shares of `a` and `b` among samples containing either.
fn assert_split(
    label: &str,
    samples: &[DecodedSample],
    (a, a_pct): (&str, f64),
    (b, b_pct): (&str, f64),
) {
    let na = inclusive(samples, a);
    let nb = inclusive(samples, b);
    let either = count_where(samples, |s| s.contains(a) || s.contains(b));
    let (sa, sb) = (pct(na, either), pct(nb, either));
    println!(
        "{label}: inclusive shares {a} {sa:.2}% ({na}), {b} {sb:.2}% ({nb}) of {either} samples \
         (built-in split {a_pct}/{b_pct}, tolerance {SHARE_TOLERANCE} pp)"
    );
    assert!(
        either as f64 >= 0.9 * total(samples) as f64,
        "{label}: only {either} of {} samples contain {a} or {b}",
        total(samples)
    );
    assert!(
        (sa - a_pct).abs() <= SHARE_TOLERANCE,
        "{label}: {a} has {sa:.2}% of the samples, expected {a_pct} +- {SHARE_TOLERANCE}"
    );
    assert!(
        (sb - b_pct).abs() <= SHARE_TOLERANCE,
        "{label}: {b} has {sb:.2}% of the samples, expected {b_pct} +- {SHARE_TOLERANCE}"
    );
}

/// Asserts that enough samples were evaluated for the percentages to mean something.
fn assert_enough(label: &str, samples: &[DecodedSample], min: u64) {
    let n = total(samples);
    assert!(
        n >= min,
        "{label}: only {n} samples evaluated, expected at least {min} ({NATIVE_HZ} Hz over {:.1} s)",
        MEASURE.as_secs_f64()
    );
}

/// Evaluating `MEASURE` at `NATIVE_HZ` of a CPU-bound fixture gives about
/// `NATIVE_HZ * MEASURE` samples; demand half (the machine may be loaded).
fn min_samples() -> u64 {
    (NATIVE_HZ as f64 * MEASURE.as_secs_f64() * 0.5) as u64
}

/// What a pid-filtered run of a fixture measured.
struct Measured {
    run: ProfiledRun,
    /// Samples from `described_at + WARM_UP` on count.
    from: u64,
    /// /metrics when the fixture was first seen described, and at the end.
    at_described: Metrics,
    at_end: Metrics,
}

impl Measured {
    fn samples(&self, label: &str) -> Vec<DecodedSample> {
        let received = self.run.otlp();
        evaluated(&received.samples, self.run.pid(), self.from, label)
    }

    /// Prints the unwinder counters over the run and over the evaluated window,
    /// and asserts that DWARF unwinding was used.
    fn assert_dwarf_used(&self, label: &str) {
        let (d0, f0) = (
            self.at_described.bpf_event("dwarf_frames"),
            self.at_described.bpf_event("frame_pointer_frames"),
        );
        let (d1, f1) = (
            self.at_end.bpf_event("dwarf_frames"),
            self.at_end.bpf_event("frame_pointer_frames"),
        );
        println!(
            "{label}: /metrics at the end: {}\n{label}: frames unwound after the fixture was \
             described: dwarf {} frame-pointer {} (whole run: dwarf {d1}, frame-pointer {f1})",
            self.at_end.unwinding_summary(),
            d1 - d0,
            f1 - f0
        );
        assert!(
            d1 > 0,
            "{label}: dwarf_frames is 0: no frame was unwound from DWARF CFI"
        );
        assert!(
            d1 - d0 > 0,
            "{label}: no DWARF frame was unwound after the fixture was described"
        );
    }
}

/// Profiles a running fixture by pid at `NATIVE_HZ`: waits until /metrics shows
/// it described (a process with a mapping table and at least one unwind table),
/// lets `WARM_UP + MEASURE` pass, reads /metrics and stops icecore.
///
/// icecore refreshes /metrics when it cuts a batch (every reporting interval),
/// so the moment the fixture is seen described is up to one interval after it
/// was: the cut-off errs on the late side.
fn measure(target: Target, label: &str) -> Measured {
    let mut run = ProfiledRun::spawn_on(target, NATIVE_HZ, &[]);
    let (described_at, at_described) = run.icecore.wait_for_metrics(
        "the fixture described to BPF",
        Duration::from_secs(30),
        |m| {
            m.value("icecore_processes_described") >= 1.0
                && m.value("icecore_unwind_tables_installed") >= 1.0
        },
    );
    println!(
        "{label}: described {:.2} s after icecore started: {}",
        (described_at - run.icecore.started_unix_nanos) as f64 / 1e9,
        at_described.unwinding_summary()
    );
    print_bpf_view(label, run.icecore.pid() as u32, run.pid(), &run.target.exe);
    let from = described_at + WARM_UP.as_nanos() as u64;
    std::thread::sleep(WARM_UP + MEASURE);
    let at_end = run.icecore.metrics_after_next_batch(BATCH_TIMEOUT);
    run.stop();
    Measured {
        run,
        from,
        at_described,
        at_end,
    }
}

/// Prints how BPF sees `exe` in process `pid` next to the kernel's view: the
/// file's LOAD segments, its executable mappings and the BPF mapping table
/// entries covering them (with their load bias), for diagnosing failures.
fn print_bpf_view(label: &str, icecore_pid: u32, pid: u32, exe: &Path) {
    let Some(maps) = UnwinderMaps::of_icecore(icecore_pid) else {
        println!("{label}: icecore's unwinder maps not found");
        return;
    };
    let mapped = bpf_maps::exec_mappings_with_offsets(pid, exe);
    let entries: Vec<String> = maps
        .mappings_of(pid)
        .unwrap_or_default()
        .iter()
        .filter(|e| {
            mapped
                .iter()
                .any(|&(s, end, _)| e.start <= s && end <= e.end)
        })
        .map(|e| {
            format!(
                "{:#x}-{:#x} bias {:#x} file {:#x} rows {}",
                e.start, e.end, e.bias, e.file_id, e.table_rows
            )
        })
        .collect();
    let mapped: Vec<String> = mapped
        .iter()
        .map(|(s, e, o)| format!("{s:#x}-{e:#x} offset {o:#x}"))
        .collect();
    println!(
        "{label}: {} LOAD segments {:?}; executable mappings {mapped:?}; BPF entries {entries:?}",
        exe.display(),
        build::load_segments(exe)
    );
}

/// A fresh temp dir for a test's fixtures (icecore's logs go there too).
fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Waits until BPF has unwind tables for every executable mapping of `file` in
/// `pid` (read from icecore's maps directly); returns the Unix time (ns).
fn wait_described_in_bpf(
    maps: &UnwinderMaps,
    pid: u32,
    file: &Path,
    timeout: Duration,
    logs: impl Fn() -> String,
) -> u64 {
    let deadline = Instant::now() + timeout;
    loop {
        if bpf_maps::has_tables_for(maps, pid, file) {
            return now_unix_nanos();
        }
        assert!(
            Instant::now() < deadline,
            "{} of pid {pid} has no unwind table in BPF after {timeout:?}: /proc maps {:x?}, \
             BPF mapping table {:x?}\n{}",
            file.display(),
            bpf_maps::exec_mappings(pid, file),
            maps.mappings_of(pid),
            logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

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
    let exe = build::compile("gcc", C_FLAGS, "native.c", &["-ldl"], tmp.path(), "native");
    let target = Target::start_exe(tmp, &exe, &["cycle", MAX_LIFETIME_SECS]);
    let m = measure(target, TEST);
    let samples = m.samples(TEST);
    assert_enough(TEST, &samples, min_samples());
    assert_reach_main(
        TEST,
        &samples,
        &[&exe],
        |s| s.contains("main"),
        REACH_MAIN_PCT,
    );
    assert_split(TEST, &samples, ("hot_alpha", 75.0), ("warm_beta", 25.0));
    m.assert_dwarf_used(TEST);
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
    let target = Target::start_exe(tmp, &exe, &[MAX_LIFETIME_SECS]);
    let m = measure(target, TEST);
    let samples = m.samples(TEST);
    assert_enough(TEST, &samples, min_samples());

    assert_reach_main(
        TEST,
        &samples,
        &[&exe],
        |s| s.contains("main"),
        REACH_MAIN_PCT,
    );
    let (int_run, double_run) = ("Worker<int>::run(int)", "Worker<double>::run(int)");
    let names: BTreeSet<&str> = samples
        .iter()
        .flat_map(|s| s.stack.iter().filter(|f| !f.is_kernel()))
        .map(|f| f.function.as_str())
        .collect();
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

/// True for a Rust symbol still carrying its hash (`…::h0123456789abcdef`, or
/// the mangled `17h0123456789abcdefE`).
fn has_rust_hash(name: &str) -> bool {
    let hex16 = |s: &str| s.len() == 16 && s.chars().all(|c| c.is_ascii_hexdigit());
    name.rsplit_once("::h").is_some_and(|(_, h)| hex16(h))
        || name.match_indices("17h").any(|(i, _)| {
            name.get(i + 3..i + 19).is_some_and(hex16) && name[i + 19..].starts_with('E')
        })
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
    let exe = build::compile(
        "rustc",
        &[
            "--edition",
            "2024",
            "--crate-name",
            "fixture",
            "-C",
            "opt-level=2",
            "-C",
            "force-frame-pointers=no",
            "-C",
            "debuginfo=1",
            "-C",
            "panic=abort",
        ],
        "native_rust.rs",
        &[],
        tmp.path(),
        "native_rust",
    );
    let target = Target::start_exe(tmp, &exe, &[MAX_LIFETIME_SECS]);
    let m = measure(target, TEST);
    let samples = m.samples(TEST);
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
    let names: BTreeSet<&str> = samples
        .iter()
        .flat_map(|s| s.stack.iter().filter(|f| !f.is_kernel()))
        .map(|f| f.function.as_str())
        .collect();
    println!("{TEST}: user function names seen: {names:?}");
    let hashed: Vec<&&str> = names.iter().filter(|n| has_rust_hash(n)).collect();
    assert!(
        hashed.is_empty(),
        "{TEST}: Rust names with their hash: {hashed:?}"
    );
    let mangled: Vec<&&str> = names
        .iter()
        .filter(|n| {
            n.starts_with("_ZN")
                || n.strip_prefix("_R")
                    .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_uppercase()))
        })
        .collect();
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
    let exe = build::compile(
        "gcc",
        C_FLAGS_NO_SIBLING,
        "native.c",
        &["-ldl"],
        tmp.path(),
        "native",
    );
    let target = Target::start_exe(
        tmp,
        &exe,
        &["recurse", &DEPTH.to_string(), MAX_LIFETIME_SECS],
    );
    let m = measure(target, TEST);
    let samples = m.samples(TEST);
    assert_enough(TEST, &samples, min_samples());

    // Samples in the spin at the bottom of the recursion.
    let spin: Vec<DecodedSample> = samples
        .iter()
        .filter(|s| s.user_leaf().is_some_and(|f| f.function == "spin_bottom"))
        .cloned()
        .collect();
    let n = total(&spin);
    let mut depths: BTreeMap<usize, u64> = BTreeMap::new();
    let mut user_frames: BTreeMap<usize, u64> = BTreeMap::new();
    for s in &spin {
        *depths.entry(s.frames_named("recurse")).or_default() += s.count;
        *user_frames.entry(s.user_names().len()).or_default() += s.count;
    }
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
    let full = build::compile(
        "gcc",
        C_FLAGS,
        "native.c",
        &["-ldl"],
        tmp.path(),
        "native-debug",
    );
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
    let target = Target::start_exe(tmp, &exe, &["cycle", MAX_LIFETIME_SECS]);
    let m = measure(target, TEST);
    let samples = m.samples(TEST);
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
    assert_reach_main(
        TEST,
        &samples,
        &[&exe],
        |s| s.contains("main"),
        REACH_MAIN_PCT,
    );
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
    let exe = build::compile(
        "gcc",
        C_FLAGS_NO_SIBLING,
        "native.c",
        &["-ldl"],
        tmp.path(),
        "native",
    );
    let mut lib_flags = C_FLAGS_NO_SIBLING.to_vec();
    lib_flags.extend(["-shared", "-fPIC"]);
    let lib = build::compile(
        "gcc",
        &lib_flags,
        "native_lib.c",
        &[],
        tmp.path(),
        "libnative_work.so",
    );
    let lib_arg = lib.display().to_string();
    let target = Target::start_exe(tmp, &exe, &["dlopen", &lib_arg, "2", MAX_LIFETIME_SECS]);
    let pid = target.pid();
    let mut run = ProfiledRun::spawn_on(target, NATIVE_HZ, &[]);
    let maps = UnwinderMaps::wait_for(run.icecore.pid() as u32, Duration::from_secs(30));

    let line = run.target.fixture.read_line();
    assert_eq!(line, "loaded", "the fixture could not load {lib_arg}");
    let loaded_at = now_unix_nanos();
    assert!(
        !bpf_maps::exec_mappings(pid, &lib).is_empty(),
        "{} is not mapped in the fixture after dlopen",
        lib.display()
    );
    let described_at = wait_described_in_bpf(&maps, pid, &lib, Duration::from_secs(20), || {
        run.icecore.logs()
    });
    println!(
        "{TEST}: library loaded {:.2} s after icecore started; its table in the fixture's BPF \
         mapping table {:.3} s after loading",
        (loaded_at - run.icecore.started_unix_nanos) as f64 / 1e9,
        (described_at - loaded_at) as f64 / 1e9
    );
    let from = described_at + WARM_UP.as_nanos() as u64;
    std::thread::sleep(WARM_UP + MEASURE);
    let at_end = run.icecore.metrics_after_next_batch(BATCH_TIMEOUT);
    run.stop();
    println!(
        "{TEST}: /metrics at the end: {}",
        at_end.unwinding_summary()
    );

    let received = run.otlp();
    let samples = evaluated(&received.samples, pid, from, TEST);
    assert_enough(TEST, &samples, min_samples());
    let in_lib: Vec<DecodedSample> = samples
        .iter()
        .filter(|s| leaf_in(s, &[&lib]) == LeafIn::Fixture)
        .cloned()
        .collect();
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
    let exe = build::compile("gcc", C_FLAGS, "native.c", &["-ldl"], tmp.path(), "native");
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
    let from = described_at + WARM_UP.as_nanos() as u64;
    std::thread::sleep(WARM_UP + MEASURE);
    let at_end = run.icecore.metrics_after_next_batch(BATCH_TIMEOUT);
    run.icecore.stop();
    assert!(fixture.is_running(), "the fixture died during the test");
    println!(
        "{TEST}: /metrics at the end: {}",
        at_end.unwinding_summary()
    );

    let received = run.otlp_of(pid);
    let pids = summary::by_pid(&received.samples).len();
    println!(
        "{TEST}: {} samples of {pids} processes received",
        total(&received.samples)
    );
    let samples = evaluated(&received.samples, pid, from, TEST);
    assert_enough(TEST, &samples, min_samples());
    assert_reach_main(
        TEST,
        &samples,
        &[&exe],
        |s| s.contains("main"),
        REACH_MAIN_PCT,
    );
    assert_split(TEST, &samples, ("hot_alpha", 75.0), ("warm_beta", 25.0));
    assert!(
        at_end.bpf_event("dwarf_frames") > 0,
        "{TEST}: no DWARF frames"
    );
}

/// Counts (pids, tables) and what they were at most while a poller ran.
#[derive(Debug, Default)]
struct Churn {
    peak_pids: usize,
    peak_tables: usize,
    /// Pids seen in PROCESS_MAPPINGS that were not there at the baseline, with
    /// the file ids their mapping tables named.
    new_pids: BTreeMap<u32, BTreeSet<u64>>,
    polls: u64,
}

/// Reads icecore's maps every few milliseconds until `stop`.
fn poll_maps(icecore_pid: u32, baseline: BTreeSet<u32>, stop: Arc<AtomicBool>) -> Churn {
    let maps = UnwinderMaps::of_icecore(icecore_pid).expect("icecore's maps");
    let mut churn = Churn::default();
    while !stop.load(Ordering::Relaxed) {
        let pids = maps.pids();
        let tables = maps.file_ids().len();
        churn.peak_pids = churn.peak_pids.max(pids.len());
        churn.peak_tables = churn.peak_tables.max(tables);
        for pid in pids.difference(&baseline) {
            let files = churn.new_pids.entry(*pid).or_default();
            if let Some(entries) = maps.mappings_of(*pid) {
                files.extend(
                    entries
                        .iter()
                        .filter(|e| e.table_rows > 0)
                        .map(|e| e.file_id),
                );
            }
        }
        churn.polls += 1;
        std::thread::sleep(Duration::from_millis(3));
    }
    churn
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Every BPF map returns to its baseline once 200 short-lived processes exited.
#[test]
fn bpf_maps_return_to_baseline_after_short_lived_processes() {
    const TEST: &str = "bpf_maps_return_to_baseline_after_short_lived_processes";
    const PROCESSES: usize = 200;
    const HZ: u32 = 997;
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir();
    // A binary of its own (unique content, so a table of its own) that nothing
    // else runs.
    let tag = format!("-DFIXTURE_TAG=\"churn-{}\"", now_unix_nanos());
    let mut flags = C_FLAGS.to_vec();
    flags.push(&tag);
    let churn_exe: PathBuf =
        build::compile("gcc", &flags, "native.c", &["-ldl"], tmp.path(), "churn");
    let mut run = SystemWideRun::spawn(tmp, HZ, &[]);
    let ice_pid = run.icecore.pid() as u32;
    let maps = UnwinderMaps::wait_for(ice_pid, Duration::from_secs(30));

    // Steady: both counts unchanged for 2 s (at most 15 s).
    let steady_since = Instant::now();
    let mut last = (maps.pids().len(), maps.file_ids().len());
    let mut unchanged_since = Instant::now();
    while unchanged_since.elapsed() < Duration::from_secs(2)
        && steady_since.elapsed() < Duration::from_secs(15)
    {
        std::thread::sleep(Duration::from_millis(100));
        let now = (maps.pids().len(), maps.file_ids().len());
        if now != last {
            last = now;
            unchanged_since = Instant::now();
        }
    }
    let base = maps.snapshot();
    println!(
        "{TEST}: baseline after {:.1} s: PROCESS_MAPPINGS {} entries, UNWIND_TABLES {} entries \
         (steady for {:.1} s)",
        steady_since.elapsed().as_secs_f64(),
        base.processes.len(),
        base.file_ids.len(),
        unchanged_since.elapsed().as_secs_f64()
    );
    let base_pids: BTreeSet<u32> = base.processes.keys().copied().collect();

    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (stop, base_pids) = (stop.clone(), base_pids.clone());
        std::thread::spawn(move || poll_maps(ice_pid, base_pids, stop))
    };
    let mut churn_pids = BTreeSet::new();
    let started = Instant::now();
    for i in 0..PROCESSES {
        let mut child = std::process::Command::new(&churn_exe)
            .args(["burn", "30"])
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", churn_exe.display()));
        churn_pids.insert(child.id());
        let status = child.wait().expect("wait for a short-lived process");
        assert!(status.success(), "short-lived process {i} failed: {status}");
    }
    let churn_secs = started.elapsed().as_secs_f64();
    let last_exit = Instant::now();
    // Two reporting intervals after the last exit (the periodic sweep runs at each).
    std::thread::sleep(2 * REPORTER_INTERVAL + Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let churn = poller.join().expect("poller thread");
    let fin = maps.snapshot();
    let at_end = run.icecore.metrics_after_next_batch(BATCH_TIMEOUT);
    println!(
        "{TEST}: {PROCESSES} processes in {churn_secs:.1} s; final read {:.1} s after the last \
         exit; {} polls of the maps meanwhile",
        last_exit.elapsed().as_secs_f64(),
        churn.polls
    );
    // Liveness now, while every process the final read saw may still run
    // (icecore itself among them).
    let fin_pids: BTreeSet<u32> = fin.processes.keys().copied().collect();
    let dead: Vec<u32> = fin_pids.iter().copied().filter(|p| !alive(*p)).collect();
    let base_alive = base_pids.iter().filter(|p| alive(**p)).count();
    run.icecore.stop();

    let described_churn: BTreeMap<u32, BTreeSet<u64>> = churn
        .new_pids
        .iter()
        .filter(|(pid, _)| churn_pids.contains(pid))
        .map(|(pid, files)| (*pid, files.clone()))
        .collect();
    let churn_files: BTreeSet<u64> = described_churn.values().flatten().copied().collect();
    let leaked_churn: Vec<u32> = fin_pids.intersection(&churn_pids).copied().collect();
    let referenced = fin.referenced_file_ids();
    let orphans: Vec<u64> = fin.file_ids.difference(&referenced).copied().collect();
    let new_unrelated: Vec<u32> = fin_pids
        .difference(&base_pids)
        .copied()
        .filter(|p| !churn_pids.contains(p))
        .collect();
    let gone: Vec<u32> = base_pids.difference(&fin_pids).copied().collect();
    println!(
        "{TEST}: PROCESS_MAPPINGS baseline {} peak {} final {}; UNWIND_TABLES baseline {} peak \
         {} final {}",
        base.processes.len(),
        churn.peak_pids,
        fin.processes.len(),
        base.file_ids.len(),
        churn.peak_tables,
        fin.file_ids.len()
    );
    println!(
        "{TEST}: {} of the {PROCESSES} short-lived processes were seen described in BPF (their \
         tables named {} file ids, {} of them not installed at the baseline); other processes \
         since the baseline: {} new {new_unrelated:?}, {} gone {gone:?}",
        described_churn.len(),
        churn_files.len(),
        churn_files.difference(&base.file_ids).count(),
        new_unrelated.len(),
        gone.len()
    );
    println!(
        "{TEST}: /metrics at the end: {}",
        at_end.unwinding_summary()
    );

    assert!(
        churn.peak_pids > base.processes.len() && churn.peak_tables > base.file_ids.len(),
        "{TEST}: the maps never grew during the churn (PROCESS_MAPPINGS peak {} vs baseline {}, \
         UNWIND_TABLES peak {} vs baseline {}): the short-lived processes were never described",
        churn.peak_pids,
        base.processes.len(),
        churn.peak_tables,
        base.file_ids.len()
    );
    assert!(
        !described_churn.is_empty(),
        "{TEST}: none of the short-lived processes was seen in PROCESS_MAPPINGS"
    );
    assert!(
        leaked_churn.is_empty(),
        "{TEST}: PROCESS_MAPPINGS still holds {} exited short-lived processes: {leaked_churn:?}",
        leaked_churn.len()
    );
    assert!(
        dead.is_empty(),
        "{TEST}: PROCESS_MAPPINGS holds entries of processes that no longer exist: {dead:?}"
    );
    assert!(
        orphans.is_empty(),
        "{TEST}: UNWIND_TABLES holds {} tables that no process's mapping table names: \
         {orphans:x?}",
        orphans.len()
    );
    if new_unrelated.is_empty() && gone.is_empty() {
        assert_eq!(
            fin.processes.len(),
            base.processes.len(),
            "{TEST}: PROCESS_MAPPINGS is not back at its baseline"
        );
        assert_eq!(
            fin.file_ids.len(),
            base.file_ids.len(),
            "{TEST}: UNWIND_TABLES is not back at its baseline: {:x?} added, {:x?} removed",
            fin.file_ids.difference(&base.file_ids).collect::<Vec<_>>(),
            base.file_ids.difference(&fin.file_ids).collect::<Vec<_>>()
        );
    } else {
        // Other processes on the machine came or went: the baseline moved with
        // them. The counts must then match what the live processes justify.
        let expected_pids = base_alive + new_unrelated.len();
        println!(
            "{TEST}: the machine was not quiet; expecting PROCESS_MAPPINGS {expected_pids} \
             (baseline processes still alive + new ones) and UNWIND_TABLES {} (tables named by \
             them)",
            referenced.len()
        );
        assert_eq!(
            fin.processes.len(),
            expected_pids,
            "{TEST}: PROCESS_MAPPINGS does not match the live processes"
        );
        assert_eq!(
            fin.file_ids.len(),
            referenced.len(),
            "{TEST}: UNWIND_TABLES does not match the files of the described processes"
        );
    }
}
