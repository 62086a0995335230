// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end test of a crowded host: four processes map 300 distinct
//! shared libraries between them (`ICECORE_CROWD_FILES` sets another number,
//! like 2000, for the long form: then 200 per process) and run in turn,
//! beside a hot process, while icecore profiles them with an
//! `--unwind-table-memory` that holds the hot process's files and two crowd
//! processes' libraries.
//!
//! The unwind tables in BPF must stay within the budget at every scrape;
//! tables must leave (the least recently sampled) and come back (when
//! sampled again), both counted; the hot process's stacks must stay
//! complete, and so must the crowd's once its current quarter's tables are
//! back. The libraries are leaves without frame pointers, so a sample in one
//! reaches `main` only through its file's table.
//!
//! A second test maps 300 libraries in one process, more than its BPF
//! mapping table holds: the mappings left out must come back when sampled.
//!
//! Needs root (it loads BPF programs); without root it prints why it is
//! skipped and passes.
//!
//!     sudo -E cargo test --release --test integration -- crowded:: --nocapture
//!     ICECORE_CROWD_FILES=2000 sudo -E cargo test --release --test integration -- crowded:: --nocapture

use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use icecore_receiver::{process_maps::ProcessMappings, unwind_maps::UnwindMaps, unwind_table};
use support::fixture::{Fixture, MAX_LIFETIME_SECS};
use support::native::{C_FLAGS, compile_native_c, temp_dir};
use support::run::{SystemWideRun, s};
use support::summary::{DecodedSample, count_where, of_pid_since, pct, top_stacks, total};
use support::{HZ, now_unix_nanos, require_root, serial};

/// Libraries of the short form.
const DEFAULT_FILES: usize = 300;
/// Libraries a crowd process maps at most.
const MAX_PER_PROCESS: usize = 200;
/// Each crowd process runs alone for this long, in turn, then the first
/// two again (their tables pushed out by the others' meanwhile).
const PHASE: Duration = Duration::from_secs(6);
/// A library's table out of BPF comes back once a sample goes through it
/// (that sample is unwound with frame pointers, so cut short): within the
/// agent's next drain (at most 500 ms) and the table's install. The crowd's
/// samples this long after their library's first of a phase are judged.
const COME_BACK: Duration = Duration::from_secs(1);
/// Those samples that reach `main` at least.
const MIN_CROWD_COMPLETE_PCT: f64 = 98.0;
/// The hot process's samples that reach `main` at least.
const MIN_HOT_COMPLETE_PCT: f64 = 99.0;

fn crowd_files() -> usize {
    std::env::var("ICECORE_CROWD_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n >= 8)
        .unwrap_or(DEFAULT_FILES)
}

/// Builds the crowd's library once and copies it to `count` files, each
/// with a tail of its own: distinct files (inode, size, content hash) and
/// so distinct tables for icecore, without `count` compiler runs.
fn build_libraries(dir: &Path, count: usize) -> PathBuf {
    let libs = dir.join("libs");
    std::fs::create_dir_all(&libs).expect("mkdir libs");
    let built = support::build::compile(
        "clang",
        &["-O2", "-fomit-frame-pointer", "-g", "-shared", "-fPIC"],
        "crowd_lib.c",
        &[],
        dir,
        "libcrowd.so",
    );
    let image = std::fs::read(&built).expect("read libcrowd.so");
    for i in 0..count {
        let mut copy = image.clone();
        // Bytes past every section and segment: the loader ignores them.
        copy.extend(format!("icecore crowd library {i:06}\n").bytes());
        std::fs::write(libs.join(format!("libcrowd{i:04}.so")), copy).expect("write a library");
    }
    libs
}

/// Builds the crowd's program (`fixtures/crowd.c`), without frame pointers.
fn build_crowd(dir: &Path) -> PathBuf {
    support::build::compile(
        "clang",
        &["-O2", "-fomit-frame-pointer", "-g"],
        "crowd.c",
        &["-ldl"],
        dir,
        "crowd",
    )
}

/// Bytes of the unwind tables of `pid`'s executable files (those under
/// `skip` left out), as icecore sizes them.
fn table_bytes_of(pid: u32, skip: &Path) -> (usize, usize) {
    let maps = ProcessMappings::read(pid).expect("read the process's mappings");
    let mut seen = std::collections::BTreeSet::new();
    let mut bytes = 0;
    for m in maps
        .mappings()
        .iter()
        .filter(|m| m.executable && !m.is_vdso())
    {
        if m.path.starts_with(skip.to_str().unwrap_or("/")) || !seen.insert((m.dev, m.inode)) {
            continue;
        }
        let path = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
        if let Ok(table) = unwind_table::build_table(Path::new(&path)) {
            bytes += UnwindMaps::table_bytes(table.rows.len());
        }
    }
    (bytes, seen.len())
}

/// The samples of `samples` in `start..end` taken at least [`COME_BACK`]
/// after the first sample in that range of their user leaf's file.
fn after_first_samples(samples: &[DecodedSample], start: u64, end: u64) -> Vec<DecodedSample> {
    let file = |s: &DecodedSample| s.user_leaf().and_then(|f| f.mapping.clone());
    let mut first = std::collections::BTreeMap::new();
    for s in samples {
        for &t in &s.timestamps {
            if (start..end).contains(&t) {
                let at = first.entry(file(s)).or_insert(t);
                *at = (*at).min(t);
            }
        }
    }
    samples
        .iter()
        .filter_map(|s| {
            let from = first.get(&file(s))? + COME_BACK.as_nanos() as u64;
            s.between(from.max(start), end)
        })
        .collect()
}

fn reaches_main(samples: &[DecodedSample]) -> (u64, u64) {
    (count_where(samples, |s| s.contains("main")), total(samples))
}

/// Judges a crowd process's samples in `start..end`: those taken
/// [`COME_BACK`] after their library's first must reach `main`. Prints the
/// figures (and the stacks cut short, when failing) under `what`, and
/// returns the failure.
fn crowd_complete(what: &str, samples: &[DecodedSample], start: u64, end: u64) -> Option<String> {
    let judged = after_first_samples(samples, start, end);
    let (complete, n) = reaches_main(&judged);
    let (all_complete, all) = reaches_main(
        &samples
            .iter()
            .filter_map(|s| s.between(start, end))
            .collect::<Vec<_>>(),
    );
    println!(
        "{what}: {complete} of {n} samples taken {} s or more after their library's first \
         reach main ({:.2}%); of all its samples {all_complete} of {all}",
        COME_BACK.as_secs(),
        pct(complete, n)
    );
    if n >= 100 && pct(complete, n) >= MIN_CROWD_COMPLETE_PCT {
        return None;
    }
    let cut: Vec<DecodedSample> = judged
        .iter()
        .filter(|s| !s.contains("main"))
        .cloned()
        .collect();
    println!(
        "{what}: its stacks that do not reach main:\n{}",
        top_stacks(&cut, 5)
    );
    Some(format!(
        "{what}: {complete} of {n} samples reach main, at least {MIN_CROWD_COMPLETE_PCT}% of \
         100 expected"
    ))
}

/// Unwind tables stay within `--unwind-table-memory` on a host mapping more
/// libraries than it holds; the least recently sampled leave and come back.
#[test]
fn unwind_tables_stay_within_their_budget_on_a_crowded_host() {
    const TEST: &str = "unwind_tables_stay_within_their_budget_on_a_crowded_host";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let files = crowd_files();
    // A process maps at most MAX_PER_PROCESS libraries (BPF describes 256
    // mappings of a process), and at least four processes share them.
    let processes = files.div_ceil(MAX_PER_PROCESS).max(4);
    let per_process = files.div_ceil(processes);
    let schedule: Vec<usize> = (0..processes).chain([0, 1]).collect();
    let tmp = temp_dir();
    let started_build = Instant::now();
    let libs = build_libraries(tmp.path(), files);
    let lib_table = {
        let table = unwind_table::build_table(&libs.join("libcrowd0000.so")).expect("lib table");
        UnwindMaps::table_bytes(table.rows.len())
    };
    let crowd_exe = build_crowd(tmp.path());
    let hot_exe = compile_native_c(C_FLAGS, tmp.path(), "hot");
    println!(
        "{TEST}: built {files} libraries in {:.1} s",
        started_build.elapsed().as_secs_f64()
    );

    let mut hot = Fixture::spawn_args(&hot_exe, &["cycle", MAX_LIFETIME_SECS]);
    // The crowd maps its libraries before the agent starts, and starts its
    // schedule on SIGUSR1.
    let lifetime = (PHASE.as_secs() as usize * (schedule.len() + 4)).to_string();
    let mut crowd: Vec<Fixture> = (0..processes)
        .map(|p| {
            let phases: Vec<String> = schedule
                .iter()
                .enumerate()
                .filter(|&(_, &runs)| runs == p)
                .map(|(phase, _)| phase.to_string())
                .collect();
            let first = p * per_process;
            let count = per_process.min(files - first);
            Fixture::spawn_args(
                &crowd_exe,
                &[
                    libs.display().to_string(),
                    first.to_string(),
                    count.to_string(),
                    PHASE.as_millis().to_string(),
                    phases.join(","),
                    lifetime.clone(),
                ],
            )
        })
        .collect();
    let (base_hot, hot_files) = table_bytes_of(hot.pid(), &libs);
    // A crowd process's own files besides the libraries: its executable,
    // and libc and the loader again (counted twice: a margin).
    let (base_crowd, _) = table_bytes_of(crowd[0].pid(), &libs);
    // Room for the hot process's files, the crowd's own, two processes'
    // libraries, and the vDSO's table and rounding.
    let budget = (base_hot + base_crowd + 2 * per_process * lib_table + (256 << 10)).max(1 << 20);
    let needed = base_hot + base_crowd + files * lib_table;
    println!(
        "{TEST}: {files} libraries of {lib_table} table bytes each in {processes} processes; hot \
         process {base_hot} bytes ({hot_files} files), a crowd process's own {base_crowd}; \
         budget {budget} bytes of {needed} needed"
    );
    assert!(
        needed >= budget + per_process * lib_table,
        "{TEST}: the crowd needs {needed} bytes, not a process's libraries over the \
         {budget}-byte budget: nothing would have to leave"
    );

    let mut args = vec![s("--pid"), s(hot.pid())];
    for c in &crowd {
        args.extend([s("--pid"), s(c.pid())]);
    }
    args.extend([s("--unwind-table-memory"), s(budget)]);
    let mut run = SystemWideRun::spawn(tmp, HZ, &args);
    for c in &crowd {
        // SAFETY: kill(2) on a child's pid, not yet reaped.
        let sent = unsafe { libc::kill(c.pid() as i32, libc::SIGUSR1) };
        assert_eq!(sent, 0, "{TEST}: cannot signal a crowd process");
    }
    let crowd_started = now_unix_nanos();
    let deadline = Instant::now() + PHASE * schedule.len() as u32;
    let mut most_bytes = 0.0f64;
    let mut scrapes = 0;
    while Instant::now() < deadline {
        let m = run.icecore.metrics();
        most_bytes = most_bytes.max(m.value("icecore_unwind_table_bytes"));
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    let at_end = run
        .icecore
        .metrics_after_next_batch(Duration::from_secs(10));
    most_bytes = most_bytes.max(at_end.value("icecore_unwind_table_bytes"));
    let rss_kib = support::status_kib(run.icecore.pid(), "VmRSS:");
    run.icecore.stop();
    assert!(hot.is_running(), "{TEST}: the hot process died");
    assert!(
        crowd.iter_mut().all(|c| c.is_running()),
        "{TEST}: a crowd process died"
    );
    let received = run.otlp_of(hot.pid());

    let evicted = at_end.value("icecore_unwind_tables_evicted_total");
    let readmitted = at_end.value("icecore_unwind_tables_readmitted_total");
    let over_budget = at_end.value("icecore_unwind_tables_over_budget_total");
    println!(
        "{TEST}: table bytes at most {most_bytes} of {budget} over {scrapes} scrapes; {evicted} \
         tables evicted, {readmitted} readmitted, {over_budget} left out over budget; BPF maps \
         {} bytes; agent RSS {rss_kib} KiB",
        at_end.value("icecore_bpf_map_bytes")
    );
    let mut failures = Vec::new();
    if most_bytes > budget as f64 {
        failures.push(format!(
            "unwind tables took {most_bytes} bytes, over the {budget}-byte budget"
        ));
    }
    if evicted < 1.0 || readmitted < 1.0 {
        failures.push(format!(
            "{evicted} tables evicted and {readmitted} readmitted: both should happen"
        ));
    }
    let (hot_samples, _) = of_pid_since(&received.samples, hot.pid(), 0);
    let (complete, n) = reaches_main(&hot_samples);
    println!(
        "{TEST}: hot process: {complete} of {n} samples reach main ({:.2}%)",
        pct(complete, n)
    );
    if n < 100 || pct(complete, n) < MIN_HOT_COMPLETE_PCT {
        failures.push(format!(
            "hot process: {complete} of {n} samples reach main, at least \
             {MIN_HOT_COMPLETE_PCT}% of 100 expected"
        ));
    }
    for (phase, &p) in schedule.iter().enumerate() {
        let start = crowd_started + phase as u64 * PHASE.as_nanos() as u64;
        let end = start + PHASE.as_nanos() as u64;
        let samples = of_pid_since(&received.samples, crowd[p].pid(), 0).0;
        let what = format!("{TEST}: phase {phase}, crowd process {p}");
        failures.extend(crowd_complete(&what, &samples, start, end));
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}

/// A process mapping more executable files than its BPF mapping table holds
/// (256 entries) keeps the mappings its samples go through: the crowd maps
/// 300 libraries and runs only the 40 it `dlopen`ed last, which the loader
/// placed lowest and which are left out until sampled. Each comes back once
/// a sample goes through it; from then on its samples reach `main` (the
/// libraries have no frame pointers: only their tables get there).
#[test]
fn a_process_mapping_more_than_its_table_holds_keeps_its_sampled_mappings() {
    const TEST: &str = "a_process_mapping_more_than_its_table_holds_keeps_its_sampled_mappings";
    const LIBRARIES: usize = 300;
    const RUN: usize = 40;
    const RUN_FOR: Duration = Duration::from_secs(6);
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir();
    let libs = build_libraries(tmp.path(), LIBRARIES);
    let crowd_exe = build_crowd(tmp.path());
    let mut crowd = Fixture::spawn_args(
        &crowd_exe,
        &[
            libs.display().to_string(),
            s(0),
            s(LIBRARIES),
            RUN_FOR.as_millis().to_string(),
            s(0),
            (RUN_FOR.as_secs() + 30).to_string(),
            s(LIBRARIES - RUN),
            s(RUN),
        ],
    );
    let mapped = ProcessMappings::read(crowd.pid())
        .expect("read the crowd's mappings")
        .executable()
        .count();
    println!("{TEST}: the crowd maps {mapped} executable ranges");
    assert!(
        mapped >= 256 + RUN,
        "{TEST}: {mapped} executable mappings leave fewer than {RUN} out"
    );
    let mut run = SystemWideRun::spawn(tmp, HZ, &[s("--pid"), s(crowd.pid())]);
    // SAFETY: kill(2) on a child's pid, not yet reaped.
    let sent = unsafe { libc::kill(crowd.pid() as i32, libc::SIGUSR1) };
    assert_eq!(sent, 0, "{TEST}: cannot signal the crowd");
    let start = now_unix_nanos();
    std::thread::sleep(RUN_FOR);
    let end = now_unix_nanos();
    let m = run
        .icecore
        .metrics_after_next_batch(Duration::from_secs(10));
    run.icecore.stop();
    assert!(crowd.is_running(), "{TEST}: the crowd died");
    let left_out = m.value("icecore_process_mappings_left_out");
    let sampled_left_out = m.value("icecore_process_mappings_sampled_left_out_total");
    let received = run.otlp_of(crowd.pid());
    let samples = of_pid_since(&received.samples, crowd.pid(), 0).0;
    println!(
        "{TEST}: {left_out} mappings left out at the end, samples through one \
         {sampled_left_out} times"
    );
    let mut failures = Vec::new();
    if left_out < (mapped - 256) as f64 || sampled_left_out < 1.0 {
        failures.push(format!(
            "{left_out} mappings left out and {sampled_left_out} samples through one: the \
             {RUN} libraries run should have been out, then sampled"
        ));
    }
    failures.extend(crowd_complete(TEST, &samples, start, end));
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}
