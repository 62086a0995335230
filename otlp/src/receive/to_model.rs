//! Converts a validated OTLP request into the profile model, so the sinks
//! that do not speak OTLP (pprof files, Parca) can take it.
//!
//! Only CPU profiles convert (sample type `samples/count` or
//! `cpu/nanoseconds`): the model is a CPU profile. Other profiles are still
//! forwarded to OTLP sinks as received, and counted as not converted.

use std::collections::HashMap;
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development::{Profile, ProfilesDictionary};

use crate::model::{
    ExecutableBuildIds, Frame, FrameKind, HostInfo, Labels, Line, Mapping, ProcessInfo,
    ProcessProfile, ProfileBatch, ProfileKind, SampleGroup,
};
use crate::otlp_encode::{
    ATTR_BUILD_ID_GNU, ATTR_CPU, ATTR_FRAME_TYPE, ATTR_THREAD_ID, ATTR_THREAD_NAME,
};

/// The model of a request, and how many of its profiles did not convert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    /// The CPU profiles, one process per resource.
    pub batch: ProfileBatch,
    /// Profiles left out because they are not CPU profiles.
    pub skipped_profiles: usize,
    /// Heap memory `batch` holds ([`ProfileBatch::heap_bytes`]).
    pub heap_bytes: usize,
}

/// Converts `request`, which [`super::validate`] accepted (indices are in
/// range; an out-of-range one would only lose a frame or a name here).
pub fn to_model(request: &ExportProfilesServiceRequest) -> Converted {
    let empty = ProfilesDictionary::default();
    let dict = request.dictionary.as_ref().unwrap_or(&empty);
    let mut frames = FrameCache::new(dict);
    let mut processes = Vec::new();
    let mut skipped_profiles = 0;
    let (mut start, mut end, mut period) = (u64::MAX, 0u64, 0i64);
    let mut host_name: Arc<str> = Arc::from("");
    let mut host = HostInfo::default();
    for resource in &request.resource_profiles {
        let attrs = resource
            .resource
            .as_ref()
            .map(|r| r.attributes.as_slice())
            .unwrap_or_default();
        if let Some(name) = string_attr(attrs, "host.name") {
            host_name = Arc::from(name);
        }
        if let Some(arch) = string_attr(attrs, "host.arch") {
            host.arch = Arc::from(arch);
        }
        if let Some(os) = string_attr(attrs, "os.type") {
            host.os_type = Arc::from(os);
        }
        let mut samples = Vec::new();
        for profile in resource.scope_profiles.iter().flat_map(|s| &s.profiles) {
            if !is_cpu_profile(profile, dict) {
                skipped_profiles += 1;
                continue;
            }
            start = start.min(profile.time_unix_nano);
            end = end.max(profile.time_unix_nano.saturating_add(profile.duration_nano));
            if period == 0 {
                period = profile.period;
            }
            for sample in &profile.samples {
                let stack = frames.stack(sample.stack_index);
                let (mut thread_id, mut thread_name) = (0u32, Arc::<str>::from(""));
                let mut cpu = None;
                for &a in &sample.attribute_indices {
                    let Some(attr) = dict.attribute_table.get(a as usize) else {
                        continue;
                    };
                    let key = string(dict, attr.key_strindex);
                    match (key, attr.value.as_ref().and_then(|v| v.value.as_ref())) {
                        (ATTR_THREAD_ID, Some(any_value::Value::IntValue(id))) => {
                            thread_id = u32::try_from(*id).unwrap_or(0);
                        }
                        (ATTR_THREAD_NAME, Some(any_value::Value::StringValue(name))) => {
                            thread_name = Arc::from(name.as_str());
                        }
                        (ATTR_CPU, Some(any_value::Value::IntValue(n))) => {
                            cpu = u32::try_from(*n).ok();
                        }
                        _ => {}
                    }
                }
                // Values-only samples are a count: it stays a number, however
                // large (a timestamp per counted sample would let a few bytes
                // of request cost megabytes).
                let group = if sample.timestamps_unix_nano.is_empty() {
                    let count = sample
                        .values
                        .iter()
                        .fold(0u64, |sum, &v| sum.saturating_add(v.max(0).unsigned_abs()));
                    SampleGroup {
                        stack: stack.clone(),
                        thread_id,
                        thread_name,
                        timestamps_unix_nanos: Vec::new(),
                        count,
                        cpu,
                        labels: Labels::default(),
                        weights_nanos: Vec::new(),
                    }
                } else {
                    SampleGroup {
                        cpu,
                        ..SampleGroup::timed(
                            stack.clone(),
                            thread_id,
                            thread_name,
                            sample.timestamps_unix_nano.clone(),
                        )
                    }
                };
                if group.count > 0 {
                    samples.push(group);
                }
            }
        }
        if samples.is_empty() {
            continue;
        }
        let executable_name = string_attr(attrs, "process.executable.name").unwrap_or("");
        processes.push(ProcessProfile {
            process: ProcessInfo {
                pid: int_attr(attrs, "process.pid")
                    .and_then(|p| u32::try_from(p).ok())
                    .unwrap_or(0),
                executable_name: Arc::from(executable_name),
                executable_path: Arc::from(
                    string_attr(attrs, "process.executable.path").unwrap_or(""),
                ),
                service_name: Arc::from(
                    string_attr(attrs, "service.name").unwrap_or(executable_name),
                ),
                container_id: Arc::from(string_attr(attrs, "container.id").unwrap_or("")),
                k8s_pod_uid: Arc::from(string_attr(attrs, "k8s.pod.uid").unwrap_or("")),
                container_name: Arc::from(string_attr(attrs, "container.name").unwrap_or("")),
                parent_pid: int_attr(attrs, "process.parent_pid")
                    .and_then(|p| u32::try_from(p).ok())
                    .unwrap_or(0),
                command_line: Arc::from(string_attr(attrs, "process.command_line").unwrap_or("")),
                build_ids: ExecutableBuildIds {
                    gnu: Arc::from(
                        string_attr(attrs, "process.executable.build_id.gnu").unwrap_or(""),
                    ),
                    go: Arc::from(
                        string_attr(attrs, "process.executable.build_id.go").unwrap_or(""),
                    ),
                },
                k8s: Arc::new(k8s_names(attrs)),
                // The sender's other attributes stay with its OTLP resource.
                labels: Arc::default(),
            },
            samples,
        });
    }
    if start == u64::MAX {
        start = 0;
    }
    let batch = ProfileBatch {
        kind: ProfileKind::Cpu,
        start_unix_nanos: start,
        duration_nanos: end.saturating_sub(start),
        period_nanos: period,
        host_name,
        host,
        processes,
    };
    Converted {
        heap_bytes: batch.heap_bytes(),
        batch,
        skipped_profiles,
    }
}

fn is_cpu_profile(profile: &Profile, dict: &ProfilesDictionary) -> bool {
    profile.sample_type.as_ref().is_none_or(|t| {
        matches!(
            (string(dict, t.type_strindex), string(dict, t.unit_strindex)),
            ("samples" | "sample", "count") | ("cpu", "nanoseconds") | ("", "")
        )
    })
}

fn string(dict: &ProfilesDictionary, index: i32) -> &str {
    dict.string_table
        .get(usize::try_from(index).unwrap_or(usize::MAX))
        .map_or("", String::as_str)
}

fn string_attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.as_str()),
            _ => None,
        }
    })
}

fn int_attr(attrs: &[KeyValue], key: &str) -> Option<i64> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::IntValue(i) => Some(*i),
            any_value::Value::StringValue(s) => s.parse().ok(),
            _ => None,
        }
    })
}

/// Builds each dictionary stack and location once.
struct FrameCache<'a> {
    dict: &'a ProfilesDictionary,
    stacks: HashMap<i32, Arc<[Arc<Frame>]>>,
    locations: HashMap<i32, Arc<Frame>>,
    mappings: HashMap<i32, Arc<Mapping>>,
}

impl<'a> FrameCache<'a> {
    fn new(dict: &'a ProfilesDictionary) -> Self {
        Self {
            dict,
            stacks: HashMap::new(),
            locations: HashMap::new(),
            mappings: HashMap::new(),
        }
    }

    fn stack(&mut self, index: i32) -> Arc<[Arc<Frame>]> {
        if let Some(stack) = self.stacks.get(&index) {
            return stack.clone();
        }
        let locations = self
            .dict
            .stack_table
            .get(index as usize)
            .map(|s| s.location_indices.clone())
            .unwrap_or_default();
        let stack: Arc<[Arc<Frame>]> = locations.iter().map(|&l| self.location(l)).collect();
        self.stacks.insert(index, stack.clone());
        stack
    }

    fn location(&mut self, index: i32) -> Arc<Frame> {
        if let Some(frame) = self.locations.get(&index) {
            return frame.clone();
        }
        let dict = self.dict;
        let location = dict
            .location_table
            .get(index as usize)
            .cloned()
            .unwrap_or_default();
        let mut kind = FrameKind::Native;
        for &a in &location.attribute_indices {
            let Some(attr) = dict.attribute_table.get(a as usize) else {
                continue;
            };
            if string(dict, attr.key_strindex) == ATTR_FRAME_TYPE
                && let Some(any_value::Value::StringValue(t)) =
                    attr.value.as_ref().and_then(|v| v.value.as_ref())
            {
                // Kinds icecore does not produce read as native code.
                kind = FrameKind::from_otel_str(t).unwrap_or(FrameKind::Native);
            }
        }
        let lines = location
            .lines
            .iter()
            .map(|line| {
                let function = dict
                    .function_table
                    .get(line.function_index as usize)
                    .cloned()
                    .unwrap_or_default();
                let filename = string(dict, function.filename_strindex);
                Line {
                    function_name: Arc::from(string(dict, function.name_strindex)),
                    system_name: Arc::from(string(dict, function.system_name_strindex)),
                    filename: (!filename.is_empty()).then(|| Arc::from(filename)),
                    line: u32::try_from(line.line).unwrap_or(0),
                    column: u32::try_from(line.column).unwrap_or(0),
                }
            })
            .collect();
        let mapping = (location.mapping_index != 0).then(|| self.mapping(location.mapping_index));
        let frame = Arc::new(Frame {
            kind,
            address: location.address,
            mapping,
            lines,
        });
        self.locations.insert(index, frame.clone());
        frame
    }

    fn mapping(&mut self, index: i32) -> Arc<Mapping> {
        if let Some(mapping) = self.mappings.get(&index) {
            return mapping.clone();
        }
        let dict = self.dict;
        let m = dict
            .mapping_table
            .get(index as usize)
            .cloned()
            .unwrap_or_default();
        let build_id = m.attribute_indices.iter().find_map(|&a| {
            let attr = dict.attribute_table.get(a as usize)?;
            if string(dict, attr.key_strindex) != ATTR_BUILD_ID_GNU {
                return None;
            }
            match attr.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(id) => Some(Arc::from(id.as_str())),
                _ => None,
            }
        });
        let mapping = Arc::new(Mapping {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename: Arc::from(string(dict, m.filename_strindex)),
            build_id,
        });
        self.mappings.insert(index, mapping.clone());
        mapping
    }
}

/// The Kubernetes names among a resource's attributes.
fn k8s_names(attrs: &[KeyValue]) -> crate::model::K8sNames {
    let name = |key| Arc::from(string_attr(attrs, key).unwrap_or(""));
    crate::model::K8sNames {
        pod: name("k8s.pod.name"),
        namespace: name("k8s.namespace.name"),
        container: name("k8s.container.name"),
        node: name("k8s.node.name"),
    }
}
