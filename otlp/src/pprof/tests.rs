#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;

use flate2::read::GzDecoder;
use prost::Message;

use super::*;
use crate::test_fixtures::{self, DURATION, PERIOD, START};

fn s(p: &Profile, i: i64) -> &str {
    &p.string_table[usize::try_from(i).unwrap()]
}

fn label_num(p: &Profile, sample: &Sample, key: &str) -> Option<i64> {
    sample
        .label
        .iter()
        .find(|l| s(p, l.key) == key)
        .map(|l| l.num)
}

fn label_str<'p>(p: &'p Profile, sample: &Sample, key: &str) -> Option<&'p str> {
    sample
        .label
        .iter()
        .find(|l| s(p, l.key) == key)
        .map(|l| s(p, l.str))
}

#[test]
fn header_fields() {
    let p = encode_profile(&test_fixtures::batch());
    assert_eq!(p.string_table[0], "");
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (s(&p, t.r#type), s(&p, t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let pt = p.period_type.unwrap();
    assert_eq!((s(&p, pt.r#type), s(&p, pt.unit)), ("cpu", "nanoseconds"));
    assert_eq!(p.period, PERIOD);
    assert_eq!(s(&p, p.default_sample_type), "cpu");
    assert_eq!(p.time_nanos, i64::try_from(START).unwrap());
    assert_eq!(p.duration_nanos, i64::try_from(DURATION).unwrap());
}

#[test]
fn the_first_mapping_is_the_one_program_or_none() {
    let mut batch = test_fixtures::batch();
    let several = encode_profile(&batch);
    assert_eq!(
        s(&several, several.mapping[0].filename),
        "",
        "no one program"
    );
    assert_eq!(several.mapping[0].memory_limit, 0);
    batch.processes.truncate(1);
    let one = encode_profile(&batch);
    assert_eq!(s(&one, one.mapping[0].filename), "/usr/bin/app");
}

#[test]
fn ids_are_sequential_and_references_resolve() {
    let p = encode_profile(&test_fixtures::batch());
    let ids = |v: Vec<u64>| assert_eq!(v, (1..=v.len() as u64).collect::<Vec<_>>());
    ids(p.mapping.iter().map(|m| m.id).collect());
    ids(p.location.iter().map(|l| l.id).collect());
    ids(p.function.iter().map(|f| f.id).collect());
    // Deduplicated: 3 mappings after the placeholder of a multi-process
    // profile, 5 locations, 5 functions (as in the OTLP test).
    assert_eq!(
        (p.mapping.len(), p.location.len(), p.function.len()),
        (4, 5, 5)
    );
    let n_loc = p.location.len() as u64;
    for sample in &p.sample {
        assert_eq!(sample.value.len(), p.sample_type.len());
        assert!(sample.location_id.iter().all(|&id| id >= 1 && id <= n_loc));
        for l in &sample.label {
            assert!(l.key != 0 && usize::try_from(l.key).unwrap() < p.string_table.len());
            assert!(usize::try_from(l.str).unwrap() < p.string_table.len());
        }
    }
    for l in &p.location {
        assert!(l.mapping_id <= p.mapping.len() as u64);
        assert!(
            l.line
                .iter()
                .all(|line| line.function_id >= 1 && line.function_id <= p.function.len() as u64)
        );
    }
}

#[test]
fn samples_values_labels_and_merging() {
    let p = encode_profile(&test_fixtures::batch());
    // Process 100: 3 merged samples; process 200: 1; the idle process adds none.
    assert_eq!(p.sample.len(), 4);
    let first = &p.sample[0];
    assert_eq!(first.value, [3, 3 * PERIOD]);
    assert_eq!(label_num(&p, first, LABEL_PID), Some(100));
    assert_eq!(label_str(&p, first, LABEL_COMM), Some("app"));
    assert_eq!(label_str(&p, first, LABEL_THREAD), Some("app"));
    assert_eq!(label_num(&p, first, LABEL_THREAD_ID), Some(100));
    assert_eq!(label_str(&p, &p.sample[1], LABEL_THREAD), Some("worker"));
    assert_eq!(label_str(&p, &p.sample[3], LABEL_COMM), Some("other"));
    let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 8);
}

#[test]
fn mappings_locations_and_lines() {
    let p = encode_profile(&test_fixtures::batch());
    let libc = p
        .mapping
        .iter()
        .find(|m| s(&p, m.filename).ends_with("libc.so.6"))
        .unwrap();
    assert_eq!(
        s(&p, libc.build_id),
        "0123456789abcdef0123456789abcdef01234567"
    );
    assert!(libc.has_functions && !libc.has_filenames && !libc.has_inline_frames);
    let app = p
        .mapping
        .iter()
        .find(|m| s(&p, m.filename) == "/usr/bin/app")
        .unwrap();
    assert_eq!(app.build_id, 0);
    assert!(
        app.has_functions && app.has_filenames && app.has_line_numbers && app.has_inline_frames
    );

    let inlined = p
        .location
        .iter()
        .find(|l| l.address == 0x5555_0000_0100)
        .unwrap();
    assert_eq!(inlined.mapping_id, app.id);
    let names: Vec<&str> = inlined
        .line
        .iter()
        .map(|l| {
            s(
                &p,
                p.function[usize::try_from(l.function_id - 1).unwrap()].name,
            )
        })
        .collect();
    assert_eq!(names, ["inner", "outer"]);
    assert_eq!(inlined.line[1].line, 40);
    let unsymbolized = p.location.iter().find(|l| l.address == 0x1000).unwrap();
    assert_eq!((unsymbolized.mapping_id, unsymbolized.line.len()), (0, 0));
    // Leaf first: sample 2 (process 100, stack b) starts at the kernel frame.
    let leaf = p.sample[2].location_id[0];
    assert_eq!(
        p.location[usize::try_from(leaf - 1).unwrap()].address,
        0xffff_ffff_8100_1000
    );
}

#[test]
fn gzip_round_trip() {
    let batch = test_fixtures::batch();
    let gz = encode_gzip(&batch).unwrap();
    assert_eq!(&gz[..2], &[0x1f, 0x8b]);
    let mut raw = Vec::new();
    GzDecoder::new(gz.as_slice()).read_to_end(&mut raw).unwrap();
    assert_eq!(
        Profile::decode(raw.as_slice()).unwrap(),
        encode_profile(&batch)
    );
}

#[test]
fn off_cpu_profiles_carry_the_time_waited() {
    let batch = test_fixtures::off_cpu_batch();
    let p = encode_profile(&batch);
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (s(&p, t.r#type), s(&p, t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("off_cpu", "nanoseconds")]);
    assert_eq!(s(&p, p.default_sample_type), "off_cpu");
    let period_type = p.period_type.expect("period type");
    assert_eq!(
        (s(&p, period_type.r#type), s(&p, period_type.unit)),
        ("context_switch", "count")
    );
    assert_eq!(p.period, 100);
    let expected: i64 = batch
        .processes
        .iter()
        .flat_map(|p| &p.samples)
        .map(|g| g.total_nanos(0) as i64)
        .sum();
    let encoded: i64 = p.sample.iter().map(|s| s.value[1]).sum();
    assert_eq!(encoded, expected);
    let count: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(count as u64, batch.sample_count());
}
