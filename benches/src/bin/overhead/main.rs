//! The overhead benchmark: what icecore costs a busy host, beside perf, in
//! one run. Needs root; `scripts/overhead-benchmark.sh` builds and runs it.
//!
//! Phases, one at a time, while the workloads (`workload`) run throughout:
//! no profiler; icecore at each rate; `perf record --call-graph dwarf` then
//! `perf script` at each rate; no profiler again. Each phase measures one
//! window of `--seconds`, after `--warmup` for icecore (its start-up —
//! loading BPF, building the first unwind tables — is reported apart).

mod perf;
mod report;
mod self_profile;
mod workload;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use clap::Parser;

use icecore_benches::{
    agent::Icecore,
    proc::{self, CpuTracker, monotonic_ns},
};

use crate::{
    perf::PerfRecord,
    report::{Machine, Report, Row},
    self_profile::SelfProfile,
    workload::Workload,
};

#[derive(Parser, Debug)]
#[command(about = "Measure icecore's overhead on a busy host, beside perf")]
struct Args {
    /// Length of each measured window, in seconds. At 19 Hz a window holds
    /// about a thousand samples and one-off work (a new binary's symbols)
    /// weighs on the average: shorter windows are noisier.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Seconds icecore runs before its window (start-up is not steady state).
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    /// Sampling rates to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "19,997")]
    frequencies: Vec<u32>,
    /// The icecore binary [default: `icecore` next to this program].
    #[arg(long)]
    icecore: Option<PathBuf>,
    /// Python interpreter of the Python workload.
    #[arg(long, default_value = "python3")]
    python: String,
    /// perf binary.
    #[arg(long, default_value = "perf")]
    perf: String,
    /// C compiler for the native workload.
    #[arg(long, default_value = "cc")]
    cc: String,
    /// Leave perf out.
    #[arg(long)]
    skip_perf: bool,
    /// Where to write the Markdown report.
    #[arg(long, default_value = "BENCHMARKS.md")]
    output: PathBuf,
}

/// Time for the CPU poller to have a point past a window's end.
const SETTLE: Duration = Duration::from_millis(600);

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("needs root: it loads icecore's BPF programs and runs perf system-wide");
    }
    if args.seconds < 5 || args.frequencies.is_empty() {
        bail!("--seconds must be at least 5 and --frequencies name a rate");
    }
    let icecore = match &args.icecore {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no directory of this program")?
            .join("icecore"),
    };
    if !icecore.is_file() {
        bail!(
            "no icecore binary at {} (build it, or pass --icecore)",
            icecore.display()
        );
    }
    let scratch = tempfile::tempdir()?;
    let mut machine = Machine::detect();
    machine.icecore = icecore_benches::icecore_version(&icecore);
    machine.python = workload::python_version(&args.python);
    if !args.skip_perf {
        machine.perf = Some(perf::version(&args.perf).with_context(|| {
            format!(
                "cannot run {} (install linux-perf, or --skip-perf)",
                args.perf
            )
        })?);
    }
    let native = workload::build_native(scratch.path(), &args.cc)?;
    let mut workloads = workload::start(&native, &args.python)?;
    eprintln!(
        "workloads: native pid {}, Python pid {}",
        workloads[0].pid(),
        workloads[1].pid()
    );
    std::thread::sleep(Duration::from_secs(3));

    // A window without a profiler before and after every profiler's: each
    // is compared with the two around it, which cancels most of the drift of
    // a shared machine.
    let window = Duration::from_secs(args.seconds);
    let mut baselines = vec![baseline(&workloads, window)];
    let mut rows = Vec::new();
    let mut self_profiles = Vec::new();
    let mut phases: Vec<(&str, u32)> = args.frequencies.iter().map(|&hz| ("icecore", hz)).collect();
    if !args.skip_perf {
        phases.extend(args.frequencies.iter().map(|&hz| ("perf", hz)));
    }
    for (profiler, hz) in phases {
        eprintln!("{profiler} at {hz} Hz...");
        let mut row = if profiler == "icecore" {
            let (row, profile) = measure_icecore(&icecore, hz, &args, &workloads, scratch.path())?;
            self_profiles.push((hz, profile));
            row
        } else {
            measure_perf(&args.perf, hz, window, &workloads, scratch.path())?
        };
        let after = baseline(&workloads, window);
        row.reference = mean_rates(&[&baselines[baselines.len() - 1], &after]);
        baselines.push(after);
        rows.push(row);
    }
    for w in &mut workloads {
        if !w.is_running() {
            bail!("the {} workload died during the benchmark", w.name);
        }
    }
    let report = Report {
        machine,
        window_seconds: args.seconds,
        workloads: workloads.iter().map(|w| w.name).collect(),
        baselines,
        rows,
        self_profiles,
    };
    let text = report.markdown();
    println!("{text}");
    icecore_benches::write_section(&args.output, "overhead", &text)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    eprintln!("written to {}", args.output.display());
    Ok(())
}

/// Sleeps through a window; returns its CLOCK_MONOTONIC bounds.
fn window_of(length: Duration) -> (u64, u64) {
    let from = monotonic_ns();
    std::thread::sleep(length);
    (from, monotonic_ns())
}

fn throughput(workloads: &[Workload], (from, to): (u64, u64)) -> Vec<Option<f64>> {
    workloads.iter().map(|w| w.rate(from, to)).collect()
}

fn expected(hz: u32, (from, to): (u64, u64)) -> u64 {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    (f64::from(hz) * cpus as f64 * (to - from) as f64 / 1e9).round() as u64
}

/// Each workload's mean rate over `rows`.
fn mean_rates(rows: &[&Row]) -> Vec<Option<f64>> {
    let workloads = rows.iter().map(|r| r.throughput.len()).max().unwrap_or(0);
    (0..workloads)
        .map(|i| {
            let rates: Vec<f64> = rows
                .iter()
                .filter_map(|r| r.throughput.get(i).copied().flatten())
                .collect();
            (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64)
        })
        .collect()
}

fn baseline(workloads: &[Workload], length: Duration) -> Row {
    eprintln!("no profiler...");
    let window = window_of(length);
    Row {
        profiler: "none",
        throughput: throughput(workloads, window),
        ..Row::default()
    }
}

fn measure_icecore(
    binary: &Path,
    hz: u32,
    args: &Args,
    workloads: &[Workload],
    scratch: &Path,
) -> anyhow::Result<(Row, SelfProfile)> {
    let started = monotonic_ns();
    let icecore = Icecore::spawn(binary, hz, scratch)?;
    let pid = icecore.pid();
    let tracker = CpuTracker::start(pid);
    std::thread::sleep(Duration::from_secs(args.warmup));
    let before = icecore.metrics()?;
    let window = window_of(Duration::from_secs(args.seconds));
    let after = icecore.metrics()?;
    let peak_rss = proc::peak_rss_bytes(pid);
    std::thread::sleep(SETTLE);
    let cpu = tracker.cpu_ns_between(window.0, window.1);
    let startup_cpu = tracker.cpu_ns_until(window.0);
    drop(tracker);
    let pprof_dir = icecore.pprof_dir.clone();
    let (reaped, summary) = icecore.stop()?;

    let delta = |name: &str| after.get(name) - before.get(name);
    let bpf = |counter: &str| after.bpf(counter) - before.bpf(counter);
    let emitted = bpf("emitted");
    let frames = bpf("dwarf_frames") + bpf("frame_pointer_frames") + bpf("python_frames");
    let runs = delta("icecore_bpf_runs_total");
    let mut notes = vec![
        format!(
            "{:.0} ms of CPU from start to the window ({} s: loading BPF, first tables); {:.0} ms over its whole life",
            startup_cpu.unwrap_or(0) as f64 / 1e6,
            (window.0 - started) / 1_000_000_000,
            reaped.cpu_ns as f64 / 1e6
        ),
        format!(
            "user space received {} of the {} samples BPF emitted over its whole life",
            summary.samples_reported, summary.emitted_by_bpf
        ),
    ];
    let lost = bpf("ring_buffer_full")
        + bpf("tail_call_failed")
        + bpf("scratch_unavailable")
        + bpf("sample_ring_missing");
    if lost > 0.0 {
        notes.push(format!("{lost} samples lost in BPF in the window"));
    }
    let row = Row {
        profiler: "icecore",
        frequency_hz: Some(hz),
        cpu_share: cpu.map(|c| c as f64 / (window.1 - window.0) as f64),
        us_per_sample: cpu
            .filter(|_| emitted > 0.0)
            .map(|c| c as f64 / 1e3 / emitted),
        peak_rss_bytes: peak_rss,
        bpf_ns_per_sample: (runs > 0.0)
            .then(|| delta("icecore_bpf_run_time_seconds_total") * 1e9 / runs),
        frames_per_sample: (emitted > 0.0).then(|| frames / emitted),
        bpf_map_bytes: Some(after.get("icecore_bpf_map_bytes") as u64),
        samples: Some(emitted as u64),
        expected_samples: Some(expected(hz, window)),
        throughput: throughput(workloads, window),
        notes,
        ..Row::default()
    };
    let profile = SelfProfile::read(&pprof_dir, pid)
        .with_context(|| format!("reading icecore's pprof files in {}", pprof_dir.display()))?;
    Ok((row, profile))
}

fn measure_perf(
    perf_bin: &str,
    hz: u32,
    length: Duration,
    workloads: &[Workload],
    scratch: &Path,
) -> anyhow::Result<Row> {
    let started = Instant::now();
    let start_ns = monotonic_ns();
    let record = PerfRecord::spawn(perf_bin, hz, scratch)?;
    let pid = record.pid();
    let tracker = CpuTracker::start(pid);
    std::thread::sleep(Duration::from_secs(2));
    let window = window_of(length);
    let peak_rss = proc::peak_rss_bytes(pid);
    std::thread::sleep(SETTLE);
    let cpu = tracker.cpu_ns_between(window.0, window.1);
    drop(tracker);
    let (recorded, data) = record.stop()?;
    let recorded_span = (start_ns, start_ns + started.elapsed().as_nanos() as u64);
    let data_bytes = data.metadata().map_or(0, |m| m.len());
    let script = perf::script(perf_bin, &data)?;
    let _ = std::fs::remove_file(&data);
    let samples = script.samples.max(1) as f64;
    let notes = vec![format!(
        "`perf record` used {:.0} ms of CPU and wrote {:.0} MB for {} samples; `perf script` took {:.1} s and {:.0} ms of CPU ({:.0} µs per sample)",
        recorded.cpu_ns as f64 / 1e6,
        data_bytes as f64 / 1e6,
        script.samples,
        script.wall.as_secs_f64(),
        script.reaped.cpu_ns as f64 / 1e6,
        script.reaped.cpu_ns as f64 / 1e3 / samples,
    )];
    Ok(Row {
        profiler: "perf",
        frequency_hz: Some(hz),
        cpu_share: cpu.map(|c| c as f64 / (window.1 - window.0) as f64),
        us_per_sample: Some((recorded.cpu_ns + script.reaped.cpu_ns) as f64 / 1e3 / samples),
        peak_rss_bytes: Some(
            peak_rss
                .unwrap_or(0)
                .max(recorded.peak_rss_bytes)
                .max(script.reaped.peak_rss_bytes),
        ),
        samples: Some(script.samples),
        expected_samples: Some(expected(hz, recorded_span)),
        throughput: throughput(workloads, window),
        notes,
        ..Row::default()
    })
}
