#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;

use flate2::{Compression, write::GzEncoder};
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use prost::Message;
use tokio::sync::mpsc;

use super::*;
use crate::encode_request;
use crate::model::ProfileBatch;
use crate::test_fixtures;

fn request() -> ExportProfilesServiceRequest {
    encode_request(&test_fixtures::batch(), "1")
}

fn refusal(request: &ExportProfilesServiceRequest) -> String {
    accept(request, &ReceiveLimits::default()).unwrap_err().0
}

/// (pid, thread, CPU, leaf-first function names, samples).
type Shape = (u32, u32, Option<u32>, Vec<String>, usize);

/// Samples per (pid, thread, CPU, leaf-first function names), order-independent.
fn shape(batch: &ProfileBatch) -> Vec<Shape> {
    let mut out: Vec<_> = batch
        .processes
        .iter()
        .flat_map(|p| {
            p.samples.iter().map(|s| {
                let names = s
                    .stack
                    .iter()
                    .flat_map(|f| f.lines.iter().map(|l| l.function_name.to_string()))
                    .collect();
                (
                    p.process.pid,
                    s.thread_id,
                    s.cpu,
                    names,
                    s.timestamps_unix_nanos.len(),
                )
            })
        })
        .collect();
    out.sort();
    // Groups with the same identity merge on encoding: merge here too.
    out.dedup_by(|b, a| {
        if (a.0, a.1, a.2, &a.3) == (b.0, b.1, b.2, &b.3) {
            a.4 += b.4;
            true
        } else {
            false
        }
    });
    out
}

#[test]
fn icecore_requests_round_trip_through_the_model() {
    let original = test_fixtures::batch();
    let received = accept(&request(), &ReceiveLimits::default()).unwrap();
    assert_eq!(received.samples, original.sample_count());
    assert_eq!(received.converted.skipped_profiles, 0);
    let batch = &received.converted.batch;
    assert_eq!(shape(batch), shape(&original));
    assert_eq!(batch.period_nanos, original.period_nanos);
    assert_eq!(batch.host_name, original.host_name);
    assert_eq!(batch.host, original.host);
    let process = &batch.processes[0].process;
    assert_eq!(process, &original.processes[0].process);
    // The body forwarded decodes to the same request.
    assert_eq!(
        ExportProfilesServiceRequest::decode(received.body.as_ref()).unwrap(),
        request()
    );
}

#[test]
fn dangling_indices_are_named() {
    let mut r = request();
    r.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = 999;
    let message = refusal(&r);
    assert!(message.contains("dangling index"), "{message}");
    assert!(
        message.contains("samples[0].stack_index = 999"),
        "{message}"
    );

    let mut r = request();
    r.dictionary.as_mut().unwrap().function_table[1].name_strindex = -1;
    assert!(refusal(&r).contains("function_table[1].name_strindex = -1"));

    let mut r = request();
    let locations = r.dictionary.as_ref().unwrap().location_table.len() as i32;
    r.dictionary.as_mut().unwrap().stack_table[1].location_indices[0] = locations;
    assert!(refusal(&r).contains("stack_table[1].location_indices"));

    let mut r = request();
    r.dictionary = None;
    assert!(refusal(&r).contains("no dictionary"));
}

#[test]
fn malformed_samples_and_floods_of_samples_are_refused() {
    let mut r = request();
    let sample = &mut r.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
    sample.timestamps_unix_nano.clear();
    sample.values.clear();
    assert!(refusal(&r).contains("neither values nor timestamps"));

    let mut r = request();
    let sample = &mut r.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
    sample.timestamps_unix_nano.clear();
    sample.values = vec![i64::MAX];
    let message = refusal(&r);
    assert!(message.contains("more than 2000000 samples"), "{message}");

    let limits = ReceiveLimits {
        max_stack_depth: 2,
        ..ReceiveLimits::default()
    };
    let message = accept(&request(), &limits).unwrap_err().0;
    assert!(message.contains("over the limit of 2"), "{message}");
}

#[test]
fn values_only_samples_convert_to_counts() {
    let mut r = request();
    let sample = &mut r.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
    let before = sample.timestamps_unix_nano.len() as u64;
    sample.timestamps_unix_nano.clear();
    sample.values = vec![5];
    let received = accept(&r, &ReceiveLimits::default()).unwrap();
    let expected = test_fixtures::batch().sample_count() - before + 5;
    assert_eq!(received.samples, expected);
    assert_eq!(received.converted.batch.sample_count(), expected);
}

fn receiver(
    capacity: usize,
    auth: ReceiverAuth,
) -> (ProfilesReceiver, mpsc::Receiver<ReceivedProfiles>) {
    receiver_with(capacity, auth, ReceiverOptions::default())
}

fn receiver_with(
    capacity: usize,
    auth: ReceiverAuth,
    options: ReceiverOptions,
) -> (ProfilesReceiver, mpsc::Receiver<ReceivedProfiles>) {
    let (tx, rx) = mpsc::channel(capacity);
    (ProfilesReceiver::new(tx, auth, options), rx)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// An OTLP/HTTP request of `body`.
fn http_request(
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let mut builder = http::Request::post(HTTP_PATH);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    builder
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap()
}

/// A gRPC export call of `message` (already gzipped when `gzip`).
fn grpc_request(
    headers: &[(&str, &str)],
    message: &[u8],
    gzip: bool,
) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let mut body = vec![u8::from(gzip)];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(message);
    let mut builder =
        http::Request::post(GRPC_EXPORT_PATH).header("content-type", "application/grpc");
    if gzip {
        builder = builder.header("grpc-encoding", "gzip");
    }
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    builder
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap()
}

/// The status and `google.rpc.Status` of an HTTP answer.
async fn http_answer(response: http::Response<UnaryBody>) -> (u16, tonic::Code, String) {
    use http_body_util::BodyExt;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    if status == 200 {
        return (status, tonic::Code::Ok, String::new());
    }
    let rpc = outcome::RpcStatus::decode(body).unwrap();
    (status, tonic::Code::from(rpc.code), rpc.message)
}

/// The gRPC status of a gRPC answer (trailers-only for errors).
async fn grpc_answer(response: http::Response<UnaryBody>) -> (tonic::Code, String) {
    use http_body_util::BodyExt;
    assert_eq!(response.status(), 200);
    if let Some(status) = tonic::Status::from_header_map(response.headers()) {
        return (status.code(), status.message().to_owned());
    }
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap();
    let status = tonic::Status::from_header_map(&trailers).unwrap();
    (status.code(), status.message().to_owned())
}

const PROTO: (&str, &str) = ("content-type", "application/x-protobuf");

#[test]
fn tokens_and_a_full_queue_are_enforced() {
    let (receiver, mut rx) = receiver(1, ReceiverAuth::bearer("s3cret"));
    let body = request().encode_to_vec();
    runtime().block_on(async {
        for bad in [
            &[][..],
            &[("authorization", "Bearer nope")],
            &[("authorization", "s3cret")],
        ] {
            let (code, _) = grpc_answer(receiver.grpc(grpc_request(bad, &body, false)).await).await;
            assert_eq!(code, tonic::Code::Unauthenticated, "{bad:?}");
        }
        let (status, code, _) =
            http_answer(receiver.http(http_request(&[PROTO], body.clone())).await).await;
        assert_eq!((status, code), (401, tonic::Code::Unauthenticated));
        let good = [("authorization", "bearer s3cret")];
        let (code, _) = grpc_answer(receiver.grpc(grpc_request(&good, &body, false)).await).await;
        assert_eq!(code, tonic::Code::Ok);
        let (code, _) = grpc_answer(receiver.grpc(grpc_request(&good, &body, false)).await).await;
        assert_eq!(code, tonic::Code::ResourceExhausted);
    });
    let forwarded = rx.try_recv().unwrap();
    assert_eq!(forwarded.samples, test_fixtures::batch().sample_count());
    let stats = receiver.stats();
    assert_eq!(stats.requests(Outcome::Accepted), 1);
    assert_eq!(stats.requests(Outcome::Unauthenticated), 4);
    assert_eq!(stats.requests(Outcome::Overloaded), 1);
    assert!(!format!("{receiver:?}").contains("s3cret"));
    assert!(
        receiver.budget().used() > 0,
        "the forwarded request holds memory"
    );
    drop(forwarded);
    assert_eq!(receiver.budget().used(), 0, "and gives it back");
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn http_bodies_are_checked() {
    let (receiver, mut rx) = receiver(8, ReceiverAuth::default());
    let body = request().encode_to_vec();
    runtime().block_on(async {
        let ok = |r| async { http_answer(r).await.0 };
        assert_eq!(
            ok(receiver.http(http_request(&[PROTO], body.clone())).await).await,
            200
        );
        let gz = [PROTO, ("content-encoding", "gzip")];
        assert_eq!(
            ok(receiver.http(http_request(&gz, gzip(&body))).await).await,
            200
        );
        assert_eq!(
            rx.try_recv().unwrap().samples,
            rx.try_recv().unwrap().samples
        );

        let json = [("content-type", "application/json")];
        let (status, _, _) =
            http_answer(receiver.http(http_request(&json, body.clone())).await).await;
        assert_eq!(status, 415);
        let (status, code, message) = http_answer(
            receiver
                .http(http_request(&[PROTO], b"\xff\xff\xff".to_vec()))
                .await,
        )
        .await;
        assert_eq!((status, code), (400, tonic::Code::InvalidArgument));
        assert!(
            message.contains("not an ExportProfilesServiceRequest"),
            "{message}"
        );
        let mut bad = request();
        bad.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].link_index = 77;
        let (status, _, message) = http_answer(
            receiver
                .http(http_request(&[PROTO], bad.encode_to_vec()))
                .await,
        )
        .await;
        assert_eq!(status, 400);
        assert!(message.contains("link_index = 77"), "{message}");
        // A gzip bomb: 64 MiB of zeros in about 64 KiB; stops at the limit,
        // as a request that will never pass (not one to retry).
        let bomb = gzip(&vec![0u8; 64 << 20]);
        assert!(bomb.len() < 1 << 20);
        let (status, code, message) =
            http_answer(receiver.http(http_request(&gz, bomb.clone())).await).await;
        assert_eq!(
            (status, code),
            (413, tonic::Code::InvalidArgument),
            "{message}"
        );
        let (code, _) = grpc_answer(receiver.grpc(grpc_request(&[], &bomb, true)).await).await;
        assert_eq!(code, tonic::Code::InvalidArgument);
        // Declared too large: refused from the header, as a google.rpc.Status.
        let huge = vec![0u8; (16 << 20) + 1];
        let (status, code, message) =
            http_answer(receiver.http(http_request(&[PROTO], huge)).await).await;
        assert_eq!((status, code), (413, tonic::Code::InvalidArgument));
        assert!(message.contains("limit"), "{message}");
        let (code, _) = grpc_answer(
            receiver
                .grpc(grpc_request(&[], b"\xff\xff\xff", false))
                .await,
        )
        .await;
        assert_eq!(
            code,
            tonic::Code::InvalidArgument,
            "undecodable protobuf is the sender's fault"
        );
    });
    assert!(rx.try_recv().is_err(), "nothing bad was forwarded");
    let stats = receiver.stats();
    assert_eq!(stats.requests(Outcome::Accepted), 2);
    assert_eq!(stats.requests(Outcome::Invalid), 3);
    assert_eq!(stats.requests(Outcome::TooLarge), 3);
    assert_eq!(stats.requests(Outcome::Unsupported), 1);
    assert_eq!(receiver.budget().used(), 0);
}

#[test]
fn counts_do_not_become_memory() {
    // One sample counted two million times: a few hundred bytes on the wire.
    let mut r = request();
    for resource in &mut r.resource_profiles {
        for scope in &mut resource.scope_profiles {
            for profile in &mut scope.profiles {
                profile.samples.truncate(1);
            }
        }
    }
    r.resource_profiles.truncate(1);
    let sample = &mut r.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
    sample.timestamps_unix_nano.clear();
    sample.values = vec![2_000_000];
    let received = accept(&r, &ReceiveLimits::default()).unwrap();
    assert_eq!(received.samples, 2_000_000);
    assert_eq!(received.converted.batch.sample_count(), 2_000_000);
    assert!(
        received.converted.heap_bytes < 64 << 10,
        "{} bytes for one counted sample",
        received.converted.heap_bytes
    );
}

#[test]
fn a_request_costing_more_than_the_budget_is_refused_before_decoding() {
    // 200,000 empty samples: 400 KB on the wire, tens of MB decoded.
    let mut r = request();
    r.resource_profiles[0].scope_profiles[0].profiles[0].samples =
        vec![Default::default(); 200_000];
    let wire = r.encode_to_vec();
    let options = ReceiverOptions {
        memory_bytes: 8 << 20,
        ..ReceiverOptions::default()
    };
    let (receiver, _rx) = receiver_with(8, ReceiverAuth::default(), options);
    runtime().block_on(async {
        let (status, code, message) =
            http_answer(receiver.http(http_request(&[PROTO], wire)).await).await;
        assert_eq!(
            (status, code),
            (413, tonic::Code::InvalidArgument),
            "{message}"
        );
        assert!(message.contains("memory budget"), "{message}");
    });
    assert_eq!(receiver.budget().used(), 0);
}
