// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The rules on the seven `ProfilesDictionary` tables of one request: the zero
//! element, references that stay in range, and (SHOULD level) no duplicate and
//! no unreferenced entries.

use std::collections::HashMap;

use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, KeyValueAndUnit, Link, Location, Mapping, Stack,
};
use prost::Message as _;

use super::super::{AttrValue, indexed_attributes};
use super::Checker;

/// `profile.frame.type` values of the semantic conventions.
const FRAME_TYPES: &[&str] = &[
    "native", "kernel", "cpython", "jvm", "v8js", "ruby", "php", "perl", "dotnet", "beam", "go",
    "rust", "luajit",
];

/// Element 0 of all seven tables is the zero value.
pub(super) fn check_zero_elements(c: &mut Checker<'_>) {
    let dict = c.dict;
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
}

/// Table contents: string, mapping, function, attribute and location indices in
/// range, a known frame type on every location, no empty stack.
pub(super) fn check_tables(c: &mut Checker<'_>) {
    let dict = c.dict;
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

/// SHOULD-level rules: no duplicates, no orphans (unreferenced entries). Run
/// last: the orphan check needs the references the other checks recorded.
pub(super) fn check_should_rules(c: &mut Checker<'_>) {
    let dict = c.dict;
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
