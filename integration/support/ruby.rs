// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The CRuby interpreters of the machine (Debian's 3.1, with and without
//! YJIT, and sid's 3.3 and experimental's 3.4 in the sid chroot), the CRuby
//! fixture, and rbspy as the reference profiler.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::package_dir;

/// A CRuby to run the fixture under.
#[derive(Debug, Clone)]
pub struct Ruby {
    /// `3.1 (Debian)`, `3.1 YJIT (Debian)`, `3.4 (Debian experimental, chroot)`.
    pub label: String,
    /// The interpreter, as a process in `root` sees it.
    pub ruby: PathBuf,
    /// Its version, as `ruby_version` says it (rbspy is told it).
    pub version: &'static str,
    /// Extra interpreter flags (`--yjit`).
    pub flags: Vec<&'static str>,
    /// The chroot it runs in, if any: its files are seen by icecore through
    /// `/proc/PID/root`, like a container's.
    pub root: Option<PathBuf>,
}

impl Ruby {
    /// Whether it runs with YJIT.
    pub fn yjit(&self) -> bool {
        self.flags.contains(&"--yjit")
    }
}

/// Debian's `/usr/bin/ruby3.1` (with and without YJIT), then sid's 3.3 and
/// experimental's 3.4 in the sid chroot, those that exist; a missing one is
/// a skip, or a failure under `ICECORE_REQUIRE_ALL=1`.
pub fn interpreters() -> Vec<Ruby> {
    let mut found = Vec::new();
    let debian = PathBuf::from("/usr/bin/ruby3.1");
    if super::prerequisite(
        "CRuby tests",
        debian.exists(),
        "Debian's ruby3.1 (apt-get install ruby3.1)",
    ) {
        for (label, flags) in [
            ("3.1 (Debian)", vec![]),
            ("3.1 YJIT (Debian)", vec!["--yjit"]),
        ] {
            found.push(Ruby {
                label: label.into(),
                ruby: debian.clone(),
                version: "3.1.2",
                flags,
                root: None,
            });
        }
    }
    if let Some(root) = super::python::sid_root() {
        for (minor, version, suite) in [(3, "3.3.8", "sid"), (4, "3.4.11", "experimental")] {
            let ruby = PathBuf::from(format!("/usr/bin/ruby3.{minor}"));
            if super::prerequisite(
                "CRuby tests",
                root.join(ruby.strip_prefix("/").unwrap_or(&ruby)).exists(),
                &format!("Debian ruby3.{minor} in {}", root.display()),
            ) {
                found.push(Ruby {
                    label: format!("3.{minor} (Debian {suite}, chroot)"),
                    ruby,
                    version,
                    flags: Vec::new(),
                    root: Some(root.clone()),
                });
            }
        }
    }
    found
}

/// The fixture script.
pub fn fixture_script() -> PathBuf {
    package_dir().join("integration/fixtures/ruby_split.rb")
}

/// The command that runs the fixture in `mode` for `seconds` under `ruby`
/// (in its chroot, with the script copied into the chroot's `/tmp`).
pub fn fixture_command(ruby: &Ruby, mode: &str, seconds: u32) -> Command {
    let mut command = match &ruby.root {
        Some(root) => {
            let inside = Path::new("/tmp/icecore_ruby_split.rb");
            super::stage_file(
                &fixture_script(),
                &root.join(inside.strip_prefix("/").unwrap_or(inside)),
            );
            let mut command = Command::new("chroot");
            command
                .arg(root)
                .arg(&ruby.ruby)
                .args(&ruby.flags)
                .arg(inside);
            command
        }
        None => {
            let mut command = Command::new(&ruby.ruby);
            command.args(&ruby.flags).arg(fixture_script());
            command
        }
    };
    command
        .args([mode, &seconds.to_string()])
        .stdout(Stdio::null());
    command
}

/// Starts the fixture (see [`fixture_command`]).
pub fn spawn_fixture(ruby: &Ruby, mode: &str, seconds: u32) -> Child {
    fixture_command(ruby, mode, seconds)
        .spawn()
        .unwrap_or_else(|e| panic!("start {} {mode}: {e}", ruby.label))
}

/// rbspy, built once into its cache by `scripts/rbspy.sh`.
pub fn rbspy() -> PathBuf {
    let status = Command::new(package_dir().join("scripts/rbspy.sh"))
        .status()
        .expect("run scripts/rbspy.sh");
    assert!(status.success(), "scripts/rbspy.sh failed: {status}");
    std::env::var_os("ICECORE_RBSPY_ROOT")
        .map_or_else(|| PathBuf::from("/var/cache/icecore/rbspy"), PathBuf::from)
        .join("bin/rbspy")
}

/// Collapsed stacks: (method names root first, count) per stack.
pub type Stacks = Vec<(Vec<String>, u64)>;

/// An rbspy recording of one process, as collapsed stacks.
pub struct RbspyRecord {
    child: Child,
    output: PathBuf,
}

impl RbspyRecord {
    /// Records `pid` (running `ruby`) at `rate` Hz for `seconds` into `dir`.
    /// Debian's stripped libruby has no symbol rbspy reads the version
    /// from: it is told the version.
    pub fn start(ruby: &Ruby, pid: u32, rate: u32, seconds: u32, dir: &Path) -> RbspyRecord {
        let output = dir.join(format!("rbspy-{pid}.txt"));
        let errors = std::fs::File::create(dir.join(format!("rbspy-{pid}.err")))
            .expect("create rbspy's error file");
        let child = Command::new(rbspy())
            .args([
                "record",
                "--nonblocking",
                "--silent",
                "--format",
                "collapsed",
            ])
            .args(["--force-version", ruby.version])
            .arg("--rate")
            .arg(rate.to_string())
            .arg("--duration")
            .arg(seconds.to_string())
            .arg("--file")
            .arg(&output)
            .arg("--pid")
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(errors)
            .spawn()
            .expect("start rbspy");
        RbspyRecord { child, output }
    }

    /// Waits for the recording; (method names root first, count) per line.
    /// rbspy names a frame `label - path:line`.
    pub fn finish(mut self) -> Stacks {
        let status = self.child.wait().expect("wait for rbspy");
        let errors = std::fs::read_to_string(self.output.with_extension("err")).unwrap_or_default();
        assert!(status.success(), "rbspy failed: {status}: {errors}");
        let text = std::fs::read_to_string(&self.output).expect("read rbspy's output");
        text.lines()
            .filter_map(|line| {
                let (stack, count) = line.rsplit_once(' ')?;
                let frames = stack
                    .split(';')
                    .map(|f| f.split(" - ").next().unwrap_or(f).trim().to_string())
                    .collect();
                Some((frames, count.parse().ok()?))
            })
            .collect()
    }
}
