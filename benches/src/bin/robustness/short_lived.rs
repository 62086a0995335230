//! Thousands of processes living milliseconds, one after another, while
//! icecore profiles the host: how many of their samples are symbolized.

use std::{collections::BTreeSet, path::Path, process::Command, time::Duration};

use anyhow::{Context, bail};
use icecore_benches::{
    agent::Icecore,
    pprof_read::{self, Sample},
    proc::{CpuTracker, monotonic_ns},
};

/// What icecore made of the short-lived processes.
#[derive(Debug, Default)]
pub struct Churn {
    pub processes: usize,
    pub lifetime_ms: u32,
    pub hz: u32,
    pub seconds: f64,
    /// Their samples with a user-space frame, outside `execve`.
    pub user_samples: u64,
    /// Of those, with a named user leaf in a known file.
    pub symbolized: u64,
    /// Of those, attributed to the short-lived program by name.
    pub named_process: u64,
    /// Samples inside `execve` (the image being replaced is the parent's).
    pub in_exec: u64,
    /// Samples in the kernel only.
    pub kernel_only: u64,
    /// icecore's CPU time during the churn, in ms.
    pub agent_cpu_ms: f64,
    /// Samples BPF emitted and icecore reported over its life.
    pub reported: u64,
    pub emitted: u64,
    /// icecore's RSS before the churn and 10 s after it, in bytes.
    pub rss_before: u64,
    pub rss_after: u64,
    /// Unsymbolized samples by their leaf's file (or its absence).
    pub unsymbolized: std::collections::BTreeMap<String, u64>,
}

pub fn run(
    icecore: &Path,
    cc: &str,
    processes: usize,
    lifetime_ms: u32,
    hz: u32,
    scratch: &Path,
) -> anyhow::Result<Churn> {
    let exe = icecore_benches::compile_native_fixture(cc, "short_lived.c", scratch)
        .map_err(anyhow::Error::msg)?;
    let agent = Icecore::spawn_named(
        icecore,
        hz,
        &["--reporter-interval", "2s"],
        scratch,
        "churn",
    )?;
    let pprof_dir = agent.pprof_dir.clone();
    let cpu = CpuTracker::start(agent.pid());
    std::thread::sleep(Duration::from_secs(2));
    let rss_before = icecore_benches::proc::rss_bytes(agent.pid()).unwrap_or(0);
    let start = monotonic_ns();
    let mut pids = BTreeSet::new();
    let lifetime = lifetime_ms.to_string();
    for i in 0..processes {
        let mut child = Command::new(&exe)
            .arg(&lifetime)
            .spawn()
            .with_context(|| format!("cannot run {}", exe.display()))?;
        pids.insert(child.id());
        if !child.wait()?.success() {
            bail!("short-lived process {i} failed");
        }
    }
    let end = monotonic_ns();
    // Long enough for a batch or two to be cut and the allocator trimmed.
    std::thread::sleep(Duration::from_secs(10));
    let rss_after = icecore_benches::proc::rss_bytes(agent.pid()).unwrap_or(0);
    let agent_cpu_ns = cpu.cpu_ns_between(start, end).unwrap_or(0);
    drop(cpu);
    let (_, summary) = agent.stop()?;
    let samples = pprof_read::read_dir(&pprof_dir)?;
    let name = exe
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let mut churn = judge(&samples, &pids, &name);
    churn.processes = processes;
    churn.lifetime_ms = lifetime_ms;
    churn.hz = hz;
    churn.seconds = (end - start) as f64 / 1e9;
    churn.agent_cpu_ms = agent_cpu_ns as f64 / 1e6;
    churn.reported = summary.samples_reported;
    churn.rss_before = rss_before;
    churn.rss_after = rss_after;
    churn.emitted = summary.emitted_by_bpf;
    Ok(churn)
}

/// Classifies the samples of `pids` (the same rules as the churn test).
fn judge(samples: &[Sample], pids: &BTreeSet<u32>, exe_name: &str) -> Churn {
    let mut churn = Churn::default();
    for sample in samples
        .iter()
        .filter(|s| s.pid.is_some_and(|p| pids.contains(&p)))
    {
        let Some(leaf) = sample.user_leaf() else {
            churn.kernel_only += sample.count;
            continue;
        };
        let in_exec = sample.frames.iter().any(|f| {
            f.is_kernel()
                && (f.function.starts_with("__x64_sys_execve")
                    || f.function.starts_with("do_execveat_common"))
        });
        if in_exec {
            churn.in_exec += sample.count;
            continue;
        }
        churn.user_samples += sample.count;
        if !leaf.function.is_empty() && !leaf.mapping.is_empty() {
            churn.symbolized += sample.count;
        } else {
            let file = if leaf.mapping.is_empty() {
                "no file".to_owned()
            } else {
                leaf.mapping.clone()
            };
            *churn.unsymbolized.entry(file).or_default() += sample.count;
        }
        if sample.comm == exe_name {
            churn.named_process += sample.count;
        }
    }
    churn
}
