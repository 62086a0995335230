//! The receiver's decoded-cost bound against what decoding really
//! allocates, measured by a counting allocator (its own test binary, so the
//! allocator sees nothing else).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::Ordering::Relaxed;

use icecore_otlp::receive::decoded_bytes;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development::{
    Location, Profile, ProfilesDictionary, ResourceProfiles, Sample, ScopeProfiles, Stack,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

mod common;

use common::{LIVE, PEAK};

#[global_allocator]
static ALLOCATOR: common::Counting = common::Counting;

/// Peak bytes allocated while decoding `wire`, above what was live before.
fn decode_peak(wire: &[u8]) -> usize {
    let before = LIVE.load(Relaxed);
    PEAK.store(before, Relaxed);
    let decoded = ExportProfilesServiceRequest::decode(wire).unwrap();
    let peak = PEAK.load(Relaxed) - before;
    drop(decoded);
    peak
}

fn wrap(profiles: Vec<Profile>, dictionary: ProfilesDictionary, resource: Resource) -> Vec<u8> {
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(resource),
            scope_profiles: vec![ScopeProfiles {
                profiles,
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(dictionary),
    }
    .encode_to_vec()
}

fn cases() -> Vec<(&'static str, Vec<u8>)> {
    let timed = Profile {
        samples: (0..5000)
            .map(|i| Sample {
                stack_index: i % 50,
                attribute_indices: vec![1, 2],
                timestamps_unix_nano: vec![1_700_000_000_000_000_000 + i as u64; 3],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let dictionary = ProfilesDictionary {
        string_table: (0..2000)
            .map(|i| format!("function_{i}_with_a_name"))
            .collect(),
        stack_table: (0..50)
            .map(|i| Stack {
                location_indices: (0..i).collect(),
            })
            .collect(),
        location_table: (0..300)
            .map(|i| Location {
                address: 0x400000 + i,
                lines: vec![Default::default(); 2],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let empty_samples = Profile {
        samples: vec![Sample::default(); 100_000],
        ..Default::default()
    };
    let empty_dictionary = ProfilesDictionary {
        location_table: vec![Location::default(); 50_000],
        stack_table: vec![Stack::default(); 50_000],
        string_table: vec![String::new(); 50_000],
        ..Default::default()
    };
    let mut nested = AnyValue {
        value: Some(any_value::Value::StringValue("leaf".into())),
    };
    for _ in 0..60 {
        nested = AnyValue {
            value: Some(any_value::Value::ArrayValue(ArrayValue {
                values: vec![nested.clone(), nested.clone()],
            })),
        };
        if nested.encoded_len() > 1 << 20 {
            break;
        }
    }
    let attributes = Resource {
        attributes: vec![KeyValue {
            key: "k".into(),
            value: Some(nested),
            ..Default::default()
        }],
        ..Default::default()
    };
    vec![
        (
            "typical",
            wrap(vec![timed], dictionary, Resource::default()),
        ),
        (
            "empty samples",
            wrap(
                vec![empty_samples],
                ProfilesDictionary::default(),
                Resource::default(),
            ),
        ),
        (
            "empty dictionary entries",
            wrap(vec![], empty_dictionary, Resource::default()),
        ),
        (
            "nested attribute values",
            wrap(vec![], ProfilesDictionary::default(), attributes),
        ),
    ]
}

#[test]
fn the_bound_is_never_below_what_decoding_allocates() {
    for (name, wire) in cases() {
        let bound = decoded_bytes(&wire).unwrap();
        let peak = decode_peak(&wire);
        println!(
            "{name}: {} wire bytes, {peak} allocated at peak, bound {bound} ({:.1}x)",
            wire.len(),
            bound as f64 / peak as f64
        );
        assert!(bound >= peak, "{name}: bound {bound} < allocated {peak}");
        assert!(
            bound <= 6 * peak.max(1024),
            "{name}: bound {bound} is over 6x the {peak} allocated"
        );
    }
}
