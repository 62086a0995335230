// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! Least privilege, end to end: started as root with `--user nobody`, the
//! agent runs as nobody with exactly the documented capabilities in every
//! thread (permitted, effective and bounding; nothing inheritable or
//! ambient; `no_new_privs`), and still profiles processes of root whose
//! binary sits in a directory closed to others: complete native stacks
//! (of a binary first seen after the drop too, whose unwind table is a new
//! BPF map) and named kernel frames, with nothing refused in the logs. Its HTTP endpoint, with a token and a
//! certificate, answers HTTPS only, 401 without the right token, and its
//! probes stay open. An unknown user and bad certificate files are refused
//! before anything is loaded.
//!
//!     sudo -E cargo test --release --test integration -- privilege:: --test-threads=1 --nocapture

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::fixture::{Fixture, Mode};
use support::pprof::{all_samples, decode_dir};
use support::run::{EXIT_GRACE, Target, duration_args, s, system_wide_args};
use support::summary::{count_where, filtered, looks_like_symbol, pct, total};
use support::{HZ, Icecore, require_root, serial};

/// The capabilities the agent keeps (src/privileges/mod.rs, KEPT):
/// DAC_READ_SEARCH 2, SYS_PTRACE 19, SYSLOG 34, BPF 39, CHECKPOINT_RESTORE 40.
const KEPT: u64 = 1 << 2 | 1 << 19 | 1 << 34 | 1 << 39 | 1 << 40;
const NOBODY: u32 = 65534;

/// The fields of a `status` file the test compares.
fn creds(status: &str) -> (Vec<u32>, [u64; 5], String) {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("no {name} in\n{status}"))
            .trim()
            .to_owned()
    };
    let mask = |name: &str| u64::from_str_radix(&field(name), 16).unwrap();
    let uids = field("Uid")
        .split_whitespace()
        .map(|u| u.parse().unwrap())
        .collect();
    (
        uids,
        [
            mask("CapPrm"),
            mask("CapEff"),
            mask("CapBnd"),
            mask("CapInh"),
            mask("CapAmb"),
        ],
        field("NoNewPrivs"),
    )
}

/// A self-signed certificate for 127.0.0.1 and localhost (the test's CA
/// too) and its key, as PEM files in `dir`: (certificate, key).
fn certificate(dir: &Path) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.subject_alt_names.push(rcgen::SanType::IpAddress(
        std::net::Ipv4Addr::LOCALHOST.into(),
    ));
    let cert = params.self_signed(&key).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    (
        write("cert.pem", &cert.pem()),
        write("key.pem", &key.serialize_pem()),
    )
}

/// `curl ARGS URL`: the HTTP status, "000" when no HTTP answer came.
fn curl(args: &[&str], url: &str) -> String {
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
        ])
        .args(args)
        .arg(url)
        .output()
        .expect("run curl");
    let code = String::from_utf8_lossy(&out.stdout).to_string();
    println!(
        "curl {args:?} {url}: {code} ({}) {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    code
}

#[test]
fn runs_as_nobody_with_the_kept_capabilities_and_still_profiles() {
    const TEST: &str = "runs_as_nobody_with_the_kept_capabilities_and_still_profiles";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    const RUN: Duration = Duration::from_secs(14);
    // Root's processes, their binary in a directory closed to others:
    // nobody reads it through CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE only.
    let target = Target::start(Mode::Cycle);
    let syscalls = Fixture::spawn(&target.exe, Mode::Syscalls);
    std::fs::set_permissions(target.dir(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let pprof_dir = target.make_subdir("pprof");
    std::os::unix::fs::chown(&pprof_dir, Some(NOBODY), Some(NOBODY)).unwrap();
    let token = target.dir().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (cert, key) = certificate(target.dir());
    let ca = cert.clone();

    // A target rather than pids: a fixture started after the drop is
    // profiled too.
    let mut args = system_wide_args(HZ);
    args.extend([
        s("--target"),
        format!("executable={}/busy*", target.dir().display()),
        s("--pprof-dir"),
        s(pprof_dir.display()),
        s("--user"),
        s("nobody"),
        s("--http-bearer-token-file"),
        s(token.display()),
        s("--http-tls-cert"),
        s(&cert),
        s("--http-tls-key"),
        s(&key),
    ]);
    args.extend(duration_args(RUN));
    let mut icecore = Icecore::spawn(&args, target.dir());
    icecore.wait_for_log("privileges lowered", Duration::from_secs(40));
    // A binary first seen after the drop (a copy: tables are per file):
    // its unwind table is a new BPF map, created with CAP_BPF alone.
    let late_exe = target.dir().join("busy-late");
    std::fs::copy(&target.exe, &late_exe).unwrap();
    let late = Fixture::spawn(&late_exe, Mode::Cycle);

    let pid = icecore.pid();
    let tasks: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .collect();
    assert!(tasks.len() > 2, "{} threads", tasks.len());
    for task in &tasks {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap();
        let (uids, caps, no_new_privs) = creds(&status);
        assert_eq!(uids, [NOBODY; 4], "thread {:?}", task.file_name());
        assert_eq!(
            caps,
            [KEPT, KEPT, KEPT, 0, 0],
            "thread {:?}: CapPrm, CapEff, CapBnd, CapInh, CapAmb",
            task.file_name()
        );
        assert_eq!(no_new_privs, "1");
    }
    println!("{} threads as nobody with CapEff {KEPT:016x}", tasks.len());

    let addr = icecore.http_address(Duration::from_secs(5));
    let https = |path: &str| format!("https://{addr}{path}");
    let with_ca = ["--cacert", ca.as_str()];
    assert_eq!(curl(&with_ca, &https("/healthz")), "200", "probe, no token");
    assert_eq!(curl(&with_ca, &https("/metrics")), "401", "no token");
    let wrong = ["--cacert", &ca, "-H", "authorization: Bearer s3cret-tokeN"];
    assert_eq!(curl(&wrong, &https("/metrics")), "401", "wrong token");
    let right = ["--cacert", &ca, "-H", "authorization: Bearer s3cret-token"];
    assert_eq!(curl(&right, &https("/metrics")), "200", "right token");
    assert_eq!(curl(&right, &https("/")), "200", "flame graph page");
    // Plain HTTP to the TLS listener gets no HTTP answer, and an unknown
    // CA is refused by the client.
    assert_eq!(curl(&[], &format!("http://{addr}/healthz")), "000");
    assert_eq!(curl(&[], &https("/healthz")), "000");

    icecore.wait_success(RUN + EXIT_GRACE);
    let samples = all_samples(&decode_dir(&pprof_dir));
    let of = |pid: u32| filtered(&samples, |smp| smp.pid == Some(i64::from(pid)));
    // Complete native stacks of the Cycle fixture: main -> run_cycle -> leaf.
    let cycle = of(target.pid());
    let n = total(&cycle);
    let complete = count_where(&cycle, |smp| {
        smp.contains("main")
            && smp.contains("run_cycle")
            && (smp.contains("hot_alpha") || smp.contains("warm_beta"))
    });
    println!(
        "cycle fixture: {n} samples, {:.1}% complete",
        pct(complete, n)
    );
    assert!(
        n >= 100,
        "{n} samples of a busy process in {RUN:?} at {HZ} Hz"
    );
    assert!(
        pct(complete, n) >= 90.0,
        "{complete} of {n} samples have main -> run_cycle -> hot_alpha/warm_beta\n{}",
        support::summary::top_stacks(&cycle, 8)
    );
    let late_samples = of(late.pid());
    let n = total(&late_samples);
    let complete = count_where(&late_samples, |smp| {
        smp.contains("main") && smp.contains("run_cycle")
    });
    println!(
        "late fixture: {n} samples, {:.1}% complete",
        pct(complete, n)
    );
    assert!(n >= 50, "{n} samples of the fixture started after the drop");
    assert!(
        pct(complete, n) >= 80.0,
        "{complete} of {n} samples of the late fixture have main -> run_cycle\n{}",
        support::summary::top_stacks(&late_samples, 8)
    );
    // Nothing the agent did after the drop was refused.
    let logs = icecore.output().to_lowercase();
    for refused in [
        "operation not permitted",
        "permission denied",
        "eperm",
        "eacces",
    ] {
        let lines: Vec<&str> = logs.lines().filter(|l| l.contains(refused)).collect();
        assert!(
            lines.is_empty(),
            "{refused} in the logs:\n{}",
            lines.join("\n")
        );
    }
    // Kernel frames, named from /proc/kallsyms, which is read after the
    // drop: CAP_SYSLOG.
    let in_kernel = of(syscalls.pid());
    let (mut frames, mut named) = (0u64, 0u64);
    for smp in &in_kernel {
        for frame in smp.stack.iter().filter(|f| f.is_kernel()) {
            frames += smp.count;
            if looks_like_symbol(&frame.function) {
                named += smp.count;
            }
        }
    }
    println!(
        "syscalls fixture: {} samples, {frames} kernel frames, {:.1}% named",
        total(&in_kernel),
        pct(named, frames)
    );
    assert!(
        frames > 0,
        "no kernel frames of the syscalls fixture\n{}",
        support::summary::top_stacks(&in_kernel, 5)
    );
    assert!(
        pct(named, frames) >= 90.0,
        "{named} of {frames} kernel frames named"
    );
}

/// `--check-config` needs no privileges and loads nothing, yet looks the
/// user up and reads the certificate files as a start would.
#[test]
fn an_unknown_user_and_bad_certificates_are_refused_at_start() {
    let dir = support::tmp();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let check = |extra: &[&str]| {
        let out = Command::new(Icecore::binary())
            .args(["--check-config", "--pprof-dir"])
            .arg(dir.path())
            .args(extra)
            .output()
            .expect("run icecore");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, stderr) = check(&["--user", "no-such-user-icecore"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--user no-such-user-icecore: no such user"),
        "{stderr}"
    );
    let junk = junk.display().to_string();
    let (code, stderr) = check(&["--http-tls-cert", &junk, "--http-tls-key", &junk]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--http-tls-cert ") && stderr.contains("no PEM certificate"),
        "{stderr}"
    );
    let (code, stderr) = check(&["--http-tls-cert", &junk]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("go together"), "{stderr}");
    let (code, stderr) = check(&["--user", "nobody"]);
    assert_eq!(code, Some(0), "{stderr}");
}
