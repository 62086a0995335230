// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! Conversion of received OTLP requests into the decoded-profile summary.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::profiles::v1development::ProfilesDictionary;

use super::{AttrValue, indexed_attributes, key_values, string_at};
use crate::support::receiver::ReceivedRequest;
use crate::support::summary::{DecodedSample, Frame};

/// Per-process view of one ResourceProfiles.
#[derive(Debug, Clone)]
pub struct ResourceInfo {
    pub attributes: BTreeMap<String, AttrValue>,
    pub pid: Option<i64>,
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
            out.push(ResourceInfo { attributes, pid });
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
            mapping: None,
            filename: None,
            line: 0,
            column: 0,
        }];
    };
    let mapping = usize::try_from(loc.mapping_index)
        .ok()
        .filter(|&i| i > 0)
        .and_then(|i| dict.mapping_table.get(i))
        .and_then(|m| string_at(dict, m.filename_strindex))
        .map(str::to_string);
    let kind = indexed_attributes(dict, &loc.attribute_indices)
        .get("profile.frame.type")
        .and_then(|v| v.as_str().map(str::to_string));
    let mut frames: Vec<Frame> = loc
        .lines
        .iter()
        .map(|line| {
            let function = usize::try_from(line.function_index)
                .ok()
                .and_then(|i| dict.function_table.get(i));
            let name = function
                .and_then(|f| string_at(dict, f.name_strindex))
                .unwrap_or_default()
                .to_string();
            let filename = function
                .and_then(|f| string_at(dict, f.filename_strindex))
                .filter(|f| !f.is_empty())
                .map(str::to_string);
            Frame {
                function: name,
                kind: kind.clone(),
                address: loc.address,
                mapping: mapping.clone(),
                filename,
                line: line.line,
                column: line.column,
            }
        })
        .collect();
    if frames.is_empty() {
        frames.push(Frame {
            function: String::new(),
            kind,
            address: loc.address,
            mapping,
            filename: None,
            line: 0,
            column: 0,
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
            let string = |key: &str| attrs.get(key).and_then(|v| v.as_str().map(str::to_string));
            let (container_id, pod_uid) = (string("container.id"), string("k8s.pod.uid"));
            let parent_pid = attrs.get("process.parent_pid").and_then(AttrValue::as_int);
            let labels: std::collections::BTreeMap<String, String> = attrs
                .iter()
                .filter_map(|(k, v)| Some((k.to_string(), v.as_str()?.to_string())))
                .collect();
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
                        // Timed samples count their timestamps (their values,
                        // if any, are each one's weight); untimed ones carry
                        // their count as values.
                        let values: u64 = s.values.iter().map(|&v| v.max(0) as u64).sum();
                        let (count, nanos) = if s.timestamps_unix_nano.is_empty() {
                            (values, 0)
                        } else {
                            (s.timestamps_unix_nano.len() as u64, values)
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
                            nanos,
                            timestamps: s.timestamps_unix_nano.clone(),
                            container_id: container_id.clone(),
                            pod_uid: pod_uid.clone(),
                            parent_pid,
                            labels: labels.clone(),
                            cpu: sattrs.get("cpu.logical_number").and_then(AttrValue::as_int),
                            sample_labels: sattrs
                                .iter()
                                .filter(|(k, _)| k.as_str() != "thread.name")
                                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                                .collect(),
                        });
                    }
                }
            }
        }
    }
    out
}
