//! BPF time per CPython frame, from the kernel's own BPF statistics
//! (`run_time_ns / run_cnt` of the entry program, tail calls included).
//!
//! Needs root. Runs `fixtures/python_recurse.py` (a plain recursive Python
//! function, burning CPU at the bottom) under a pyenv CPython 3.12, one
//! instance per CPU, at several Python depths, and fits
//! `ns per sample = fixed + per_frame × Python frames`: from 3.11 on, Python
//! calls Python without a new C frame, so the native part stays the same at
//! every depth. A CPython 3.10, when pyenv has one, runs in the same rounds
//! for comparison: there every Python frame also costs native frames.
//!
//! The first samples teach icecore each process (Python frames appear only
//! once user space has described it), so each run counts only what happens
//! between the end of a warm-up and the end of the run.
//!
//! `cargo bench -p icecore-benches --bench python_cost`
//!
//! Environment: `PYTHON_COST_PYTHON` (interpreter instead of pyenv's 3.12),
//! `PYTHON_COST_DEPTHS` (e.g. `5,150`), `PYTHON_COST_HZ`, `PYTHON_COST_ROUNDS`.

#![expect(
    clippy::expect_used,
    reason = "a benchmark harness: failed setup should abort with its message"
)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use icecore_receiver::{
    Counter, CpuProfiler, ProfilerOptions, SamplerOptions, runtimes::python::detect,
};

const FREQUENCY_HZ: u32 = 997;
const WARM_UP: Duration = Duration::from_secs(2);
const MEASURED: Duration = Duration::from_secs(4);
const DEPTHS: [u32; 3] = [5, 50, 150];
/// Rounds over all depths and interpreters, interleaved so that a noisy
/// period of the machine spreads over every point instead of skewing one.
const ROUNDS: usize = 2;

/// Totals read from the profiler at one point in time.
#[derive(Clone, Copy, Default)]
struct Totals {
    run_time_ns: u64,
    runs: u64,
    python_frames: u64,
    native_frames: u64,
    emitted: u64,
    cut: u64,
}

impl Totals {
    fn read(profiler: &mut CpuProfiler) -> Totals {
        // Counters and BPF cost are refreshed when a batch is cut.
        profiler.take_batch();
        let stats = profiler.stats();
        let stats = stats.lock().expect("stats lock");
        let c = |counter| stats.counters.get(counter);
        Totals {
            run_time_ns: stats.bpf_cost.run_time_ns,
            runs: stats.bpf_cost.run_count,
            python_frames: c(Counter::PythonFrames),
            native_frames: c(Counter::DwarfFrames) + c(Counter::FramePointerFrames),
            emitted: c(Counter::Emitted),
            cut: c(Counter::UserStackTruncated) + c(Counter::PythonStackTruncated),
        }
    }
}

struct Run {
    python: usize,
    depth: u32,
    runs: u64,
    native_per_sample: f64,
    python_per_sample: f64,
    cut_share: f64,
    ns_per_sample: f64,
}

fn pyenv_python(minor: u8) -> Option<PathBuf> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")))?;
    let prefix = format!("3.{minor}.");
    let mut versions: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path().join(format!("bin/python3.{minor}")))
        .filter(|p| p.exists())
        .collect();
    versions.sort();
    versions.pop()
}

/// `3.12` from the interpreter's file name, or the whole name.
fn label(python: &Path) -> String {
    let name = python.to_string_lossy();
    match detect::version_from_name(&name) {
        Some((major, minor)) if minor > 0 => format!("{major}.{minor}"),
        _ => name.rsplit('/').next().unwrap_or(&name).to_owned(),
    }
}

fn sample_while(profiler: &mut CpuProfiler, time: Duration) {
    let deadline = Instant::now() + time;
    while Instant::now() < deadline {
        profiler.drain();
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn measure(python: &Path, depth: u32, cpus: usize, frequency_hz: u32) -> (Totals, Totals) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/python_recurse.py");
    let seconds = (WARM_UP + MEASURED).as_secs() + 3;
    let mut children: Vec<Child> = (0..cpus)
        .map(|_| {
            Command::new(python)
                .arg(&script)
                .args([depth.to_string(), seconds.to_string()])
                .spawn()
                .expect("spawn python fixture")
        })
        .collect();
    let pids = children.iter().map(Child::id).collect();
    let options = ProfilerOptions::new(
        SamplerOptions::new(frequency_hz, pids),
        Duration::from_secs(3600),
    );
    let mut profiler = CpuProfiler::start(&options).expect("start sampling (root needed)");
    sample_while(&mut profiler, WARM_UP);
    let before = Totals::read(&mut profiler);
    sample_while(&mut profiler, MEASURED);
    let after = Totals::read(&mut profiler);
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    (before, after)
}

fn run(python: usize, depth: u32, (before, after): (Totals, Totals)) -> Run {
    let per = |a: u64, b: u64, n: u64| b.saturating_sub(a) as f64 / n.max(1) as f64;
    let emitted = after.emitted.saturating_sub(before.emitted);
    let runs = after.runs.saturating_sub(before.runs);
    Run {
        python,
        depth,
        runs,
        native_per_sample: per(before.native_frames, after.native_frames, emitted),
        python_per_sample: per(before.python_frames, after.python_frames, emitted),
        cut_share: per(before.cut, after.cut, emitted),
        ns_per_sample: per(before.run_time_ns, after.run_time_ns, runs),
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn main() {
    if !icecore_benches::root_bench_selected("python_cost") {
        return;
    }
    let Some(main_python) = std::env::var_os("PYTHON_COST_PYTHON")
        .map(PathBuf::from)
        .or_else(|| pyenv_python(12))
    else {
        println!("python_cost: skipped, no pyenv CPython 3.12 (set PYTHON_COST_PYTHON)");
        return;
    };
    let mut pythons = vec![main_python];
    if let Some(old) = pyenv_python(10).filter(|p| label(p) != label(&pythons[0])) {
        pythons.push(old);
    }
    let labels: Vec<String> = pythons.iter().map(|p| label(p)).collect();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let depths: Vec<u32> = std::env::var("PYTHON_COST_DEPTHS")
        .ok()
        .map(|v| v.split(',').filter_map(|d| d.trim().parse().ok()).collect())
        .filter(|d: &Vec<u32>| !d.is_empty())
        .unwrap_or_else(|| DEPTHS.to_vec());
    let rounds = env_or("PYTHON_COST_ROUNDS", ROUNDS);
    let frequency_hz = env_or("PYTHON_COST_HZ", FREQUENCY_HZ);
    let mut runs = Vec::new();
    for _ in 0..rounds {
        for &depth in &depths {
            for (i, python) in pythons.iter().enumerate() {
                runs.push(run(i, depth, measure(python, depth, cpus, frequency_hz)));
            }
        }
    }
    runs.sort_by_key(|r| (r.python, r.depth));
    println!(
        "BPF cost per sample of CPython (cpu-clock {frequency_hz} Hz, {cpus} fixture instances, \
         {}s warm-up + {}s measured, {rounds} rounds)",
        WARM_UP.as_secs(),
        MEASURED.as_secs()
    );
    println!(
        "{:>7} {:>6} {:>8} {:>14} {:>14} {:>6} {:>10}",
        "python", "depth", "runs", "native/sample", "python/sample", "cut", "ns/sample"
    );
    for r in &runs {
        println!(
            "{:>7} {:>6} {:>8} {:>14.1} {:>14.1} {:>5.0}% {:>10.0}",
            labels[r.python],
            r.depth,
            r.runs,
            r.native_per_sample,
            r.python_per_sample,
            r.cut_share * 100.0,
            r.ns_per_sample
        );
    }
    let points: Vec<(f64, f64)> = runs
        .iter()
        .filter(|r| r.python == 0)
        .map(|r| (r.python_per_sample, r.ns_per_sample))
        .collect();
    let (fixed, per_frame) = icecore_benches::fit(&points);
    println!(
        "fit: {fixed:.0} ns fixed + {per_frame:.1} ns per Python frame ({})",
        labels[0]
    );
}
