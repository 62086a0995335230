//! The robustness benchmark: what becomes of short-lived processes' samples,
//! and whether the agent gives back the memory that big binaries cost it.
//! Needs root; `scripts/robustness-benchmark.sh` builds and runs it.
//!
//! 1. Short-lived processes: icecore profiles the whole host while thousands
//!    of processes living milliseconds run one after another; their samples
//!    in icecore's pprof output are judged symbolized when their user-space
//!    leaf has a function name and a file.
//! 2. Memory: icecore at its defaults while `rustc -O` (whose
//!    `librustc_driver.so` is about 150 MB) compiles in a loop, then idle;
//!    RSS before, at its peak and after the loop, with DWARF on and off.

mod memory;
mod report;
mod short_lived;

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Short-lived processes' symbolization and the agent's memory after rustc")]
struct Args {
    /// Short-lived processes to run.
    #[arg(long, default_value_t = 2500)]
    processes: usize,
    /// How long each lives, in milliseconds of CPU.
    #[arg(long, default_value_t = 20)]
    lifetime_ms: u32,
    /// Sampling rate while they run.
    #[arg(long, default_value_t = 97)]
    churn_hz: u32,
    /// Seconds of the rustc loop.
    #[arg(long, default_value_t = 40)]
    rustc_seconds: u64,
    /// Seconds to wait after the loop before reading the settled RSS.
    #[arg(long, default_value_t = 30)]
    settle_seconds: u64,
    /// The icecore binary [default: `icecore` next to this program].
    #[arg(long)]
    icecore: Option<PathBuf>,
    /// rustc for the memory phase.
    #[arg(long, default_value = "rustc")]
    rustc: String,
    /// C compiler for the short-lived process.
    #[arg(long, default_value = "cc")]
    cc: String,
    /// Leave out the memory phase (or, with --skip-churn, the other).
    #[arg(long)]
    skip_memory: bool,
    /// Leave out the short-lived processes.
    #[arg(long)]
    skip_churn: bool,
    /// Markdown file whose `robustness` section gets the report.
    #[arg(long, default_value = "BENCHMARKS.md")]
    output: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("needs root: it loads icecore's BPF programs");
    }
    let icecore = match &args.icecore {
        Some(path) => path.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no directory of this program")?
            .join("icecore"),
    };
    let scratch = tempfile::tempdir()?;
    let churn = if args.skip_churn {
        None
    } else {
        eprintln!(
            "short-lived: {} processes of {} ms at {} Hz",
            args.processes, args.lifetime_ms, args.churn_hz
        );
        Some(short_lived::run(
            &icecore,
            &args.cc,
            args.processes,
            args.lifetime_ms,
            args.churn_hz,
            scratch.path(),
        )?)
    };
    let memory = if args.skip_memory {
        Vec::new()
    } else {
        memory::run(
            &icecore,
            &args.rustc,
            args.rustc_seconds,
            args.settle_seconds,
            scratch.path(),
        )?
    };
    let text = report::markdown(&icecore, churn.as_ref(), &memory);
    println!("{text}");
    icecore_benches::write_section(&args.output, "robustness", &text)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    eprintln!("written to {}", args.output.display());
    Ok(())
}
