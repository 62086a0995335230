// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! Builds `integration/fixtures/busy.c` with clang and runs it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Functions defined in busy.c (the ones that can show up as frames).
pub const FIXTURE_FUNCTIONS: &[&str] = &[
    "main",
    "run_cycle",
    "hot_alpha",
    "alpha_inner",
    "warm_beta",
    "beta_inner",
    "spin_cpu",
    "thread_cpu_ns",
    "wall_ns",
    "run_threads",
    "worker_a_main",
    "worker_a_spin",
    "worker_b_main",
    "worker_b_spin",
    "syscall_loop",
    "read_zero_syscall",
];

/// Name of the built executable (also the main thread's comm).
pub const EXE_NAME: &str = "busy";

/// The longest a fixture lives even if the test process dies without killing it.
pub const MAX_LIFETIME_SECS: &str = "300";

/// Compiles busy.c into `dir` and returns the executable.
pub fn build(dir: &Path) -> PathBuf {
    build_c("busy.c", EXE_NAME, dir, &["-pthread"])
}

/// Compiles `integration/fixtures/SOURCE` into `dir/EXE` (clang, frame
/// pointers everywhere, leaf included: gcc 12 would drop the leaf frame's
/// frame pointer) with `extra` flags.
pub fn build_c(source: &str, exe: &str, dir: &Path, extra: &[&str]) -> PathBuf {
    let src = super::package_dir()
        .join("integration/fixtures")
        .join(source);
    let exe = dir.join(exe);
    let out = Command::new("clang")
        .args([
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-mno-omit-leaf-frame-pointer",
        ])
        .args(extra)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run clang (needed to build the fixture): {e}"));
    assert!(
        out.status.success(),
        "clang failed to build {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe.canonicalize().expect("canonicalize fixture path")
}

/// Which built-in workload the fixture runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// main -> run_cycle -> hot_alpha (75 % of CPU) / warm_beta (25 %).
    Cycle,
    /// Threads "worker-a" (worker_a_main -> worker_a_spin) and "worker-b".
    Threads,
    /// main -> syscall_loop -> read_zero_syscall -> read(/dev/zero) in the kernel.
    Syscalls,
}

/// A running fixture; killed (SIGKILL) and reaped on drop.
pub struct Fixture {
    child: Child,
    /// The fixture's stdout after its "ready" line, kept open for the fixture's
    /// whole life (a closed pipe would kill it with SIGPIPE on its next write).
    stdout: BufReader<ChildStdout>,
    /// The busy.c workload, when the fixture is busy.c.
    pub mode: Option<Mode>,
}

impl Fixture {
    /// Starts `exe` in `mode` and waits until it reports "ready".
    pub fn spawn(exe: &Path, mode: Mode) -> Fixture {
        let mode_args: &[&str] = match mode {
            Mode::Cycle => &[],
            Mode::Threads => &["threads"],
            Mode::Syscalls => &["syscalls"],
        };
        let mut args: Vec<String> = mode_args.iter().map(|a| a.to_string()).collect();
        args.push(MAX_LIFETIME_SECS.to_string());
        let mut fixture = Fixture::spawn_args(exe, &args);
        fixture.mode = Some(mode);
        fixture
    }

    /// Starts `exe ARGS` (any fixture that prints "ready" on stdout once it
    /// runs its workload) and waits for that line.
    pub fn spawn_args<S: AsRef<str>>(exe: &Path, args: &[S]) -> Fixture {
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        let mut child = Command::new(exe)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start fixture {}: {e}", exe.display()));
        let stdout = child.stdout.take().expect("fixture stdout is piped");
        let mut fixture = Fixture {
            child,
            stdout: BufReader::new(stdout),
            mode: None,
        };
        let line = fixture.read_line();
        assert_eq!(
            line,
            "ready",
            "fixture {} did not start properly",
            exe.display()
        );
        println!(
            "fixture {} {args:?} running as pid {}",
            exe.display(),
            fixture.pid()
        );
        fixture
    }

    /// The fixture's next line on stdout, trimmed (blocks; "" once it exited).
    pub fn read_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("read fixture stdout");
        line.trim().to_string()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while the fixture has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU time (user + system, all threads) of a process, in seconds, from /proc/PID/stat.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesized comm: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((utime + stime) / ticks)
}

/// Records a process's CPU time every 50 ms, so that the CPU time it used in any
/// window (e.g. between its first and last sample) can be interpolated. A CPU-bound
/// fixture gets HZ samples per CPU-second no matter how loaded the machine is,
/// which makes sample-count expectations independent of other load.
pub struct CpuTracker {
    points: Arc<Mutex<Vec<(u64, f64)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl CpuTracker {
    pub fn start(pid: u32) -> CpuTracker {
        let points = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (points.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(cpu) = process_cpu_seconds(pid) {
                    p.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((super::now_unix_nanos(), cpu));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        CpuTracker {
            points,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops recording.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    fn at(points: &[(u64, f64)], t: u64) -> f64 {
        match points.iter().position(|&(pt, _)| pt >= t) {
            None => points.last().map_or(0.0, |p| p.1),
            Some(0) => points[0].1,
            Some(i) => {
                let ((t0, c0), (t1, c1)) = (points[i - 1], points[i]);
                c0 + (c1 - c0) * (t - t0) as f64 / (t1 - t0).max(1) as f64
            }
        }
    }

    /// CPU seconds the process used between two Unix-epoch-nanosecond instants.
    pub fn cpu_seconds_between(&self, from: u64, to: u64) -> f64 {
        let points = self.points.lock().unwrap_or_else(|e| e.into_inner());
        Self::at(&points, to) - Self::at(&points, from)
    }
}

impl Drop for CpuTracker {
    fn drop(&mut self) {
        self.stop();
    }
}
