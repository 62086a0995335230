#![allow(clippy::unwrap_used)]

use std::time::Duration;

use prost::Message;

use super::*;
use crate::otlp_encode::{ResourceAttributes, encode_pprof_request};
use crate::pprof::proto::{Function, Label, Line, Location, Sample, ValueType};

/// A Go-like heap profile: two stacks (`main.alloc` under `main.main`, and
/// `main.other`), four sample types, `values` per stack.
fn heap(time_nanos: i64, values: [[i64; 4]; 2]) -> Profile {
    let strings = [
        "",
        "alloc_objects",
        "count",
        "alloc_space",
        "bytes",
        "inuse_objects",
        "inuse_space",
        "space",
        "main.alloc",
        "main.main",
        "main.other",
        "main.go",
        "bytes",
    ];
    let vt = |t: i64, u: i64| ValueType { r#type: t, unit: u };
    let function = |id: u64, name: i64| Function {
        id,
        name,
        system_name: name,
        filename: 11,
        start_line: 1,
    };
    let location = |id: u64, address: u64, function_id: u64, line: i64| Location {
        id,
        mapping_id: 0,
        address,
        line: vec![Line {
            function_id,
            line,
            column: 0,
        }],
        is_folded: false,
    };
    Profile {
        sample_type: vec![vt(1, 2), vt(3, 4), vt(5, 2), vt(6, 4)],
        sample: vec![
            Sample {
                location_id: vec![1, 2],
                value: values[0].to_vec(),
                label: vec![Label {
                    key: 12,
                    num: 64,
                    ..Label::default()
                }],
            },
            Sample {
                location_id: vec![3],
                value: values[1].to_vec(),
                label: Vec::new(),
            },
        ],
        location: vec![
            location(1, 0x1000, 1, 10),
            location(2, 0x2000, 2, 20),
            location(3, 0x3000, 3, 30),
        ],
        function: vec![function(1, 8), function(2, 9), function(3, 10)],
        string_table: strings.iter().map(|s| (*s).to_owned()).collect(),
        time_nanos,
        period_type: Some(vt(7, 4)),
        period: 512 * 1024,
        ..Profile::default()
    }
}

fn gzipped(profile: &Profile) -> Vec<u8> {
    ScrapedProfile::new("memory".to_owned(), Vec::new(), profile.clone())
        .gzipped
        .to_vec()
}

#[test]
fn decodes_gzipped_and_plain_profiles_and_refuses_what_is_not_one() {
    let profile = heap(1, [[1, 2, 3, 4], [5, 6, 7, 8]]);
    assert_eq!(decode(&gzipped(&profile)).unwrap(), profile);
    assert_eq!(decode(&profile.encode_to_vec()).unwrap(), profile);
    let reason = |body: &[u8]| decode(body).unwrap_err().reason();
    assert_eq!(reason(b""), "not_pprof");
    assert_eq!(reason(b"<html>404 page not found</html>"), "not_pprof");
    assert_eq!(reason(&[0x1f, 0x8b, 0, 1, 2]), "not_pprof");
    let mut short = profile.clone();
    short.sample[0].value.pop();
    assert!(
        decode(&short.encode_to_vec())
            .unwrap_err()
            .to_string()
            .contains("3 values for 4")
    );
    let mut bad_string = profile.clone();
    bad_string.function[0].name = 999;
    assert_eq!(reason(&bad_string.encode_to_vec()), "not_pprof");
    // A gzip bomb stops at the limit.
    let zeros = vec![0u8; MAX_PROFILE_BYTES + 1024];
    let bomb = {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&zeros).unwrap();
        gz.finish().unwrap()
    };
    assert!(bomb.len() < MAX_RESPONSE_BYTES);
    assert_eq!(reason(&bomb), "too_large");
}

#[test]
fn cumulative_profiles_become_deltas_and_restarts_a_new_baseline() {
    let mut delta = CumulativeDelta::default();
    assert!(matches!(
        delta.apply(heap(1_000, [[10, 1000, 2, 200], [5, 500, 0, 0]])),
        DeltaOutcome::Baseline
    ));
    // Stack 1 allocated 3 more objects; stack 2 nothing (its sample goes,
    // all its values being zero); in-use values pass as they are.
    let DeltaOutcome::Ready(p) = delta.apply(heap(11_000, [[13, 1300, 1, 100], [5, 500, 0, 0]]))
    else {
        panic!("a delta")
    };
    assert_eq!(p.duration_nanos, 10_000);
    assert_eq!(p.time_nanos, 11_000);
    assert_eq!(p.sample.len(), 1);
    assert_eq!(p.sample[0].value, [3, 300, 1, 100]);
    // A count that went down: the target restarted.
    assert!(matches!(
        delta.apply(heap(21_000, [[1, 100, 1, 100], [5, 500, 0, 0]])),
        DeltaOutcome::Reset
    ));
    let DeltaOutcome::Ready(p) = delta.apply(heap(31_000, [[2, 200, 1, 100], [6, 600, 1, 1]]))
    else {
        panic!("a delta")
    };
    assert_eq!(
        p.sample.iter().map(|s| s.value.clone()).collect::<Vec<_>>(),
        [vec![1, 100, 1, 100], vec![1, 100, 1, 1]]
    );
}

#[test]
fn duplicate_stacks_are_summed_and_profiles_with_a_duration_pass_through() {
    let mut delta = CumulativeDelta::default();
    let twice = |time, v: i64| {
        let mut p = heap(time, [[v, v, 0, 0], [0, 0, 0, 0]]);
        p.sample[1] = p.sample[0].clone();
        p
    };
    assert!(matches!(delta.apply(twice(1, 1)), DeltaOutcome::Baseline));
    let DeltaOutcome::Ready(p) = delta.apply(twice(2, 3)) else {
        panic!("a delta")
    };
    assert_eq!(p.sample.len(), 1);
    assert_eq!(p.sample[0].value, [4, 4, 0, 0]);
    // `?seconds=` answers are deltas already.
    let mut asked = heap(3, [[1, 1, 1, 1], [1, 1, 1, 1]]);
    asked.duration_nanos = 10;
    let DeltaOutcome::Ready(p) = CumulativeDelta::default().apply(asked.clone()) else {
        panic!("passed through")
    };
    assert_eq!(*p, asked);
}

#[test]
fn every_sample_type_becomes_an_otlp_profile_with_the_names() {
    let profile = heap(5, [[1, 2, 0, 0], [3, 4, 5, 6]]);
    let labels = vec![
        ("job".to_owned(), "shop".to_owned()),
        ("instance".to_owned(), "127.0.0.1:6060".to_owned()),
    ];
    let request = encode_pprof_request(
        &profile,
        "memory",
        &labels,
        "1.0",
        &ResourceAttributes::default(),
    );
    let dict = request.dictionary.as_ref().unwrap();
    let s = |i: i32| dict.string_table[i as usize].as_str();
    let resource = &request.resource_profiles[0];
    let attributes: Vec<(&str, String)> = resource
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .map(|kv| {
            (
                kv.key.as_str(),
                format!("{:?}", kv.value.as_ref().unwrap().value),
            )
        })
        .collect();
    assert_eq!(attributes[0].0, "service.name");
    assert!(attributes[0].1.contains("shop"));
    assert!(
        attributes
            .iter()
            .any(|(k, v)| *k == "instance" && v.contains("6060"))
    );
    let scope = &resource.scope_profiles[0];
    assert_eq!(scope.scope.as_ref().unwrap().name, "memory");
    let types: Vec<(&str, &str, Vec<i64>)> = scope
        .profiles
        .iter()
        .map(|p| {
            let t = p.sample_type.unwrap();
            let values = p.samples.iter().map(|s| s.values[0]).collect();
            (s(t.type_strindex), s(t.unit_strindex), values)
        })
        .collect();
    assert_eq!(
        types,
        [
            ("alloc_objects", "count", vec![1, 3]),
            ("alloc_space", "bytes", vec![2, 4]),
            ("inuse_objects", "count", vec![5]),
            ("inuse_space", "bytes", vec![6]),
        ]
    );
    // The first sample's stack: main.alloc (leaf) under main.main, with
    // its numeric label and unit.
    let first = &scope.profiles[0].samples[0];
    let stack = &dict.stack_table[first.stack_index as usize];
    let names: Vec<&str> = stack
        .location_indices
        .iter()
        .map(|&l| {
            let line = &dict.location_table[l as usize].lines[0];
            s(dict.function_table[line.function_index as usize].name_strindex)
        })
        .collect();
    assert_eq!(names, ["main.alloc", "main.main"]);
    let label = &dict.attribute_table[first.attribute_indices[0] as usize];
    assert_eq!(
        (s(label.key_strindex), s(label.unit_strindex)),
        ("bytes", "")
    );
    let period = scope.profiles[0].period_type.unwrap();
    assert_eq!(s(period.type_strindex), "space");
    assert_eq!(scope.profiles[0].period, 512 * 1024);
}

#[test]
fn the_dictionary_holds_only_what_samples_use() {
    // The second stack (main.other) has no value left, as after a delta.
    let profile = heap(5, [[1, 2, 0, 0], [0, 0, 0, 0]]);
    let request = encode_pprof_request(
        &profile,
        "memory",
        &[],
        "1.0",
        &ResourceAttributes::default(),
    );
    let dict = request.dictionary.unwrap();
    // The zero entries, and main.alloc and main.main.
    assert_eq!(dict.location_table.len(), 3);
    assert_eq!(dict.function_table.len(), 3);
    assert_eq!(dict.stack_table.len(), 2);
    assert!(!dict.string_table.iter().any(|s| s == "main.other"));
}

/// Serves one canned answer per connection on 127.0.0.1; `None` reads the
/// request and never answers.
async fn serve(answer: Option<Vec<u8>>) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request).await;
                match answer {
                    Some(bytes) => {
                        let _ = stream.write_all(&bytes).await;
                    }
                    None => tokio::time::sleep(Duration::from_secs(60)).await,
                }
            });
        }
    });
    address
}

fn http_answer(status: &str, body: &[u8]) -> Vec<u8> {
    let mut answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(body);
    answer
}

fn endpoint(address: std::net::SocketAddr) -> PprofEndpoint {
    PprofEndpoint::new(&PprofEndpointOptions {
        base_url: format!("http://{address}"),
        path_and_query: "/debug/pprof/heap".to_owned(),
        timeout: Duration::from_millis(500),
        ca_file: None,
        insecure_skip_verify: false,
    })
    .unwrap()
}

#[tokio::test]
async fn hostile_targets_are_failures_of_their_kind() {
    let profile = heap(1, [[1, 2, 3, 4], [5, 6, 7, 8]]);
    let good = serve(Some(http_answer("200 OK", &gzipped(&profile)))).await;
    let scraped = endpoint(good).scrape().await.unwrap();
    assert_eq!(scraped.profile, profile);

    let reason = |address| async move { endpoint(address).scrape().await.unwrap_err().reason() };
    let silent = serve(None).await;
    assert_eq!(reason(silent).await, "timeout");
    let missing = serve(Some(http_answer("404 Not Found", b"404 page not found"))).await;
    assert_eq!(reason(missing).await, "http_status");
    let html = serve(Some(http_answer("200 OK", b"<html>hello</html>"))).await;
    assert_eq!(reason(html).await, "not_pprof");
    let huge = serve(Some(http_answer(
        "200 OK",
        &vec![0u8; MAX_RESPONSE_BYTES + 1],
    )))
    .await;
    assert_eq!(reason(huge).await, "too_large");
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    assert_eq!(reason(closed).await, "connect");
}
