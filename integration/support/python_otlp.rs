// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! An OTLP receiver made of the official Python bindings (PyPI
//! `opentelemetry-proto`, pinned to the release that carries the proto v1.10
//! field numbers, and `grpcio`): `fixtures/otlp_receiver.py`, run in a venv
//! that is created once per target directory.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The `opentelemetry-proto` release whose `Sample` has `values` = 4.
const OTEL_PROTO: &str = "opentelemetry-proto==1.45.2";

/// The venv's Python, creating the venv first if needed. Panics with pip's
/// output when PyPI cannot be reached.
pub fn venv_python() -> PathBuf {
    pypi_venv("otlp-python-venv", &[OTEL_PROTO, "grpcio"]).join("bin/python")
}

/// A venv in the target directory named `name` holding `packages` from
/// PyPI, created once (again when the package list changes). Returns its
/// directory. Panics with pip's output when PyPI cannot be reached.
pub fn pypi_venv(name: &str, packages: &[&str]) -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let ready = venv.join(".installed");
    let wanted = packages.join(" ");
    if std::fs::read_to_string(&ready).is_ok_and(|v| v == wanted) {
        return venv;
    }
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            out.status.success(),
            "{what} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let _ = std::fs::remove_dir_all(&venv);
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "python3 -m venv",
    );
    run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(packages),
        &format!("pip install {wanted} (PyPI)"),
    );
    std::fs::write(&ready, &wanted).expect("mark the venv ready");
    venv
}

/// The receiver process; killed on drop.
pub struct PythonReceiver {
    child: Child,
    pub port: u16,
    summary: PathBuf,
}

impl PythonReceiver {
    /// Starts the receiver, writing its summary into `dir`.
    pub fn start(dir: &Path) -> PythonReceiver {
        let python = venv_python();
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("integration/fixtures/otlp_receiver.py");
        let summary = dir.join("python-receiver.json");
        let mut child = Command::new(python)
            .arg(&script)
            .arg(&summary)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the Python OTLP receiver");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the receiver's port");
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the Python receiver printed {line:?}, not a port"));
        println!("Python OTLP receiver listening on 127.0.0.1:{port}");
        PythonReceiver {
            child,
            port,
            summary,
        }
    }

    /// What it decoded so far.
    pub fn summary(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(&self.summary).expect("read the receiver's summary");
        serde_json::from_str(&text).expect("the summary is JSON")
    }
}

impl Drop for PythonReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
