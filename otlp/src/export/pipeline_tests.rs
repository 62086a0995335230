//! The pipeline against a real gRPC server that fails on cue.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_server::{
    ProfilesService, ProfilesServiceServer,
};
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use tonic::Code;
use tonic::codec::CompressionEncoding;
use tonic::metadata::MetadataMap;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use super::*;
use crate::model::ProfileBatch;
use crate::test_fixtures;

/// Answers each request with the next scripted code (OK once the script is
/// done), and records the requests it accepted.
#[derive(Default)]
struct ScriptedCollector {
    script: Mutex<VecDeque<Code>>,
    accepted: Mutex<Vec<(MetadataMap, ExportProfilesServiceRequest)>>,
    calls: Mutex<usize>,
}

#[tonic::async_trait]
impl ProfilesService for ScriptedCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportProfilesServiceRequest>,
    ) -> Result<tonic::Response<ExportProfilesServiceResponse>, tonic::Status> {
        *self.calls.lock().unwrap() += 1;
        let code = self.script.lock().unwrap().pop_front().unwrap_or(Code::Ok);
        if code != Code::Ok {
            return Err(tonic::Status::new(code, "scripted failure"));
        }
        let metadata = request.metadata().clone();
        self.accepted
            .lock()
            .unwrap()
            .push((metadata, request.into_inner()));
        Ok(tonic::Response::new(
            ExportProfilesServiceResponse::default(),
        ))
    }
}

struct RunningServer {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl RunningServer {
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

async fn serve(addr: SocketAddr, collector: Arc<ScriptedCollector>) -> RunningServer {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service =
        ProfilesServiceServer::from_arc(collector).accept_compressed(CompressionEncoding::Gzip);
    let task = tokio::spawn(
        Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped.await;
            }),
    );
    RunningServer { stop, task }
}

/// An address nothing listens on (bound, then released).
fn free_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        initial_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(300),
        ..RetryPolicy::default()
    }
}

fn pipeline(addr: SocketAddr, headers: Vec<(String, String)>) -> OtlpPipeline {
    let exporter = OtlpExporter::new(OtlpExporterOptions {
        timeout: Duration::from_secs(2),
        headers,
        ..OtlpExporterOptions::new(format!("http://{addr}"))
    })
    .unwrap();
    OtlpPipeline::start(exporter, fast_retries(), QueueLimits::default())
}

/// The fixture batch, told apart from others by its window start.
fn batch(tag: u64) -> ProfileBatch {
    let mut batch = test_fixtures::batch();
    batch.start_unix_nanos = tag;
    batch
}

fn window_start(request: &ExportProfilesServiceRequest) -> u64 {
    request.resource_profiles[0].scope_profiles[0].profiles[0].time_unix_nano
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_while_the_endpoint_is_down() {
    let addr = free_address();
    let pipeline = pipeline(addr, Vec::new());
    for tag in 1..=3 {
        pipeline.submit(&batch(tag));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stats = pipeline.stats();
    assert_eq!(stats.sent_requests.load(Relaxed), 0);
    assert!(stats.retries.load(Relaxed) >= 2, "{stats:?}");

    let collector = Arc::new(ScriptedCollector::default());
    let server = serve(addr, collector.clone()).await;
    for tag in 4..=5 {
        pipeline.submit(&batch(tag));
    }
    let stats = pipeline.shutdown(Duration::from_secs(20)).await;
    server.stop().await;

    let accepted = collector.accepted.lock().unwrap();
    let tags: Vec<u64> = accepted.iter().map(|(_, r)| window_start(r)).collect();
    assert_eq!(tags, [1, 2, 3, 4, 5], "every batch, in order");
    let samples = 5 * test_fixtures::batch().sample_count();
    assert_eq!(stats.sent_samples.load(Relaxed), samples);
    assert_eq!(stats.dropped_samples(), 0);
    assert_eq!(stats.queued_requests.load(Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_errors_are_retried_and_refusals_dropped() {
    let addr = free_address();
    let collector = Arc::new(ScriptedCollector::default());
    collector.script.lock().unwrap().extend([
        Code::Unavailable,
        Code::ResourceExhausted,
        Code::Ok,
        Code::InvalidArgument,
    ]);
    let server = serve(addr, collector.clone()).await;
    let headers = vec![
        ("X-Scope-OrgID".to_owned(), "team-a".to_owned()),
        ("authorization".to_owned(), "Bearer s3cret".to_owned()),
    ];
    let pipeline = pipeline(addr, headers);
    pipeline.submit(&batch(1));
    pipeline.submit(&batch(2));
    let stats = pipeline.shutdown(Duration::from_secs(20)).await;
    server.stop().await;

    assert_eq!(*collector.calls.lock().unwrap(), 4);
    assert_eq!(stats.retries.load(Relaxed), 2);
    assert_eq!(stats.sent_requests.load(Relaxed), 1);
    let per_batch = test_fixtures::batch().sample_count();
    assert_eq!(stats.dropped_rejected.load(Relaxed), per_batch);
    let accepted = collector.accepted.lock().unwrap();
    let (metadata, request) = &accepted[0];
    assert_eq!(window_start(request), 1);
    assert_eq!(metadata.get("x-scope-orgid").unwrap(), "team-a");
    assert_eq!(metadata.get("authorization").unwrap(), "Bearer s3cret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_gives_up_after_the_grace_period_and_counts_it() {
    let pipeline = pipeline(free_address(), Vec::new());
    pipeline.submit(&batch(1));
    pipeline.submit(&batch(2));
    let started = Instant::now();
    let stats = pipeline.shutdown(Duration::from_millis(700)).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    let per_batch = test_fixtures::batch().sample_count();
    assert_eq!(stats.dropped_at_shutdown.load(Relaxed), 2 * per_batch);
    assert_eq!(stats.sent_requests.load(Relaxed), 0);
    assert_eq!(stats.queued_requests.load(Relaxed), 0);
}

#[test]
fn bad_headers_are_refused_up_front() {
    for (name, value) in [("bad header", "x"), ("x-ok", "line\nbreak"), ("x-bin", "a")] {
        let err = OtlpExporter::new(OtlpExporterOptions {
            headers: vec![(name.to_owned(), value.to_owned())],
            ..OtlpExporterOptions::new("http://127.0.0.1:4317")
        })
        .unwrap_err();
        assert!(matches!(err, ExportError::InvalidHeader { .. }), "{err}");
        assert!(err.to_string().contains(name), "{err}");
    }
}
