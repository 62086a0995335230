// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The agent's own telemetry: with `--self-traces` its spans reach an OTLP
//! trace sink (an in-test `TraceService` server, decoding with the
//! OpenTelemetry protos), as one trace per start-up with the process
//! descriptions inside it, plus table builds and exports; and its log
//! lines come as JSON or logfmt when asked.
//!
//! Needs root (it loads BPF programs); without root it prints why it is
//! skipped and passes.
//!
//!     sudo -E cargo test --release --test integration -- telemetry:: --test-threads=1 --nocapture

use crate::support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use support::fixture::Mode;
use support::receiver::OtlpReceiver;
use support::run::{EXIT_GRACE, Target, base_args_at, duration_args, s};
use support::{HZ, Icecore, require_root, serial};

#[derive(Default, Clone)]
struct TraceSink {
    requests: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

#[tonic::async_trait]
impl TraceService for TraceSink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.requests.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// Serves the sink on 127.0.0.1 on a runtime of its own.
fn serve(sink: TraceSink) -> (SocketAddr, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = listener.local_addr().unwrap();
    runtime.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(sink))
            .serve_with_incoming(incoming)
            .await;
    });
    (address, runtime)
}

#[test]
fn self_traces_reach_an_otlp_trace_sink() {
    const TEST: &str = "self_traces_reach_an_otlp_trace_sink";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let sink = TraceSink::default();
    let (address, _runtime) = serve(sink.clone());
    let profiles = OtlpReceiver::start();
    let target = Target::start(Mode::Cycle);
    let mut args = base_args_at(target.pid(), HZ);
    args.extend([
        s("--otlp-endpoint"),
        profiles.endpoint(),
        s("--self-traces"),
    ]);
    args.extend(duration_args(Duration::from_secs(4)));
    // The traces go to their own endpoint, named as the SDKs name it.
    let wrapper = [
        s("env"),
        format!("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://{address}"),
    ];
    let mut icecore = Icecore::spawn_wrapped(&wrapper, &args, target.dir());
    icecore.wait_success(Duration::from_secs(4) + EXIT_GRACE);

    let requests = sink.requests.lock().unwrap().clone();
    let spans: Vec<&Span> = requests
        .iter()
        .flat_map(|r| &r.resource_spans)
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
        .collect();
    let names: std::collections::BTreeMap<&str, usize> =
        spans.iter().fold(Default::default(), |mut m, s| {
            *m.entry(s.name.as_str()).or_default() += 1;
            m
        });
    println!(
        "{TEST}: {} requests, spans by name: {names:?}",
        requests.len()
    );
    for name in [
        "startup",
        "describe_processes",
        "build_unwind_table",
        "export",
    ] {
        assert!(
            names.contains_key(name),
            "{TEST}: no {name:?} span among {names:?}\n{}",
            icecore.logs()
        );
    }
    let service = requests[0].resource_spans[0]
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .find(|a| a.key == "service.name")
        .and_then(|a| a.value.as_ref()?.value.clone());
    assert_eq!(service, Some(Value::StringValue("icecore".into())));
    let one = |name: &str| spans.iter().find(|s| s.name == name).unwrap();
    let (startup, describe) = (one("startup"), one("describe_processes"));
    assert_eq!(describe.trace_id, startup.trace_id, "{TEST}: one trace");
    assert_eq!(
        describe.parent_span_id, startup.span_id,
        "{TEST}: the descriptions happen inside the start-up"
    );
    let export = one("export");
    let endpoint = export
        .attributes
        .iter()
        .find(|a| a.key == "endpoint")
        .and_then(|a| a.value.as_ref()?.value.clone());
    assert_eq!(endpoint, Some(Value::StringValue(profiles.endpoint())));
}

#[test]
fn log_lines_are_json_or_logfmt_as_asked() {
    const TEST: &str = "log_lines_are_json_or_logfmt_as_asked";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let target = Target::start(Mode::Cycle);
    for format in ["json", "logfmt"] {
        let logs = target.make_subdir(format);
        let mut args = base_args_at(target.pid(), HZ);
        args.extend([
            s("--log-format"),
            s(format),
            s("--pprof-dir"),
            s(logs.join("pprof").display()),
        ]);
        args.extend(duration_args(Duration::from_secs(2)));
        let mut icecore = Icecore::spawn(&args, &logs);
        icecore.wait_success(Duration::from_secs(2) + EXIT_GRACE);
        let stderr = icecore.stderr();
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        println!(
            "{TEST}: {format}: {} lines, first {:?}",
            lines.len(),
            lines.first()
        );
        assert!(lines.len() >= 3, "{TEST}: {format}: {stderr}");
        for line in &lines {
            match format {
                "json" => {
                    let value: serde_json::Value = serde_json::from_str(line)
                        .unwrap_or_else(|e| panic!("{TEST}: not JSON ({e}): {line}"));
                    for key in ["timestamp", "level", "message", "target"] {
                        assert!(value.get(key).is_some(), "{TEST}: no {key} in {line}");
                    }
                }
                _ => {
                    assert!(
                        line.starts_with("ts=")
                            && line.contains(" level=")
                            && line.contains(" msg="),
                        "{TEST}: not logfmt: {line}"
                    );
                }
            }
        }
        assert!(
            lines.iter().any(|l| l.contains("icecore stopped")),
            "{TEST}: {format}: the last line is missing"
        );
    }
}
