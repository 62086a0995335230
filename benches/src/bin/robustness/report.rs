//! The robustness benchmark's Markdown report, with its targets.

use std::{fmt::Write, path::Path};

use crate::{memory::MemoryRun, short_lived::Churn};

/// Settled RSS target, 30 s after the rustc loop.
const SETTLED_TARGET: u64 = 60 << 20;
/// Peak RSS target over the loop.
const PEAK_TARGET: u64 = 100 << 20;
/// Share of the short-lived processes' samples to symbolize.
const SYMBOLIZED_TARGET: f64 = 95.0;

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**missed**" }
}

pub fn markdown(icecore: &Path, churn: Option<&Churn>, memory: &[MemoryRun]) -> String {
    let mut out = String::new();
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "# icecore robustness benchmark\n\nProduced by `scripts/robustness-benchmark.sh` on {date} with {}.\n",
        icecore_benches::icecore_version(icecore)
    );
    if let Some(c) = churn {
        let pct = |n: u64| 100.0 * n as f64 / c.user_samples.max(1) as f64;
        let symbolized = pct(c.symbolized);
        let _ = writeln!(
            out,
            "## Short-lived processes\n\n{} processes living {} ms each, one after another ({:.1} s), \
             icecore at {} Hz on every CPU. A sample counts as symbolized when its user-space leaf \
             has a function name and a file; samples inside `execve` (whose user frames belong to \
             the image being replaced) are counted apart.\n",
            c.processes, c.lifetime_ms, c.seconds, c.hz
        );
        let _ = writeln!(
            out,
            "| their samples with a user frame | symbolized | under the program's name | inside execve | kernel only | icecore CPU during the churn | icecore RSS before / 10 s after | reported / emitted by BPF |\n|---|---|---|---|---|---|---|---|"
        );
        let _ = writeln!(
            out,
            "| {} | {} ({symbolized:.1} %) | {} ({:.1} %) | {} | {} | {:.0} ms ({:.2} % of one core) | {} / {} | {} / {} |\n",
            c.user_samples,
            c.symbolized,
            c.named_process,
            pct(c.named_process),
            c.in_exec,
            c.kernel_only,
            c.agent_cpu_ms,
            c.agent_cpu_ms / 10.0 / c.seconds.max(0.001),
            mb(c.rss_before),
            mb(c.rss_after),
            c.reported,
            c.emitted
        );
        let _ = writeln!(
            out,
            "Target: at least {SYMBOLIZED_TARGET:.0} % symbolized: {}. Unsymbolized leaves by \
             file: {:?}.\n",
            verdict(symbolized >= SYMBOLIZED_TARGET),
            c.unsymbolized
        );
    }
    if !memory.is_empty() {
        let _ = writeln!(
            out,
            "## Memory after a large binary\n\nicecore at its defaults (19 Hz, pprof sink) while \
             `rustc -O` compiles a small program in a loop (rustc maps `librustc_driver.so`, about \
             150 MB, whose unwind table and symbols icecore builds), then idle.\n"
        );
        let _ = writeln!(
            out,
            "| run | compiles | RSS idle before | peak RSS | RSS after the loop | peak ≤ 100 MB | after ≤ 60 MB |\n|---|---|---|---|---|---|---|"
        );
        for run in memory {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} ({} s after) | {} | {} |",
                run.name,
                run.compiles,
                mb(run.idle_rss),
                mb(run.peak_rss),
                mb(run.settled_rss),
                run.settle_seconds,
                verdict(run.peak_rss <= PEAK_TARGET),
                verdict(run.settled_rss <= SETTLED_TARGET)
            );
        }
    }
    out
}
