// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The setup every profiling test repeats: build and start the fixture in a
//! fresh temp dir, start the sinks (OTLP receiver, pprof dir), point `icecore`
//! at the fixture's pid, wait for its exit and read back what it exported.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use super::fixture::{self, CpuTracker, Fixture, Mode};
use super::receiver::OtlpReceiver;
use super::{HZ, Icecore, otlp, pprof};

/// Slack on top of `--duration` for BPF loading, symbolization and the final flush.
pub const EXIT_GRACE: Duration = Duration::from_secs(40);

/// Shorthand for building argument lists.
pub fn s(x: impl ToString) -> String {
    x.to_string()
}

/// Common flags: the fixture's pid, 97 Hz, 2 s intervals, no HTTP port clash.
pub fn base_args(pid: u32) -> Vec<String> {
    base_args_at(pid, HZ)
}

/// `base_args` at `hz` samples per second.
pub fn base_args_at(pid: u32, hz: u32) -> Vec<String> {
    let mut args = vec![s("--pid"), s(pid)];
    args.extend(system_wide_args(hz));
    args
}

/// The common flags without a pid filter: every process, `hz`, 2 s intervals,
/// no HTTP port clash.
pub fn system_wide_args(hz: u32) -> Vec<String> {
    vec![
        s("--sampling-frequency"),
        s(hz),
        s("--reporter-interval"),
        s(format!("{}s", REPORTER_INTERVAL.as_secs())),
        s("--http-address"),
        s("127.0.0.1:0"),
    ]
}

/// The `--reporter-interval` of the common flags.
pub const REPORTER_INTERVAL: Duration = Duration::from_secs(2);

/// `--duration` in whole seconds, as the tests pass it (`8s`).
pub fn duration_args(duration: Duration) -> [String; 2] {
    [s("--duration"), format!("{}s", duration.as_secs())]
}

pub fn make_dir(path: &Path) {
    std::fs::create_dir_all(path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
}

/// The fixture, built into a fresh temp dir and running in one mode. Fields drop
/// in order: the fixture is killed before its directory is removed.
pub struct Target {
    pub fixture: Fixture,
    /// The built fixture executable.
    pub exe: PathBuf,
    pub tmp: TempDir,
}

impl Target {
    /// Builds the fixture into a new temp dir and starts it in `mode`.
    pub fn start(mode: Mode) -> Target {
        let tmp = tempfile::tempdir().expect("tempdir");
        let exe = fixture::build(tmp.path());
        let fixture = Fixture::spawn(&exe, mode);
        Target { fixture, exe, tmp }
    }

    /// Starts `exe ARGS`, a fixture built into `tmp` (see `Fixture::spawn_args`).
    pub fn start_exe<S: AsRef<str>>(tmp: TempDir, exe: &Path, args: &[S]) -> Target {
        let fixture = Fixture::spawn_args(exe, args);
        Target {
            fixture,
            exe: exe.to_path_buf(),
            tmp,
        }
    }

    pub fn pid(&self) -> u32 {
        self.fixture.pid()
    }

    /// The temp dir (icecore's logs go here too).
    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    /// Creates `name` in the temp dir and returns its path.
    pub fn make_subdir(&self, name: &str) -> PathBuf {
        let path = self.dir().join(name);
        make_dir(&path);
        path
    }

    pub fn assert_alive(&mut self) {
        assert!(
            self.fixture.is_running(),
            "the fixture died during the test"
        );
    }
}

/// `icecore` profiling a fixture by pid into both sinks: an in-test OTLP
/// receiver and a pprof dir. Fields drop in order: icecore, receiver, CPU
/// tracker, then the fixture and its temp dir.
pub struct ProfiledRun {
    pub icecore: Icecore,
    /// `--sampling-frequency` of the run.
    pub hz: u32,
    pub receiver: OtlpReceiver,
    /// The fixture's CPU time, recorded from before icecore started.
    pub cpu: CpuTracker,
    pub pprof_dir: PathBuf,
    pub target: Target,
}

impl ProfiledRun {
    /// Starts the fixture in `mode`, the OTLP receiver and a pprof dir, then
    /// `icecore` with the base flags, both sinks and `extra_args`.
    pub fn spawn(mode: Mode, extra_args: &[String]) -> ProfiledRun {
        ProfiledRun::spawn_on(Target::start(mode), HZ, extra_args)
    }

    /// Starts the OTLP receiver and a pprof dir, then `icecore` on the running
    /// `target` with the base flags at `hz`, both sinks and `extra_args`.
    pub fn spawn_on(target: Target, hz: u32, extra_args: &[String]) -> ProfiledRun {
        let cpu = CpuTracker::start(target.pid());
        let receiver = OtlpReceiver::start();
        let pprof_dir = target.make_subdir("pprof");
        let mut args = base_args_at(target.pid(), hz);
        args.extend([
            s("--otlp-endpoint"),
            receiver.endpoint(),
            s("--pprof-dir"),
            s(pprof_dir.display()),
        ]);
        args.extend(extra_args.iter().cloned());
        let icecore = Icecore::spawn(&args, target.dir());
        ProfiledRun {
            icecore,
            hz,
            receiver,
            cpu,
            pprof_dir,
            target,
        }
    }

    pub fn pid(&self) -> u32 {
        self.target.pid()
    }

    /// Waits for icecore to stop on its own after `duration`, prints its logs
    /// and asserts a clean exit with the fixture still running.
    pub fn finish(&mut self, duration: Duration) {
        self.icecore.wait_success(duration + EXIT_GRACE);
        self.target.assert_alive();
    }

    /// Stops icecore with SIGTERM (it flushes the current interval), prints its
    /// logs and asserts a clean exit with the fixture still running.
    pub fn stop(&mut self) {
        self.icecore.stop();
        self.target.assert_alive();
    }

    /// Every OTLP request received, validated, with its samples.
    pub fn otlp(&self) -> otlp::Received {
        otlp::receive_valid(self.receiver.requests(), self.hz)
    }

    /// Every pprof file written, validated, with its samples.
    pub fn pprof(&self) -> pprof::Written {
        pprof::read_valid(&self.pprof_dir, self.hz)
    }
}

/// `icecore` profiling every process into both sinks, for fixtures started
/// while it runs. Fields drop in order: icecore, receiver, then the temp dir.
pub struct SystemWideRun {
    pub icecore: Icecore,
    pub hz: u32,
    pub receiver: OtlpReceiver,
    pub pprof_dir: PathBuf,
    /// icecore's logs and sinks, and whatever the test builds.
    pub tmp: TempDir,
}

impl SystemWideRun {
    /// Once the fixtures ended: lets icecore report their last samples (two
    /// reporter intervals, then its next batch), stops it, and returns its
    /// metrics of that batch.
    pub fn finish_after_fixtures(&mut self) -> super::metrics::Metrics {
        std::thread::sleep(2 * REPORTER_INTERVAL + Duration::from_millis(500));
        let metrics = self
            .icecore
            .metrics_after_next_batch(Duration::from_secs(30));
        self.icecore.stop();
        metrics
    }

    /// Starts the OTLP receiver and a pprof dir in `tmp`, then `icecore` without
    /// a pid filter at `hz` with both sinks and `extra_args`.
    pub fn spawn(tmp: TempDir, hz: u32, extra_args: &[String]) -> SystemWideRun {
        Self::spawn_wrapped(tmp, hz, &[], extra_args)
    }

    /// [`Self::spawn`] with icecore started through `wrapper` (`env K=V`).
    pub fn spawn_wrapped(
        tmp: TempDir,
        hz: u32,
        wrapper: &[&str],
        extra_args: &[String],
    ) -> SystemWideRun {
        let receiver = OtlpReceiver::start();
        let pprof_dir = tmp.path().join("pprof");
        make_dir(&pprof_dir);
        let mut args = system_wide_args(hz);
        args.extend([
            s("--otlp-endpoint"),
            receiver.endpoint(),
            s("--pprof-dir"),
            s(pprof_dir.display()),
        ]);
        args.extend(extra_args.iter().cloned());
        let mut icecore = Icecore::spawn_wrapped(wrapper, &args, tmp.path());
        // Tests start their fixtures "after the agent": once it samples, not
        // once its process exists (loading and verifying the BPF programs
        // takes seconds on a loaded 2-CPU host).
        icecore.wait_for_log("sampling started", Duration::from_secs(60));
        SystemWideRun {
            icecore,
            hz,
            receiver,
            pprof_dir,
            tmp,
        }
    }

    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    /// Every OTLP request received, with the samples of every process; the
    /// part of the requests about `pid` (its resources) must be valid OTLP.
    ///
    /// Violations in other processes' resources are printed, not asserted:
    /// a system-wide profile holds processes that exited or have no executable
    /// (kernel threads), which the tests of one fixture have no say about.
    pub fn otlp_of(&self, pid: u32) -> otlp::Received {
        let requests = self.receiver.requests();
        assert!(!requests.is_empty(), "no OTLP request arrived");
        let report = otlp::validate::validate(&requests, self.hz);
        if !report.violations.is_empty() {
            println!(
                "OTLP: {} structural violation(s) in the system-wide output, first: {:?}",
                report.violations.len(),
                &report.violations[..report.violations.len().min(5)]
            );
            let odd: Vec<(Option<i64>, String)> = otlp::decode::resources(&requests)
                .into_iter()
                .filter(|r| {
                    r.attributes
                        .get("process.executable.path")
                        .and_then(|v| v.as_str())
                        .is_none_or(str::is_empty)
                })
                .map(|r| {
                    let name = r
                        .attributes
                        .get("process.executable.name")
                        .and_then(|v| v.as_str())
                        .unwrap_or("")
                        .to_string();
                    (r.pid, name)
                })
                .collect();
            println!("OTLP: resources without process.executable.path (pid, name): {odd:?}");
        }
        let of_pid: Vec<_> = requests
            .iter()
            .filter_map(|r| {
                let mut r = r.clone();
                let dict = r.request.dictionary.clone().unwrap_or_default();
                r.request.resource_profiles.retain(|rp| {
                    let attrs = rp
                        .resource
                        .as_ref()
                        .map(|res| otlp::key_values(&dict, &res.attributes))
                        .unwrap_or_default();
                    attrs.get("process.pid").and_then(otlp::AttrValue::as_int)
                        == Some(i64::from(pid))
                });
                (!r.request.resource_profiles.is_empty()).then_some(r)
            })
            .collect();
        assert!(!of_pid.is_empty(), "no OTLP resource of pid {pid} arrived");
        let report = otlp::validate::validate(&of_pid, self.hz);
        let n = report.violations.len();
        assert!(
            n == 0,
            "{n} OTLP structural violation(s) in the resources of pid {pid}:\n  {}",
            report.violations[..n.min(50)].join("\n  ")
        );
        let samples = otlp::decode::samples(&requests);
        otlp::Received { requests, samples }
    }
}

/// Profiles the fixture in `mode` with `icecore … --duration DURATION` into both
/// sinks and waits for a clean exit; the caller reads the outputs.
pub fn run_icecore_on(mode: Mode, extra_args: &[String], duration: Duration) -> ProfiledRun {
    let mut args = extra_args.to_vec();
    args.extend(duration_args(duration));
    let mut run = ProfiledRun::spawn(mode, &args);
    run.finish(duration);
    run
}
