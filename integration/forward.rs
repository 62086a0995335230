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
//!     sudo -E cargo test --test forward -- --nocapture

// Test code: a panic is how a helper reports a failed expectation.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[allow(
    dead_code,
    reason = "support/ serves several test targets; this one uses only part of it"
)]
mod support;

use std::time::{Duration, Instant};

use support::fixture::Mode;
use support::receiver::OtlpReceiver;
use support::run::{EXIT_GRACE, Target, base_args_at, duration_args, s};
use support::summary::total;
use support::{HZ, Icecore, otlp, pprof, require_root, serial};

/// `VmHWM` of a process, in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

mod forwarding {
    use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
    use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::profiles::v1development::{
        Function, Line, Location, Profile, ProfilesDictionary, ResourceProfiles, Sample,
        ScopeProfiles, Stack, ValueType,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;

    pub const REMOTE_PID: i64 = 4242;
    pub const SAMPLES_PER_REQUEST: usize = 50;

    fn kv(key: &str, value: any_value::Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..KeyValue::default()
        }
    }

    /// A CPU profile of a process that is not on this host, built directly
    /// from the proto types: `remote_main -> remote_leaf`, 50 samples.
    pub fn remote_request() -> ExportProfilesServiceRequest {
        let strings = [
            "",
            "samples",
            "count",
            "cpu",
            "nanoseconds",
            "remote_main",
            "remote_leaf",
        ];
        let now = super::support::now_unix_nanos();
        let dictionary = ProfilesDictionary {
            string_table: strings.iter().map(|s| (*s).to_owned()).collect(),
            function_table: vec![
                Function::default(),
                Function {
                    name_strindex: 5,
                    ..Function::default()
                },
                Function {
                    name_strindex: 6,
                    ..Function::default()
                },
            ],
            location_table: vec![
                Location::default(),
                Location {
                    lines: vec![Line {
                        function_index: 1,
                        ..Line::default()
                    }],
                    ..Location::default()
                },
                Location {
                    lines: vec![Line {
                        function_index: 2,
                        ..Line::default()
                    }],
                    ..Location::default()
                },
            ],
            stack_table: vec![
                Stack::default(),
                Stack {
                    location_indices: vec![2, 1],
                },
            ],
            mapping_table: vec![Default::default()],
            link_table: vec![Default::default()],
            attribute_table: vec![Default::default()],
        };
        let profile = Profile {
            sample_type: Some(ValueType {
                type_strindex: 1,
                unit_strindex: 2,
            }),
            period_type: Some(ValueType {
                type_strindex: 3,
                unit_strindex: 4,
            }),
            period: 10_000_000,
            time_unix_nano: now - 1_000_000_000,
            duration_nano: 1_000_000_000,
            samples: vec![Sample {
                stack_index: 1,
                timestamps_unix_nano: (0..SAMPLES_PER_REQUEST as u64)
                    .map(|i| now - 1_000_000_000 + i * 10_000_000)
                    .collect(),
                ..Sample::default()
            }],
            ..Profile::default()
        };
        ExportProfilesServiceRequest {
            resource_profiles: vec![ResourceProfiles {
                resource: Some(Resource {
                    attributes: vec![
                        kv(
                            "service.name",
                            any_value::Value::StringValue("remote-app".into()),
                        ),
                        kv("process.pid", any_value::Value::IntValue(REMOTE_PID)),
                        kv(
                            "process.executable.name",
                            any_value::Value::StringValue("remote".into()),
                        ),
                    ],
                    ..Resource::default()
                }),
                scope_profiles: vec![ScopeProfiles {
                    profiles: vec![profile],
                    ..ScopeProfiles::default()
                }],
                ..ResourceProfiles::default()
            }],
            dictionary: Some(dictionary),
        }
    }

    /// Sends `request` with an optional bearer token; the gRPC status code.
    pub async fn send(
        url: &str,
        request: ExportProfilesServiceRequest,
        token: Option<&str>,
    ) -> tonic::Code {
        let mut client = ProfilesServiceClient::connect(url.to_owned())
            .await
            .expect("connect to icecore's receiver")
            .max_encoding_message_size(64 << 20);
        let mut request = tonic::Request::new(request);
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        match client.export(request).await {
            Ok(_) => tonic::Code::Ok,
            Err(status) => {
                println!("refused: {:?} {}", status.code(), status.message());
                status.code()
            }
        }
    }
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
        let valid = forwarding::remote_request;
        assert_eq!(
            forwarding::send(&url, valid(), None).await,
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            forwarding::send(&url, valid(), Some("wrong")).await,
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
                forwarding::send(&url, bad, token).await,
                tonic::Code::InvalidArgument,
                "malformed request {i}"
            );
            if i % 10 == 0 {
                assert_eq!(
                    forwarding::send(&url, valid(), token).await,
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
            forwarding::send(&url, huge, token).await,
            tonic::Code::InvalidArgument,
            "oversized request"
        );
        // A flood of 24 concurrent 15 MiB requests, each with a dangling
        // index deep inside: refused, with memory bounded by the receiver's
        // concurrency limit rather than by the flood.
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
                tokio::spawn(async move { forwarding::send(&url, request, token).await })
            })
            .collect();
        for task in flood {
            assert_eq!(task.await.unwrap(), tonic::Code::InvalidArgument);
        }
        assert_eq!(
            forwarding::send(&url, valid(), token).await,
            tonic::Code::Ok
        );
        accepted += 1;
    });
    // OTLP/HTTP too, with curl as the client.
    let body = target.dir().join("request.pb");
    std::fs::write(
        &body,
        prost::Message::encode_to_vec(&forwarding::remote_request()),
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
    // 4 requests decoded at once, 16 MiB each (about 195 MiB measured);
    // without the concurrency limit the same flood peaks at about 334 MiB.
    assert!(
        peak_rss_kib < 280 * 1024,
        "peak RSS {peak_rss_kib} KiB: the flood was not bounded"
    );

    let remote = |samples: &[support::summary::DecodedSample]| -> u64 {
        samples
            .iter()
            .filter(|s| s.contains("remote_leaf") && s.pid == Some(forwarding::REMOTE_PID))
            .map(|s| s.count)
            .sum()
    };
    let expected = (accepted * forwarding::SAMPLES_PER_REQUEST) as u64;
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
