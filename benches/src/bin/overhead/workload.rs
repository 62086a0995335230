//! The busy fixtures whose throughput the profilers may cost: a native
//! program without frame pointers and a Python script, one per CPU. Each
//! prints "<CLOCK_MONOTONIC ns> <units done>" every 200 ms, so its rate can
//! be measured over any window while it runs for the whole benchmark.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread::JoinHandle,
};

use anyhow::Context;

/// One running fixture and the progress it reported.
pub struct Workload {
    pub name: &'static str,
    child: Child,
    progress: Arc<Mutex<Vec<(u64, u64)>>>,
    reader: Option<JoinHandle<()>>,
}

impl Workload {
    fn spawn(name: &'static str, command: &mut Command) -> anyhow::Result<Workload> {
        let mut child = command
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start the {name} fixture ({command:?})"))?;
        let stdout = child.stdout.take().context("piped stdout")?;
        let progress = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let progress = progress.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Some(point) = parse_progress(&line)
                        && let Ok(mut p) = progress.lock()
                    {
                        p.push(point);
                    }
                }
            })
        };
        Ok(Workload {
            name,
            child,
            progress,
            reader: Some(reader),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Units per second between two CLOCK_MONOTONIC instants, from the
    /// reports closest inside the window; None if fewer than two fall in it.
    pub fn rate(&self, from: u64, to: u64) -> Option<f64> {
        let progress = self.progress.lock().ok()?;
        let inside: Vec<_> = progress
            .iter()
            .filter(|&&(t, _)| t >= from && t <= to)
            .collect();
        let (&(t0, u0), &(t1, u1)) = (inside.first()?, inside.last()?);
        (t1 > t0).then(|| (u1 - u0) as f64 * 1e9 / (t1 - t0) as f64)
    }

    /// Whether it still runs (a fixture that died invalidates the numbers).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

fn parse_progress(line: &str) -> Option<(u64, u64)> {
    let mut parts = line.split_whitespace();
    let t = parts.next()?.parse().ok()?;
    let units = parts.next()?.parse().ok()?;
    Some((t, units))
}

fn fixture_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// Compiles the native fixture without frame pointers.
pub fn build_native(dir: &Path, compiler: &str) -> anyhow::Result<PathBuf> {
    icecore_benches::compile_native_fixture(compiler, "throughput.c", dir)
        .map_err(|e| anyhow::anyhow!("{e} (set --cc)"))
}

/// Starts both fixtures.
pub fn start(native: &Path, python: &str) -> anyhow::Result<Vec<Workload>> {
    let native = Workload::spawn("native", &mut Command::new(native))?;
    let python = Workload::spawn(
        "Python",
        Command::new(python).arg(fixture_source("throughput.py")),
    )?;
    Ok(vec![native, python])
}

/// Python's version string, for the report.
pub fn python_version(python: &str) -> Option<String> {
    let out = Command::new(python).arg("--version").output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_progress_lines() {
        assert_eq!(parse_progress("123 456"), Some((123, 456)));
        assert_eq!(parse_progress("123"), None);
        assert_eq!(parse_progress("x 1"), None);
    }

    #[test]
    fn native_fixture_reports_progress() {
        let dir = tempfile::tempdir().expect("temp dir");
        let exe = build_native(dir.path(), "cc").expect("cc builds the fixture");
        let mut fixture = Workload::spawn("native", &mut Command::new(&exe)).expect("spawn");
        let start = icecore_benches::proc::monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(900));
        assert!(fixture.is_running());
        let rate = fixture.rate(start, icecore_benches::proc::monotonic_ns());
        assert!(rate.is_some_and(|r| r > 0.0), "{rate:?}");
    }
}
