#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value::Value};
use opentelemetry_proto::tonic::profiles::v1development::{
    KeyValueAndUnit, Link, ProfilesDictionary, Sample,
};
use prost::Message;

use super::*;
use crate::test_fixtures::{self, DURATION, PERIOD, START};

fn request() -> ExportProfilesServiceRequest {
    encode_request(&test_fixtures::batch(), "1.2.3")
}

fn dict(req: &ExportProfilesServiceRequest) -> &ProfilesDictionary {
    req.dictionary.as_ref().unwrap()
}

fn string(d: &ProfilesDictionary, i: i32) -> &str {
    &d.string_table[usize::try_from(i).unwrap()]
}

fn attr(d: &ProfilesDictionary, i: i32) -> (&str, Value) {
    let a = &d.attribute_table[usize::try_from(i).unwrap()];
    let value = a.value.as_ref().unwrap().value.clone().unwrap();
    (string(d, a.key_strindex), value)
}

fn resource_attr<'a>(attrs: &'a [KeyValue], key: &str) -> &'a Value {
    let kv = attrs.iter().find(|kv| kv.key == key).unwrap();
    kv.value.as_ref().unwrap().value.as_ref().unwrap()
}

#[test]
fn sample_field_numbers_match_v1_10() {
    let sample = Sample {
        stack_index: 1,
        attribute_indices: vec![2, 3],
        link_index: 4,
        values: vec![5],
        timestamps_unix_nano: vec![6],
    };
    // v1.10 renumbered Sample: attribute_indices=2, link_index=3, values=4 (tag 0x22).
    let expected = [
        0x08, 1, // stack_index = 1
        0x12, 2, 2, 3, // attribute_indices = 2, packed
        0x18, 4, // link_index = 3
        0x22, 1, 5, // values = 4, packed
        0x2a, 8, 6, 0, 0, 0, 0, 0, 0, 0, // timestamps_unix_nano = 5, packed fixed64
    ];
    assert_eq!(sample.encode_to_vec(), expected);
}

#[test]
fn every_table_starts_with_its_zero_element() {
    let req = request();
    let d = dict(&req);
    assert_eq!(d.string_table[0], "");
    assert_eq!(d.mapping_table[0], Default::default());
    assert_eq!(d.location_table[0], Default::default());
    assert_eq!(d.function_table[0], Default::default());
    assert_eq!(d.attribute_table[0], KeyValueAndUnit::default());
    assert_eq!(d.stack_table[0], Default::default());
    assert_eq!(
        d.link_table,
        vec![Link {
            trace_id: vec![0; 16],
            span_id: vec![0; 8]
        }]
    );
    // The zero-value guarantee holds for an empty batch too.
    let mut empty = test_fixtures::batch();
    empty.processes.clear();
    let req = encode_request(&empty, "1");
    assert!(req.resource_profiles.is_empty());
    let d = dict(&req);
    assert_eq!(
        (
            d.string_table.len(),
            d.mapping_table.len(),
            d.location_table.len()
        ),
        (5, 1, 1)
    );
}

/// True when no two entries encode to the same bytes.
fn unique<M: Message>(table: &[M]) -> bool {
    let set: HashSet<Vec<u8>> = table.iter().map(Message::encode_to_vec).collect();
    set.len() == table.len()
}

#[test]
fn tables_are_deduplicated() {
    let req = request();
    let d = dict(&req);
    assert_eq!(
        d.string_table.iter().collect::<HashSet<_>>().len(),
        d.string_table.len()
    );
    assert!(unique(&d.mapping_table));
    assert!(unique(&d.location_table));
    assert!(unique(&d.function_table));
    assert!(unique(&d.attribute_table));
    assert!(unique(&d.stack_table));
    // libc, app, kernel; read, inner, outer, main, ksys_read; 5 distinct frames; 3 stacks.
    assert_eq!(d.mapping_table.len(), 1 + 3);
    assert_eq!(d.function_table.len(), 1 + 5);
    assert_eq!(d.location_table.len(), 1 + 5);
    assert_eq!(d.stack_table.len(), 1 + 3);
}

#[test]
fn every_index_is_in_range() {
    let req = request();
    let d = dict(&req);
    let check =
        |i: i32, len: usize| assert!(i >= 0 && usize::try_from(i).unwrap() < len, "{i} >= {len}");
    let strings = d.string_table.len();
    let attrs = d.attribute_table.len();
    for m in &d.mapping_table {
        check(m.filename_strindex, strings);
        m.attribute_indices.iter().for_each(|&i| check(i, attrs));
    }
    for l in &d.location_table {
        check(l.mapping_index, d.mapping_table.len());
        l.attribute_indices.iter().for_each(|&i| check(i, attrs));
        l.lines
            .iter()
            .for_each(|line| check(line.function_index, d.function_table.len()));
    }
    for f in &d.function_table {
        check(f.name_strindex, strings);
        check(f.system_name_strindex, strings);
        check(f.filename_strindex, strings);
    }
    for a in &d.attribute_table {
        check(a.key_strindex, strings);
        check(a.unit_strindex, strings);
    }
    for s in &d.stack_table {
        s.location_indices
            .iter()
            .for_each(|&i| check(i, d.location_table.len()));
    }
    for rp in &req.resource_profiles {
        for p in &rp.scope_profiles[0].profiles {
            let st = p.sample_type.unwrap();
            let pt = p.period_type.unwrap();
            [
                st.type_strindex,
                st.unit_strindex,
                pt.type_strindex,
                pt.unit_strindex,
            ]
            .iter()
            .for_each(|&i| check(i, strings));
            for s in &p.samples {
                check(s.stack_index, d.stack_table.len());
                check(s.link_index, d.link_table.len());
                s.attribute_indices.iter().for_each(|&i| check(i, attrs));
            }
        }
    }
}

#[test]
fn profile_shape_resource_and_scope() {
    let req = request();
    let d = dict(&req);
    // The process without samples is left out.
    assert_eq!(req.resource_profiles.len(), 2);
    let rp = &req.resource_profiles[0];
    assert_eq!(rp.schema_url, SCHEMA_URL);
    let attrs = &rp.resource.as_ref().unwrap().attributes;
    assert_eq!(resource_attr(attrs, "process.pid"), &Value::IntValue(100));
    assert_eq!(
        resource_attr(attrs, "service.name"),
        &Value::StringValue("app".into())
    );
    assert_eq!(
        resource_attr(attrs, "process.executable.name"),
        &Value::StringValue("app".into())
    );
    assert_eq!(
        resource_attr(attrs, "process.executable.path"),
        &Value::StringValue("/usr/bin/app".into())
    );
    assert_eq!(
        resource_attr(attrs, "host.name"),
        &Value::StringValue("testhost".into())
    );
    assert_eq!(
        resource_attr(attrs, "host.arch"),
        &Value::StringValue("amd64".into())
    );
    assert_eq!(
        resource_attr(attrs, "os.type"),
        &Value::StringValue("linux".into())
    );
    assert_eq!(
        resource_attr(attrs, "container.id"),
        &Value::StringValue(test_fixtures::CONTAINER_ID.into())
    );
    assert_eq!(
        resource_attr(attrs, "k8s.pod.uid"),
        &Value::StringValue(test_fixtures::POD_UID.into())
    );
    assert_eq!(
        resource_attr(attrs, "process.parent_pid"),
        &Value::IntValue(1)
    );
    // Outside containers the attributes are left out, not sent empty.
    let other = &req.resource_profiles[1]
        .resource
        .as_ref()
        .unwrap()
        .attributes;
    assert!(
        !other
            .iter()
            .any(|kv| kv.key == "container.id" || kv.key == "k8s.pod.uid")
    );
    assert_eq!(rp.scope_profiles.len(), 1);
    let scope = rp.scope_profiles[0].scope.as_ref().unwrap();
    assert_eq!(
        (scope.name.as_str(), scope.version.as_str()),
        ("icecore", "1.2.3")
    );
    let profiles = &rp.scope_profiles[0].profiles;
    assert_eq!(profiles.len(), 1);
    let p = &profiles[0];
    let st = p.sample_type.unwrap();
    let pt = p.period_type.unwrap();
    assert_eq!(
        (string(d, st.type_strindex), string(d, st.unit_strindex)),
        ("samples", "count")
    );
    assert_eq!(
        (string(d, pt.type_strindex), string(d, pt.unit_strindex)),
        ("cpu", "nanoseconds")
    );
    assert_eq!(p.period, PERIOD);
    assert_eq!((p.time_unix_nano, p.duration_nano), (START, DURATION));
    assert!(p.profile_id.is_empty());
}

#[test]
fn samples_merge_and_carry_timestamps_only() {
    let req = request();
    let d = dict(&req);
    let p = &req.resource_profiles[0].scope_profiles[0].profiles[0];
    // (stack a, app) merged from two groups; (stack a, worker); (stack b, app).
    assert_eq!(p.samples.len(), 3);
    let counts: Vec<usize> = p
        .samples
        .iter()
        .map(|s| s.timestamps_unix_nano.len())
        .collect();
    assert_eq!(counts, [3, 1, 3]);
    assert_eq!(
        p.samples[0].timestamps_unix_nano,
        [START + 1, START + 2, START + 3]
    );
    assert_eq!(p.samples[0].stack_index, p.samples[1].stack_index);
    for s in &p.samples {
        assert!(s.values.is_empty());
        assert_eq!(s.link_index, 0);
        let attrs: Vec<_> = s.attribute_indices.iter().map(|&i| attr(d, i)).collect();
        assert_eq!(attrs[0].0, "thread.name");
        assert_eq!(attrs[1].0, "thread.id");
    }
    assert_eq!(
        attr(d, p.samples[1].attribute_indices[0]).1,
        Value::StringValue("worker".into())
    );
    assert_eq!(
        attr(d, p.samples[1].attribute_indices[1]).1,
        Value::IntValue(101)
    );
}

#[test]
fn timestamps_lie_inside_the_window() {
    let mut batch = test_fixtures::batch();
    let check = |req: &ExportProfilesServiceRequest| {
        for rp in &req.resource_profiles {
            let p = &rp.scope_profiles[0].profiles[0];
            for &t in p.samples.iter().flat_map(|s| &s.timestamps_unix_nano) {
                assert!(t >= p.time_unix_nano && t < p.time_unix_nano + p.duration_nano);
            }
        }
    };
    check(&encode_request(&batch, "1"));
    // A stray timestamp widens the window rather than falling outside it.
    batch.processes[0].samples[0]
        .timestamps_unix_nanos
        .push(START + DURATION + 10);
    batch.processes[0].samples[0]
        .timestamps_unix_nanos
        .push(START - 10);
    let req = encode_request(&batch, "1");
    check(&req);
    let p = &req.resource_profiles[0].scope_profiles[0].profiles[0];
    assert_eq!(
        (p.time_unix_nano, p.duration_nano),
        (START - 10, DURATION + 21)
    );
}

#[test]
fn locations_carry_frame_type_lines_and_mappings() {
    let req = request();
    let d = dict(&req);
    let by_addr = |addr: u64| d.location_table.iter().find(|l| l.address == addr).unwrap();
    let kernel = by_addr(0xffff_ffff_8100_1000);
    assert_eq!(kernel.attribute_indices.len(), 1);
    assert_eq!(
        attr(d, kernel.attribute_indices[0]),
        (ATTR_FRAME_TYPE, Value::StringValue("kernel".into()))
    );
    let inlined = by_addr(0x5555_0000_0100);
    assert_eq!(
        attr(d, inlined.attribute_indices[0]).1,
        Value::StringValue("native".into())
    );
    // Innermost inlined function first.
    let names: Vec<&str> = inlined
        .lines
        .iter()
        .map(|l| {
            let f = d.function_table[usize::try_from(l.function_index).unwrap()];
            assert_eq!(string(d, f.filename_strindex), "app.c");
            assert_eq!(
                string(d, f.system_name_strindex),
                format!("_Z{}", string(d, f.name_strindex))
            );
            string(d, f.name_strindex)
        })
        .collect();
    assert_eq!(names, ["inner", "outer"]);
    assert_eq!(inlined.lines[0].line, 12);
    let unsymbolized = by_addr(0x1000);
    assert_eq!(
        (unsymbolized.mapping_index, unsymbolized.lines.len()),
        (0, 0)
    );

    let libc = &d.mapping_table[usize::try_from(by_addr(0x7f00_0000_1234).mapping_index).unwrap()];
    assert_eq!(
        string(d, libc.filename_strindex),
        "/usr/lib/x86_64-linux-gnu/libc.so.6"
    );
    assert_eq!(
        (libc.memory_start, libc.memory_limit, libc.file_offset),
        (0x7f00_0000_0000, 0x7f00_0020_0000, 0x28000)
    );
    assert_eq!(
        attr(d, libc.attribute_indices[0]),
        (
            ATTR_BUILD_ID_GNU,
            Value::StringValue("0123456789abcdef0123456789abcdef01234567".into())
        )
    );
    let app = &d.mapping_table[usize::try_from(inlined.mapping_index).unwrap()];
    assert!(app.attribute_indices.is_empty());
}

#[test]
fn request_round_trips_through_prost() {
    let req = request();
    let decoded = ExportProfilesServiceRequest::decode(req.encode_to_vec().as_slice()).unwrap();
    assert_eq!(decoded, req);
}

#[test]
fn configured_resource_attributes_apply_to_every_resource() {
    let configured = ResourceAttributes {
        service_name: Some("checkout".into()),
        extra: vec![
            ("deployment.environment.name".into(), "prod".into()),
            // Measured values win over configured ones.
            ("process.pid".into(), "1".into()),
        ],
    };
    let req = encode_request_with(&test_fixtures::batch(), "1", &configured);
    assert_eq!(req.resource_profiles.len(), 2);
    for rp in &req.resource_profiles {
        let attrs = &rp.resource.as_ref().unwrap().attributes;
        assert_eq!(
            resource_attr(attrs, "service.name"),
            &Value::StringValue("checkout".into())
        );
        assert_eq!(
            resource_attr(attrs, "deployment.environment.name"),
            &Value::StringValue("prod".into())
        );
        assert!(matches!(resource_attr(attrs, "process.pid"), Value::IntValue(p) if *p != 1));
        assert_eq!(attrs.iter().filter(|kv| kv.key == "process.pid").count(), 1);
    }
}

#[test]
fn off_cpu_samples_have_a_value_per_timestamp() {
    let batch = crate::test_fixtures::off_cpu_batch();
    let req = encode_request(&batch, "1.2.3");
    let d = dict(&req);
    let mut values = 0i64;
    for rp in &req.resource_profiles {
        let profile = &rp.scope_profiles[0].profiles[0];
        let sample_type = profile.sample_type.expect("sample type");
        assert_eq!(string(d, sample_type.type_strindex), "off_cpu");
        assert_eq!(string(d, sample_type.unit_strindex), "nanoseconds");
        let period_type = profile.period_type.expect("period type");
        assert_eq!(string(d, period_type.type_strindex), "context_switch");
        assert_eq!(profile.period, 100);
        for sample in &profile.samples {
            assert_eq!(sample.values.len(), sample.timestamps_unix_nano.len());
            values += sample.values.iter().sum::<i64>();
        }
    }
    let expected: u64 = batch
        .processes
        .iter()
        .flat_map(|p| &p.samples)
        .map(|g| g.total_nanos(0))
        .sum();
    assert_eq!(values as u64, expected);
}
