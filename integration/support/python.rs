// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The CPython interpreters of the machine (pyenv's and Debian's), the
//! CPython fixture, and py-spy (PyPI, in a venv created once per target
//! directory) as the reference profiler.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::package_dir;

/// The py-spy release used as the reference.
const PY_SPY: &str = "py-spy==0.4.3";

/// A CPython to run the fixture under.
#[derive(Debug, Clone)]
pub struct Interpreter {
    /// `3.12.1 (pyenv)`, `3.11 (Debian)`, `3.14 (Debian sid, chroot)`.
    pub label: String,
    /// The interpreter, as a process in `root` sees it.
    pub python: PathBuf,
    /// The chroot it runs in, if any: its files are seen by icecore through
    /// `/proc/PID/root`, like a container's.
    pub root: Option<PathBuf>,
}

/// Debian sid's interpreters, in the chroot `scripts/cpython-chroots.sh`
/// makes (installed on first use; a minute).
const SID_VERSIONS: [u32; 3] = [13, 14, 15];

/// The sid chroot, created or completed if needed; None (or a failure under
/// `ICECORE_REQUIRE_ALL=1`) when it cannot be.
pub fn sid_root() -> Option<PathBuf> {
    let root = std::env::var_os("ICECORE_SID_ROOT")
        .map_or_else(|| PathBuf::from("/var/cache/icecore/sid"), PathBuf::from);
    let status = Command::new(package_dir().join("scripts/cpython-chroots.sh"))
        .arg(&root)
        .status();
    match status {
        Ok(status) if status.success() => Some(root),
        other => {
            super::prerequisite(
                "CPython tests",
                false,
                &format!(
                    "Debian sid CPython chroot in {} (scripts/cpython-chroots.sh: {other:?})",
                    root.display()
                ),
            );
            None
        }
    }
}

/// Every CPython 3.8–3.13 of pyenv (`$PYENV_ROOT` or `~/.pyenv`), then
/// Debian's `/usr/bin/python3.11`, then Debian sid's 3.13–3.15 in their
/// chroot, those that exist.
pub fn interpreters() -> Vec<Interpreter> {
    let mut found = Vec::new();
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")));
    if let Some(versions) = root.map(|r| r.join("versions"))
        && let Ok(dir) = std::fs::read_dir(&versions)
    {
        let mut by_minor = BTreeMap::new();
        for entry in dir.flatten() {
            let version = entry.file_name().to_string_lossy().to_string();
            let mut parts = version.split('.');
            let (Some("3"), Some(minor)) = (parts.next(), parts.next()) else {
                continue;
            };
            let Ok(minor) = minor.parse::<u32>() else {
                continue;
            };
            let python = entry.path().join(format!("bin/python3.{minor}"));
            if (8..=13).contains(&minor) && python.exists() {
                by_minor.insert(minor, (version, python));
            }
        }
        for (version, python) in by_minor.into_values() {
            found.push(Interpreter {
                label: format!("{version} (pyenv)"),
                python,
                root: None,
            });
        }
    }
    let debian = PathBuf::from("/usr/bin/python3.11");
    if debian.exists() {
        found.push(Interpreter {
            label: "3.11 (Debian)".into(),
            python: debian,
            root: None,
        });
    }
    if let Some(root) = sid_root() {
        for minor in SID_VERSIONS {
            found.push(Interpreter {
                label: format!("3.{minor} (sid chroot)"),
                python: PathBuf::from(format!("/usr/bin/python3.{minor}")),
                root: Some(root.clone()),
            });
        }
    }
    found
}

/// The fixture script.
pub fn fixture_script() -> PathBuf {
    package_dir().join("integration/fixtures/python_split.py")
}

/// Starts the fixture in `mode` for `seconds` under `interpreter` (in its
/// chroot, with the script copied into the chroot's `/tmp`).
pub fn spawn_fixture(interpreter: &Interpreter, mode: &str, seconds: u32) -> Child {
    let mut command = match &interpreter.root {
        Some(root) => {
            let inside = Path::new("/tmp/icecore_python_split.py");
            super::stage_file(
                &fixture_script(),
                &root.join(inside.strip_prefix("/").unwrap_or(inside)),
            );
            let mut command = Command::new("chroot");
            command.arg(root).arg(&interpreter.python).arg(inside);
            command
        }
        None => {
            let mut command = Command::new(&interpreter.python);
            command.arg(fixture_script());
            command
        }
    };
    command
        .args([mode, &seconds.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {} {mode}: {e}", interpreter.label))
}

/// py-spy from its venv, installing it first if needed.
pub fn py_spy() -> PathBuf {
    super::python_otlp::pypi_venv("py-spy-venv", &[PY_SPY]).join("bin/py-spy")
}

/// A py-spy recording of one process, as folded stacks.
pub struct PySpyRecord {
    child: Child,
    output: PathBuf,
}

impl PySpyRecord {
    /// Records `pid` at `rate` Hz for `seconds` into `dir`.
    pub fn start(pid: u32, rate: u32, seconds: u32, dir: &Path) -> PySpyRecord {
        let output = dir.join(format!("py-spy-{pid}.txt"));
        let errors = std::fs::File::create(dir.join(format!("py-spy-{pid}.err")))
            .expect("create py-spy's error file");
        let child = Command::new(py_spy())
            .args(["record", "--nonblocking", "-f", "raw", "-r"])
            .arg(rate.to_string())
            .arg("-d")
            .arg(seconds.to_string())
            .arg("-o")
            .arg(&output)
            .arg("--pid")
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(errors)
            .spawn()
            .expect("start py-spy");
        PySpyRecord { child, output }
    }

    /// Waits for the recording; (stack frames root first, count) per line.
    pub fn finish(mut self) -> Vec<(Vec<String>, u64)> {
        let status = self.child.wait().expect("wait for py-spy");
        let errors = std::fs::read_to_string(self.output.with_extension("err")).unwrap_or_default();
        assert!(status.success(), "py-spy failed: {status}: {errors}");
        let text = std::fs::read_to_string(&self.output).expect("read py-spy's output");
        text.lines()
            .filter_map(|line| {
                let (stack, count) = line.rsplit_once(' ')?;
                let frames = stack
                    .split(';')
                    .map(|f| f.split(" (").next().unwrap_or(f).trim().to_string())
                    .collect();
                Some((frames, count.parse().ok()?))
            })
            .collect()
    }
}
