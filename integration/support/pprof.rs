// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! Independent pprof decoder: compiles the pprof schema `otlp/proto/profile.proto`
//! with protox at test time and walks `perftools.profiles.Profile` reflectively,
//! by field name, so it shares no code with icecore's encoder (only the schema
//! file, which the `otlp` crate generates its message types from).

use std::collections::HashMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, DynamicMessage, ReflectMessage as _, Value};

use super::summary::{DecodedSample, Frame};

/// One decoded pprof file.
#[derive(Debug, Clone)]
pub struct PprofProfile {
    pub path: PathBuf,
    /// (type, unit) per sample value.
    pub sample_types: Vec<(String, String)>,
    pub period_type: Option<(String, String)>,
    pub period: i64,
    pub time_nanos: i64,
    pub duration_nanos: i64,
    pub samples: Vec<DecodedSample>,
    /// Broken pprof rules (string table, ids, ranges, lengths, unknown fields).
    pub violations: Vec<String>,
}

fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let dir = super::package_dir().join("otlp/proto");
        let fds = protox::compile(["profile.proto"], [&dir]).unwrap_or_else(|e| {
            panic!("protox cannot compile {}/profile.proto: {e}", dir.display())
        });
        DescriptorPool::from_file_descriptor_set(fds).expect("pprof descriptor pool")
    })
}

fn field(msg: &DynamicMessage, name: &str) -> Value {
    assert!(
        msg.descriptor().get_field_by_name(name).is_some(),
        "{} has no field {name} (test bug)",
        msg.descriptor().full_name()
    );
    msg.get_field_by_name(name)
        .map(|v| v.into_owned())
        .unwrap_or(Value::Bool(false))
}

fn int(msg: &DynamicMessage, name: &str) -> i64 {
    match field(msg, name) {
        Value::I64(v) => v,
        Value::U64(v) => v as i64,
        Value::I32(v) => v as i64,
        Value::U32(v) => v as i64,
        other => panic!("{name} is not an integer: {other:?}"),
    }
}

fn uint(msg: &DynamicMessage, name: &str) -> u64 {
    match field(msg, name) {
        Value::U64(v) => v,
        Value::I64(v) => v as u64,
        other => panic!("{name} is not an integer: {other:?}"),
    }
}

fn messages(msg: &DynamicMessage, name: &str) -> Vec<DynamicMessage> {
    match field(msg, name) {
        Value::List(items) => items
            .into_iter()
            .filter_map(|v| match v {
                Value::Message(m) => Some(m),
                _ => None,
            })
            .collect(),
        other => panic!("{name} is not a repeated message: {other:?}"),
    }
}

fn message(msg: &DynamicMessage, name: &str) -> Option<DynamicMessage> {
    if !msg.has_field_by_name(name) {
        return None;
    }
    match field(msg, name) {
        Value::Message(m) => Some(m),
        _ => None,
    }
}

fn ints(msg: &DynamicMessage, name: &str) -> Vec<i64> {
    match field(msg, name) {
        Value::List(items) => items
            .into_iter()
            .map(|v| match v {
                Value::I64(x) => x,
                Value::U64(x) => x as i64,
                other => panic!("{name} holds a non-integer: {other:?}"),
            })
            .collect(),
        other => panic!("{name} is not a repeated integer: {other:?}"),
    }
}

fn strings(msg: &DynamicMessage, name: &str) -> Vec<String> {
    match field(msg, name) {
        Value::List(items) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => s,
                other => panic!("{name} holds a non-string: {other:?}"),
            })
            .collect(),
        other => panic!("{name} is not a repeated string: {other:?}"),
    }
}

fn unknown_fields(msg: &DynamicMessage, path: &str, out: &mut Vec<String>) {
    for u in msg.unknown_fields() {
        out.push(format!("unknown field {} in {path}", u.number()));
    }
    for (f, v) in msg.fields() {
        match v {
            Value::Message(m) => unknown_fields(m, &format!("{path}.{}", f.name()), out),
            Value::List(items) => {
                for (i, item) in items.iter().enumerate() {
                    if let Value::Message(m) = item {
                        unknown_fields(m, &format!("{path}.{}[{i}]", f.name()), out);
                    }
                }
            }
            _ => {}
        }
    }
}

/// pprof has no frame kinds; by the convention of perf and Parca, kernel
/// frames are those of the `[kernel.kallsyms]` mapping.
fn kernel_kind(mapping: Option<&str>) -> Option<String> {
    (mapping == Some("[kernel.kallsyms]")).then(|| "kernel".to_owned())
}

/// Gunzips and decodes one pprof file.
pub fn decode_file(path: &Path) -> PprofProfile {
    let compressed = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert!(
        compressed.starts_with(&[0x1f, 0x8b]),
        "{} is not gzipped",
        path.display()
    );
    let mut bytes = Vec::new();
    flate2::read::MultiGzDecoder::new(compressed.as_slice())
        .read_to_end(&mut bytes)
        .unwrap_or_else(|e| panic!("gunzip {}: {e}", path.display()));
    decode_bytes(&bytes, path)
}

/// Decodes uncompressed pprof bytes.
pub fn decode_bytes(bytes: &[u8], path: &Path) -> PprofProfile {
    let desc = pool()
        .get_message_by_name("perftools.profiles.Profile")
        .expect("Profile descriptor");
    let msg = DynamicMessage::decode(desc, bytes)
        .unwrap_or_else(|e| panic!("{} is not a pprof Profile: {e}", path.display()));
    let mut v = Vec::new();
    unknown_fields(&msg, "Profile", &mut v);

    let strings_table = strings(&msg, "string_table");
    if strings_table.first().map(String::as_str) != Some("") {
        v.push("string_table[0] is not \"\"".into());
    }
    let s = |i: i64, what: &str, v: &mut Vec<String>| -> String {
        match usize::try_from(i).ok().and_then(|i| strings_table.get(i)) {
            Some(x) => x.clone(),
            None => {
                v.push(format!("{what}: string index {i} out of range"));
                String::new()
            }
        }
    };

    let mut sample_types = Vec::new();
    for vt in messages(&msg, "sample_type") {
        let t = s(int(&vt, "type"), "sample_type.type", &mut v);
        let u = s(int(&vt, "unit"), "sample_type.unit", &mut v);
        sample_types.push((t, u));
    }
    let period_type = message(&msg, "period_type").map(|vt| {
        (
            s(int(&vt, "type"), "period_type.type", &mut v),
            s(int(&vt, "unit"), "period_type.unit", &mut v),
        )
    });

    // Functions, mappings, locations: ids must be 1..N in order (Parca's rule).
    let mut functions: HashMap<u64, String> = HashMap::new();
    for (i, f) in messages(&msg, "function").iter().enumerate() {
        let id = uint(f, "id");
        if id != i as u64 + 1 {
            v.push(format!("function[{i}].id = {id}, expected {}", i + 1));
        }
        let name = s(int(f, "name"), "function.name", &mut v);
        s(int(f, "system_name"), "function.system_name", &mut v);
        s(int(f, "filename"), "function.filename", &mut v);
        functions.insert(id, name);
    }
    let mut mapping_files: HashMap<u64, String> = HashMap::new();
    for (i, m) in messages(&msg, "mapping").iter().enumerate() {
        let id = uint(m, "id");
        if id != i as u64 + 1 {
            v.push(format!("mapping[{i}].id = {id}, expected {}", i + 1));
        }
        let filename = s(int(m, "filename"), "mapping.filename", &mut v);
        s(int(m, "build_id"), "mapping.build_id", &mut v);
        mapping_files.insert(id, filename);
    }
    let mut locations: HashMap<u64, Vec<Frame>> = HashMap::new();
    for (i, l) in messages(&msg, "location").iter().enumerate() {
        let id = uint(l, "id");
        if id != i as u64 + 1 {
            v.push(format!("location[{i}].id = {id}, expected {}", i + 1));
        }
        let mapping_id = uint(l, "mapping_id");
        if mapping_id != 0 && !mapping_files.contains_key(&mapping_id) {
            v.push(format!(
                "location {id}: mapping_id {mapping_id} does not exist"
            ));
        }
        let address = uint(l, "address");
        let mapping = mapping_files.get(&mapping_id).cloned();
        let mut frames = Vec::new();
        for line in messages(l, "line") {
            let fid = uint(&line, "function_id");
            let name = match functions.get(&fid) {
                Some(n) => n.clone(),
                None => {
                    v.push(format!("location {id}: function_id {fid} does not exist"));
                    String::new()
                }
            };
            frames.push(Frame {
                function: name,
                kind: kernel_kind(mapping.as_deref()),
                address,
                mapping: mapping.clone(),
                filename: None,
                line: int(&line, "line"),
                column: int(&line, "column"),
            });
        }
        if frames.is_empty() {
            frames.push(Frame {
                function: String::new(),
                kind: kernel_kind(mapping.as_deref()),
                address,
                mapping,
                filename: None,
                line: 0,
                column: 0,
            });
        }
        locations.insert(id, frames);
    }

    let mut samples = Vec::new();
    for (i, smp) in messages(&msg, "sample").iter().enumerate() {
        let values = ints(smp, "value");
        if values.len() != sample_types.len() {
            v.push(format!(
                "sample[{i}] has {} values for {} sample types",
                values.len(),
                sample_types.len()
            ));
        }
        if values.len() == 2 && values[0] > 0 && values[1] <= 0 {
            v.push(format!(
                "sample[{i}]: cpu/nanoseconds value {} is not positive",
                values[1]
            ));
        }
        let mut stack = Vec::new();
        for id in ints(smp, "location_id") {
            match locations.get(&(id as u64)) {
                Some(frames) => stack.extend(frames.iter().cloned()),
                None => v.push(format!("sample[{i}]: location_id {id} does not exist")),
            }
        }
        let mut out = DecodedSample {
            stack,
            count: values.first().copied().unwrap_or(0).max(0) as u64,
            nanos: values.get(1).copied().unwrap_or(0).max(0) as u64,
            ..Default::default()
        };
        for label in messages(smp, "label") {
            let key_index = int(&label, "key");
            if key_index == 0 {
                v.push(format!("sample[{i}]: label with key 0"));
            }
            let key = s(key_index, "label.key", &mut v);
            let str_index = int(&label, "str");
            let num = int(&label, "num");
            let value = (str_index != 0).then(|| s(str_index, "label.str", &mut v));
            if let Some(value) = &value {
                out.labels.insert(key.clone(), value.clone());
            }
            match key.as_str() {
                "pid" => out.pid = Some(num),
                "comm" => out.comm = value,
                "thread" => out.thread_name = value,
                "thread_id" | "tid" => out.thread_id = Some(num),
                "cpu" => out.cpu = Some(num),
                "container_id" => out.container_id = value,
                "pod_uid" => out.pod_uid = value,
                _ => {}
            }
        }
        samples.push(out);
    }

    PprofProfile {
        path: path.to_path_buf(),
        sample_types,
        period_type,
        period: int(&msg, "period"),
        time_nanos: int(&msg, "time_nanos"),
        duration_nanos: int(&msg, "duration_nanos"),
        samples,
        violations: v,
    }
}

/// Every file in `dir`, sorted by name.
pub fn dir_entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok()).map(|e| e.path()).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// Decodes every `*.pb.gz` in `dir`, ordered by profile start time.
pub fn decode_dir(dir: &Path) -> Vec<PprofProfile> {
    let mut v: Vec<PprofProfile> = dir_entries(dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".pb.gz"))
        .map(|p| decode_file(&p))
        .collect();
    v.sort_by_key(|p| (p.time_nanos, p.path.clone()));
    v
}

/// All samples of all profiles.
pub fn all_samples(profiles: &[PprofProfile]) -> Vec<DecodedSample> {
    profiles.iter().flat_map(|p| p.samples.clone()).collect()
}

/// Every pprof file of a directory, validated, and all their samples.
pub struct Written {
    /// Ordered by profile start time.
    pub profiles: Vec<PprofProfile>,
    pub samples: Vec<DecodedSample>,
}

/// Decodes every `*.pb.gz` in `dir` and asserts that they are valid icecore
/// pprof files sampled at `hz`.
pub fn read_valid(dir: &Path, hz: u32) -> Written {
    let profiles = decode_dir(dir);
    assert_valid(&profiles, hz);
    let samples = all_samples(&profiles);
    Written { profiles, samples }
}

/// Every file in the pprof dir must be a finished `*.pb.gz` (they are written to a
/// temporary name and renamed, so no partial file may remain after exit).
pub fn assert_only_pprof_files(dir: &Path) {
    let strays: Vec<_> = dir_entries(dir)
        .into_iter()
        .filter(|p| !p.to_string_lossy().ends_with(".pb.gz"))
        .collect();
    assert!(
        strays.is_empty(),
        "unexpected files left in the pprof dir: {strays:?}"
    );
}

/// Structural assertions every icecore pprof file must satisfy.
pub fn assert_valid(profiles: &[PprofProfile], hz: u32) {
    let mut problems = Vec::new();
    let expected_types = vec![
        ("samples".to_string(), "count".to_string()),
        ("cpu".to_string(), "nanoseconds".to_string()),
    ];
    for p in profiles {
        let name = p.path.display();
        for v in &p.violations {
            problems.push(format!("{name}: {v}"));
        }
        if p.sample_types != expected_types {
            problems.push(format!(
                "{name}: sample_type {:?}, expected {expected_types:?}",
                p.sample_types
            ));
        }
        if let Some(pt) = &p.period_type
            && (pt.0 != "cpu" || pt.1 != "nanoseconds")
        {
            problems.push(format!(
                "{name}: period_type {pt:?}, expected (cpu, nanoseconds)"
            ));
        }
        let period = 1e9 / hz as f64;
        if p.period != 0 && (p.period as f64 - period).abs() > 1.0 {
            problems.push(format!(
                "{name}: period {} ns, expected {period:.0}",
                p.period
            ));
        }
        for (i, s) in p.samples.iter().enumerate() {
            if s.count == 0 {
                problems.push(format!("{name}: sample[{i}] has count 0"));
            }
            if s.pid.is_none() {
                problems.push(format!("{name}: sample[{i}] has no pid label"));
            }
            if s.stack.is_empty() {
                problems.push(format!("{name}: sample[{i}] has no locations"));
            }
        }
    }
    problems.truncate(50);
    assert!(
        problems.is_empty(),
        "invalid pprof output:\n  {}",
        problems.join("\n  ")
    );
}
