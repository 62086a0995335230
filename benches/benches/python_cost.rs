//! BPF time per CPython frame, from the kernel's own BPF statistics
//! (harness: `icecore_benches::runtime_cost`).
//!
//! Needs root. Runs `fixtures/python_recurse.py` (a plain recursive Python
//! function, burning CPU at the bottom) under a pyenv CPython 3.12 at several
//! Python depths: from 3.11 on, Python calls Python without a new C frame, so
//! the native part stays the same at every depth and the fit's slope is the
//! cost of a Python frame. A CPython 3.10, when pyenv has one, runs in the
//! same rounds for comparison: there every Python frame also costs native
//! frames.
//!
//! `cargo bench -p icecore-benches --bench python_cost`
//!
//! Environment: `PYTHON_COST_PYTHON` (interpreter instead of pyenv's 3.12),
//! `PYTHON_COST_DEPTHS` (e.g. `5,150`), `PYTHON_COST_HZ`, `PYTHON_COST_ROUNDS`.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use icecore_benches::runtime_cost::{CostBench, Subject};
use icecore_receiver::{Counter, runtimes::python::detect};

fn pyenv_python(minor: u8) -> Option<PathBuf> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")))?;
    let prefix = format!("3.{minor}.");
    let mut versions: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path().join(format!("bin/python3.{minor}")))
        .filter(|p| p.exists())
        .collect();
    versions.sort();
    versions.pop()
}

/// `3.12` from the interpreter's file name, or the whole name.
fn label(python: &Path) -> String {
    let name = python.to_string_lossy();
    match detect::version_from_name(&name) {
        Some((major, minor)) if minor > 0 => format!("{major}.{minor}"),
        _ => name.rsplit('/').next().unwrap_or(&name).to_owned(),
    }
}

fn subject(python: PathBuf) -> Subject {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/python_recurse.py");
    Subject {
        label: label(&python),
        command: Box::new(move |depth, seconds| {
            let mut command = Command::new(&python);
            command
                .arg(&script)
                .args([depth.to_string(), seconds.to_string()]);
            command
        }),
    }
}

fn main() {
    if !icecore_benches::root_bench_selected("python_cost") {
        return;
    }
    let Some(main_python) = std::env::var_os("PYTHON_COST_PYTHON")
        .map(PathBuf::from)
        .or_else(|| pyenv_python(12))
    else {
        println!("python_cost: skipped, no pyenv CPython 3.12 (set PYTHON_COST_PYTHON)");
        return;
    };
    let mut subjects = vec![subject(main_python)];
    if let Some(old) = pyenv_python(10).filter(|p| label(p) != subjects[0].label) {
        subjects.push(subject(old));
    }
    let bench = CostBench {
        env_prefix: "PYTHON_COST",
        frame_name: "Python",
        frames: &[Counter::PythonFrames],
        cut: &[Counter::UserStackTruncated, Counter::PythonStackTruncated],
        depths: &[5, 50, 150],
        rounds: 2,
        frequency_hz: 997,
        warm_up: Duration::from_secs(2),
        measured: Duration::from_secs(4),
    };
    bench.run(&subjects);
}
