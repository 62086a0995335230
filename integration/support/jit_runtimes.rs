// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The JIT runtimes of the perf-map tests: Node.js (the machine's, 20 or
//! newer) and .NET Core 3.1 (PyPI `dotnetcore2`, installed on first use in a
//! fixed cache directory), with C# compiled by Mono's `mcs` (Debian's
//! `mono-mcs`, installed on first use), and `node --cpu-prof` as Node's
//! reference profiler.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::package_dir;

/// Where .NET Core 3.1 is installed once and kept between runs.
pub const DOTNET_CACHE: &str = "/var/cache/icecore/dotnetcore2";
/// The runtime's PyPI release.
const DOTNET_PACKAGE: &str = "dotnetcore2==3.1.23";
/// The V8 flags of the Node workloads: a perf map; interpreted functions
/// with code of their own (else they all run in one trampoline); no
/// inlining, so that each function keeps its frame.
pub const NODE_FLAGS: [&str; 3] = [
    "--perf-basic-prof",
    "--interpreted-frames-native-stack",
    "--no-turbo-inlining",
];

/// `/usr/bin/node` when it is Node.js 20 or newer.
pub fn node() -> Option<PathBuf> {
    let node = PathBuf::from("/usr/bin/node");
    let out = Command::new(&node).arg("--version").output().ok()?;
    let version = String::from_utf8_lossy(&out.stdout);
    let major: u32 = version
        .trim()
        .trim_start_matches('v')
        .split('.')
        .next()?
        .parse()
        .ok()?;
    (major >= 20).then_some(node)
}

/// The Node workload in `mode` (`split` or `grow`) for `seconds`.
pub fn node_command(node: &Path, mode: &str, seconds: u32) -> Command {
    let mut command = Command::new(node);
    command
        // V8 writes an isolate log in its working directory under these
        // flags: keep them under target/.
        .current_dir(fixture_dir())
        .args(NODE_FLAGS)
        .arg(package_dir().join("integration/fixtures/jit_split.js"))
        .args([mode, &seconds.to_string()])
        .stdout(Stdio::null());
    command
}

/// Each of `functions`' inclusive share (percent of the samples in any of
/// them) by Node's own profiler, `node --cpu-prof`, over `seconds` of the
/// split workload.
pub fn node_reference_split(
    node: &Path,
    seconds: u32,
    functions: &[&str],
) -> Result<BTreeMap<String, f64>, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let status = Command::new(node)
        .current_dir(dir.path())
        .args(NODE_FLAGS)
        .arg("--cpu-prof")
        .arg("--cpu-prof-dir")
        .arg(dir.path())
        .arg(package_dir().join("integration/fixtures/jit_split.js"))
        .args(["split", &seconds.to_string()])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("node --cpu-prof failed: {status}"));
    }
    let profile = std::fs::read_dir(dir.path())
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "cpuprofile"))
        .ok_or("node --cpu-prof wrote no .cpuprofile")?;
    let text = std::fs::read_to_string(&profile).map_err(|e| e.to_string())?;
    cpuprofile_shares(&text, functions)
}

/// Inclusive shares of `functions` in a `.cpuprofile` (Chrome DevTools'
/// format: nodes with `callFrame.functionName` and `children`, and the
/// sampled leaf node of each sample).
pub fn cpuprofile_shares(text: &str, functions: &[&str]) -> Result<BTreeMap<String, f64>, String> {
    let profile: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let nodes = profile["nodes"].as_array().ok_or("no nodes")?;
    let mut name = BTreeMap::new();
    let mut parent = BTreeMap::new();
    for node in nodes {
        let id = node["id"].as_i64().ok_or("node without id")?;
        name.insert(
            id,
            node["callFrame"]["functionName"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
        );
        for child in node["children"].as_array().into_iter().flatten() {
            if let Some(child) = child.as_i64() {
                parent.insert(child, id);
            }
        }
    }
    let mut counts: BTreeMap<String, u64> =
        functions.iter().map(|f| ((*f).to_owned(), 0)).collect();
    let mut all = 0u64;
    for sample in profile["samples"].as_array().ok_or("no samples")? {
        let mut at = sample.as_i64();
        let mut seen = Vec::new();
        while let Some(id) = at {
            if let Some(n) = name.get(&id)
                && functions.contains(&n.as_str())
                && !seen.contains(n)
            {
                seen.push(n.clone());
            }
            at = parent.get(&id).copied();
        }
        if !seen.is_empty() {
            all += 1;
        }
        for n in seen {
            *counts.entry(n).or_default() += 1;
        }
    }
    if all == 0 {
        return Err("no sample in the functions".into());
    }
    Ok(counts
        .into_iter()
        .map(|(f, n)| (f, 100.0 * n as f64 / all as f64))
        .collect())
}

/// Where built fixtures and the Node workloads' V8 logs go (under target/).
fn fixture_dir() -> PathBuf {
    let dir = package_dir().join("target/jit-fixtures");
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// .NET Core 3.1 with the C# workload built.
#[derive(Debug, Clone)]
pub struct DotNet {
    pub dotnet: PathBuf,
    pub exe: PathBuf,
    pub runtimeconfig: PathBuf,
}

impl DotNet {
    /// The workload for `seconds`, writing its perf map.
    pub fn command(&self, seconds: u32) -> Command {
        let mut command = Command::new(&self.dotnet);
        command
            .arg("exec")
            .arg("--runtimeconfig")
            .arg(&self.runtimeconfig)
            .arg(&self.exe)
            .arg(seconds.to_string())
            // 3.1's spelling of DOTNET_PerfMapEnabled.
            .env("COMPlus_PerfMapEnabled", "1")
            // 3.1 predates the ICU of this Debian and would abort.
            .env("DOTNET_SYSTEM_GLOBALIZATION_INVARIANT", "1")
            // Each method compiled once: tier-1 recompilations of Alpha,
            // Beta and Gamma omit the frame pointer, which hides their
            // caller (Main) from a frame-pointer walk.
            .env("COMPlus_TC_CallCounting", "0")
            .stdout(Stdio::null());
        command
    }
}

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let out = command.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// .NET Core 3.1, installed into [`DOTNET_CACHE`] when missing, and the C#
/// workload compiled with `mcs` (installed when missing) into a directory
/// of the target dir.
pub fn dotnet() -> Result<DotNet, String> {
    let cache = Path::new(DOTNET_CACHE);
    let dotnet = cache.join("dotnetcore2/bin/dotnet");
    if !dotnet.exists() {
        // Into a sibling first: an interrupted install leaves no half cache.
        let staging = cache.with_extension("partial");
        let _ = std::fs::remove_dir_all(&staging);
        // A cache without its binary is a broken one.
        let _ = std::fs::remove_dir_all(cache);
        if let Some(parent) = cache.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        run(
            Command::new("python3")
                .args(["-m", "pip", "install", "--quiet", "--target"])
                .arg(&staging)
                .arg(DOTNET_PACKAGE),
            "pip install dotnetcore2",
        )?;
        std::fs::rename(&staging, cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    }
    if Command::new("mcs").arg("--version").output().is_err() {
        let install = || {
            run(
                Command::new("apt-get")
                    .args(["install", "-y", "-qq", "mono-mcs"])
                    .env("DEBIAN_FRONTEND", "noninteractive"),
                "apt-get install mono-mcs",
            )
        };
        // A fresh image may have no package lists yet.
        if install().is_err() {
            run(
                Command::new("apt-get").args(["update", "-qq"]),
                "apt-get update",
            )?;
            install()?;
        }
    }
    let out = fixture_dir();
    let exe = out.join("jit_split.exe");
    run(
        Command::new("mcs")
            .arg("-optimize+")
            .arg(format!("-out:{}", exe.display()))
            .arg(package_dir().join("integration/fixtures/jit_split.cs")),
        "mcs",
    )?;
    let runtimeconfig = out.join("jit_split.runtimeconfig.json");
    std::fs::write(
        &runtimeconfig,
        r#"{"runtimeOptions":{"tfm":"netcoreapp3.1","framework":{"name":"Microsoft.NETCore.App","version":"3.1.0"}}}"#,
    )
    .map_err(|e| e.to_string())?;
    Ok(DotNet {
        dotnet,
        exe,
        runtimeconfig,
    })
}
