// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! OTLP Profiles (v1.10) structural validation of received requests: the
//! transport (gzip, no unknown fields), the dictionary tables (`dictionary`) and
//! the resources, scopes, profiles and samples that reference them.

mod dictionary;

use std::collections::HashSet;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::profiles::v1development::{Profile, ProfilesDictionary, ValueType};

use super::{AttrValue, indexed_attributes, key_values, string_at};
use crate::support::receiver::ReceivedRequest;

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

    dictionary::check_zero_elements(&mut c);
    dictionary::check_tables(&mut c);
    check_resources(&mut c, req, period);
    dictionary::check_should_rules(&mut c);
}

/// Resources, scopes, profiles, samples.
fn check_resources(c: &mut Checker<'_>, req: &ExportProfilesServiceRequest, period: i64) {
    let dict = c.dict;
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
                // One resource per process image: a pid that ran `exec` in
                // the interval has one per executable.
                let path = match attrs.get("process.executable.path") {
                    Some(AttrValue::Str(path)) => path.clone(),
                    _ => String::new(),
                };
                if !pids.insert((*pid, path.clone())) {
                    c.bad(format!(
                        "{rctx}: pid {pid} ({path}) has more than one ResourceProfiles"
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
                check_profile(c, &pctx, p, period);
            }
        }
    }
}

/// One profile and its samples; `pctx` names it in messages.
fn check_profile(c: &mut Checker<'_>, pctx: &str, p: &Profile, period: i64) {
    let dict = c.dict;
    // An off-CPU profile: each sample's value is the time waited, and the
    // period the context switches one recorded wait stands for.
    let off_cpu = p
        .sample_type
        .as_ref()
        .and_then(|vt| string_at(dict, vt.type_strindex))
        == Some("off_cpu");
    if off_cpu {
        c.value_type(
            p.sample_type.as_ref(),
            ("off_cpu", "nanoseconds"),
            &format!("{pctx}.sample_type"),
        );
        c.value_type(
            p.period_type.as_ref(),
            ("context_switch", "count"),
            &format!("{pctx}.period_type"),
        );
        if p.period < 1 {
            c.bad(format!("{pctx}: period {}, expected at least 1", p.period));
        }
        if p.samples.iter().any(|s| s.values.is_empty()) {
            c.bad(format!("{pctx}: an off-CPU sample without values"));
        }
    } else {
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
        // Optional (a forwarded sender may not say), a CPU number if there.
        match sattrs.get("cpu.logical_number") {
            None => {}
            Some(AttrValue::Int(cpu)) if (0..4096).contains(cpu) => {}
            other => c.bad(format!(
                "{xctx}: cpu.logical_number is {other:?}, expected a CPU number"
            )),
        }
    }
    if shapes.len() > 1 {
        c.bad(format!("{pctx}: samples mix values shapes"));
    }
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
