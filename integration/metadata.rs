// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of process metadata: a process placed in a cgroup named
//! the way Docker, containerd under Kubernetes and CRI-O name theirs gets
//! the container ID (and pod UID) as OTLP resource attributes and pprof
//! labels; a host process gets neither.
//!
//!     sudo -E cargo test --release --test integration -- metadata:: --test-threads=1 --nocapture

use crate::support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::kube::{
    Cgroups, FakeApiServer, cgroup2_root, containerd_pod_cgroup, pod_json, pod_list, spawn_in,
};
use support::native::{C_FLAGS, compile_native_c, temp_dir};
use support::pprof;
use support::run::SystemWideRun;
use support::summary::{DecodedSample, total};
use support::{prerequisite, require_root, serial};

const HZ: u32 = 199;

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
    let _made = Cgroups::make(&root, cases.iter().map(|(_, cgroup, _, _)| cgroup.as_str()));
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

/// A process in a containerd pod's cgroup gets its pod's name, namespace,
/// container and node from the API server (a fake one serving the node's
/// pod list), and `service.name` as Alloy infers it (`NAMESPACE/CONTAINER`);
/// with the API server unreachable, its container ID and pod UID still
/// arrive and the agent keeps running; from the kubelet's `/pods` (the
/// read-only port's API) the same names arrive.
#[test]
fn pod_names_come_from_the_api_server_and_ids_without_it() {
    const TEST: &str = "pod_names_come_from_the_api_server_and_ids_without_it";
    const CONTAINER: &str = "4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c";
    const POD: &str = "9f3a5e7c-4d6b-4e8f-a0b1-c2d3e4f5a6b7";
    if !require_root(TEST) {
        return;
    }
    let Some(root) = cgroup2_root() else {
        prerequisite(TEST, false, "no cgroup v2 hierarchy mounted");
        return;
    };
    let _serial = serial();
    let cgroup = containerd_pod_cgroup(POD, CONTAINER);
    let _made = Cgroups::make(&root, [cgroup.as_str()]);
    let list = pod_list(&[pod_json(
        POD,
        "checkout-7f9",
        "shop",
        r#"{"app":"checkout"}"#,
        CONTAINER,
    )]);
    let api = FakeApiServer::start(list);
    let unreachable_port = support::net::HeldPort::hold();
    let unreachable = unreachable_port.address.port();

    for (what, source, port, named) in [
        ("API up", "--kubernetes-api", api.port, true),
        ("API down", "--kubernetes-api", unreachable, false),
        ("kubelet", "--kubelet-url", api.port, true),
    ] {
        let tmp = temp_dir();
        let exe = compile_native_c(C_FLAGS, tmp.path(), "native");
        let token = tmp.path().join("token");
        std::fs::write(&token, "pod-reader-token\n").unwrap();
        let args = [
            source.to_owned(),
            format!("http://127.0.0.1:{port}"),
            "--node-name".to_owned(),
            "test-node".to_owned(),
            "--kubernetes-token-file".to_owned(),
            token.display().to_string(),
        ];
        let mut run = SystemWideRun::spawn(tmp, HZ, &args);
        let mut child = spawn_in(&root.join(&cgroup), &exe);
        std::thread::sleep(Duration::from_secs(4));
        let _ = run
            .icecore
            .metrics_after_next_batch(Duration::from_secs(30));
        run.icecore.stop();
        let pid = child.id();
        let _ = child.kill();
        let _ = child.wait();
        let logs = run.icecore.output();
        let otlp = run.otlp_of(pid).samples;
        let pprof_samples = pprof::all_samples(&pprof::decode_dir(&run.pprof_dir));
        let of_fixture = |samples: &[DecodedSample]| -> Vec<DecodedSample> {
            samples
                .iter()
                .filter(|s| s.pid == Some(i64::from(pid)) && s.comm.as_deref() == Some("native"))
                .cloned()
                .collect()
        };
        let (otlp, pprof_samples) = (of_fixture(&otlp), of_fixture(&pprof_samples));
        println!(
            "{TEST}: {what}: {} OTLP and {} pprof samples of the fixture; OTLP resource {:?}",
            total(&otlp),
            total(&pprof_samples),
            otlp.first().map(|s| &s.labels)
        );
        assert!(
            total(&otlp) > 0 && total(&pprof_samples) > 0,
            "{TEST}: {what}: no samples\n{logs}"
        );
        for s in &otlp {
            let attr = |k: &str| s.labels.get(k).map(String::as_str);
            assert_eq!(s.container_id.as_deref(), Some(CONTAINER), "{TEST}: {what}");
            assert_eq!(s.pod_uid.as_deref(), Some(POD), "{TEST}: {what}");
            if named {
                assert_eq!(
                    attr("k8s.pod.name"),
                    Some("checkout-7f9"),
                    "{TEST}: {what}: {:?}",
                    s.labels
                );
                assert_eq!(attr("k8s.namespace.name"), Some("shop"), "{TEST}: {what}");
                assert_eq!(attr("k8s.container.name"), Some("app"), "{TEST}: {what}");
                assert_eq!(attr("k8s.node.name"), Some("test-node"), "{TEST}: {what}");
                assert_eq!(attr("service.name"), Some("shop/app"), "{TEST}: {what}");
            } else {
                assert_eq!(attr("k8s.pod.name"), None, "{TEST}: {what}");
                assert_eq!(attr("service.name"), Some("native"), "{TEST}: {what}");
            }
        }
        for s in &pprof_samples {
            let label = |k: &str| s.labels.get(k).map(String::as_str);
            if named {
                assert_eq!(
                    label("pod"),
                    Some("checkout-7f9"),
                    "{TEST}: {what}: {:?}",
                    s.labels
                );
                assert_eq!(label("namespace"), Some("shop"), "{TEST}: {what}");
                assert_eq!(label("container"), Some("app"), "{TEST}: {what}");
            } else {
                assert_eq!(label("pod"), None, "{TEST}: {what}");
            }
        }
        if !named {
            assert!(
                logs.contains("Kubernetes pods:"),
                "{TEST}: {what}: no warning about the unreachable API server\n{logs}"
            );
        }
    }
    let requests = api.requests.lock().unwrap().clone();
    println!("{TEST}: the API server got {} requests", requests.len());
    let list = requests
        .iter()
        .find(|r| !r.contains("watch=true"))
        .expect("a pod list request");
    assert!(
        list.starts_with("GET /api/v1/pods?fieldSelector=spec.nodeName%3Dtest-node "),
        "{TEST}: {list}"
    );
    assert!(
        list.to_ascii_lowercase()
            .contains("authorization: bearer pod-reader-token"),
        "{TEST}: no bearer token: {list}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.contains("watch=true") && r.contains("resourceVersion=7")),
        "{TEST}: no watch from the list's version: {requests:?}"
    );
    assert!(
        requests.iter().any(|r| r.starts_with("GET /pods ")),
        "{TEST}: the kubelet's pods were not read: {requests:?}"
    );
}

/// A fake Docker Engine on a Unix socket: answers `GET /containers/ID/json`
/// for `id` with `name` and 404 for any other container.
fn fake_docker(socket: &Path, id: &'static str, name: &'static str) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
            }
            let (status, body) = if first.starts_with(&format!("GET /containers/{id}/json ")) {
                (
                    "200 OK",
                    format!(
                        r#"{{"Id":"{id}","Name":"/{name}","Config":{{"Image":"nginx:1.27","Labels":{{"com.docker.compose.service":"web"}}}}}}"#
                    ),
                )
            } else {
                (
                    "404 Not Found",
                    r#"{"message":"No such container"}"#.to_owned(),
                )
            };
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
}

/// A process in a cgroup named as Docker names its containers gets the
/// container's name from the Docker Engine's socket (a fake one) as
/// `container.name` and, no pod naming it, as `service.name`.
#[test]
fn docker_containers_are_named_from_the_engine() {
    const TEST: &str = "docker_containers_are_named_from_the_engine";
    const CONTAINER: &str = "5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d";
    if !require_root(TEST) {
        return;
    }
    let Some(root) = cgroup2_root() else {
        prerequisite(TEST, false, "no cgroup v2 hierarchy mounted");
        return;
    };
    let _serial = serial();
    let cgroup = format!("system.slice/docker-{CONTAINER}.scope");
    let _made = Cgroups::make(&root, [cgroup.as_str()]);
    let tmp = temp_dir();
    let exe = compile_native_c(C_FLAGS, tmp.path(), "native");
    let socket = tmp.path().join("docker.sock");
    fake_docker(&socket, CONTAINER, "web-frontend");
    let args = [
        "--docker-socket".to_owned(),
        socket.display().to_string(),
        "--kubernetes-api".to_owned(),
        "off".to_owned(),
    ];
    let mut run = SystemWideRun::spawn(tmp, HZ, &args);
    let mut child = spawn_in(&root.join(&cgroup), &exe);
    std::thread::sleep(Duration::from_secs(4));
    let _ = run
        .icecore
        .metrics_after_next_batch(Duration::from_secs(30));
    run.icecore.stop();
    let pid = child.id();
    let _ = child.kill();
    let _ = child.wait();
    let of_fixture = |samples: Vec<DecodedSample>| -> Vec<DecodedSample> {
        samples
            .into_iter()
            .filter(|s| s.pid == Some(i64::from(pid)) && s.comm.as_deref() == Some("native"))
            .collect()
    };
    let otlp = of_fixture(run.otlp_of(pid).samples);
    let pprof_samples = of_fixture(pprof::all_samples(&pprof::decode_dir(&run.pprof_dir)));
    let named = |s: &&DecodedSample, key: &str| {
        s.labels.get(key).map(String::as_str) == Some("web-frontend")
    };
    let otlp_named: u64 = otlp
        .iter()
        .filter(|s| named(s, "container.name") && named(s, "service.name"))
        .map(|s| s.count)
        .sum();
    let pprof_named: u64 = pprof_samples
        .iter()
        .filter(|s| named(s, "container_name"))
        .map(|s| s.count)
        .sum();
    println!(
        "{TEST}: OTLP {otlp_named} of {} samples named, pprof {pprof_named} of {}; first resource {:?}",
        total(&otlp),
        total(&pprof_samples),
        otlp.first().map(|s| &s.labels)
    );
    // The name arrives after the process's first samples (the engine is
    // asked when the process is learned): most, not all, carry it.
    assert!(
        total(&otlp) > 0,
        "{TEST}: no samples\n{}",
        run.icecore.output()
    );
    assert!(
        otlp_named * 10 >= total(&otlp) * 8 && pprof_named * 10 >= total(&pprof_samples) * 8,
        "{TEST}: under 80% of the samples named web-frontend"
    );
    assert!(
        otlp.iter()
            .all(|s| s.container_id.as_deref() == Some(CONTAINER))
    );
}
