// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! Headless Chromium driven by playwright-core (`integration/browser/`),
//! and a plain HTTP GET for the agent's page and API.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{package_dir, prerequisite};

/// Whether the browser is there: installs it with `scripts/browser.sh`
/// (Debian's Chromium, playwright-core in /var/cache/icecore/playwright),
/// or reports why not through `prerequisite`.
pub fn available(test: &str) -> bool {
    let output = Command::new(package_dir().join("scripts/browser.sh")).output();
    let ok = matches!(&output, Ok(o) if o.status.success());
    let why = match &output {
        Ok(o) => format!(
            "headless Chromium and playwright-core (scripts/browser.sh: {}{})",
            String::from_utf8_lossy(&o.stdout).trim(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("scripts/browser.sh could not run: {e}"),
    };
    if ok {
        println!(
            "{test}: {}",
            String::from_utf8_lossy(&output.map(|o| o.stdout).unwrap_or_default()).trim()
        );
    }
    prerequisite(test, ok, &why)
}

/// Runs `integration/browser/SCRIPT` with `plan` (JSON) and returns what it
/// printed on stdout, parsed; panics with its stderr when it fails.
pub fn run_script(script: &str, plan: &serde_json::Value) -> serde_json::Value {
    let path = package_dir().join("integration/browser").join(script);
    let output = Command::new("node")
        .arg(&path)
        .arg(plan.to_string())
        .output()
        .unwrap_or_else(|e| panic!("cannot run node {}: {e}", path.display()));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{} failed ({}):\n{stderr}",
        path.display(),
        output.status
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or("");
    serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("{script} printed no JSON ({e}):\n{stdout}\n{stderr}"))
}

/// Where a test's screenshots go: kept after the run, under `target/`.
pub fn artifacts_dir(test: &str) -> PathBuf {
    let dir = package_dir().join("target/test-artifacts").join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    dir
}

/// `GET path` over HTTP/1.0 (no chunking): the status and the body.
pub fn get(addr: SocketAddr, path: &str) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("read timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("send request");
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("GET {path}: no header end"));
    let head = String::from_utf8_lossy(&response[..end]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("GET {path}: bad status line {head:?}"));
    (status, response[end + 4..].to_vec())
}

/// `GET path`, which must answer 200 with JSON.
pub fn get_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let (status, body) = get(addr, path);
    assert_eq!(
        status,
        200,
        "GET {path}: {}",
        String::from_utf8_lossy(&body)
    );
    serde_json::from_slice(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON: {e}"))
}

/// Writes `bytes` to `dir/name` and returns the path.
pub fn save(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}
