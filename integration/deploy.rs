// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The deployment files under `deploy/`, tested as far as a machine
//! without systemd as PID 1 or a Kubernetes cluster allows:
//!
//! - the systemd unit passes `systemd-analyze verify` without a warning,
//!   and icecore profiles with exactly its capability bounding set, a
//!   process of another user in a directory closed to others included, its
//!   kernel frames named; without `CAP_SYS_PTRACE` it refuses to start,
//!   without `CAP_DAC_READ_SEARCH` that process goes unnamed, and without
//!   `CAP_SYSLOG` its kernel frames do, so each is needed;
//! - the Kubernetes manifests validate strictly against the schemas of
//!   Kubernetes 1.30 (the first with `appArmorProfile`) and of the newest
//!   release `kubernetes-validate` knows, and grant the unit's
//!   capabilities, not `privileged`;
//! - every config file shipped passes `icecore --check-config`, and a
//!   broken one is refused with exit status 2;
//! - `/readyz` turns ready after the first batch and unready while a sink
//!   fails, while `/healthz` stays up.
//!
//!     sudo -E cargo test --release --test integration -- deploy:: --test-threads=1 --nocapture

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use support::pprof::{all_samples, decode_dir};
use support::run::s;
use support::summary::{count_where, looks_like_symbol, pct};
use support::{Icecore, package_dir, prerequisite, require_root, serial, tmp};

/// Where the test keeps `kubernetes-validate` (from PyPI) between runs.
const VALIDATOR_VENV: &str = "/var/cache/icecore/kubernetes-validate";
const VALIDATOR_VERSION: &str = "1.37.0";
/// The Kubernetes releases the manifests are checked against.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.30", "1.37"];
/// `nobody`: the owner of the closed directory's process.
const NOBODY: u32 = 65534;

fn deploy_file(name: &str) -> PathBuf {
    package_dir().join("deploy").join(name)
}

/// The capabilities a systemd unit's `CapabilityBoundingSet=` grants, as
/// lower-case names without `CAP_` (`bpf`, `perfmon`).
fn unit_capabilities(unit: &str) -> Vec<String> {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("CapabilityBoundingSet= in the unit");
    line.split_whitespace()
        .map(|cap| {
            cap.strip_prefix("CAP_")
                .unwrap_or_else(|| panic!("{cap} is not a CAP_ name"))
                .to_ascii_lowercase()
        })
        .collect()
}

/// `icecore --config FILE --check-config`: (exit code, stdout + stderr).
fn check_config(file: &Path) -> (i32, String) {
    let output = Command::new(Icecore::binary())
        .arg("--config")
        .arg(file)
        .arg("--check-config")
        .output()
        .expect("run icecore --check-config");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

#[test]
fn the_systemd_unit_verifies_and_its_config_is_valid() {
    const TEST: &str = "the_systemd_unit_verifies_and_its_config_is_valid";
    let analyze = Path::new("/usr/bin/systemd-analyze");
    if !prerequisite(
        TEST,
        analyze.exists(),
        "systemd-analyze (apt-get install systemd)",
    ) {
        return;
    }
    // A root holding the unit, the binary it starts and systemd's own
    // units, so that verify resolves everything it names.
    let root = tmp();
    let units = root.path().join("usr/lib/systemd");
    std::fs::create_dir_all(&units).unwrap();
    let status = Command::new("cp")
        .args(["-a", "/usr/lib/systemd/system"])
        .arg(&units)
        .status()
        .unwrap();
    assert!(status.success(), "copy systemd's units");
    let bin = root.path().join("usr/local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(Icecore::binary(), bin.join("icecore")).unwrap();
    let system = root.path().join("etc/systemd/system");
    std::fs::create_dir_all(&system).unwrap();
    std::fs::copy(
        deploy_file("systemd/icecore.service"),
        system.join("icecore.service"),
    )
    .unwrap();
    let output = Command::new(analyze)
        .arg("verify")
        .arg(format!("--root={}", root.path().display()))
        .arg("icecore.service")
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!(
        "{TEST}: systemd-analyze verify: {:?} {said:?}",
        output.status
    );
    // Unknown keys are only warnings: any output fails the test.
    assert!(
        output.status.success() && said.trim().is_empty(),
        "{TEST}: systemd-analyze verify: {said}"
    );

    let (code, text) = check_config(&deploy_file("systemd/icecore.yaml"));
    println!("{TEST}: deploy/systemd/icecore.yaml: {text}");
    assert_eq!(code, 0, "{TEST}: {text}");
}

#[test]
fn every_shipped_config_passes_check_config_and_a_broken_one_fails() {
    const TEST: &str = "every_shipped_config_passes_check_config_and_a_broken_one_fails";
    for file in [
        "systemd/icecore.yaml",
        "collector/icecore.yaml",
        "parca/icecore.yaml",
        "pyroscope/icecore.yaml",
    ] {
        let (code, text) = check_config(&deploy_file(file));
        println!("{TEST}: {file}: {code} {text}");
        assert_eq!(code, 0, "{TEST}: {file}: {text}");
        assert!(text.contains("the configuration is valid"), "{text}");
    }
    let dir = tmp();
    for (broken, says) in [
        ("otlp_endpoint: ftp://collector:4317\n", "otlp_endpoint"),
        ("sampling_frequency: 0\n", "sampling_frequency"),
        (
            "otlp_endpoint: http://c:4317\nsampling_frequncy: 19\n",
            "sampling_frequncy",
        ),
        (
            "parca_endpoint: http://p:7070\nparca_bearer_token_file: /nonexistent/token\n",
            "parca-bearer-token-file",
        ),
        ("pprof_dir: /etc/passwd\n", "pprof-dir"),
        (
            "pyroscope_endpoint: http://p:4040\npyroscope_tenant_id: \"a b\"\n",
            "pyroscope_tenant_id",
        ),
        ("pyroscope_tenant_id: team-a\n", "pyroscope_endpoint"),
        ("pprof_dir: /tmp\nself_traces: true\n", "self-traces"),
        ("log_format: yaml\n", "log_format"),
    ] {
        let file = dir.path().join("broken.yaml");
        std::fs::write(&file, broken).unwrap();
        let (code, text) = check_config(&file);
        println!("{TEST}: {broken:?}: {code} {text}");
        assert_eq!(code, 2, "{TEST}: {broken:?} was accepted: {text}");
        assert!(text.contains(says), "{TEST}: {broken:?}: {text}");
    }
}

/// The Python of a venv holding `kubernetes-validate`, made if missing.
fn kubernetes_validate() -> Option<PathBuf> {
    let venv = Path::new(VALIDATOR_VENV);
    let tool = venv.join("bin/kubernetes-validate");
    let installed = || {
        Command::new(venv.join("bin/pip"))
            .args(["show", "kubernetes-validate"])
            .output()
            .is_ok_and(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .contains(&format!("Version: {VALIDATOR_VERSION}"))
            })
    };
    if tool.exists() && installed() {
        return Some(tool);
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(venv)
        .status()
        .is_ok_and(|s| s.success())
        && Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet"])
            .arg(format!("kubernetes-validate=={VALIDATOR_VERSION}"))
            .status()
            .is_ok_and(|s| s.success());
    (made && tool.exists()).then_some(tool)
}

#[test]
fn the_kubernetes_manifests_validate_and_grant_the_units_capabilities() {
    const TEST: &str = "the_kubernetes_manifests_validate_and_grant_the_units_capabilities";
    let manifests = deploy_file("kubernetes/icecore.yaml");
    let Some(validator) = kubernetes_validate() else {
        prerequisite(
            TEST,
            false,
            &format!("kubernetes-validate {VALIDATOR_VERSION} from PyPI in {VALIDATOR_VENV}"),
        );
        return;
    };
    for version in KUBERNETES_VERSIONS {
        let output = Command::new(&validator)
            .args(["--strict", "--kubernetes-version", version])
            .arg(&manifests)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr);
        println!("{TEST}: Kubernetes {version}:\n{said}");
        assert!(
            output.status.success() && !said.contains("ERROR"),
            "{TEST}: Kubernetes {version}: {said}"
        );
        for kind in [
            "namespace",
            "serviceaccount",
            "clusterrole",
            "clusterrolebinding",
            "configmap",
            "daemonset",
        ] {
            assert!(
                said.contains(&format!("passed for resource {kind}/icecore")),
                "{TEST}: {kind} not validated against {version}: {said}"
            );
        }
    }

    // The same capabilities as the unit, and not privileged.
    let text = std::fs::read_to_string(&manifests).unwrap();
    let documents: Vec<serde_norway::Value> = serde_norway::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let daemonset = documents
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet");
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true, "{TEST}: hostPID");
    let context = &pod["containers"][0]["securityContext"];
    assert_eq!(context["privileged"], false, "{TEST}: privileged");
    let added: Vec<String> = context["capabilities"]["add"]
        .as_sequence()
        .expect("capabilities to add")
        .iter()
        .map(|c| c.as_str().unwrap().to_ascii_lowercase())
        .collect();
    let unit = std::fs::read_to_string(deploy_file("systemd/icecore.service")).unwrap();
    assert_eq!(
        added,
        unit_capabilities(&unit),
        "{TEST}: the pod's and the unit's capabilities"
    );
    assert_eq!(
        context["capabilities"]["drop"][0], "ALL",
        "{TEST}: every other capability dropped"
    );
    let env = pod["containers"][0]["env"].as_sequence().unwrap();
    assert!(
        env.iter().any(|e| e["name"] == "NODE_NAME"
            && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"),
        "{TEST}: NODE_NAME from the downward API"
    );

    // The ConfigMap's config is one icecore accepts.
    let config = documents
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .and_then(|d| d["data"]["icecore.yaml"].as_str())
        .expect("the ConfigMap's icecore.yaml");
    let dir = tmp();
    let file = dir.path().join("icecore.yaml");
    std::fs::write(&file, config).unwrap();
    let (code, said) = check_config(&file);
    println!("{TEST}: the ConfigMap's icecore.yaml: {said}");
    assert_eq!(code, 0, "{TEST}: {said}");
}

/// Mounts tracefs where systemd would have (`sys-kernel-tracing.mount`):
/// icecore without `CAP_SYS_ADMIN` cannot.
fn ensure_tracefs() {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/kernel/tracing"))
    {
        return;
    }
    let status = Command::new("mount")
        .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
        .status()
        .unwrap();
    assert!(status.success(), "mount tracefs");
}

/// `setpriv` arguments that leave root exactly `caps` (and no new
/// privileges), as the unit's bounding set does.
fn with_only(caps: &[String]) -> Vec<String> {
    let set: Vec<String> = caps.iter().map(|c| format!("+{c}")).collect();
    vec![
        s("setpriv"),
        s("--no-new-privs"),
        format!("--bounding-set=-all,{}", set.join(",")),
        s("--"),
    ]
}

/// The busy fixture, owned by `nobody` in a directory only `nobody` may
/// enter, running as `nobody`, reading `/dev/zero` (mostly in the kernel):
/// (its pid, the child).
fn closed_fixture(dir: &Path) -> (u32, std::process::Child) {
    let closed = dir.join("closed");
    std::fs::create_dir(&closed).unwrap();
    let exe = support::fixture::build(dir);
    let inside = closed.join("busy");
    std::fs::copy(&exe, &inside).unwrap();
    for path in [&closed, &inside] {
        std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    // The temp dir itself must let nobody through to `closed`.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    let child = Command::new("setpriv")
        .args([
            format!("--reuid={NOBODY}"),
            format!("--regid={NOBODY}"),
            s("--clear-groups"),
        ])
        .arg(&inside)
        .args(["syscalls", "30"])
        .stdout(Stdio::null())
        .spawn()
        .expect("start the fixture as nobody");
    (child.id(), child)
}

/// How a process's samples were named, from a pprof directory.
#[derive(Debug, Default, Clone, Copy)]
struct Named {
    /// Samples with one of the fixture's functions in their stack.
    user: u64,
    /// All its samples.
    all: u64,
    /// Samples with kernel frames...
    in_kernel: u64,
    /// ...all of them named.
    kernel_named: u64,
}

fn named_samples(pprof: &Path, pid: u32) -> Named {
    let samples: Vec<_> = all_samples(&decode_dir(pprof))
        .into_iter()
        .filter(|s| s.pid == Some(i64::from(pid)))
        .collect();
    fn kernel(s: &support::summary::DecodedSample) -> Vec<&support::summary::Frame> {
        s.stack.iter().filter(|f| f.is_kernel()).collect()
    }
    Named {
        user: count_where(&samples, |s| {
            s.stack
                .iter()
                .any(|f| support::fixture::FIXTURE_FUNCTIONS.contains(&f.function.as_str()))
        }),
        all: count_where(&samples, |_| true),
        in_kernel: count_where(&samples, |s| !kernel(s).is_empty()),
        kernel_named: count_where(&samples, |s| {
            let frames = kernel(s);
            !frames.is_empty() && frames.iter().all(|f| looks_like_symbol(&f.function))
        }),
    }
}

/// Whether `/proc/kallsyms` shows addresses only to `CAP_SYSLOG` (the
/// kernel's `kallsyms_show_value`): `kptr_restrict` 1, or 0 with
/// `perf_event_paranoid` above 1; and whether it hides them from all
/// (`kptr_restrict` 2).
fn kallsyms_needs_syslog() -> (bool, bool) {
    let read = |name: &str| -> i64 {
        std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let (restrict, paranoid) = (read("kptr_restrict"), read("perf_event_paranoid"));
    (
        restrict == 1 || (restrict == 0 && paranoid > 1),
        restrict >= 2,
    )
}

#[test]
fn the_units_capabilities_are_enough_and_each_is_needed() {
    const TEST: &str = "the_units_capabilities_are_enough_and_each_is_needed";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    ensure_tracefs();
    let unit = std::fs::read_to_string(deploy_file("systemd/icecore.service")).unwrap();
    let caps = unit_capabilities(&unit);
    println!("{TEST}: the unit's capabilities: {caps:?}");

    let dir = tmp();
    let (pid, mut fixture) = closed_fixture(dir.path());
    let run = |name: &str, caps: &[String]| -> (Option<i32>, String, Named) {
        let logs = dir.path().join(name);
        std::fs::create_dir(&logs).unwrap();
        let pprof = logs.join("pprof");
        let args = [
            s("--pid"),
            pid.to_string(),
            s("--sampling-frequency"),
            s("97"),
            s("--reporter-interval"),
            s("1s"),
            s("--duration"),
            s("4s"),
            s("--http-address"),
            s("127.0.0.1:0"),
            s("--pprof-dir"),
            s(pprof.display()),
        ];
        let mut icecore = Icecore::spawn_wrapped(&with_only(caps), &args, &logs);
        let status = icecore.wait_exit(Duration::from_secs(30));
        let counts = if pprof.exists() {
            named_samples(&pprof, pid)
        } else {
            Named::default()
        };
        (status.code(), icecore.logs(), counts)
    };

    let (code, logs, named) = run("unit", &caps);
    let Named {
        user,
        all,
        in_kernel,
        kernel_named,
    } = named;
    println!(
        "{TEST}: with the unit's capabilities: exit {code:?}, {user} of {all} samples ({:.1}%) \
         named in the fixture's functions; {kernel_named} of the {in_kernel} with kernel frames \
         name them all",
        pct(user, all)
    );
    assert_eq!(code, Some(0), "{TEST}: {logs}");
    assert!(
        all >= 100 && pct(user, all) >= 90.0,
        "{TEST}: {user} of {all} samples named with the unit's capabilities\n{logs}"
    );
    let (needs_syslog, hidden) = kallsyms_needs_syslog();
    if prerequisite(
        TEST,
        !hidden,
        "kptr_restrict is 2: /proc/kallsyms hides the kernel's addresses even from CAP_SYSLOG",
    ) {
        assert!(
            pct(in_kernel, all) >= 50.0 && pct(kernel_named, in_kernel) >= 90.0,
            "{TEST}: {kernel_named} of {in_kernel} samples with kernel frames ({all} in all) \
             name them with the unit's capabilities\n{logs}"
        );
    }

    let without =
        |cap: &str| -> Vec<String> { caps.iter().filter(|c| *c != cap).cloned().collect() };
    let (code, logs, _) = run("no_ptrace", &without("sys_ptrace"));
    println!("{TEST}: without sys_ptrace: exit {code:?}");
    assert!(
        code != Some(0) && logs.contains("CAP_SYS_PTRACE"),
        "{TEST}: without CAP_SYS_PTRACE icecore must refuse, naming it:\n{logs}"
    );

    let (code, logs, Named { user, all, .. }) = run("no_dac", &without("dac_read_search"));
    println!("{TEST}: without dac_read_search: exit {code:?}, {user} of {all} samples named");
    assert_eq!(code, Some(0), "{TEST}: {logs}");
    assert!(
        all >= 100 && pct(user, all) < 10.0,
        "{TEST}: without CAP_DAC_READ_SEARCH the closed directory's binary should go unread, \
         yet {user} of {all} samples were named"
    );

    // Root sees the kernel's addresses without CAP_SYSLOG on a machine
    // that shows them to all: then there is nothing to show here.
    if needs_syslog {
        let (code, logs, named) = run("no_syslog", &without("syslog"));
        println!(
            "{TEST}: without syslog: exit {code:?}, {} of the {} samples with kernel frames name \
             them all",
            named.kernel_named, named.in_kernel
        );
        assert_eq!(code, Some(0), "{TEST}: {logs}");
        assert!(
            named.in_kernel >= 50 && pct(named.kernel_named, named.in_kernel) < 10.0,
            "{TEST}: without CAP_SYSLOG kernel frames should go unnamed, yet {} of {} samples \
             named them",
            named.kernel_named,
            named.in_kernel
        );
    } else {
        println!(
            "{TEST}: /proc/kallsyms shows addresses without CAP_SYSLOG here (kptr_restrict 0, \
             perf_event_paranoid at most 1): its need is not shown"
        );
    }
    let _ = fixture.kill();
    let _ = fixture.wait();
}

/// `GET http://ADDR/PATH`: (status, body).
fn get(address: std::net::SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5))
    else {
        return (0, String::new());
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A child process killed (and reaped) when the test is done with it,
/// whether it passes or not.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `path` until `want(status, body)` or `timeout`; the last answer.
fn poll(
    address: std::net::SocketAddr,
    path: &str,
    timeout: Duration,
    want: impl Fn(u16, &str) -> bool,
) -> (u16, String) {
    let deadline = Instant::now() + timeout;
    loop {
        let (status, body) = get(address, path);
        if want(status, &body) || Instant::now() >= deadline {
            return (status, body);
        }
        sleep(Duration::from_millis(200));
    }
}

#[test]
fn readiness_follows_the_first_batch_and_the_sinks() {
    const TEST: &str = "readiness_follows_the_first_batch_and_the_sinks";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let dir = tmp();
    // A port nothing listens on: every export fails.
    let dead = support::net::HeldPort::hold();
    let dead_port = dead.address.port();
    let common = [
        s("--sampling-frequency"),
        s("19"),
        s("--http-address"),
        s("127.0.0.1:0"),
    ];

    let logs = dir.path().join("failing");
    std::fs::create_dir(&logs).unwrap();
    let mut args = common.to_vec();
    args.extend([
        s("--otlp-endpoint"),
        format!("http://127.0.0.1:{dead_port}"),
        s("--reporter-interval"),
        s("2s"),
    ]);
    // A batch without samples sends nothing (and fails nothing): on an
    // idle machine at 19 Hz the first ones may be empty, so something runs.
    let busy = KilledOnDrop(
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("start a busy shell"),
    );
    let mut icecore = Icecore::spawn(&args, &logs);
    let address = icecore.http_address(Duration::from_secs(30));
    let (status, body) = poll(
        address,
        "/readyz",
        Duration::from_secs(20),
        |status, body| status == 503 && body.contains("otlp: the last export failed"),
    );
    println!("{TEST}: OTLP endpoint down: /readyz {status} {body:?}");
    assert!(
        status == 503 && body.contains("otlp: the last export failed"),
        "{TEST}: /readyz with the OTLP endpoint down: {status} {body:?}\n{}",
        icecore.logs()
    );
    assert_eq!(get(address, "/healthz").0, 200, "{TEST}: /healthz stays up");
    // It exits 1 (nothing was delivered), as it should.
    icecore.signal(15);
    icecore.wait_exit(Duration::from_secs(60));
    drop(busy);

    let logs = dir.path().join("working");
    std::fs::create_dir(&logs).unwrap();
    // A 5 s interval: the first answer comes before the first batch.
    let mut args = common.to_vec();
    args.extend([
        s("--pprof-dir"),
        s(logs.join("pprof").display()),
        s("--reporter-interval"),
        s("5s"),
    ]);
    let mut icecore = Icecore::spawn(&args, &logs);
    let address = icecore.http_address(Duration::from_secs(30));
    let (status, body) = poll(address, "/readyz", Duration::from_secs(5), |status, _| {
        status != 0
    });
    println!("{TEST}: before the first batch: /readyz {status} {body:?}");
    assert!(
        status == 503 && body.contains("sampling: no batch produced yet"),
        "{TEST}: before the first batch: {status} {body:?}"
    );
    let (status, body) = poll(address, "/readyz", Duration::from_secs(20), |status, _| {
        status == 200
    });
    println!("{TEST}: pprof files only: /readyz {status} {body:?}");
    assert_eq!(status, 200, "{TEST}: {body:?}\n{}", icecore.logs());
    icecore.stop();
}
