// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of the exporters: the real `icecore` binary profiles a
//! fixture while its OTLP endpoint misbehaves, and what arrives is decoded
//! by the in-test receiver and compared with the pprof files written in the
//! same run (a sink the outage does not touch).
//!
//! Needs root (it loads BPF programs); without root it prints why it is
//! skipped and passes.
//!
//!     sudo -E cargo test --test export -- --nocapture

// Test code: a panic is how a helper reports a failed expectation.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[allow(
    dead_code,
    reason = "support/ serves several test targets; this one uses only part of it"
)]
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::fixture::Mode;
use support::python_otlp::PythonReceiver;
use support::receiver::OtlpReceiver;
use support::run::{EXIT_GRACE, Target, base_args_at, duration_args, s};
use support::summary::{inclusive, pct, total};
use support::{HZ, Icecore, otlp, pprof, require_root, serial};

/// The endpoint is down for the first seconds of the run; every sample the
/// pprof sink got still arrives over OTLP, with the configured headers.
#[test]
fn samples_survive_an_endpoint_outage() {
    const TEST: &str = "samples_survive_an_endpoint_outage";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    const RUN: Duration = Duration::from_secs(10);
    const OUTAGE: Duration = Duration::from_secs(5);

    // An address nothing listens on yet.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let target = Target::start(Mode::Cycle);
    let pprof_dir = target.make_subdir("pprof");
    let token_file = target.dir().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let mut args = base_args_at(target.pid(), HZ);
    args.extend([
        s("--otlp-endpoint"),
        format!("http://{addr}"),
        s("--otlp-header"),
        s("X-Scope-OrgID=team-a"),
        s("--otlp-bearer-token-file"),
        s(token_file.display()),
        s("--pprof-dir"),
        s(pprof_dir.display()),
    ]);
    args.extend(duration_args(RUN));
    let started = Instant::now();
    let mut icecore = Icecore::spawn(&args, target.dir());

    std::thread::sleep(OUTAGE);
    let up_unix_nanos = support::now_unix_nanos();
    let receiver = OtlpReceiver::start_on(addr);
    let down_for = started.elapsed();
    icecore.wait_success(RUN + EXIT_GRACE);

    let written = pprof::read_valid(&pprof_dir, HZ);
    let received = otlp::receive_valid(receiver.requests(), HZ);
    let (t_otlp, t_pprof) = (total(&received.samples), total(&written.samples));
    let stderr = icecore.stderr();
    println!(
        "endpoint down for {down_for:?}: OTLP {t_otlp} samples in {} requests, pprof {t_pprof} in {} files",
        received.requests.len(),
        written.profiles.len()
    );
    // Batches whose window closed while the endpoint was down waited in
    // the queue and arrived later.
    let queued = received
        .requests
        .iter()
        .filter(|r| {
            let profile = &r.request.resource_profiles[0].scope_profiles[0].profiles[0];
            profile.time_unix_nano + profile.duration_nano < up_unix_nanos
        })
        .count();
    assert!(
        queued >= 2,
        "only {queued} batches were made during the outage"
    );
    assert!(
        stderr.contains("retrying"),
        "no retry was logged:\n{stderr}"
    );
    assert_eq!(t_otlp, t_pprof, "samples lost over OTLP");
    assert_eq!(received.requests.len(), written.profiles.len());
    assert!(t_otlp > 0);
    for request in &received.requests {
        let header = |name: &str| {
            request
                .headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(header("x-scope-orgid"), Some("team-a"));
        assert_eq!(header("authorization"), Some("Bearer s3cret-token"));
    }
    assert!(
        !stderr.contains("s3cret-token"),
        "the token leaked into the logs"
    );
}

/// The official Python bindings (PyPI `opentelemetry-proto`) receive the
/// export over gRPC and decode the same samples the pprof sink wrote.
#[test]
fn the_official_python_bindings_decode_the_export() {
    const TEST: &str = "the_official_python_bindings_decode_the_export";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    const RUN: Duration = Duration::from_secs(6);
    let target = Target::start(Mode::Cycle);
    let receiver = PythonReceiver::start(target.dir());
    let pprof_dir = target.make_subdir("pprof");
    let mut args = base_args_at(target.pid(), HZ);
    args.extend([
        s("--otlp-endpoint"),
        format!("http://127.0.0.1:{}", receiver.port),
        s("--service-name"),
        s("checkout"),
        s("--pprof-dir"),
        s(pprof_dir.display()),
    ]);
    args.extend(duration_args(RUN));
    let mut icecore = Icecore::spawn(&args, target.dir());
    icecore.wait_success(RUN + EXIT_GRACE);

    let written = pprof::read_valid(&pprof_dir, HZ);
    let summary = receiver.summary();
    println!("Python receiver decoded: {summary}");
    assert_eq!(summary["problems"], serde_json::json!([]));
    let samples = summary["samples"].as_u64().unwrap();
    assert_eq!(samples, total(&written.samples), "Python vs pprof totals");
    assert_eq!(
        summary["requests"].as_u64().unwrap(),
        written.profiles.len() as u64
    );
    let python = |f: &str| summary["inclusive"][f].as_u64().unwrap_or(0);
    for function in ["main", "hot_alpha", "warm_beta"] {
        assert_eq!(
            python(function),
            inclusive(&written.samples, function),
            "{function}: Python vs pprof"
        );
    }
    let alpha = pct(
        python("hot_alpha"),
        python("hot_alpha") + python("warm_beta"),
    );
    assert!((alpha - 75.0).abs() <= 5.0, "hot_alpha share {alpha:.1}%");
    let resources = summary["resources"].as_array().unwrap();
    assert!(!resources.is_empty());
    for resource in resources {
        assert_eq!(resource["service.name"], "checkout");
        assert_eq!(resource["process.pid"], i64::from(target.pid()));
    }
}

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

mod parca_store {
    use std::sync::{Arc, Mutex};

    use icecore_otlp::export::parca::proto::profile_store_service_server::{
        ProfileStoreService, ProfileStoreServiceServer,
    };
    use icecore_otlp::export::parca::proto::{WriteRawRequest, WriteRawResponse};

    /// A WriteRaw server generated from Parca's proto; keeps every request.
    #[derive(Default, Clone)]
    pub struct ParcaStore {
        pub requests: Arc<Mutex<Vec<WriteRawRequest>>>,
    }

    #[tonic::async_trait]
    impl ProfileStoreService for ParcaStore {
        async fn write_raw(
            &self,
            request: tonic::Request<WriteRawRequest>,
        ) -> Result<tonic::Response<WriteRawResponse>, tonic::Status> {
            self.requests.lock().unwrap().push(request.into_inner());
            Ok(tonic::Response::new(WriteRawResponse::default()))
        }
    }

    /// Serves on 127.0.0.1 from a runtime of its own; returns the port.
    pub fn serve(store: ParcaStore, runtime: &tokio::runtime::Runtime) -> u16 {
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(ProfileStoreServiceServer::new(store))
                    .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
            );
            port
        })
    }
}

/// `--parca-endpoint`: a WriteRaw server built from Parca's proto receives
/// one labelled series per process per batch, holding the same samples as
/// the pprof files of the same run.
#[test]
fn parca_write_raw_receives_labelled_series() {
    const TEST: &str = "parca_write_raw_receives_labelled_series";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    const RUN: Duration = Duration::from_secs(6);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = parca_store::ParcaStore::default();
    let port = parca_store::serve(store.clone(), &runtime);
    let target = Target::start(Mode::Cycle);
    let pprof_dir = target.make_subdir("pprof");
    let mut args = base_args_at(target.pid(), HZ);
    args.extend([
        s("--parca-endpoint"),
        format!("http://127.0.0.1:{port}"),
        s("--pprof-dir"),
        s(pprof_dir.display()),
    ]);
    args.extend(duration_args(RUN));
    let mut icecore = Icecore::spawn(&args, target.dir());
    icecore.wait_success(RUN + EXIT_GRACE);

    let written = pprof::read_valid(&pprof_dir, HZ);
    let requests = store.requests.lock().unwrap().clone();
    let mut parca_samples = 0u64;
    let mut series = 0;
    for request in &requests {
        assert!(!request.normalized);
        for s in &request.series {
            series += 1;
            let labels = &s.labels.as_ref().unwrap().labels;
            let label = |name: &str| {
                labels
                    .iter()
                    .find(|l| l.name == name)
                    .map(|l| l.value.clone())
            };
            assert_eq!(label("__name__").as_deref(), Some("process_cpu"));
            assert_eq!(label("pid"), Some(target.pid().to_string()));
            assert_eq!(label("comm").as_deref(), Some("busy"));
            for sample in &s.samples {
                assert_eq!(sample.raw_profile[..2], [0x1f, 0x8b], "gzipped pprof");
                let mut raw = Vec::new();
                std::io::Read::read_to_end(
                    &mut flate2::read::GzDecoder::new(sample.raw_profile.as_slice()),
                    &mut raw,
                )
                .unwrap();
                let profile = pprof::decode_bytes(&raw, Path::new("parca"));
                parca_samples += total(&pprof::all_samples(&[profile]));
            }
        }
    }
    println!(
        "Parca got {series} series in {} requests, {parca_samples} samples; pprof files {}",
        requests.len(),
        total(&written.samples)
    );
    assert!(series >= 2);
    assert_eq!(parca_samples, total(&written.samples));
}

/// `GET /debug/pprof/profile?seconds=N` answers with a gzipped pprof of the
/// next N seconds, decodable by an independent pprof reader.
#[test]
fn pull_endpoint_serves_the_next_seconds_as_pprof() {
    const TEST: &str = "pull_endpoint_serves_the_next_seconds_as_pprof";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    const RUN: Duration = Duration::from_secs(14);
    const PULL_SECONDS: u64 = 4;
    let target = Target::start(Mode::Cycle);
    let pprof_dir = target.make_subdir("pprof");
    let mut args = base_args_at(target.pid(), HZ);
    args.extend([s("--pprof-dir"), s(pprof_dir.display())]);
    args.extend(duration_args(RUN));
    let mut icecore = Icecore::spawn(&args, target.dir());
    let addr = icecore.http_address(Duration::from_secs(20));
    let get = |query: &str, out: &Path| {
        let result = std::process::Command::new("curl")
            .args(["-s", "-o"])
            .arg(out)
            .args(["-w", "%{http_code}", "--max-time", "60"])
            .arg(format!("http://{addr}/debug/pprof/profile{query}"))
            .output()
            .expect("run curl");
        String::from_utf8_lossy(&result.stdout).to_string()
    };
    let bad = target.dir().join("bad");
    assert_eq!(get("?seconds=0", &bad), "400");
    assert_eq!(get("?seconds=ten", &bad), "400");
    let pulled = target.dir().join("pulled.pb.gz");
    let started = Instant::now();
    assert_eq!(get(&format!("?seconds={PULL_SECONDS}"), &pulled), "200");
    let took = started.elapsed();
    icecore.wait_success(RUN + EXIT_GRACE);

    let gz = std::fs::read(&pulled).unwrap();
    assert_eq!(gz[..2], [0x1f, 0x8b], "gzipped");
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gz.as_slice()), &mut raw).unwrap();
    let profile = pprof::decode_bytes(&raw, &pulled);
    pprof::assert_valid(std::slice::from_ref(&profile), HZ);
    let samples = pprof::all_samples(std::slice::from_ref(&profile));
    let n = total(&samples);
    let expected = PULL_SECONDS * u64::from(HZ);
    println!(
        "pulled {PULL_SECONDS} s in {took:?}: {n} samples (a busy CPU at {HZ} Hz: {expected})"
    );
    assert!(
        took >= Duration::from_secs(PULL_SECONDS),
        "answered before the window closed"
    );
    assert!(
        n as f64 >= expected as f64 * 0.8 && n as f64 <= expected as f64 * 1.1,
        "{n} samples for {expected} expected"
    );
    assert!(inclusive(&samples, "hot_alpha") > 0);
    assert!(
        samples
            .iter()
            .all(|s| s.pid == Some(i64::from(target.pid())))
    );
}
