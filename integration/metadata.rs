// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of process metadata: a process placed in a cgroup named
//! the way Docker, containerd under Kubernetes and CRI-O name theirs gets
//! the container ID (and pod UID) as OTLP resource attributes and pprof
//! labels; a host process gets neither.
//!
//!     sudo -E cargo test --release --test metadata -- --test-threads=1 --nocapture

// Test code: a panic is how a helper reports a failed expectation.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[allow(
    dead_code,
    reason = "support/ serves several test targets; this one uses only part of it"
)]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::native::{C_FLAGS, compile_native_c, temp_dir};
use support::pprof;
use support::run::SystemWideRun;
use support::summary::{DecodedSample, total};
use support::{prerequisite, require_root, serial};

const HZ: u32 = 199;

/// The cgroup v2 hierarchy (`/sys/fs/cgroup` on unified hosts,
/// `/sys/fs/cgroup/unified` on hybrid ones).
fn cgroup2_root() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_, at, kind) = (fields.next()?, fields.next()?, fields.next()?);
        (kind == "cgroup2").then(|| PathBuf::from(at))
    })
}

/// Cgroups made for the test, removed (deepest first) when dropped.
struct Cgroups(Vec<PathBuf>);

impl Drop for Cgroups {
    fn drop(&mut self) {
        for dir in self.0.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A process that moves itself into `cgroup`, then runs `exe cycle 300`.
fn spawn_in(cgroup: &Path, exe: &Path) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec {} cycle 300",
            cgroup.display(),
            exe.display()
        ))
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the fixture")
}

#[test]
fn containers_and_pods_are_named_from_their_cgroups() {
    const TEST: &str = "containers_and_pods_are_named_from_their_cgroups";
    const DOCKER: &str = "1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809";
    const CONTAINERD: &str = "2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a";
    const CRIO: &str = "3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b";
    const POD_A: &str = "7d1e3c5a-2b4f-4c6d-8e9f-0a1b2c3d4e5f";
    const POD_B: &str = "8e2f4d6b-3c5a-4d7e-9f0a-1b2c3d4e5f60";
    if !require_root(TEST) {
        return;
    }
    let Some(root) = cgroup2_root() else {
        prerequisite(TEST, false, "no cgroup v2 hierarchy mounted");
        return;
    };
    let _serial = serial();
    let systemd = |uid: &str| uid.replace('-', "_");
    // (what, cgroup below the v2 root, container ID, pod UID)
    let cases = [
        (
            "Docker",
            format!("system.slice/docker-{DOCKER}.scope"),
            Some(DOCKER),
            None,
        ),
        (
            "containerd pod",
            format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CONTAINERD}.scope",
                systemd(POD_A)
            ),
            Some(CONTAINERD),
            Some(POD_A),
        ),
        (
            "CRI-O pod",
            format!(
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/crio-{CRIO}.scope",
                systemd(POD_B)
            ),
            Some(CRIO),
            Some(POD_B),
        ),
        ("host process", String::new(), None, None),
    ];
    let mut made = Cgroups(Vec::new());
    for (_, cgroup, _, _) in &cases {
        let mut dir = root.clone();
        for part in Path::new(cgroup).components() {
            dir.push(part);
            if !dir.exists() {
                std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
                made.0.push(dir.clone());
            }
        }
    }
    let tmp = temp_dir();
    let exe = compile_native_c(C_FLAGS, tmp.path(), "native");
    let mut run = SystemWideRun::spawn(tmp, HZ, &[]);
    let mut children: Vec<Child> = cases
        .iter()
        .map(|(_, cgroup, _, _)| {
            if cgroup.is_empty() {
                Command::new(&exe)
                    .args(["cycle", "300"])
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("spawn the fixture")
            } else {
                spawn_in(&root.join(cgroup), &exe)
            }
        })
        .collect();
    std::thread::sleep(Duration::from_secs(4));
    let _ = run
        .icecore
        .metrics_after_next_batch(Duration::from_secs(30));
    run.icecore.stop();
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    let otlp = run.otlp_of(pids[0]).samples;
    let pprof_samples = pprof::all_samples(&pprof::decode_dir(&run.pprof_dir));

    let mut failures = Vec::new();
    for ((what, _, container, pod), pid) in cases.iter().zip(&pids) {
        for (sink, samples) in [("OTLP", &otlp), ("pprof", &pprof_samples)] {
            // The fixture's image: the same pid ran `sh` (outside the
            // cgroup) until it moved itself and ran `exec`.
            let of_pid: Vec<&DecodedSample> = samples
                .iter()
                .filter(|s| s.pid == Some(i64::from(*pid)) && s.comm.as_deref() == Some("native"))
                .collect();
            let n: u64 = of_pid.iter().map(|s| s.count).sum();
            let labelled = |s: &DecodedSample| {
                s.container_id.as_deref() == *container && s.pod_uid.as_deref() == *pod
            };
            let right: u64 = of_pid.iter().filter(|s| labelled(s)).map(|s| s.count).sum();
            let wrong = of_pid.iter().find(|s| !labelled(s));
            println!(
                "{TEST}: {what} (pid {pid}), {sink}: {right} of {n} samples with container {container:?}, pod {pod:?}"
            );
            if n == 0 || right != n {
                failures.push(format!(
                    "{what} (pid {pid}), {sink}: {right} of {n} samples labelled right; \
                     one wrong: {:?}",
                    wrong.map(|s| (&s.container_id, &s.pod_uid))
                ));
            }
        }
    }
    // Every fixture is a child of this test (the shell execs the fixture).
    let parents: std::collections::BTreeSet<Option<i64>> = otlp
        .iter()
        .filter(|s| pids.iter().any(|&p| s.pid == Some(i64::from(p))))
        .map(|s| s.parent_pid)
        .collect();
    println!("{TEST}: process.parent_pid of the fixtures: {parents:?}");
    if parents != [Some(i64::from(std::process::id()))].into() {
        failures.push(format!(
            "process.parent_pid {parents:?}, expected this test's pid {}",
            std::process::id()
        ));
    }
    assert!(total(&otlp) > 0, "{TEST}: no OTLP samples");
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}
