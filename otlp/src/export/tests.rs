#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flate2::read::GzDecoder;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_server::{
    ProfilesService, ProfilesServiceServer,
};
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesPartialSuccess, ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use prost::Message;
use tonic::codec::CompressionEncoding;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use super::*;
use crate::model::ProfileBatch;
use crate::pprof::Profile;
use crate::test_fixtures;

/// Records what it receives; answers with a partial success rejecting one profile.
#[derive(Default)]
struct Collector {
    received: Mutex<Vec<(Option<String>, ExportProfilesServiceRequest)>>,
}

#[tonic::async_trait]
impl ProfilesService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportProfilesServiceRequest>,
    ) -> Result<tonic::Response<ExportProfilesServiceResponse>, tonic::Status> {
        let encoding = request
            .metadata()
            .get("grpc-encoding")
            .map(|v| v.to_str().unwrap().to_owned());
        self.received
            .lock()
            .unwrap()
            .push((encoding, request.into_inner()));
        Ok(tonic::Response::new(ExportProfilesServiceResponse {
            partial_success: Some(ExportProfilesPartialSuccess {
                rejected_profiles: 1,
                error_message: "one profile too many".into(),
            }),
        }))
    }
}

fn options(endpoint: &str) -> OtlpExporterOptions {
    OtlpExporterOptions {
        timeout: Duration::from_secs(1),
        ..OtlpExporterOptions::new(endpoint)
    }
}

fn empty_batch() -> ProfileBatch {
    let mut batch = test_fixtures::batch();
    batch.processes.truncate(0);
    batch
}

#[test]
fn endpoint_scheme_is_checked() {
    for bad in [
        "grpc://localhost:4317",
        "localhost:4317",
        "unix:///tmp/x",
        "",
    ] {
        let err = OtlpExporter::new(options(bad)).unwrap_err();
        assert!(
            matches!(err, ExportError::UnsupportedScheme { .. }),
            "{bad}: {err}"
        );
        assert!(err.to_string().contains("http://"), "{err}");
    }
    let err = OtlpExporter::new(options("http://bad host:4317")).unwrap_err();
    assert!(matches!(err, ExportError::InvalidEndpoint { .. }), "{err}");
    // No runtime and no server needed: connecting is lazy.
    let exporter = OtlpExporter::new(options("HTTP://127.0.0.1:1")).unwrap();
    assert_eq!(exporter.endpoint(), "HTTP://127.0.0.1:1");
    // https sets up TLS; a host without root certificates gets a TLS error, not a scheme error.
    match OtlpExporter::new(options("https://collector.invalid:4317")) {
        Ok(_) | Err(ExportError::Tls { .. }) => {}
        Err(e) => panic!("https endpoint: {e}"),
    }
}

#[tokio::test]
async fn exports_gzip_request_to_a_real_server() {
    let collector = Arc::new(Collector::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = ProfilesServiceServer::from_arc(collector.clone())
        .accept_compressed(CompressionEncoding::Gzip);
    let server = tokio::spawn(
        Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped.await;
            }),
    );

    let exporter = OtlpExporter::new(OtlpExporterOptions {
        scope_version: "9.9.9".into(),
        ..options(&format!("http://{addr}"))
    })
    .unwrap();
    assert_eq!(
        exporter.export(&empty_batch()).await.unwrap(),
        ExportOutcome::Empty
    );
    let batch = test_fixtures::batch();
    let outcome = exporter.export(&batch).await.unwrap();
    let ExportOutcome::Sent {
        profiles,
        samples,
        encoded_bytes,
        rejected_profiles,
        message,
    } = outcome
    else {
        panic!("not sent: {outcome:?}");
    };
    assert_eq!((profiles, samples, rejected_profiles), (2, 8, 1));
    assert_eq!(message.as_deref(), Some("one profile too many"));

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    let received = collector.received.lock().unwrap();
    // The empty batch was never sent.
    assert_eq!(received.len(), 1);
    let (encoding, request) = &received[0];
    assert_eq!(encoding.as_deref(), Some("gzip"));
    assert_eq!(request, &crate::encode_request(&batch, "9.9.9"));
    assert_eq!(request.encoded_len(), encoded_bytes);
}

#[tokio::test]
async fn unreachable_collector_is_an_rpc_error() {
    // Bind then drop, so the port is very likely closed.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let endpoint = format!("http://{addr}");
    let exporter = OtlpExporter::new(OtlpExporterOptions {
        timeout: Duration::from_secs(2),
        ..options(&endpoint)
    })
    .unwrap();
    let err = exporter.export(&test_fixtures::batch()).await.unwrap_err();
    assert!(matches!(err, ExportError::Rpc { .. }), "{err}");
    assert!(err.to_string().contains(&endpoint), "{err}");
}

/// A fresh, empty directory under the system temp dir.
fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("icecore-otlp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn pprof_dir_writer_writes_decodable_files() {
    let dir = temp_dir("pprof-dir");
    let writer = PprofDirWriter::new(dir.join("nested"), Default::default()).unwrap();
    assert!(writer.dir().is_dir());
    assert_eq!(writer.write(&empty_batch()).unwrap(), None);

    let batch = test_fixtures::batch();
    let first = writer.write(&batch).unwrap().unwrap();
    let second = writer.write(&batch).unwrap().unwrap();
    assert_eq!(
        first.file_name().unwrap().to_str().unwrap(),
        "icecore-20261122T051400Z-000000.pb.gz"
    );
    assert_ne!(first, second);
    // Only the two files: no probe or temporary files left behind.
    let mut names: Vec<_> = std::fs::read_dir(writer.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("icecore-") && n.ends_with(".pb.gz"))
    );

    let mut raw = Vec::new();
    GzDecoder::new(std::fs::File::open(&first).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    assert_eq!(
        Profile::decode(raw.as_slice()).unwrap(),
        crate::encode_profile(&batch)
    );

    // A new writer on the same directory does not overwrite existing files.
    let again = PprofDirWriter::new(writer.dir().to_owned(), Default::default()).unwrap();
    let third = again.write(&batch).unwrap().unwrap();
    assert!(
        third.ends_with("icecore-20261122T051400Z-000002.pb.gz"),
        "{third:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn pprof_dir_writer_reports_the_bad_path() {
    let dir = temp_dir("pprof-bad");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let target = file.join("sub");
    let err = PprofDirWriter::new(target.clone(), Default::default()).unwrap_err();
    assert!(matches!(err, ExportError::CreateDir { .. }), "{err}");
    assert!(err.to_string().contains(target.to_str().unwrap()), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
