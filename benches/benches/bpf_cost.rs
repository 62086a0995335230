//! BPF time per sample and per native frame, from the kernel's own BPF
//! statistics (`run_time_ns / run_cnt` of the entry program, which includes
//! every tail-called program).
//!
//! Needs root. Profiles a recursion fixture built without frame pointers at
//! several depths, one instance per CPU so almost every perf event is a full
//! sample, and fits `ns per sample = fixed + per_frame × frames` over a window
//! after a warm-up (the first samples run with every cache cold while the
//! agent learns the processes: a start-up cost, not a per-sample one).
//!
//! `cargo bench -p icecore-benches --bench bpf_cost`

#![expect(
    clippy::expect_used,
    reason = "a benchmark harness: failed setup should abort with its message"
)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use icecore_receiver::{Counter, CpuProfiler, ProfilerOptions, ProfilerStats, SamplerOptions};

const FREQUENCY_HZ: u32 = 997;
/// Seconds before the measured window.
const WARMUP_SECONDS: u64 = 2;
/// Seconds measured.
const SECONDS: u64 = 4;
const DEPTHS: [u32; 4] = [5, 60, 150, 280];
/// Rounds over all depths, interleaved so that a noisy period of the
/// machine spreads over every depth instead of skewing one.
const ROUNDS: usize = 3;

struct Run {
    depth: u32,
    ns_per_sample: f64,
    frames_per_sample: f64,
    samples: u64,
}

fn build_fixture(dir: &Path) -> PathBuf {
    icecore_benches::compile_native_fixture("cc", "recurse.c", dir)
        .unwrap_or_else(|e| panic!("cannot build the fixture: {e}"))
}

fn measure(exe: &Path, depth: u32, cpus: usize, frequency_hz: u32) -> Run {
    let seconds = WARMUP_SECONDS + SECONDS + 2;
    let mut children: Vec<Child> = (0..cpus)
        .map(|_| {
            Command::new(exe)
                .args([depth.to_string(), seconds.to_string()])
                .spawn()
                .expect("spawn fixture")
        })
        .collect();
    let pids = children.iter().map(Child::id).collect();
    let options = ProfilerOptions::new(
        SamplerOptions::new(frequency_hz, pids),
        Duration::from_secs(3600),
    );
    let mut profiler = CpuProfiler::start(&options).expect("start sampling (root needed)");
    // Warm-up: the first samples learn the processes and install tables, with
    // every cache cold; the measured window starts after it.
    run_for(&mut profiler, Duration::from_secs(WARMUP_SECONDS));
    let before = snapshot(&mut profiler);
    run_for(&mut profiler, Duration::from_secs(SECONDS));
    let after = snapshot(&mut profiler);
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    let delta = |c: Counter| after.counters.get(c) - before.counters.get(c);
    let emitted = delta(Counter::Emitted).max(1);
    let frames = delta(Counter::DwarfFrames) + delta(Counter::FramePointerFrames);
    let runs = after.bpf_cost.run_count - before.bpf_cost.run_count;
    let run_time_ns = after.bpf_cost.run_time_ns - before.bpf_cost.run_time_ns;
    Run {
        depth,
        ns_per_sample: run_time_ns as f64 / runs.max(1) as f64,
        frames_per_sample: frames as f64 / emitted as f64,
        samples: runs,
    }
}

/// Drains the ring every 100 ms for `length`.
fn run_for(profiler: &mut CpuProfiler, length: Duration) {
    let deadline = Instant::now() + length;
    while Instant::now() < deadline {
        profiler.drain();
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The counters and BPF statistics as of now.
fn snapshot(profiler: &mut CpuProfiler) -> ProfilerStats {
    // Taking a batch drains the ring and refreshes the statistics.
    profiler.take_batch();
    let shared = profiler.stats();
    shared.lock().expect("stats lock").clone()
}

fn main() {
    if !icecore_benches::root_bench_selected("bpf_cost") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = build_fixture(dir.path());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // BPF_COST_DEPTHS=5,280 and BPF_COST_ROUNDS=1 make quicker comparisons.
    let depths: Vec<u32> = std::env::var("BPF_COST_DEPTHS")
        .ok()
        .map(|v| v.split(',').filter_map(|d| d.trim().parse().ok()).collect())
        .filter(|d: &Vec<u32>| !d.is_empty())
        .unwrap_or_else(|| DEPTHS.to_vec());
    let rounds = std::env::var("BPF_COST_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ROUNDS);
    // BPF_COST_HZ: caches are colder at lower frequencies, and samples dearer.
    let frequency_hz = std::env::var("BPF_COST_HZ")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(FREQUENCY_HZ);
    let runs: Vec<Run> = (0..rounds)
        .flat_map(|_| {
            depths
                .iter()
                .map(|&d| measure(&exe, d, cpus, frequency_hz))
                .collect::<Vec<_>>()
        })
        .collect();
    println!(
        "BPF cost per sample (cpu-clock {frequency_hz} Hz, {cpus} fixture instances, {SECONDS} s \
         after {WARMUP_SECONDS} s of warm-up each, {rounds} rounds)"
    );
    println!(
        "{:>6} {:>10} {:>14} {:>14}",
        "depth", "runs", "frames/sample", "ns/sample"
    );
    for r in &runs {
        println!(
            "{:>6} {:>10} {:>14.1} {:>14.0}",
            r.depth, r.samples, r.frames_per_sample, r.ns_per_sample
        );
    }
    let points: Vec<(f64, f64)> = runs
        .iter()
        .map(|r| (r.frames_per_sample, r.ns_per_sample))
        .collect();
    let (fixed, per_frame) = icecore_benches::fit(&points);
    println!(
        "fit over every run: {fixed:.0} ns fixed + {per_frame:.1} ns per native frame \
         (target: 2000 + 100)"
    );
    // A busy neighbour on a shared machine slows a whole round: the median
    // of each depth's rounds is what a quiet machine would show.
    let medians: Vec<(f64, f64)> = depths
        .iter()
        .filter_map(|&d| {
            let of_depth: Vec<&Run> = runs.iter().filter(|r| r.depth == d).collect();
            let ns = median(of_depth.iter().map(|r| r.ns_per_sample).collect())?;
            let frames = median(of_depth.iter().map(|r| r.frames_per_sample).collect())?;
            Some((frames, ns))
        })
        .collect();
    for (frames, ns) in &medians {
        println!("median at {frames:.1} frames: {ns:.0} ns");
    }
    let (fixed, per_frame) = icecore_benches::fit(&medians);
    println!(
        "fit over the medians: {fixed:.0} ns fixed + {per_frame:.1} ns per native frame \
         (target: 2000 + 100)"
    );
}

/// The middle value (the mean of the middle two for an even count).
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}
