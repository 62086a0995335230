//! The Parca exporter against a WriteRaw server generated from Parca's proto.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flate2::read::GzDecoder;
use prost::Message;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use super::parca::proto::profile_store_service_server::{
    ProfileStoreService, ProfileStoreServiceServer,
};
use super::parca::proto::{WriteRawRequest, WriteRawResponse};
use super::*;
use crate::pprof::Profile;
use crate::test_fixtures;

#[derive(Default)]
struct ParcaStore {
    requests: Mutex<Vec<(tonic::metadata::MetadataMap, WriteRawRequest)>>,
}

#[tonic::async_trait]
impl ProfileStoreService for ParcaStore {
    async fn write_raw(
        &self,
        request: tonic::Request<WriteRawRequest>,
    ) -> Result<tonic::Response<WriteRawResponse>, tonic::Status> {
        let metadata = request.metadata().clone();
        let request = request.into_inner();
        // Parca's own rule: every series needs a __name__.
        for series in &request.series {
            let labels = &series.labels.as_ref().unwrap().labels;
            if !labels.iter().any(|l| l.name == "__name__") {
                return Err(tonic::Status::invalid_argument("missing __name__"));
            }
        }
        self.requests.lock().unwrap().push((metadata, request));
        Ok(tonic::Response::new(WriteRawResponse::default()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_raw_carries_one_labelled_series_per_process() {
    let store = Arc::new(ParcaStore::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .add_service(ProfileStoreServiceServer::from_arc(store.clone()))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let exporter = ParcaExporter::new(&ParcaOptions {
        timeout: Duration::from_secs(5),
        headers: vec![("authorization".into(), "Bearer parca-token".into())],
        ..ParcaOptions::new(format!("http://{addr}"))
    })
    .unwrap();
    let pipeline = ExportPipeline::start(exporter, RetryPolicy::default(), QueueLimits::default());
    let batch = test_fixtures::batch();
    pipeline.submit(&batch);
    let stats = pipeline.shutdown(Duration::from_secs(10)).await;
    assert_eq!(stats.sent_requests.load(Relaxed), 1);

    let requests = store.requests.lock().unwrap();
    let (metadata, request) = &requests[0];
    assert_eq!(metadata.get("authorization").unwrap(), "Bearer parca-token");
    assert!(!request.normalized);
    // Processes without samples have no series.
    let with_samples: Vec<_> = batch
        .processes
        .iter()
        .filter(|p| {
            p.samples
                .iter()
                .any(|g| !g.timestamps_unix_nanos.is_empty())
        })
        .collect();
    assert_eq!(request.series.len(), with_samples.len());
    for (series, process) in request.series.iter().zip(with_samples) {
        let labels: Vec<(&str, &str)> = series
            .labels
            .as_ref()
            .unwrap()
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(labels[0], ("__name__", PARCA_PROFILE_NAME));
        let pid = process.process.pid.to_string();
        assert!(labels.contains(&("pid", pid.as_str())), "{labels:?}");
        assert!(labels.contains(&("comm", &*process.process.executable_name)));
        let raw = &series.samples[0].raw_profile;
        assert_eq!(raw[..2], [0x1f, 0x8b], "gzipped pprof");
        let mut bytes = Vec::new();
        GzDecoder::new(raw.as_slice())
            .read_to_end(&mut bytes)
            .unwrap();
        let profile = Profile::decode(bytes.as_slice()).unwrap();
        let samples: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
        let expected: usize = process
            .samples
            .iter()
            .map(|g| g.timestamps_unix_nanos.len())
            .sum();
        assert_eq!(samples, expected as i64, "pid {pid}");
    }
}
