//! The harness of the BPF cost benchmarks (`bpf_cost`, `python_cost`, and
//! one per runtime): BPF time per sample from the kernel's own statistics
//! (`run_time_ns / run_cnt` of the entry program, every tail-called program
//! included), against the frames each sample walked.
//!
//! A runtime's benchmark names its fixtures ([`Subject`]: a command that
//! recurses to a given depth and burns CPU at the bottom for a given time) and
//! the counters of its frames; the harness runs one instance per CPU (so
//! almost every perf event is a full sample), counts only a window after a
//! warm-up (the first samples learn the processes with every cache cold: a
//! start-up cost, not a per-sample one), interleaves rounds over depths and
//! subjects (a noisy period of a shared machine spreads over every point
//! instead of skewing one), prints a table and fits
//! `ns per sample = fixed + per frame × frames` per subject.

#![expect(
    clippy::expect_used,
    reason = "a benchmark harness: failed setup should abort with its message"
)]

use std::{
    process::{Child, Command},
    time::{Duration, Instant},
};

use icecore_receiver::{Counter, CpuProfiler, ProfilerOptions, ProfilerStats, SamplerOptions};

/// A fixture to profile.
pub struct Subject {
    /// Its column in the table, e.g. `3.12` or `native`.
    pub label: String,
    /// The command for a depth and a run time in seconds.
    pub command: Box<dyn Fn(u32, u64) -> Command>,
}

/// One benchmark: its fixtures, its counters and its defaults.
pub struct CostBench {
    /// Prefix of its environment variables: `{PREFIX}_DEPTHS` (e.g. `5,280`),
    /// `{PREFIX}_ROUNDS`, `{PREFIX}_HZ`.
    pub env_prefix: &'static str,
    /// What a frame is called in the table, e.g. `native` or `Python`.
    pub frame_name: &'static str,
    /// Counters whose sum is the frames fitted against.
    pub frames: &'static [Counter],
    /// Counters whose sum is the samples cut short.
    pub cut: &'static [Counter],
    /// Depths when the environment names none.
    pub depths: &'static [u32],
    /// Rounds when the environment names none.
    pub rounds: usize,
    /// Sampling frequency when the environment names none.
    pub frequency_hz: u32,
    /// Before the measured window.
    pub warm_up: Duration,
    /// The measured window.
    pub measured: Duration,
}

/// One measured window.
pub struct Run {
    /// Index of its subject.
    pub subject: usize,
    /// The fixture's depth argument.
    pub depth: u32,
    /// Program runs (samples taken) in the window.
    pub runs: u64,
    /// Native frames per emitted sample.
    pub native_per_sample: f64,
    /// The benchmark's frames per emitted sample.
    pub frames_per_sample: f64,
    /// Share of samples cut short.
    pub cut_share: f64,
    /// BPF time per run.
    pub ns_per_sample: f64,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

impl CostBench {
    /// Runs every round and prints the table and the fits.
    pub fn run(&self, subjects: &[Subject]) -> Vec<Run> {
        let depths: Vec<u32> = std::env::var(format!("{}_DEPTHS", self.env_prefix))
            .ok()
            .map(|v| v.split(',').filter_map(|d| d.trim().parse().ok()).collect())
            .filter(|d: &Vec<u32>| !d.is_empty())
            .unwrap_or_else(|| self.depths.to_vec());
        let rounds = env_or(&format!("{}_ROUNDS", self.env_prefix), self.rounds);
        let frequency_hz = env_or(&format!("{}_HZ", self.env_prefix), self.frequency_hz);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut runs = Vec::new();
        for _ in 0..rounds {
            for &depth in &depths {
                for (i, subject) in subjects.iter().enumerate() {
                    runs.push(self.measure(i, subject, depth, cpus, frequency_hz));
                }
            }
        }
        runs.sort_by_key(|r| (r.subject, r.depth));
        println!(
            "BPF cost per sample (cpu-clock {frequency_hz} Hz, {cpus} fixture instances, \
             {} s measured after {} s of warm-up, {rounds} rounds)",
            self.measured.as_secs(),
            self.warm_up.as_secs()
        );
        let per_sample = format!("{}/sample", self.frame_name);
        println!(
            "{:>8} {:>6} {:>8} {:>14} {:>14} {:>6} {:>10}",
            "subject", "depth", "runs", "native/sample", per_sample, "cut", "ns/sample"
        );
        for r in &runs {
            println!(
                "{:>8} {:>6} {:>8} {:>14.1} {:>14.1} {:>5.0}% {:>10.0}",
                subjects[r.subject].label,
                r.depth,
                r.runs,
                r.native_per_sample,
                r.frames_per_sample,
                r.cut_share * 100.0,
                r.ns_per_sample
            );
        }
        for (i, subject) in subjects.iter().enumerate() {
            let of_subject: Vec<&Run> = runs.iter().filter(|r| r.subject == i).collect();
            let points: Vec<(f64, f64)> = of_subject
                .iter()
                .map(|r| (r.frames_per_sample, r.ns_per_sample))
                .collect();
            let (fixed, per_frame) = crate::fit(&points);
            println!(
                "{}: fit over every run: {fixed:.0} ns fixed + {per_frame:.1} ns per {} frame",
                subject.label, self.frame_name
            );
            // A busy neighbour slows a whole round: the median of each
            // depth's rounds is what a quiet machine would show.
            let medians: Vec<(f64, f64)> = depths
                .iter()
                .filter_map(|&d| {
                    let of_depth: Vec<&&Run> = of_subject.iter().filter(|r| r.depth == d).collect();
                    let ns = median(of_depth.iter().map(|r| r.ns_per_sample).collect())?;
                    let frames = median(of_depth.iter().map(|r| r.frames_per_sample).collect())?;
                    Some((frames, ns))
                })
                .collect();
            for (frames, ns) in &medians {
                println!(
                    "{}: median at {frames:.1} {} frames: {ns:.0} ns",
                    subject.label, self.frame_name
                );
            }
            if medians.len() > 1 {
                let (fixed, per_frame) = crate::fit(&medians);
                println!(
                    "{}: fit over the medians: {fixed:.0} ns fixed + {per_frame:.1} ns per {} \
                     frame",
                    subject.label, self.frame_name
                );
            }
        }
        runs
    }

    fn measure(
        &self,
        index: usize,
        subject: &Subject,
        depth: u32,
        cpus: usize,
        frequency_hz: u32,
    ) -> Run {
        let seconds = (self.warm_up + self.measured).as_secs() + 3;
        let mut children: Vec<Child> = (0..cpus)
            .map(|_| {
                (subject.command)(depth, seconds)
                    .spawn()
                    .expect("spawn the fixture")
            })
            .collect();
        let pids = children.iter().map(Child::id).collect();
        let options = ProfilerOptions::new(
            SamplerOptions::new(frequency_hz, pids),
            Duration::from_secs(3600),
        );
        let mut profiler = CpuProfiler::start(&options).expect("start sampling (root needed)");
        run_for(&mut profiler, self.warm_up);
        let before = snapshot(&mut profiler);
        run_for(&mut profiler, self.measured);
        let after = snapshot(&mut profiler);
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let delta = |counters: &[Counter]| -> u64 {
            counters
                .iter()
                .map(|&c| after.counters.get(c).saturating_sub(before.counters.get(c)))
                .sum()
        };
        let emitted = delta(&[Counter::Emitted]).max(1) as f64;
        let runs = after
            .bpf_cost
            .run_count
            .saturating_sub(before.bpf_cost.run_count);
        let run_time_ns = after
            .bpf_cost
            .run_time_ns
            .saturating_sub(before.bpf_cost.run_time_ns);
        Run {
            subject: index,
            depth,
            runs,
            native_per_sample: delta(&[Counter::DwarfFrames, Counter::FramePointerFrames]) as f64
                / emitted,
            frames_per_sample: delta(self.frames) as f64 / emitted,
            cut_share: delta(self.cut) as f64 / emitted,
            ns_per_sample: run_time_ns as f64 / runs.max(1) as f64,
        }
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
    profiler.take_batches();
    let shared = profiler.stats();
    shared.lock().expect("stats lock").clone()
}

/// The middle value (the mean of the middle two for an even count).
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}
