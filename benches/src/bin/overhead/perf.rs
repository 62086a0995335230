//! The reference path: `perf record --call-graph dwarf` system-wide, then
//! `perf script` to turn the samples into symbolized stacks.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

use icecore_benches::proc::{self, Reaped};

/// A running `perf record`.
pub struct PerfRecord {
    child: Child,
    data: PathBuf,
    log: PathBuf,
}

impl PerfRecord {
    pub fn spawn(perf: &str, frequency_hz: u32, scratch: &Path) -> anyhow::Result<PerfRecord> {
        let data = scratch.join(format!("perf-{frequency_hz}hz.data"));
        let log = scratch.join(format!("perf-record-{frequency_hz}hz.log"));
        let child = Command::new(perf)
            .args(["record", "-a", "--call-graph", "dwarf", "-F"])
            .arg(frequency_hz.to_string())
            .arg("-o")
            .arg(&data)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("cannot start {perf} (install linux-perf, or --skip-perf)"))?;
        let mut record = PerfRecord { child, data, log };
        // perf writes its header once the events are open.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !record.data.metadata().is_ok_and(|m| m.len() > 0) {
            if let Ok(Some(status)) = record.child.try_wait() {
                bail!(
                    "perf record exited ({status}): {}",
                    std::fs::read_to_string(&record.log).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                bail!("perf record wrote nothing in 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(record)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops recording (SIGINT, as Ctrl-C) and reaps it.
    pub fn stop(mut self) -> anyhow::Result<(Reaped, PathBuf)> {
        proc::signal(&self.child, libc::SIGINT)?;
        let reaped = proc::reap(&mut self.child)?;
        // perf exits non-zero when interrupted on some versions; the data
        // file is what matters, and `perf script` checks it.
        Ok((reaped, self.data.clone()))
    }
}

impl Drop for PerfRecord {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `perf script` cost to print every sample's symbolized stack.
pub struct Script {
    pub samples: u64,
    pub reaped: Reaped,
    pub wall: Duration,
}

/// Runs `perf script` over `data`, counting the samples it prints.
pub fn script(perf: &str, data: &Path) -> anyhow::Result<Script> {
    let started = Instant::now();
    let mut child = Command::new(perf)
        .arg("script")
        .arg("-i")
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {perf} script"))?;
    let stdout = child.stdout.take().context("piped stdout")?;
    let mut samples = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap_or_default();
        if is_sample_header(&line) {
            samples += 1;
        }
    }
    let reaped = proc::reap(&mut child)?;
    if !reaped.success {
        bail!("perf script failed on {}", data.display());
    }
    Ok(Script {
        samples,
        reaped,
        wall: started.elapsed(),
    })
}

/// `perf script` prints each sample as a header line (command, pid, time,
/// event) followed by indented stack lines and a blank line.
fn is_sample_header(line: &str) -> bool {
    !line.is_empty() && !line.starts_with(char::is_whitespace)
}

/// `perf version x.y.z`, for the report.
pub fn version(perf: &str) -> Option<String> {
    let out = Command::new(perf).arg("--version").output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_sample_headers_only() {
        let text = "throughput 1234 [000] 123.456:   1010101 cpu-clock:ppp: \n\
                    \t    55d0 descend+0x20 (/tmp/throughput)\n\
                    \t    55e0 main+0x40 (/tmp/throughput)\n\
                    \n\
                    python3 1235 [001] 123.457:   1010101 cpu-clock:ppp: \n\
                    \t    7f00 _PyEval_EvalFrameDefault+0x1 (/usr/bin/python3.11)\n\n";
        assert_eq!(text.lines().filter(|l| is_sample_header(l)).count(), 2);
    }
}
