// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! OTLP Profiles (v1.10) requests as the in-test receiver got them: attribute
//! helpers (here), structural validation (`validate`) and conversion into the
//! decoded-profile summary (`decode`).

pub mod decode;
pub mod validate;

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development::ProfilesDictionary;

use super::receiver::ReceivedRequest;
use super::summary::DecodedSample;

/// Every request a run exported, validated, and all their samples.
pub struct Received {
    /// In arrival order.
    pub requests: Vec<ReceivedRequest>,
    pub samples: Vec<DecodedSample>,
}

/// Asserts that `requests` are valid OTLP sampled at `hz` and decodes their samples.
pub fn receive_valid(requests: Vec<ReceivedRequest>, hz: u32) -> Received {
    validate::assert_valid(&requests, hz);
    let samples = decode::samples(&requests);
    Received { requests, samples }
}

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
