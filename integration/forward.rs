// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end test of icecore as a relay: OTLP profiles sent to its
//! `--otlp-listen` port by another process reach both of its sinks, while
//! malformed, oversized, unauthenticated and flooding requests are refused
//! with bounded memory.
//!
//! Needs root (it loads BPF programs); without root it prints why it is
//! skipped and passes.
//!
//!     sudo -E cargo test --release --test integration -- forward:: --nocapture

use crate::support;

use std::time::{Duration, Instant};

use support::fixture::Mode;
use support::receiver::OtlpReceiver;
use support::run::{EXIT_GRACE, Target, base_args_at, duration_args, s};
use support::summary::total;
use support::{HZ, Icecore, otlp, pprof, receiver_client, require_root, serial};

/// `VmHWM` of a process, in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// OTLP received on --otlp-listen reaches both sinks; malformed, oversized
/// and unauthenticated requests are refused while valid ones keep passing.
#[test]
fn received_otlp_is_forwarded_and_bad_input_refused() {
    const TEST: &str = "received_otlp_is_forwarded_and_bad_input_refused";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    const RUN: Duration = Duration::from_secs(10);
    let target = Target::start(Mode::Cycle);
    let upstream = OtlpReceiver::start();
    let pprof_dir = target.make_subdir("pprof");
    let token_file = target.dir().join("listen-token");
    std::fs::write(&token_file, "let-me-in\n").unwrap();
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut args = base_args_at(target.pid(), HZ);
    args.extend([
        s("--otlp-endpoint"),
        upstream.endpoint(),
        s("--pprof-dir"),
        s(pprof_dir.display()),
        s("--otlp-listen"),
        s(listen),
        s("--otlp-listen-bearer-token-file"),
        s(token_file.display()),
    ]);
    args.extend(duration_args(RUN));
    let mut icecore = Icecore::spawn(&args, target.dir());
    let url = format!("http://{listen}");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let token = Some("let-me-in");
    let mut accepted = 0usize;
    runtime.block_on(async {
        // Wait for the receiver to listen.
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(listen).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "icecore never listened on {listen}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let valid = receiver_client::remote_request;
        assert_eq!(
            receiver_client::send(&url, valid(), None).await,
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            receiver_client::send(&url, valid(), Some("wrong")).await,
            tonic::Code::Unauthenticated
        );
        // A flood of malformed requests, each followed by a valid one.
        for i in 0..100 {
            let mut bad = valid();
            let sample = &mut bad.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
            match i % 3 {
                0 => sample.stack_index = 7,
                1 => sample.timestamps_unix_nano.clear(),
                _ => bad.dictionary.as_mut().unwrap().function_table[2].name_strindex = 99,
            }
            assert_eq!(
                receiver_client::send(&url, bad, token).await,
                tonic::Code::InvalidArgument,
                "malformed request {i}"
            );
            if i % 10 == 0 {
                assert_eq!(
                    receiver_client::send(&url, valid(), token).await,
                    tonic::Code::Ok
                );
                accepted += 1;
            }
        }
        // Oversized: 20 MiB of strings, over the 16 MiB limit.
        let mut huge = valid();
        huge.dictionary
            .as_mut()
            .unwrap()
            .string_table
            .extend((0..20).map(|_| "x".repeat(1 << 20)));
        assert_eq!(
            receiver_client::send(&url, huge, token).await,
            tonic::Code::InvalidArgument,
            "oversized request"
        );
        // A flood of 24 concurrent 15 MiB requests, each with a dangling
        // index deep inside: refused as invalid once decoded, or at once
        // with RESOURCE_EXHAUSTED while the memory budget is taken by the
        // others, so memory is bounded by the budget rather than the flood.
        let mut big_bad = valid();
        big_bad
            .dictionary
            .as_mut()
            .unwrap()
            .string_table
            .extend((0..15).map(|_| "y".repeat((1 << 20) - 64)));
        big_bad.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = 9;
        let flood: Vec<_> = (0..24)
            .map(|_| {
                let request = big_bad.clone();
                let url = url.clone();
                tokio::spawn(async move { receiver_client::send(&url, request, token).await })
            })
            .collect();
        let (mut invalid, mut exhausted) = (0, 0);
        for task in flood {
            match task.await.unwrap() {
                tonic::Code::InvalidArgument => invalid += 1,
                tonic::Code::ResourceExhausted => exhausted += 1,
                other => panic!("a flooding request got {other:?}"),
            }
        }
        println!("flood of 24: {invalid} refused as invalid, {exhausted} as over the budget");
        assert!(invalid > 0, "no flooding request was decoded and refused");
        assert_eq!(
            receiver_client::send(&url, valid(), token).await,
            tonic::Code::Ok
        );
        accepted += 1;
    });
    // OTLP/HTTP too, with curl as the client.
    let body = target.dir().join("request.pb");
    std::fs::write(
        &body,
        prost::Message::encode_to_vec(&receiver_client::remote_request()),
    )
    .unwrap();
    let curl = |auth: &str| {
        let out = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
            .args(["-H", "content-type: application/x-protobuf", "-H", auth])
            .arg("--data-binary")
            .arg(format!("@{}", body.display()))
            .arg(format!("http://{listen}/v1development/profiles"))
            .output()
            .expect("run curl");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert_eq!(curl("authorization: Bearer let-me-in"), "200");
    accepted += 1;
    assert_eq!(curl("x-none: 1"), "401");
    let peak_rss_kib = peak_rss_kib(icecore.pid());
    icecore.wait_success(RUN + EXIT_GRACE);
    println!(
        "icecore peak RSS after the floods: {} MiB",
        peak_rss_kib / 1024
    );
    // The receiver's 128 MiB budget plus the agent's own memory.
    assert!(
        peak_rss_kib < 200 * 1024,
        "peak RSS {peak_rss_kib} KiB: the flood was not bounded"
    );

    let remote = |samples: &[support::summary::DecodedSample]| -> u64 {
        samples
            .iter()
            .filter(|s| s.contains("remote_leaf") && s.pid == Some(receiver_client::REMOTE_PID))
            .map(|s| s.count)
            .sum()
    };
    let expected = (accepted * receiver_client::SAMPLES_PER_REQUEST) as u64;
    // Forwarded requests keep the remote producer's shape (no thread or
    // frame-type attributes, its own period), so they are decoded without
    // the checks icecore's own output must pass.
    let forwarded = otlp::decode::samples(&upstream.requests());
    let written = pprof::all_samples(&pprof::decode_dir(&pprof_dir));
    println!(
        "accepted {accepted} requests: upstream OTLP got {} remote samples, pprof {}",
        remote(&forwarded),
        remote(&written)
    );
    assert_eq!(remote(&forwarded), expected);
    assert_eq!(remote(&written), expected);
    // The local profile kept flowing alongside.
    assert!(total(&forwarded) > expected);
    let metrics_seen = icecore.stderr();
    assert!(!metrics_seen.contains("panicked"), "{metrics_seen}");
}
