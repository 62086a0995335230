// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end test of short-lived processes: 200 processes of 30 ms each run
//! one after another while icecore profiles the host at 997 Hz. Their
//! samples must be symbolized although each is gone long before its batch
//! is cut, and every BPF map must return to its baseline once they exited.
//!
//! Needs root (it loads BPF programs); without root it prints why it is
//! skipped and passes.
//!
//!     sudo -E cargo test --release --test integration -- short_lived:: --nocapture

use crate::support;

use std::time::{Duration, Instant};

use support::bpf_maps::UnwinderMaps;
use support::native::churn::{
    MapPoller, Outcome, SymbolizedShare, liveness, run_short_lived, steady_baseline,
};
use support::native::measure::print_metrics_at_end;
use support::native::{BATCH_TIMEOUT, compile_unique_native_c, temp_dir};
use support::run::{REPORTER_INTERVAL, SystemWideRun};
use support::{otlp, require_root, serial};

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
    let churn_exe = compile_unique_native_c(tmp.path(), "churn");
    let mut run = SystemWideRun::spawn(
        tmp,
        HZ,
        &[
            "--log-level".to_string(),
            "info,icecore_receiver=debug".to_string(),
        ],
    );
    let ice_pid = run.icecore.pid() as u32;
    let maps = UnwinderMaps::wait_for(ice_pid, Duration::from_secs(30));

    let base = steady_baseline(TEST, &maps);
    let base_pids = base.pids();

    let poller = MapPoller::start(ice_pid, base_pids.clone());
    let started = Instant::now();
    let churn_pids = run_short_lived(&churn_exe, PROCESSES);
    let churn_secs = started.elapsed().as_secs_f64();
    let last_exit = Instant::now();
    // Two reporting intervals after the last exit (the periodic sweep runs at each).
    std::thread::sleep(2 * REPORTER_INTERVAL + Duration::from_millis(500));
    let churn = poller.finish();
    let fin = maps.snapshot();
    // Liveness at once, while every process the final read saw may still run
    // (icecore itself among them): waiting for the metrics first would give
    // any process the machine runs meanwhile the time to exit.
    let (dead, base_alive) = liveness(&fin, &base_pids);
    // A process of the machine may exit just as the final read happens;
    // icecore drops it moments later. One still there after a grace is a leak.
    let dead: Vec<u32> = if dead.is_empty() {
        dead
    } else {
        std::thread::sleep(Duration::from_millis(1500));
        let now = maps.pids();
        println!(
            "{TEST}: {dead:?} exited around the final read; still described 1.5 s later: {:?}",
            dead.iter().filter(|p| now.contains(p)).collect::<Vec<_>>()
        );
        dead.into_iter().filter(|p| now.contains(p)).collect()
    };
    // Likewise a table being installed for a process of the machine (a big
    // file takes a while) is in UNWIND_TABLES before its process's mapping
    // table names it; only a table still unnamed after a grace is leaked.
    let unnamed = |snap: &support::bpf_maps::Snapshot| -> Vec<u32> {
        snap.tables
            .difference(&snap.referenced_tables())
            .copied()
            .collect()
    };
    let leaked_tables: Vec<u32> = if unnamed(&fin).is_empty() {
        Vec::new()
    } else {
        std::thread::sleep(Duration::from_millis(1500));
        let later = unnamed(&maps.snapshot());
        unnamed(&fin)
            .into_iter()
            .filter(|t| later.contains(t))
            .collect()
    };
    let at_end = run.icecore.metrics_after_next_batch(BATCH_TIMEOUT);
    println!(
        "{TEST}: {PROCESSES} processes in {churn_secs:.1} s; final read {:.1} s after the last \
         exit; {} polls of the maps meanwhile",
        last_exit.elapsed().as_secs_f64(),
        churn.polls
    );
    run.icecore.stop();
    let _ = std::fs::copy(
        run.dir().join("icecore.stderr"),
        "/tmp/churn-icecore.stderr",
    );

    let Outcome {
        described_churn,
        leaked_churn,
        referenced,
        orphans,
        new_unrelated,
        gone,
        ..
    } = Outcome::report(TEST, PROCESSES, &churn, &churn_pids, &base, &fin);
    print_metrics_at_end(TEST, &at_end);

    // Their samples are symbolized although each process was gone long
    // before its batch was cut: learned at exec and at its first sample.
    let received = otlp::decode::samples(&run.receiver.requests());
    let share = SymbolizedShare::of(&received, &churn_pids, &churn_exe);
    println!("{TEST}: short-lived processes' samples: {share}");
    assert!(
        share.user_samples >= (PROCESSES * 10) as u64,
        "{TEST}: too few samples of the short-lived processes: {share}"
    );
    assert!(
        share.symbolized * 100 >= share.user_samples * 95,
        "{TEST}: under 95% of the short-lived processes' samples symbolized: {share}"
    );

    assert!(
        churn.peak_pids > base.processes.len() && churn.peak_tables > base.tables.len(),
        "{TEST}: the maps never grew during the churn (PROCESS_MAPPINGS peak {} vs baseline {}, \
         UNWIND_TABLES peak {} vs baseline {}): the short-lived processes were never described",
        churn.peak_pids,
        base.processes.len(),
        churn.peak_tables,
        base.tables.len()
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
    println!("{TEST}: tables no mapping table named at the final read: {orphans:x?}");
    let orphans = leaked_tables;
    assert!(
        orphans.is_empty(),
        "{TEST}: UNWIND_TABLES holds {} tables that no process's mapping table names: \
         {orphans:x?}",
        orphans.len()
    );
    assert_eq!(
        fin.process_slots.len(),
        fin.processes.len(),
        "{TEST}: PROCESS_MAPPINGS holds {} tables for {} described pids: slots leaked",
        fin.process_slots.len(),
        fin.processes.len()
    );
    if new_unrelated.is_empty() && gone.is_empty() {
        assert_eq!(
            fin.processes.len(),
            base.processes.len(),
            "{TEST}: PROCESS_MAPPINGS is not back at its baseline"
        );
        assert_eq!(
            fin.tables.len(),
            base.tables.len(),
            "{TEST}: UNWIND_TABLES is not back at its baseline: {:x?} added, {:x?} removed",
            fin.tables.difference(&base.tables).collect::<Vec<_>>(),
            base.tables.difference(&fin.tables).collect::<Vec<_>>()
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
            fin.tables.len(),
            referenced.len(),
            "{TEST}: UNWIND_TABLES does not match the files of the described processes"
        );
    }
}
