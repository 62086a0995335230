//! What off-CPU profiling costs: BPF time per context switch, from the
//! kernel's own statistics of the `sched_switch` program (the unwinders it
//! tail-calls included), for a switch the random draw filters out and for
//! one it records, and the agent's CPU, at paced context-switch rates and
//! several thresholds.
//!
//! Needs root and gcc. Builds `integration/fixtures/off_cpu.c` and runs its
//! `storm` mode (two threads ping-ponging a byte over two pipes: two
//! blocking switches per hop, paced by spinning) at each rate, under an
//! in-process profiler at 19 Hz with off-CPU sampling at each threshold.
//! The program runs on every switch of the host, so its run count is the
//! host's switches; the fixture's own are most of them.
//!
//! A threshold of 1e-9 records (almost) nothing: its time per switch is the
//! filter's cost. The cost of a recorded switch is the extra time at a
//! threshold over the filter's, per stack recorded.
//!
//! `cargo bench -p icecore-benches --bench off_cpu_cost`
//!
//! Environment: `OFF_CPU_COST_RATES` (switches per second, e.g.
//! `10000,100000`), `OFF_CPU_COST_THRESHOLDS` (e.g. `1e-9,0.01,0.1,1`),
//! `OFF_CPU_COST_SECONDS` (measured window, default 5).

#![expect(
    clippy::expect_used,
    reason = "a benchmark: failed setup should abort with its message"
)]

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use icecore_receiver::{
    Counter, CpuProfiler, OffCpuOptions, ProfilerOptions, ProfilerStats, SamplerOptions,
};

const WARM_UP: Duration = Duration::from_secs(1);

fn list(name: &str, default: &[f64]) -> Vec<f64> {
    match std::env::var(name) {
        Ok(text) => text
            .split(',')
            .map(|v| v.trim().parse().expect("a number"))
            .collect(),
        Err(_) => default.to_vec(),
    }
}

fn main() {
    if !icecore_benches::root_bench_selected("off_cpu_cost") {
        return;
    }
    let rates = list("OFF_CPU_COST_RATES", &[10_000.0, 100_000.0]);
    let thresholds = list("OFF_CPU_COST_THRESHOLDS", &[1e-9, 0.01, 0.1, 1.0]);
    let measured = Duration::from_secs(
        std::env::var("OFF_CPU_COST_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = dir.path().join("off_cpu");
    let source = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../integration/fixtures/off_cpu.c"
    );
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
        .arg(&exe)
        .arg(source)
        .status()
        .expect("run gcc");
    assert!(status.success(), "gcc failed");

    println!(
        "{:>12} {:>10} {:>14} {:>12} {:>14} {:>16} {:>10}",
        "switches/s",
        "threshold",
        "host switches",
        "recorded",
        "ns per switch",
        "ns per recorded",
        "agent CPU"
    );
    for &rate in &rates {
        let mut filter_ns = None;
        for &threshold in &thresholds {
            let point = measure(&exe, rate, threshold, measured);
            let per_switch = point.run_time_ns as f64 / point.runs.max(1) as f64;
            if threshold <= 1e-6 {
                filter_ns = Some(per_switch);
            }
            let per_recorded = filter_ns.filter(|_| point.recorded > 0).map(|filter| {
                (point.run_time_ns as f64 - filter * point.runs as f64) / point.recorded as f64
            });
            println!(
                "{:>12.0} {:>10} {:>14} {:>12} {:>14.0} {:>16} {:>9.2}%",
                point.runs as f64 / point.seconds,
                threshold,
                point.runs,
                point.recorded,
                per_switch,
                per_recorded.map_or_else(|| "-".to_string(), |ns| format!("{ns:.0}")),
                100.0 * point.agent_cpu_seconds / point.seconds,
            );
        }
    }
}

struct Point {
    seconds: f64,
    runs: u64,
    run_time_ns: u64,
    recorded: u64,
    agent_cpu_seconds: f64,
}

fn measure(exe: &std::path::Path, rate: f64, threshold: f64, measured: Duration) -> Point {
    let seconds = (WARM_UP + measured).as_secs() + 6;
    let mut child = Command::new(exe)
        .args([
            "storm".to_string(),
            seconds.to_string(),
            // Two blocking switches per hop.
            (rate / 2.0).to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the fixture");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read ready");
    let mut sampler = SamplerOptions::new(19, vec![child.id()]);
    sampler.off_cpu = Some(OffCpuOptions {
        probability: threshold,
        min_duration: Duration::from_micros(1),
    });
    let options = ProfilerOptions::new(sampler, Duration::from_secs(3600));
    let mut profiler = CpuProfiler::start(&options).expect("start sampling (root needed)");
    // SAFETY: a signal to the fixture this benchmark started.
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    run_for(&mut profiler, WARM_UP);
    let (before, cpu_before) = snapshot(&mut profiler);
    let started = Instant::now();
    run_for(&mut profiler, measured);
    let (after, cpu_after) = snapshot(&mut profiler);
    let elapsed = started.elapsed().as_secs_f64();
    drop(profiler);
    let _ = child.kill();
    let _ = child.wait();
    let cost = |s: &ProfilerStats| s.off_cpu.map(|o| o.bpf_cost).unwrap_or_default();
    let (b, a) = (cost(&before), cost(&after));
    Point {
        seconds: elapsed,
        runs: a.run_count.saturating_sub(b.run_count),
        run_time_ns: a.run_time_ns.saturating_sub(b.run_time_ns),
        recorded: after
            .counters
            .get(Counter::OffCpuSamples)
            .saturating_sub(before.counters.get(Counter::OffCpuSamples)),
        agent_cpu_seconds: cpu_after - cpu_before,
    }
}

/// Drains the rings every 100 ms for `length`.
fn run_for(profiler: &mut CpuProfiler, length: Duration) {
    let deadline = Instant::now() + length;
    while Instant::now() < deadline {
        profiler.drain();
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The statistics and this process's CPU seconds (the agent's), as of now.
fn snapshot(profiler: &mut CpuProfiler) -> (ProfilerStats, f64) {
    profiler.take_batches();
    let stats = profiler.stats().lock().expect("stats lock").clone();
    (stats, process_cpu_seconds())
}

fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}
