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
    vec![
        s("--pid"),
        s(pid),
        s("--sampling-frequency"),
        s(HZ),
        s("--reporter-interval"),
        s("2s"),
        s("--http-address"),
        s("127.0.0.1:0"),
    ]
}

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
        let target = Target::start(mode);
        let cpu = CpuTracker::start(target.pid());
        let receiver = OtlpReceiver::start();
        let pprof_dir = target.make_subdir("pprof");
        let mut args = base_args(target.pid());
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

    /// Every OTLP request received, validated, with its samples.
    pub fn otlp(&self) -> otlp::Received {
        otlp::receive_valid(self.receiver.requests(), HZ)
    }

    /// Every pprof file written, validated, with its samples.
    pub fn pprof(&self) -> pprof::Written {
        pprof::read_valid(&self.pprof_dir, HZ)
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
