// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! OTLP Profiles (v1.10) structural validation and conversion of received
//! requests into the decoded-profile summary.

use std::collections::{BTreeMap, HashMap, HashSet};

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, KeyValueAndUnit, Link, Location, Mapping, ProfilesDictionary, Stack, ValueType,
};
use prost::Message as _;

use super::receiver::ReceivedRequest;
use super::summary::{DecodedSample, Frame};

/// `profile.frame.type` values of the semantic conventions.
const FRAME_TYPES: &[&str] = &[
    "native", "kernel", "cpython", "jvm", "v8js", "ruby", "php", "perl", "dotnet", "beam", "go",
    "rust", "luajit",
];

/// A decoded attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Str(String),
    Int(i64),
    Other(String),
}

impl AttrValue {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            AttrValue::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            AttrValue::Int(i) => Some(*i),
            _ => None,
        }
    }
}

fn string_at(dict: &ProfilesDictionary, i: i32) -> Option<&str> {
    usize::try_from(i)
        .ok()
        .and_then(|i| dict.string_table.get(i))
        .map(String::as_str)
}

fn any_value(dict: &ProfilesDictionary, v: Option<&AnyValue>) -> AttrValue {
    match v.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => AttrValue::Str(s.clone()),
        Some(any_value::Value::StringValueStrindex(i)) => {
            AttrValue::Str(string_at(dict, *i).unwrap_or_default().to_string())
        }
        Some(any_value::Value::IntValue(i)) => AttrValue::Int(*i),
        other => AttrValue::Other(format!("{other:?}")),
    }
}

/// Resource (or scope) attributes by key; keys given by `key_strindex` resolved.
pub fn key_values(dict: &ProfilesDictionary, kvs: &[KeyValue]) -> BTreeMap<String, AttrValue> {
    kvs.iter()
        .map(|kv| {
            let key = if kv.key.is_empty() {
                string_at(dict, kv.key_strindex)
                    .unwrap_or_default()
                    .to_string()
            } else {
                kv.key.clone()
            };
            (key, any_value(dict, kv.value.as_ref()))
        })
        .collect()
}

/// Dictionary attributes (`attribute_indices`) by key; out-of-range indices skipped.
pub fn indexed_attributes(
    dict: &ProfilesDictionary,
    indices: &[i32],
) -> BTreeMap<String, AttrValue> {
    indices
        .iter()
        .filter_map(|&i| {
            usize::try_from(i)
                .ok()
                .and_then(|i| dict.attribute_table.get(i))
        })
        .map(|kvu| {
            (
                string_at(dict, kvu.key_strindex)
                    .unwrap_or_default()
                    .to_string(),
                any_value(dict, kvu.value.as_ref()),
            )
        })
        .collect()
}

/// Per-process view of one ResourceProfiles.
#[derive(Debug, Clone)]
pub struct ResourceInfo {
    pub attributes: BTreeMap<String, AttrValue>,
    pub scope_name: Option<String>,
    pub pid: Option<i64>,
    /// Profile windows (time_unix_nano, duration_nano).
    pub windows: Vec<(u64, u64)>,
}

pub fn resources(requests: &[ReceivedRequest]) -> Vec<ResourceInfo> {
    let empty = ProfilesDictionary::default();
    let mut out = Vec::new();
    for r in requests {
        let dict = r.request.dictionary.as_ref().unwrap_or(&empty);
        for rp in &r.request.resource_profiles {
            let attributes = rp
                .resource
                .as_ref()
                .map(|res| key_values(dict, &res.attributes))
                .unwrap_or_default();
            let pid = attributes.get("process.pid").and_then(AttrValue::as_int);
            let scope_name = rp
                .scope_profiles
                .first()
                .and_then(|sp| sp.scope.as_ref())
                .map(|s| s.name.clone());
            let windows = rp
                .scope_profiles
                .iter()
                .flat_map(|sp| &sp.profiles)
                .map(|p| (p.time_unix_nano, p.duration_nano))
                .collect();
            out.push(ResourceInfo {
                attributes,
                scope_name,
                pid,
                windows,
            });
        }
    }
    out
}

fn location_frames(dict: &ProfilesDictionary, index: i32) -> Vec<Frame> {
    let Some(loc) = usize::try_from(index)
        .ok()
        .and_then(|i| dict.location_table.get(i))
    else {
        return vec![Frame {
            function: format!("<bad location index {index}>"),
            kind: None,
            address: 0,
        }];
    };
    let kind = indexed_attributes(dict, &loc.attribute_indices)
        .get("profile.frame.type")
        .and_then(|v| v.as_str().map(str::to_string));
    let mut frames: Vec<Frame> = loc
        .lines
        .iter()
        .map(|line| {
            let name = usize::try_from(line.function_index)
                .ok()
                .and_then(|i| dict.function_table.get(i))
                .and_then(|f| string_at(dict, f.name_strindex))
                .unwrap_or_default()
                .to_string();
            Frame {
                function: name,
                kind: kind.clone(),
                address: loc.address,
            }
        })
        .collect();
    if frames.is_empty() {
        frames.push(Frame {
            function: String::new(),
            kind,
            address: loc.address,
        });
    }
    frames
}

/// Every sample of every request, with the pid and executable name of its resource.
pub fn samples(requests: &[ReceivedRequest]) -> Vec<DecodedSample> {
    let empty = ProfilesDictionary::default();
    let mut out = Vec::new();
    for r in requests {
        let dict = r.request.dictionary.as_ref().unwrap_or(&empty);
        for rp in &r.request.resource_profiles {
            let attrs = rp
                .resource
                .as_ref()
                .map(|res| key_values(dict, &res.attributes))
                .unwrap_or_default();
            let pid = attrs.get("process.pid").and_then(AttrValue::as_int);
            let comm = attrs
                .get("process.executable.name")
                .and_then(|v| v.as_str().map(str::to_string));
            for sp in &rp.scope_profiles {
                for p in &sp.profiles {
                    for s in &p.samples {
                        let sattrs = indexed_attributes(dict, &s.attribute_indices);
                        let stack = usize::try_from(s.stack_index)
                            .ok()
                            .and_then(|i| dict.stack_table.get(i))
                            .map(|st| {
                                st.location_indices
                                    .iter()
                                    .flat_map(|&li| location_frames(dict, li))
                                    .collect()
                            })
                            .unwrap_or_default();
                        let count = if s.values.is_empty() {
                            s.timestamps_unix_nano.len() as u64
                        } else {
                            s.values.iter().map(|&v| v.max(0) as u64).sum()
                        };
                        out.push(DecodedSample {
                            pid,
                            comm: comm.clone(),
                            thread_name: sattrs
                                .get("thread.name")
                                .and_then(|v| v.as_str().map(str::to_string)),
                            thread_id: sattrs.get("thread.id").and_then(AttrValue::as_int),
                            stack,
                            count,
                            timestamps: s.timestamps_unix_nano.clone(),
                        });
                    }
                }
            }
        }
    }
    out
}

/// Result of validating requests: MUST-level violations and SHOULD-level warnings.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<String>,
    pub warnings: Vec<String>,
}

struct Checker<'a> {
    dict: &'a ProfilesDictionary,
    ctx: String,
    report: &'a mut Report,
    used_strings: HashSet<usize>,
    used_mappings: HashSet<usize>,
    used_locations: HashSet<usize>,
    used_functions: HashSet<usize>,
    used_links: HashSet<usize>,
    used_attributes: HashSet<usize>,
    used_stacks: HashSet<usize>,
}

impl Checker<'_> {
    fn bad(&mut self, msg: String) {
        self.report.violations.push(format!("{}: {msg}", self.ctx));
    }

    fn index(&mut self, i: i32, len: usize, what: &str) -> Option<usize> {
        match usize::try_from(i) {
            Ok(u) if u < len => Some(u),
            _ => {
                self.bad(format!("{what} = {i} out of range (table has {len})"));
                None
            }
        }
    }

    fn str(&mut self, i: i32, what: &str) {
        if let Some(u) = self.index(i, self.dict.string_table.len(), what) {
            self.used_strings.insert(u);
        }
    }

    fn attrs(&mut self, indices: &[i32], what: &str) {
        for &i in indices {
            if let Some(u) = self.index(i, self.dict.attribute_table.len(), what) {
                self.used_attributes.insert(u);
                if u == 0 {
                    self.bad(format!("{what} references the null attribute 0"));
                }
            }
        }
    }

    fn value_type(&mut self, vt: Option<&ValueType>, expected: (&str, &str), what: &str) {
        let Some(vt) = vt else {
            self.bad(format!("{what} missing, expected {expected:?}"));
            return;
        };
        self.str(vt.type_strindex, &format!("{what}.type_strindex"));
        self.str(vt.unit_strindex, &format!("{what}.unit_strindex"));
        let got = (
            string_at(self.dict, vt.type_strindex).unwrap_or("<bad>"),
            string_at(self.dict, vt.unit_strindex).unwrap_or("<bad>"),
        );
        if got != expected {
            self.bad(format!("{what} is {got:?}, expected {expected:?}"));
        }
    }
}

fn duplicates<T, K: std::hash::Hash + Eq>(items: &[T], key: impl Fn(&T) -> K) -> Vec<usize> {
    let mut seen = HashMap::new();
    let mut dups = Vec::new();
    for (i, it) in items.iter().enumerate().skip(1) {
        if seen.insert(key(it), i).is_some() {
            dups.push(i);
        }
    }
    dups
}

/// Validates the structural OTLP rules over every request.
pub fn validate(requests: &[ReceivedRequest], hz: u32) -> Report {
    let mut report = Report::default();
    let period = (1e9 / hz as f64).round() as i64;
    for (ri, r) in requests.iter().enumerate() {
        let ctx = format!("request {ri}");
        if r.grpc_encoding.as_deref() != Some("gzip") {
            report.violations.push(format!(
                "{ctx}: grpc-encoding is {:?}, expected gzip",
                r.grpc_encoding
            ));
        }
        for u in &r.unknown_fields {
            report
                .violations
                .push(format!("{ctx}: field unknown to OTLP v1.10: {u}"));
        }
        let Some(dict) = r.request.dictionary.as_ref() else {
            report.violations.push(format!("{ctx}: no dictionary"));
            continue;
        };
        validate_request(&r.request, dict, ctx, period, &mut report);
    }
    report
}

fn validate_request(
    req: &ExportProfilesServiceRequest,
    dict: &ProfilesDictionary,
    ctx: String,
    period: i64,
    report: &mut Report,
) {
    let mut c = Checker {
        dict,
        ctx,
        report,
        used_strings: HashSet::new(),
        used_mappings: HashSet::new(),
        used_locations: HashSet::new(),
        used_functions: HashSet::new(),
        used_links: HashSet::new(),
        used_attributes: HashSet::new(),
        used_stacks: HashSet::new(),
    };

    // Element 0 of all seven tables is the zero value.
    let zero_link_ok = |l: &Link| {
        (l.trace_id.is_empty() || l.trace_id == [0u8; 16])
            && (l.span_id.is_empty() || l.span_id == [0u8; 8])
    };
    let checks: [(&str, Option<bool>); 7] = [
        (
            "mapping_table",
            dict.mapping_table.first().map(|m| *m == Mapping::default()),
        ),
        (
            "location_table",
            dict.location_table
                .first()
                .map(|l| *l == Location::default()),
        ),
        (
            "function_table",
            dict.function_table
                .first()
                .map(|f| *f == Function::default()),
        ),
        ("link_table", dict.link_table.first().map(zero_link_ok)),
        (
            "string_table",
            dict.string_table.first().map(|s| s.is_empty()),
        ),
        (
            "attribute_table",
            dict.attribute_table
                .first()
                .map(|a| *a == KeyValueAndUnit::default()),
        ),
        (
            "stack_table",
            dict.stack_table.first().map(|s| *s == Stack::default()),
        ),
    ];
    for (table, ok) in checks {
        match ok {
            None => c.bad(format!(
                "dictionary.{table} is empty (needs its zero element 0)"
            )),
            Some(false) => c.bad(format!("dictionary.{table}[0] is not the zero value")),
            Some(true) => {}
        }
    }

    // Table contents.
    for (i, m) in dict.mapping_table.iter().enumerate().skip(1) {
        c.str(
            m.filename_strindex,
            &format!("mapping[{i}].filename_strindex"),
        );
        c.attrs(
            &m.attribute_indices,
            &format!("mapping[{i}].attribute_indices"),
        );
    }
    for (i, l) in dict.location_table.iter().enumerate().skip(1) {
        if let Some(u) = c.index(
            l.mapping_index,
            dict.mapping_table.len(),
            &format!("location[{i}].mapping_index"),
        ) {
            c.used_mappings.insert(u);
        }
        for (j, line) in l.lines.iter().enumerate() {
            if let Some(u) = c.index(
                line.function_index,
                dict.function_table.len(),
                &format!("location[{i}].lines[{j}].function_index"),
            ) {
                c.used_functions.insert(u);
            }
        }
        c.attrs(
            &l.attribute_indices,
            &format!("location[{i}].attribute_indices"),
        );
        let attrs = indexed_attributes(dict, &l.attribute_indices);
        match attrs.get("profile.frame.type").and_then(AttrValue::as_str) {
            Some(t) if FRAME_TYPES.contains(&t) => {}
            other => c.bad(format!("location[{i}] has profile.frame.type {other:?}")),
        }
    }
    for (i, f) in dict.function_table.iter().enumerate().skip(1) {
        c.str(f.name_strindex, &format!("function[{i}].name_strindex"));
        c.str(
            f.system_name_strindex,
            &format!("function[{i}].system_name_strindex"),
        );
        c.str(
            f.filename_strindex,
            &format!("function[{i}].filename_strindex"),
        );
    }
    for (i, a) in dict.attribute_table.iter().enumerate().skip(1) {
        c.str(a.key_strindex, &format!("attribute[{i}].key_strindex"));
        if a.key_strindex == 0 {
            c.bad(format!("attribute[{i}] has an empty key"));
        }
        c.str(a.unit_strindex, &format!("attribute[{i}].unit_strindex"));
        if let Some(any_value::Value::StringValueStrindex(s)) =
            a.value.as_ref().and_then(|v| v.value.as_ref())
        {
            c.str(*s, &format!("attribute[{i}].value.string_value_strindex"));
        }
    }
    for (i, s) in dict.stack_table.iter().enumerate().skip(1) {
        if s.location_indices.is_empty() {
            c.bad(format!("stack[{i}] is empty"));
        }
        for &li in &s.location_indices {
            if let Some(u) = c.index(
                li,
                dict.location_table.len(),
                &format!("stack[{i}].location_indices"),
            ) {
                if u == 0 {
                    c.bad(format!("stack[{i}] references the null location 0"));
                }
                c.used_locations.insert(u);
            }
        }
    }

    // Resources, scopes, profiles, samples.
    let mut pids = HashSet::new();
    for (ri, rp) in req.resource_profiles.iter().enumerate() {
        let rctx = format!("resource_profiles[{ri}]");
        let Some(res) = rp.resource.as_ref() else {
            c.bad(format!("{rctx} has no resource"));
            continue;
        };
        let attrs = key_values(dict, &res.attributes);
        for key in [
            "service.name",
            "process.executable.name",
            "process.executable.path",
            "host.name",
        ] {
            match attrs.get(key) {
                Some(AttrValue::Str(s)) if !s.is_empty() => {}
                other => c.bad(format!(
                    "{rctx}: resource attribute {key} is {other:?}, expected a non-empty string"
                )),
            }
        }
        match attrs.get("process.pid") {
            Some(AttrValue::Int(pid)) if *pid > 0 => {
                if !pids.insert(*pid) {
                    c.bad(format!(
                        "{rctx}: pid {pid} has more than one ResourceProfiles"
                    ));
                }
            }
            other => c.bad(format!(
                "{rctx}: process.pid is {other:?}, expected a positive int"
            )),
        }
        if rp.scope_profiles.len() != 1 {
            c.bad(format!(
                "{rctx} has {} scope_profiles, expected 1",
                rp.scope_profiles.len()
            ));
        }
        for (si, sp) in rp.scope_profiles.iter().enumerate() {
            let sctx = format!("{rctx}.scope_profiles[{si}]");
            match sp.scope.as_ref() {
                Some(s) if s.name == "icecore" => {}
                other => c.bad(format!(
                    "{sctx}: scope is {other:?}, expected name \"icecore\""
                )),
            }
            if sp.profiles.len() != 1 {
                c.bad(format!(
                    "{sctx} has {} profiles, expected 1",
                    sp.profiles.len()
                ));
            }
            for (pi, p) in sp.profiles.iter().enumerate() {
                let pctx = format!("{sctx}.profiles[{pi}]");
                c.value_type(
                    p.sample_type.as_ref(),
                    ("samples", "count"),
                    &format!("{pctx}.sample_type"),
                );
                c.value_type(
                    p.period_type.as_ref(),
                    ("cpu", "nanoseconds"),
                    &format!("{pctx}.period_type"),
                );
                if (p.period - period).abs() > 1 {
                    c.bad(format!("{pctx}: period {} ns, expected {period}", p.period));
                }
                if p.time_unix_nano == 0 || p.duration_nano == 0 {
                    c.bad(format!(
                        "{pctx}: window time_unix_nano={} duration_nano={}",
                        p.time_unix_nano, p.duration_nano
                    ));
                }
                if !(p.profile_id.is_empty()
                    || (p.profile_id.len() == 16 && p.profile_id.iter().any(|&b| b != 0)))
                {
                    c.bad(format!(
                        "{pctx}: profile_id {:?} is neither empty nor 16 non-zero bytes",
                        p.profile_id
                    ));
                }
                c.attrs(&p.attribute_indices, &format!("{pctx}.attribute_indices"));
                if p.samples.is_empty() {
                    c.bad(format!("{pctx} has no samples"));
                }
                let end = p.time_unix_nano.saturating_add(p.duration_nano);
                let mut shapes = HashSet::new();
                for (xi, s) in p.samples.iter().enumerate() {
                    let xctx = format!("{pctx}.samples[{xi}]");
                    if let Some(u) = c.index(
                        s.stack_index,
                        dict.stack_table.len(),
                        &format!("{xctx}.stack_index"),
                    ) {
                        if u == 0 {
                            c.bad(format!("{xctx} has no stack (stack_index 0)"));
                        }
                        c.used_stacks.insert(u);
                    }
                    c.attrs(&s.attribute_indices, &format!("{xctx}.attribute_indices"));
                    if let Some(u) = c.index(
                        s.link_index,
                        dict.link_table.len(),
                        &format!("{xctx}.link_index"),
                    ) {
                        c.used_links.insert(u);
                    }
                    if s.timestamps_unix_nano.is_empty() {
                        c.bad(format!("{xctx} has no timestamps_unix_nano"));
                    }
                    if !s.values.is_empty() && s.values.len() != s.timestamps_unix_nano.len() {
                        c.bad(format!(
                            "{xctx}: {} values but {} timestamps",
                            s.values.len(),
                            s.timestamps_unix_nano.len()
                        ));
                    }
                    shapes.insert(s.values.is_empty());
                    for &ts in &s.timestamps_unix_nano {
                        if ts < p.time_unix_nano || ts >= end {
                            c.bad(format!(
                                "{xctx}: timestamp {ts} outside [{}, {end})",
                                p.time_unix_nano
                            ));
                            break;
                        }
                    }
                    let sattrs = indexed_attributes(dict, &s.attribute_indices);
                    match sattrs.get("thread.name") {
                        Some(AttrValue::Str(n)) if !n.is_empty() => {}
                        other => c.bad(format!("{xctx}: thread.name is {other:?}")),
                    }
                    match sattrs.get("thread.id") {
                        Some(AttrValue::Int(t)) if *t > 0 => {}
                        other => c.bad(format!(
                            "{xctx}: thread.id is {other:?}, expected a positive int"
                        )),
                    }
                }
                if shapes.len() > 1 {
                    c.bad(format!("{pctx}: samples mix values shapes"));
                }
            }
        }
    }

    // SHOULD-level rules: no duplicates, no orphans.
    let mut warn = Vec::new();
    let dup_report = [
        (
            "string_table",
            duplicates(&dict.string_table, |s| s.clone()),
        ),
        (
            "mapping_table",
            duplicates(&dict.mapping_table, |m| m.clone()),
        ),
        (
            "location_table",
            duplicates(&dict.location_table, |l| l.encode_to_vec()),
        ),
        ("function_table", duplicates(&dict.function_table, |f| *f)),
        (
            "attribute_table",
            duplicates(&dict.attribute_table, |a| a.encode_to_vec()),
        ),
        ("stack_table", duplicates(&dict.stack_table, |s| s.clone())),
    ];
    for (table, dups) in dup_report {
        if !dups.is_empty() {
            warn.push(format!(
                "{}: dictionary.{table} has duplicates at {dups:?}",
                c.ctx
            ));
        }
    }
    let orphan_report = [
        ("string_table", dict.string_table.len(), &c.used_strings),
        ("mapping_table", dict.mapping_table.len(), &c.used_mappings),
        (
            "location_table",
            dict.location_table.len(),
            &c.used_locations,
        ),
        (
            "function_table",
            dict.function_table.len(),
            &c.used_functions,
        ),
        (
            "attribute_table",
            dict.attribute_table.len(),
            &c.used_attributes,
        ),
        ("stack_table", dict.stack_table.len(), &c.used_stacks),
    ];
    for (table, len, used) in orphan_report {
        let orphans: Vec<usize> = (1..len).filter(|i| !used.contains(i)).collect();
        if !orphans.is_empty() {
            warn.push(format!(
                "{}: dictionary.{table} has {} unreferenced entries (first {:?})",
                c.ctx,
                orphans.len(),
                &orphans[..orphans.len().min(5)]
            ));
        }
    }
    let _ = &c.used_links;
    c.report.warnings.extend(warn);
}

/// Validates and panics with every violation; prints SHOULD-level warnings.
pub fn assert_valid(requests: &[ReceivedRequest], hz: u32) {
    assert!(!requests.is_empty(), "no OTLP request arrived");
    let report = validate(requests, hz);
    for w in &report.warnings {
        println!("OTLP warning (SHOULD rule): {w}");
    }
    let mut v = report.violations;
    let n = v.len();
    v.truncate(50);
    assert!(
        v.is_empty(),
        "{n} OTLP structural violation(s):\n  {}",
        v.join("\n  ")
    );
}
