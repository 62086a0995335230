//! icecore under measurement: spawned system-wide with its defaults except
//! the sampling rate and what a benchmark adds, writing pprof files to a
//! scratch directory, and read through its `/metrics`.

use std::{
    collections::HashMap,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

use crate::proc::{self, Reaped};

/// A running icecore.
pub struct Icecore {
    child: Child,
    http: SocketAddr,
    pub pprof_dir: PathBuf,
    log: PathBuf,
}

/// A scrape of `/metrics`: the sample's name with its labels → value.
#[derive(Debug, Clone, Default)]
pub struct Metrics(HashMap<String, f64>);

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        Metrics(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| {
                    let (name, value) = l.rsplit_once(' ')?;
                    Some((name.to_owned(), value.parse().ok()?))
                })
                .collect(),
        )
    }

    pub fn get(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or(0.0)
    }

    pub fn bpf(&self, counter: &str) -> f64 {
        self.get(&format!(
            "icecore_bpf_events_total{{counter=\"{counter}\"}}"
        ))
    }
}

/// A free local port (another process could take it before icecore binds;
/// icecore then fails to start and the benchmark says so).
fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Icecore {
    pub fn spawn(binary: &Path, frequency_hz: u32, scratch: &Path) -> anyhow::Result<Icecore> {
        Self::spawn_named(
            binary,
            frequency_hz,
            &[],
            scratch,
            &format!("{frequency_hz}hz"),
        )
    }

    /// [`Self::spawn`] with `extra` flags; `name` tells its log and pprof
    /// directory from other runs' in `scratch`.
    pub fn spawn_named(
        binary: &Path,
        frequency_hz: u32,
        extra: &[&str],
        scratch: &Path,
        name: &str,
    ) -> anyhow::Result<Icecore> {
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let pprof_dir = scratch.join(format!("pprof-{name}"));
        std::fs::create_dir_all(&pprof_dir)?;
        let log = scratch.join(format!("icecore-{name}.log"));
        let child = Command::new(binary)
            .arg("--sampling-frequency")
            .arg(frequency_hz.to_string())
            .arg("--pprof-dir")
            .arg(&pprof_dir)
            .arg("--http-address")
            .arg(http.to_string())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let mut icecore = Icecore {
            child,
            http,
            pprof_dir,
            log,
        };
        icecore.wait_until_sampling(Duration::from_secs(60))?;
        Ok(icecore)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Until `/metrics` answers and the BPF program has run.
    fn wait_until_sampling(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!("icecore exited ({status}) at start: {}", self.log_tail());
            }
            if self.metrics().is_ok_and(|m| m.bpf("samples") > 0.0) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!(
            "icecore did not start sampling in {timeout:?}: {}",
            self.log_tail()
        )
    }

    pub fn metrics(&self) -> anyhow::Result<Metrics> {
        let mut stream = TcpStream::connect_timeout(&self.http, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            stream,
            "GET /metrics HTTP/1.0\r\nHost: {}\r\n\r\n",
            self.http
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b)
            .context("no HTTP body")?;
        Ok(Metrics::parse(body))
    }

    /// Stops it with SIGTERM (it flushes its last batch) and reaps it.
    pub fn stop(mut self) -> anyhow::Result<(Reaped, Summary)> {
        proc::signal(&self.child, libc::SIGTERM)?;
        let reaped = proc::reap(&mut self.child)?;
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        if !reaped.success {
            bail!("icecore failed: {}", self.log_tail());
        }
        let summary = Summary::from_log(&log)
            .with_context(|| format!("no 'icecore stopped' line in {}", self.log.display()))?;
        Ok((reaped, summary))
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }
}

impl Drop for Icecore {
    fn drop(&mut self) {
        // Only when `stop` was not reached (an error): never leave it running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// icecore's last log line: what it received against what BPF emitted over
/// its whole life.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub samples_reported: u64,
    pub emitted_by_bpf: u64,
}

impl Summary {
    fn from_log(log: &str) -> Option<Summary> {
        let line = log.lines().rev().find(|l| l.contains("icecore stopped"))?;
        let field = |name: &str| -> Option<u64> {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))?
                .parse()
                .ok()
        };
        Some(Summary {
            samples_reported: field("samples")?,
            emitted_by_bpf: field("emitted_by_bpf")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_metrics_with_labels() {
        let m = Metrics::parse(
            "# HELP x y\nicecore_bpf_events_total{counter=\"samples\"} 12\nicecore_bpf_map_bytes 4838024\n",
        );
        assert_eq!(m.bpf("samples"), 12.0);
        assert_eq!(m.get("icecore_bpf_map_bytes"), 4838024.0);
        assert_eq!(m.get("missing"), 0.0);
    }

    #[test]
    fn reads_the_stop_line() {
        let log = "2026-11-22T15:10:32.674315Z  INFO icecore: icecore stopped samples=1140 batches=4 \
                   emitted_by_bpf=1141 bpf_ns_per_sample=3942 exported=4\n";
        assert_eq!(
            Summary::from_log(log),
            Some(Summary {
                samples_reported: 1140,
                emitted_by_bpf: 1141
            })
        );
        assert_eq!(Summary::from_log("INFO icecore starting\n"), None);
    }
}
