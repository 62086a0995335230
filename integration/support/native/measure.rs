// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! A pid-filtered run of a native fixture: waiting until icecore has described
//! it to BPF, the evaluated window after the warm-up, and what /metrics showed.

use std::path::Path;
use std::time::{Duration, Instant};

use super::analysis::evaluated;
use super::{BATCH_TIMEOUT, MEASURE, NATIVE_HZ, WARM_UP};
use crate::support::bpf_maps::{self, UnwinderMaps};
use crate::support::build;
use crate::support::metrics::Metrics;
use crate::support::now_unix_nanos;
use crate::support::run::{ProfiledRun, Target};
use crate::support::summary::DecodedSample;

/// What a pid-filtered run of a fixture measured.
pub struct Measured {
    pub run: ProfiledRun,
    /// Samples from `described_at + WARM_UP` on count.
    pub from: u64,
    /// /metrics when the fixture was first seen described, and at the end.
    pub at_described: Metrics,
    pub at_end: Metrics,
}

impl Measured {
    pub fn samples(&self, label: &str) -> Vec<DecodedSample> {
        let received = self.run.otlp();
        evaluated(&received.samples, self.run.pid(), self.from, label)
    }

    /// Prints the unwinder counters over the run and over the evaluated window,
    /// and asserts that DWARF unwinding was used.
    pub fn assert_dwarf_used(&self, label: &str) {
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
pub fn measure(target: Target, label: &str) -> Measured {
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
    let from = sleep_through_window(described_at);
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
pub fn print_bpf_view(label: &str, icecore_pid: u32, pid: u32, exe: &Path) {
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
                "{:#x}-{:#x} bias {:#x} file {:#x} rows {} slot {}",
                e.start, e.end, e.bias, e.file_id, e.table_rows, e.table_slot
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

/// Waits until BPF has unwind tables for every executable mapping of `file` in
/// `pid` (read from icecore's maps directly); returns the Unix time (ns).
pub fn wait_described_in_bpf(
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
             BPF mapping table {:x?} (pids with one: {:?})\n{}",
            file.display(),
            bpf_maps::exec_mappings(pid, file),
            maps.mappings_of(pid),
            maps.pids(),
            logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Lets `WARM_UP + MEASURE` pass after the fixture was `described_at` (Unix
/// ns); returns the Unix time (ns) from which samples are evaluated.
pub fn sleep_through_window(described_at: u64) -> u64 {
    let from = described_at + WARM_UP.as_nanos() as u64;
    std::thread::sleep(WARM_UP + MEASURE);
    from
}

/// Starts `exe` with `args` in `tmp`, profiles it (`measure`) and returns the
/// measurement with the samples it evaluates.
pub fn measure_fixture<S: AsRef<str>>(
    label: &str,
    tmp: tempfile::TempDir,
    exe: &Path,
    args: &[S],
) -> (Measured, Vec<DecodedSample>) {
    let target = Target::start_exe(tmp, exe, args);
    let m = measure(target, label);
    let samples = m.samples(label);
    (m, samples)
}

/// Prints icecore's unwinding counters from /metrics at the end of a run.
pub fn print_metrics_at_end(label: &str, at_end: &Metrics) {
    println!(
        "{label}: /metrics at the end: {}",
        at_end.unwinding_summary()
    );
}

/// Waits until the fixture of `run` reports that it loaded `lib` (dlopen), that
/// `lib` is mapped in it and that BPF has `lib`'s unwind table for it; prints
/// the delays and returns the Unix time (ns) it was seen described.
pub fn wait_dlopened_described(
    label: &str,
    run: &mut ProfiledRun,
    maps: &UnwinderMaps,
    lib: &Path,
) -> u64 {
    let pid = run.pid();
    let lib_arg = lib.display().to_string();
    let line = run.target.fixture.read_line();
    assert_eq!(line, "loaded", "the fixture could not load {lib_arg}");
    let loaded_at = now_unix_nanos();
    assert!(
        !bpf_maps::exec_mappings(pid, lib).is_empty(),
        "{} is not mapped in the fixture after dlopen",
        lib.display()
    );
    let described_at = wait_described_in_bpf(maps, pid, lib, Duration::from_secs(20), || {
        run.icecore.logs()
    });
    println!(
        "{label}: library loaded {:.2} s after icecore started; its table in the fixture's BPF \
         mapping table {:.3} s after loading",
        (loaded_at - run.icecore.started_unix_nanos) as f64 / 1e9,
        (described_at - loaded_at) as f64 / 1e9
    );
    described_at
}
