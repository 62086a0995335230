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

/// Samples per (pid, thread, leaf-first function names), order-independent.
fn shape(batch: &ProfileBatch) -> Vec<(u32, u32, Vec<String>, usize)> {
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
                    names,
                    s.timestamps_unix_nanos.len(),
                )
            })
        })
        .collect();
    out.sort();
    // Groups with the same identity merge on encoding: merge here too.
    out.dedup_by(|b, a| {
        if (a.0, a.1, &a.2) == (b.0, b.1, &b.2) {
            a.3 += b.3;
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
    assert_eq!(received.samples, original.sample_count() as u64);
    assert_eq!(received.converted.skipped_profiles, 0);
    let batch = &received.converted.batch;
    assert_eq!(shape(batch), shape(&original));
    assert_eq!(batch.period_nanos, original.period_nanos);
    assert_eq!(batch.host_name, original.host_name);
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
    let before = sample.timestamps_unix_nano.len();
    sample.timestamps_unix_nano.clear();
    sample.values = vec![5];
    let received = accept(&r, &ReceiveLimits::default()).unwrap();
    let expected = test_fixtures::batch().sample_count() - before + 5;
    assert_eq!(received.samples, expected as u64);
    assert_eq!(received.converted.batch.sample_count(), expected);
}

fn receiver(
    capacity: usize,
    auth: ReceiverAuth,
) -> (ProfilesReceiver, mpsc::Receiver<ReceivedProfiles>) {
    let (tx, rx) = mpsc::channel(capacity);
    (
        ProfilesReceiver::new(tx, auth, ReceiveLimits::default()),
        rx,
    )
}

#[test]
fn tokens_and_a_full_queue_are_enforced() {
    let (receiver, mut rx) = receiver(1, ReceiverAuth::bearer("s3cret"));
    let r = request();
    for bad in [
        None,
        Some("Bearer nope"),
        Some("s3cret"),
        Some("Bearer s3cre"),
    ] {
        let status = receiver.handle(bad, &r).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{bad:?}");
    }
    receiver.handle(Some("Bearer s3cret"), &r).unwrap();
    let status = receiver.handle(Some("Bearer s3cret"), &r).unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    let forwarded = rx.try_recv().unwrap();
    assert_eq!(
        forwarded.samples,
        test_fixtures::batch().sample_count() as u64
    );
    let stats = receiver.stats();
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(stats.accepted_requests.load(Relaxed), 1);
    assert_eq!(stats.unauthenticated_requests.load(Relaxed), 4);
    assert_eq!(stats.overloaded_requests.load(Relaxed), 1);
    assert!(!format!("{receiver:?}").contains("s3cret"));
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
    let proto = Some("application/x-protobuf");
    accept_http(&receiver, proto, None, None, &body).unwrap();
    accept_http(&receiver, proto, Some("gzip"), None, &gzip(&body)).unwrap();
    assert_eq!(
        rx.try_recv().unwrap().samples,
        rx.try_recv().unwrap().samples
    );

    let err = accept_http(&receiver, Some("application/json"), None, None, &body).unwrap_err();
    assert_eq!(err.status, 415);
    let err = accept_http(&receiver, proto, None, None, b"\xff\xff\xff").unwrap_err();
    assert_eq!(err.status, 400);
    assert!(err.message.contains("not an ExportProfilesServiceRequest"));
    let mut bad = request();
    bad.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].link_index = 77;
    let err = accept_http(&receiver, proto, None, None, &bad.encode_to_vec()).unwrap_err();
    assert_eq!(err.status, 400);
    assert!(err.message.contains("link_index = 77"), "{}", err.message);
    assert!(!err.body.is_empty());
    // A gzip bomb: 64 MiB of zeros in about 64 KiB; stops at the limit.
    let bomb = gzip(&vec![0u8; 64 << 20]);
    assert!(bomb.len() < 1 << 20);
    let err = accept_http(&receiver, proto, Some("gzip"), None, &bomb).unwrap_err();
    assert_eq!(err.status, 413);
    assert!(rx.try_recv().is_err(), "nothing bad was forwarded");
}
