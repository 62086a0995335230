// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! Start-up cost: describing every process running on this host to BPF
//! before sampling begins (`startup::describe_running`, as
//! `CpuProfiler::start` calls it): learning each process from `/proc`
//! (`ProcessTable::get_or_learn`), offering it to the runtimes, writing its
//! mapping table (`NativeUnwindInfo::describe_process`), and waiting for the
//! unwind tables of the files they map, each file built once.
//!
//! This is paid at every start of the agent, before its first sample, and
//! grows with what the host runs, so it is measured on the real host with
//! the real BPF maps, in wall time and in CPU time of this process (user +
//! system, the table-building thread and the map updates included).
//!
//! - `startup/cold`: each run loads the BPF object afresh (untimed), so that
//!   every table is built and installed and every mapping table written;
//!   one line per run on stderr gives processes, tables, wall and CPU time.
//!   Cold for icecore, not for the kernel: after the first run the files
//!   are in the page cache.
//! - `startup/warm`: the processes a first cold run described, described
//!   again while all their tables exist (and are still installed): the cost
//!   of processes whose files are known. Before each run (untimed) BPF and
//!   the runtimes forget them, and the process table starts empty, so each
//!   is learned from `/proc` and given a mapping table again. Processes
//!   started since are left out: their files may need tables.
//!
//! Needs root (skipped otherwise, or when the BPF object cannot be loaded).
//!
//! `cargo bench -p icecore-benches --bench startup`

#![expect(
    clippy::expect_used,
    reason = "a benchmark harness: failed setup should abort with its message"
)]

use std::{
    hint::black_box,
    num::NonZeroUsize,
    time::{Duration, Instant},
};

use criterion::{Criterion, SamplingMode};
use icecore_receiver::{
    ProfilerOptions, SamplerOptions,
    native_unwind::{DEFAULT_MAX_TABLE_BYTES, NativeUnwindInfo},
    processes::ProcessTable,
    runtimes::{RUNTIMES, Runtimes},
    sampler::CpuSampler,
    startup::{StartupDescription, describe_running},
    unwind_maps::UnwindMaps,
};

/// How long a run waits for the tables at most: long enough for every
/// table of a busy host to be built (the agent waits
/// `startup_tables_wait`, 10 s by default, and builds the rest later).
const TABLES_WAIT: Duration = Duration::from_secs(120);

/// What `CpuProfiler::start` sets up before describing the running
/// processes, on a freshly loaded BPF object.
struct Agent {
    /// Holds the BPF programs and maps the others write to.
    _sampler: CpuSampler,
    native: NativeUnwindInfo,
    runtimes: Runtimes,
    options: ProfilerOptions,
}

impl Agent {
    /// Loads the BPF object and builds the native unwinder and the
    /// runtimes as `CpuProfiler::start` does (without sampling).
    fn load() -> Result<Agent, String> {
        let mut options =
            ProfilerOptions::new(SamplerOptions::new(19, Vec::new()), Duration::from_secs(5));
        options.startup_tables_wait = TABLES_WAIT;
        let mut sampler = CpuSampler::load(&options.sampler).map_err(|e| e.to_string())?;
        let set = sampler
            .take_unwind_maps()
            .ok_or("the BPF object has no unwind maps")?;
        let maps = UnwindMaps::new(set).map_err(|e| e.to_string())?;
        let native = NativeUnwindInfo::new(
            maps,
            NonZeroUsize::new(1024).unwrap_or(NonZeroUsize::MIN),
            DEFAULT_MAX_TABLE_BYTES,
        )
        .map_err(|e| e.to_string())?;
        // Every runtime whose BPF program (if it has one) loaded.
        let mut plugins = Vec::new();
        for runtime in RUNTIMES {
            if runtime.bpf.is_some_and(|bpf| !sampler.runtime_loaded(bpf)) {
                eprintln!("startup: runtime {} off: not loaded", runtime.name);
                continue;
            }
            match (runtime.build)(&mut sampler) {
                Ok(plugin) => plugins.push(plugin),
                Err(e) => eprintln!("startup: runtime {} off: {e}", runtime.name),
            }
        }
        Ok(Agent {
            _sampler: sampler,
            native,
            runtimes: Runtimes::new(plugins),
            options,
        })
    }

    /// An empty process table, as the agent starts with.
    fn process_table(&self) -> ProcessTable {
        let mut processes = ProcessTable::new(self.options.max_processes);
        processes.set_command_lines(self.options.command_lines);
        processes
    }

    /// Describes every running process (or every one of `targets`), timed.
    fn describe(&mut self, processes: &mut ProcessTable, targets: &[u32]) -> Run {
        let cpu = cpu_time();
        let started = Instant::now();
        let description = describe_running(
            &mut self.native,
            &mut self.runtimes,
            processes,
            targets,
            self.options.startup_tables_wait,
        );
        let wall = started.elapsed();
        let cpu = cpu_time().saturating_sub(cpu);
        Run {
            description: black_box(description),
            wall,
            cpu,
        }
    }

    /// The running processes BPF has a mapping table of.
    fn described(&self) -> Vec<u32> {
        running_pids()
            .into_iter()
            .filter(|&pid| self.native.is_described(pid))
            .collect()
    }

    /// Forgets `pids` (BPF's mapping tables, the runtimes' attachments),
    /// keeping the built tables, still installed.
    fn forget(&mut self, pids: &[u32]) {
        for &pid in pids {
            self.native.forget_process(pid);
            self.runtimes.detach(pid);
        }
    }
}

/// One timed description of the running processes.
struct Run {
    description: StartupDescription,
    wall: Duration,
    cpu: Duration,
}

/// CPU time of this process so far, every thread's, user and system.
fn cpu_time() -> Duration {
    // SAFETY: an all-zero rusage is a valid value (plain integers).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let of = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    of(usage.ru_utime) + of(usage.ru_stime)
}

/// Every pid in `/proc`.
fn running_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median wall and CPU time of `runs` (not empty), in ms.
fn medians(runs: &mut [(Duration, Duration)]) -> (f64, f64) {
    let mid = runs.len() / 2;
    runs.sort_unstable_by_key(|r| r.0);
    let wall = runs[mid].0;
    runs.sort_unstable_by_key(|r| r.1);
    (ms(wall), ms(runs[mid].1))
}

fn startup(c: &mut Criterion) {
    let mut group = c.benchmark_group("startup");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(5));

    let mut cold_runs = Vec::new();
    group.bench_function("cold", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut agent = Agent::load().expect("load the BPF object");
                let mut processes = agent.process_table();
                let run = agent.describe(&mut processes, &[]);
                let stats = agent.native.stats();
                eprintln!(
                    "startup: {} processes, {} tables built ({} files without, {} pending), \
                     {} installed ({:.1} MiB), wall {:.1} ms, cpu {:.1} ms",
                    run.description.processes,
                    stats.tables_built,
                    stats.tables_unusable,
                    run.description.builds_pending,
                    stats.tables_installed,
                    stats.table_bytes_installed as f64 / (1024.0 * 1024.0),
                    ms(run.wall),
                    ms(run.cpu),
                );
                cold_runs.push((run.wall, run.cpu));
                total += run.wall;
                // The BPF object and the unwinder's thread go outside the timing.
                drop(processes);
                drop(agent);
            }
            total
        })
    });

    let mut warm_runs = Vec::new();
    let mut warm_processes = 0;
    let mut warm_builds = 0;
    let mut warm: Option<(Agent, Vec<u32>)> = None;
    group.bench_function("warm", |b| {
        let (agent, pids) = warm.get_or_insert_with(|| {
            let mut agent = Agent::load().expect("load the BPF object");
            let mut processes = agent.process_table();
            agent.describe(&mut processes, &[]);
            let pids = agent.described();
            (agent, pids)
        });
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                agent.forget(pids);
                let mut processes = agent.process_table();
                let built = agent.native.stats().tables_built;
                // The processes described cold (not those started since,
                // whose files may need tables): the same loop, from a list
                // rather than from /proc.
                let run = agent.describe(&mut processes, pids);
                warm_builds += agent.native.stats().tables_built - built;
                warm_processes = run.description.processes;
                warm_runs.push((run.wall, run.cpu));
                total += run.wall;
                drop(processes);
            }
            total
        })
    });
    group.finish();
    drop(warm);

    if !cold_runs.is_empty() {
        let (wall, cpu) = medians(&mut cold_runs);
        eprintln!(
            "startup cold: median over {} runs: wall {wall:.1} ms, cpu {cpu:.1} ms",
            cold_runs.len()
        );
    }
    if !warm_runs.is_empty() {
        let (wall, cpu) = medians(&mut warm_runs);
        eprintln!(
            "startup warm: {warm_processes} processes, median over {} runs: wall {wall:.2} ms, \
         cpu {cpu:.2} ms ({warm_builds} tables built meanwhile: processes changed images)",
            warm_runs.len()
        );
    }
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("startup: skipped, needs root to load the BPF programs");
        return;
    }
    if let Err(e) = Agent::load() {
        println!("startup: skipped, cannot load the BPF programs: {e}");
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    startup(&mut c);
    c.final_summary();
}
