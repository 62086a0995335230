// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The map-baseline machinery of the short-lived-process test: waiting until
//! icecore's BPF maps are steady, polling them while processes come and go,
//! running the short-lived processes and comparing the final maps with the
//! baseline.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::support::bpf_maps::{Snapshot, UnwinderMaps};
use crate::support::summary::DecodedSample;

/// Counts (pids, tables) and what they were at most while a poller ran.
#[derive(Debug, Default)]
pub struct Churn {
    pub peak_pids: usize,
    pub peak_tables: usize,
    /// Pids seen in PROCESS_MAPPINGS that were not there at the baseline, with
    /// the table slots their mapping tables named.
    pub new_pids: BTreeMap<u32, BTreeSet<u32>>,
    pub polls: u64,
}

/// Reads icecore's maps every few milliseconds until `stop`.
fn poll_maps(icecore_pid: u32, baseline: BTreeSet<u32>, stop: Arc<AtomicBool>) -> Churn {
    let maps = UnwinderMaps::of_icecore(icecore_pid).expect("icecore's maps");
    let mut churn = Churn::default();
    while !stop.load(Ordering::Relaxed) {
        let pids = maps.pids();
        let tables = maps.table_slots().len();
        churn.peak_pids = churn.peak_pids.max(pids.len());
        churn.peak_tables = churn.peak_tables.max(tables);
        for pid in pids.difference(&baseline) {
            let files = churn.new_pids.entry(*pid).or_default();
            if let Some(entries) = maps.mappings_of(*pid) {
                files.extend(
                    entries
                        .iter()
                        .filter(|e| e.table_rows > 0)
                        .map(|e| e.table_slot),
                );
            }
        }
        churn.polls += 1;
        std::thread::sleep(Duration::from_millis(3));
    }
    churn
}

/// A thread polling icecore's maps (`poll_maps`) until `finish`.
pub struct MapPoller {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Churn>,
}

impl MapPoller {
    /// Starts polling the maps of icecore `icecore_pid`; pids not in
    /// `baseline` are recorded as new.
    pub fn start(icecore_pid: u32, baseline: BTreeSet<u32>) -> MapPoller {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || poll_maps(icecore_pid, baseline, stop))
        };
        MapPoller { stop, thread }
    }

    /// Stops the poller and returns what it saw.
    pub fn finish(self) -> Churn {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("poller thread")
    }
}

pub fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The pids of `fin` whose process no longer exists, and how many of
/// `base_pids` are still alive. Called right after the final read, while every
/// process it saw may still run (icecore itself among them).
pub fn liveness(fin: &Snapshot, base_pids: &BTreeSet<u32>) -> (Vec<u32>, usize) {
    let dead: Vec<u32> = fin.pids().into_iter().filter(|p| !alive(*p)).collect();
    let base_alive = base_pids.iter().filter(|p| alive(**p)).count();
    (dead, base_alive)
}

/// Waits until both counts of `maps` (pids, tables) are unchanged for 2 s (at
/// most 15 s). Returns when the wait started and since when they were unchanged.
pub fn wait_steady(maps: &UnwinderMaps) -> (Instant, Instant) {
    let steady_since = Instant::now();
    let mut last = (maps.pids().len(), maps.table_slots().len());
    let mut unchanged_since = Instant::now();
    while unchanged_since.elapsed() < Duration::from_secs(2)
        && steady_since.elapsed() < Duration::from_secs(15)
    {
        std::thread::sleep(Duration::from_millis(100));
        let now = (maps.pids().len(), maps.table_slots().len());
        if now != last {
            last = now;
            unchanged_since = Instant::now();
        }
    }
    (steady_since, unchanged_since)
}

/// Waits until the maps are steady (`wait_steady`) and returns their snapshot,
/// printed.
pub fn steady_baseline(label: &str, maps: &UnwinderMaps) -> Snapshot {
    let (steady_since, unchanged_since) = wait_steady(maps);
    let base = maps.snapshot();
    println!(
        "{label}: baseline after {:.1} s: PROCESS_MAPPINGS {} entries, UNWIND_TABLES {} entries \
         (steady for {:.1} s)",
        steady_since.elapsed().as_secs_f64(),
        base.processes.len(),
        base.tables.len(),
        unchanged_since.elapsed().as_secs_f64()
    );
    base
}

/// How each short-lived process of [`run_churn`] spends its 10 ms.
pub const CHURN_MODES: [&[&str]; 3] = [
    &["burn", "10"],
    // Three more threads beside the main one.
    &["threads", "3", "10"],
    // Two children forked without exec.
    &["fork", "2", "10"],
];

/// Runs `processes` short-lived processes, `workers` at a time: each an
/// exec of the next of `exes` in the next of [`CHURN_MODES`], to its
/// successful exit. Returns the pids of all of them and of the children they
/// forked without exec.
pub fn run_churn(exes: &[std::path::PathBuf], processes: usize, workers: usize) -> BTreeSet<u32> {
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;
    let next = AtomicUsize::new(0);
    let pids = Mutex::new(BTreeSet::new());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= processes {
                        return;
                    }
                    let exe = &exes[i % exes.len()];
                    let mode = CHURN_MODES[i % CHURN_MODES.len()];
                    let child = std::process::Command::new(exe)
                        .args(mode)
                        .stdin(std::process::Stdio::null())
                        .stdout(std::process::Stdio::piped())
                        .spawn()
                        .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()));
                    let pid = child.id();
                    let out = child
                        .wait_with_output()
                        .expect("wait for a short-lived process");
                    assert!(
                        out.status.success(),
                        "short-lived process {i} ({} {mode:?}) failed: {}",
                        exe.display(),
                        out.status
                    );
                    let forked = String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .filter_map(|l| l.trim().parse::<u32>().ok())
                        .collect::<Vec<_>>();
                    let mut pids = pids.lock().expect("pids");
                    pids.insert(pid);
                    pids.extend(forked);
                }
            });
        }
    });
    pids.into_inner().expect("pids")
}

/// The final maps compared with the baseline and the churn.
pub struct Outcome {
    /// Short-lived processes seen in PROCESS_MAPPINGS, with their tables' slots.
    pub described_churn: BTreeMap<u32, BTreeSet<u32>>,
    /// The table slots those tables named.
    pub churn_files: BTreeSet<u32>,
    /// Short-lived processes still in PROCESS_MAPPINGS at the end.
    pub leaked_churn: Vec<u32>,
    /// File ids named by the final mapping tables.
    pub referenced: BTreeSet<u32>,
    /// Installed tables no final mapping table names.
    pub orphans: Vec<u32>,
    /// Processes in the final maps that are neither at the baseline nor short-lived.
    pub new_unrelated: Vec<u32>,
    /// Baseline processes no longer in the final maps.
    pub gone: Vec<u32>,
}

impl Outcome {
    /// `of` the churn against `base`, printed (`print`).
    pub fn report(
        label: &str,
        processes: usize,
        churn: &Churn,
        churn_pids: &BTreeSet<u32>,
        base: &Snapshot,
        fin: &Snapshot,
    ) -> Outcome {
        let outcome = Outcome::of(churn, churn_pids, &base.pids(), fin);
        outcome.print(label, processes, base, churn, fin);
        outcome
    }

    pub fn of(
        churn: &Churn,
        churn_pids: &BTreeSet<u32>,
        base_pids: &BTreeSet<u32>,
        fin: &Snapshot,
    ) -> Outcome {
        let fin_pids = fin.pids();
        let described_churn: BTreeMap<u32, BTreeSet<u32>> = churn
            .new_pids
            .iter()
            .filter(|(pid, _)| churn_pids.contains(pid))
            .map(|(pid, files)| (*pid, files.clone()))
            .collect();
        let churn_files: BTreeSet<u32> = described_churn.values().flatten().copied().collect();
        let leaked_churn: Vec<u32> = fin_pids.intersection(churn_pids).copied().collect();
        let referenced = fin.referenced_tables();
        let orphans: Vec<u32> = fin.tables.difference(&referenced).copied().collect();
        let new_unrelated: Vec<u32> = fin_pids
            .difference(base_pids)
            .copied()
            .filter(|p| !churn_pids.contains(p))
            .collect();
        let gone: Vec<u32> = base_pids.difference(&fin_pids).copied().collect();
        Outcome {
            described_churn,
            churn_files,
            leaked_churn,
            referenced,
            orphans,
            new_unrelated,
            gone,
        }
    }

    /// Prints the counts at the baseline, their peaks and the final ones, and
    /// what became of the `processes` short-lived processes and the others.
    pub fn print(
        &self,
        label: &str,
        processes: usize,
        base: &Snapshot,
        churn: &Churn,
        fin: &Snapshot,
    ) {
        let Outcome {
            described_churn,
            churn_files,
            new_unrelated,
            gone,
            ..
        } = self;
        println!(
            "{label}: PROCESS_MAPPINGS baseline {} peak {} final {}; UNWIND_TABLES baseline {} peak \
             {} final {}",
            base.processes.len(),
            churn.peak_pids,
            fin.processes.len(),
            base.tables.len(),
            churn.peak_tables,
            fin.tables.len()
        );
        println!(
            "{label}: {} of the {processes} short-lived processes were seen described in BPF (their \
             tables used {} slots, {} of them empty at the baseline); other processes \
             since the baseline: {} new {new_unrelated:?}, {} gone {gone:?}",
            described_churn.len(),
            churn_files.len(),
            churn_files.difference(&base.tables).count(),
            new_unrelated.len(),
            gone.len()
        );
    }
}

/// How many samples of short-lived processes were symbolized: their
/// user-space leaf named and in a known file, under the right executable.
#[derive(Debug, Default, Clone)]
pub struct SymbolizedShare {
    /// Unsymbolized samples by their leaf's mapping (or its absence).
    pub unsymbolized_by_mapping: BTreeMap<String, u64>,
    /// A few unsymbolized samples, for the failure message.
    pub examples: Vec<String>,
    /// Samples of the processes with a user-space frame, outside `execve`.
    pub user_samples: u64,
    /// Of those, samples whose user leaf has a function name and a mapping.
    pub symbolized: u64,
    /// Of those, samples attributed to the right executable.
    pub named_process: u64,
    /// Samples of the processes in the kernel only (exec, exit, faults).
    pub kernel_only: u64,
    /// Samples inside `execve`: the image being replaced is the parent's
    /// copy, never learned, so their user frames stay addresses.
    pub in_exec: u64,
}

impl SymbolizedShare {
    pub fn of(
        samples: &[DecodedSample],
        pids: &BTreeSet<u32>,
        exes: &[std::path::PathBuf],
    ) -> SymbolizedShare {
        let exe_names: BTreeSet<String> = exes
            .iter()
            .filter_map(|e| e.file_name())
            .map(|n| n.to_string_lossy().to_string())
            .collect();
        let mut share = SymbolizedShare::default();
        for sample in samples.iter().filter(|s| {
            s.pid
                .is_some_and(|p| u32::try_from(p).is_ok_and(|p| pids.contains(&p)))
        }) {
            let Some(leaf) = sample.user_leaf() else {
                share.kernel_only += sample.count;
                continue;
            };
            let in_exec = sample.stack.iter().any(|f| {
                f.is_kernel()
                    && (f.function.starts_with("__x64_sys_execve")
                        || f.function.starts_with("do_execveat_common"))
            });
            if in_exec {
                share.in_exec += sample.count;
                continue;
            }
            share.user_samples += sample.count;
            if !leaf.function.is_empty() && leaf.mapping.is_some() {
                share.symbolized += sample.count;
            } else {
                let key = format!(
                    "{} ({})",
                    leaf.mapping.as_deref().unwrap_or("no mapping"),
                    if leaf.function.is_empty() {
                        "no function"
                    } else {
                        "named"
                    }
                );
                *share.unsymbolized_by_mapping.entry(key).or_default() += sample.count;
                if share.examples.len() < 8 {
                    let frames: Vec<String> = sample
                        .stack
                        .iter()
                        .map(|f| format!("{}@{:#x}", f.function, f.address))
                        .collect();
                    share.examples.push(format!(
                        "{:?} tid {:?} x{}: {}",
                        sample.comm,
                        sample.thread_id,
                        sample.count,
                        frames.join(" < ")
                    ));
                }
            }
            if sample.comm.as_ref().is_some_and(|c| exe_names.contains(c)) {
                share.named_process += sample.count;
            }
        }
        share
    }
}

impl std::fmt::Display for SymbolizedShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pct = |n: u64| 100.0 * n as f64 / self.user_samples.max(1) as f64;
        write!(
            f,
            "{} of {} samples with a user frame symbolized ({:.1}%), {} under the right executable \
             ({:.1}%); {} in the kernel only, {} inside execve (user frames of the image it replaces); \
             unsymbolized leaves: {:?}; for example:\n  {}",
            self.symbolized,
            self.user_samples,
            pct(self.symbolized),
            self.named_process,
            pct(self.named_process),
            self.kernel_only,
            self.in_exec,
            self.unsymbolized_by_mapping,
            self.examples.join("\n  ")
        )
    }
}
