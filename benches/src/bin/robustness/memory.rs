//! icecore's resident memory while `rustc -O` compiles in a loop and after:
//! a big binary's unwind table and symbols must not stay resident.

use std::{
    path::Path,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use icecore_benches::{
    agent::Icecore,
    proc::{peak_rss_bytes, rss_bytes},
};

/// One run of the memory phase.
#[derive(Debug)]
pub struct MemoryRun {
    pub name: &'static str,
    pub compiles: u32,
    /// RSS before the loop, idle.
    pub idle_rss: u64,
    /// Highest RSS (VmHWM) over the whole run.
    pub peak_rss: u64,
    /// RSS `settle` after the loop ended.
    pub settled_rss: u64,
    pub settle_seconds: u64,
}

/// Enough Rust for `rustc -O` to run a second or two.
fn program() -> String {
    let mut text = String::from("use std::collections::HashMap;\n");
    for i in 0..60 {
        text.push_str(&format!(
            "pub fn f{i}(v: &[u64]) -> HashMap<u64, Vec<String>> {{\n\
             let mut m = HashMap::new();\n\
             for (k, x) in v.iter().enumerate() {{ m.entry(x % {m}).or_insert_with(Vec::new).push(format!(\"{{}}-{{}}\", k, x * {i})); }}\n\
             m\n}}\n",
            m = i + 3
        ));
    }
    text.push_str("fn main() { let v: Vec<u64> = (0..100).collect(); let mut n = 0;\n");
    for i in 0..60 {
        text.push_str(&format!("n += f{i}(&v).len();\n"));
    }
    text.push_str("println!(\"{n}\"); }\n");
    text
}

pub fn run(
    icecore: &Path,
    rustc: &str,
    loop_seconds: u64,
    settle_seconds: u64,
    scratch: &Path,
) -> anyhow::Result<Vec<MemoryRun>> {
    let source = scratch.join("compiled.rs");
    std::fs::write(&source, program())?;
    let mut runs = Vec::new();
    for (name, extra) in [
        ("DWARF at its default budget", &[][..]),
        ("DWARF off", &["--debug-info-memory", "0"][..]),
    ] {
        eprintln!("memory: {name}: {loop_seconds} s of rustc, then {settle_seconds} s idle");
        let agent = Icecore::spawn_named(icecore, 19, extra, scratch, &name.replace(' ', "-"))?;
        let pid = agent.pid();
        std::thread::sleep(Duration::from_secs(10));
        let idle_rss = rss_bytes(pid).context("icecore's RSS")?;
        // VmRSS between polls could miss a short peak; VmHWM does not.
        let stop = Arc::new(AtomicBool::new(false));
        let polled_peak = Arc::new(AtomicU64::new(0));
        let poller = {
            let (stop, polled_peak) = (stop.clone(), polled_peak.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    if let Some(rss) = rss_bytes(pid) {
                        polled_peak.fetch_max(rss, Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        let started = Instant::now();
        let mut compiles = 0;
        while started.elapsed() < Duration::from_secs(loop_seconds) {
            let out = scratch.join("compiled");
            let status = Command::new(rustc)
                .args(["-O", "--edition", "2021", "-o"])
                .arg(&out)
                .arg(&source)
                .status()
                .with_context(|| format!("cannot run {rustc}"))?;
            if !status.success() {
                bail!("{rustc} failed on the benchmark's program");
            }
            compiles += 1;
        }
        std::thread::sleep(Duration::from_secs(settle_seconds));
        let settled_rss = rss_bytes(pid).context("icecore's RSS")?;
        let peak_rss = peak_rss_bytes(pid)
            .unwrap_or(0)
            .max(polled_peak.load(Relaxed));
        stop.store(true, Relaxed);
        let _ = poller.join();
        agent.stop()?;
        runs.push(MemoryRun {
            name,
            compiles,
            idle_rss,
            peak_rss,
            settled_rss,
            settle_seconds,
        });
    }
    Ok(runs)
}
