// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! Containers and pods without a container runtime: cgroups named the way
//! Docker, containerd and CRI-O name theirs, processes moved into them, and
//! a fake Kubernetes API server (and kubelet) serving a node's pods.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The cgroup v2 hierarchy (`/sys/fs/cgroup` on unified hosts,
/// `/sys/fs/cgroup/unified` on hybrid ones).
pub fn cgroup2_root() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_, at, kind) = (fields.next()?, fields.next()?, fields.next()?);
        (kind == "cgroup2").then(|| PathBuf::from(at))
    })
}

/// Cgroups made for the test, removed (deepest first) when dropped.
pub struct Cgroups(Vec<PathBuf>);

impl Cgroups {
    /// Creates each of `paths` (and its parents) below `root`.
    pub fn make<'a>(root: &Path, paths: impl IntoIterator<Item = &'a str>) -> Cgroups {
        let mut made = Cgroups(Vec::new());
        for path in paths {
            let mut dir = root.to_path_buf();
            for part in Path::new(path).components() {
                dir.push(part);
                if !dir.exists() {
                    std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
                    made.0.push(dir.clone());
                }
            }
        }
        made
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for dir in self.0.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A process that moves itself into `cgroup`, then runs `exe cycle 300`.
pub fn spawn_in(cgroup: &Path, exe: &Path) -> Child {
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

/// The cgroup (below the v2 root) of a containerd container in a burstable
/// pod, as the kubelet's systemd driver names it.
pub fn containerd_pod_cgroup(pod_uid: &str, container: &str) -> String {
    format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{container}.scope",
        pod_uid.replace('-', "_")
    )
}

/// A pod as the API server and the kubelet serialize it.
pub fn pod_json(uid: &str, name: &str, namespace: &str, labels: &str, container: &str) -> String {
    format!(
        r#"{{"metadata":{{"uid":"{uid}","name":"{name}","namespace":"{namespace}","labels":{labels}}},
             "spec":{{"nodeName":"test-node"}},
             "status":{{"containerStatuses":[{{"name":"app","containerID":"containerd://{container}"}}]}}}}"#
    )
}

/// A pod list holding `pods` (JSON objects) at `resourceVersion` 7.
pub fn pod_list(pods: &[String]) -> String {
    format!(
        r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"7"}},"items":[{}]}}"#,
        pods.join(",")
    )
}

/// A fake Kubernetes API server: answers any GET that is not a watch (the
/// API server's pod list, the kubelet's `/pods`) with `list`; a watch gets
/// `events` (each after its delay from the watch's start, one JSON line
/// each) and is then held open. Keeps each request's head and when each
/// event was sent.
pub struct FakeApiServer {
    pub port: u16,
    pub requests: Arc<Mutex<Vec<String>>>,
    /// Wall-clock time each watch event was written.
    pub events_sent: Arc<Mutex<Vec<SystemTime>>>,
}

impl FakeApiServer {
    /// A server whose watches stay eventless.
    pub fn start(list: String) -> FakeApiServer {
        FakeApiServer::with_events(list, Vec::new())
    }

    /// A server whose first watch sends `events` (delay, `{"type":..,"object":..}`).
    pub fn with_events(list: String, events: Vec<(Duration, String)>) -> FakeApiServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let events_sent = Arc::new(Mutex::new(Vec::new()));
        let (seen, sent) = (requests.clone(), events_sent.clone());
        let events = Arc::new(Mutex::new(Some(events)));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (list, seen, sent, events) =
                    (list.clone(), seen.clone(), sent.clone(), events.clone());
                std::thread::spawn(move || serve(stream, &list, &seen, &sent, &events));
            }
        });
        FakeApiServer {
            port,
            requests,
            events_sent,
        }
    }
}

fn serve(
    stream: std::net::TcpStream,
    list: &str,
    seen: &Mutex<Vec<String>>,
    sent: &Mutex<Vec<SystemTime>>,
    events: &Mutex<Option<Vec<(Duration, String)>>>,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let watch = head
        .lines()
        .next()
        .is_some_and(|l| l.contains("watch=true"));
    seen.lock().unwrap().push(head);
    let mut stream = stream;
    if !watch {
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{list}",
            list.len()
        );
        return;
    }
    let _ = stream.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
          Transfer-Encoding: chunked\r\n\r\n",
    );
    let _ = stream.flush();
    let started = std::time::Instant::now();
    let mine = events.lock().unwrap().take().unwrap_or_default();
    for (delay, event) in mine {
        std::thread::sleep(delay.saturating_sub(started.elapsed()));
        let line = format!("{}\n", event.replace('\n', " "));
        let _ = write!(stream, "{:x}\r\n{line}\r\n", line.len());
        let _ = stream.flush();
        sent.lock().unwrap().push(SystemTime::now());
    }
    // Open, without more events, until the client goes.
    std::thread::sleep(Duration::from_secs(120));
}
