//! Encodes a [`ProfileBatch`] as an OTLP Profiles (proto v1.10)
//! `ExportProfilesServiceRequest`: one dictionary for the request, one
//! `ResourceProfiles` per process, each with one CPU `Profile` whose samples
//! carry timestamps only (each timestamp counts one sample).

mod dict;
mod from_pprof;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development::{
    Profile, ResourceProfiles, Sample, ScopeProfiles, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::model::{ProcessProfile, ProfileBatch, ProfileKind};
pub use dict::{ATTR_BUILD_ID_GNU, ATTR_FRAME_TYPE};
use dict::{AttrValue, DictBuilder};
pub use from_pprof::encode_pprof_request;

/// Semantic-conventions schema the resource attributes follow.
pub const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.38.0";
/// Instrumentation scope name; Parca uses it as the profile name.
pub const SCOPE_NAME: &str = "icecore";

/// Sample attribute: the thread's name (`comm`).
pub const ATTR_THREAD_NAME: &str = "thread.name";
/// Sample attribute: the OS thread ID.
pub const ATTR_THREAD_ID: &str = "thread.id";
/// Sample attribute: the logical CPU the sample was taken on.
pub const ATTR_CPU: &str = "cpu.logical_number";

/// Resource attributes the user configured for everything icecore sends
/// (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceAttributes {
    /// Replaces every resource's `service.name` (by default the process's
    /// executable name).
    pub service_name: Option<String>,
    /// Added to every resource, unless icecore sets the same key itself
    /// (`process.pid`, `host.name`…: what is measured wins over what is said).
    pub extra: Vec<(String, String)>,
}

/// Builds the OTLP request for `batch`. `scope_version` becomes the
/// instrumentation scope's version (normally icecore's version).
///
/// Processes without samples are left out, since a profile must hold at
/// least one sample; the result may thus have no `resource_profiles`.
pub fn encode_request(batch: &ProfileBatch, scope_version: &str) -> ExportProfilesServiceRequest {
    encode_request_with(batch, scope_version, &ResourceAttributes::default())
}

/// [`encode_request`] with configured resource attributes.
pub fn encode_request_with(
    batch: &ProfileBatch,
    scope_version: &str,
    configured: &ResourceAttributes,
) -> ExportProfilesServiceRequest {
    let mut dict = DictBuilder::new();
    // CPU: samples counted, one period of CPU time each, as the
    // OpenTelemetry profiler sends them. Off-CPU: each sample's value is
    // the time waited, and the period is the context switches one recorded
    // wait stands for. Wall-clock: each sample's value is its time, a CPU
    // sample's one period.
    let (sample_type, period_type, period) = match batch.kind {
        ProfileKind::Cpu => (
            ("samples", "count"),
            ("cpu", "nanoseconds"),
            batch.period_nanos,
        ),
        ProfileKind::OffCpu { one_in } => (
            ("off_cpu", "nanoseconds"),
            ("context_switch", "count"),
            i64::try_from(one_in).unwrap_or(i64::MAX),
        ),
        ProfileKind::WallClock => (
            ("wall", "nanoseconds"),
            ("wall", "nanoseconds"),
            batch.period_nanos,
        ),
    };
    let sample_type = ValueType {
        type_strindex: dict.string(sample_type.0),
        unit_strindex: dict.string(sample_type.1),
    };
    let period_type = ValueType {
        type_strindex: dict.string(period_type.0),
        unit_strindex: dict.string(period_type.1),
    };
    let (time_unix_nano, duration_nano) = window(batch);

    let resource_profiles = batch
        .processes
        .iter()
        .filter(|p| p.samples.iter().any(|s| s.count > 0))
        .map(|process| {
            let profile = Profile {
                sample_type: Some(sample_type),
                samples: samples(&mut dict, process),
                time_unix_nano,
                duration_nano,
                period_type: Some(period_type),
                period,
                ..Profile::default()
            };
            ResourceProfiles {
                resource: Some(resource(batch, process, configured)),
                scope_profiles: vec![ScopeProfiles {
                    scope: Some(InstrumentationScope {
                        name: SCOPE_NAME.to_owned(),
                        version: scope_version.to_owned(),
                        ..InstrumentationScope::default()
                    }),
                    profiles: vec![profile],
                    schema_url: String::new(),
                }],
                schema_url: SCHEMA_URL.to_owned(),
            }
        })
        .collect();

    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(dict.finish()),
    }
}

/// The profile window `(start, duration)`: the batch window, widened to cover
/// any stray timestamp, since Parca rejects a profile with a timestamp outside
/// its window and dropping the sample would lose data.
pub(crate) fn window(batch: &ProfileBatch) -> (u64, u64) {
    let timestamps = batch
        .processes
        .iter()
        .flat_map(|p| &p.samples)
        .flat_map(|s| &s.timestamps_unix_nanos);
    let (min, max) = timestamps.fold((u64::MAX, 0), |(lo, hi), &t| (lo.min(t), hi.max(t)));
    let start = batch.start_unix_nanos.min(min);
    let end = batch
        .start_unix_nanos
        .saturating_add(batch.duration_nanos)
        .max(max.saturating_add(1));
    (start, end - start)
}

/// The process's samples, merging groups with the same stack and attributes.
/// Timed groups become timestamps; untimed ones (a count only) become a
/// value, in a sample of their own since OTLP requires a sample's values and
/// timestamps to be of equal length when it has both.
fn samples<'a>(dict: &mut DictBuilder<'a>, process: &'a ProcessProfile) -> Vec<Sample> {
    let mut samples: Vec<Sample> = Vec::with_capacity(process.samples.len());
    // Thread name, thread ID and CPU (-1: none), then the group's own
    // labels (empty, so not allocated, but for relabeling by thread).
    let mut by_identity: HashMap<(i32, [i32; 3], Vec<i32>, bool), usize> = HashMap::new();
    for group in process.samples.iter().filter(|g| g.count > 0) {
        let stack_index = dict.stack(&group.stack);
        let attributes = [
            dict.attribute(ATTR_THREAD_NAME, AttrValue::Str(&group.thread_name)),
            dict.attribute(ATTR_THREAD_ID, AttrValue::Int(i64::from(group.thread_id))),
            group.cpu.map_or(-1, |cpu| {
                dict.attribute(ATTR_CPU, AttrValue::Int(i64::from(cpu)))
            }),
        ];
        let labels: Vec<i32> = group
            .labels
            .iter()
            .map(|(name, value)| dict.attribute(name, AttrValue::Str(value)))
            .collect();
        let timed = group.is_timed();
        let count = i64::try_from(group.count).unwrap_or(i64::MAX);
        let identity = (stack_index, attributes, labels, timed);
        let weights = group
            .weights_nanos
            .iter()
            .map(|&w| i64::try_from(w).unwrap_or(i64::MAX));
        match by_identity.get(&identity) {
            Some(&at) if timed => {
                let sample = &mut samples[at];
                sample
                    .timestamps_unix_nano
                    .extend_from_slice(&group.timestamps_unix_nanos);
                // Weighted samples carry a value per timestamp.
                sample.values.extend(weights);
            }
            Some(&at) => {
                let value = &mut samples[at].values[0];
                *value = value.saturating_add(count);
            }
            None => {
                let attribute_indices = (identity.1.iter().copied())
                    .filter(|&i| i >= 0)
                    .chain(identity.2.iter().copied())
                    .collect();
                by_identity.insert(identity, samples.len());
                samples.push(Sample {
                    stack_index,
                    attribute_indices,
                    link_index: 0,
                    values: if timed {
                        weights.collect()
                    } else {
                        vec![count]
                    },
                    timestamps_unix_nano: group.timestamps_unix_nanos.clone(),
                });
            }
        }
    }
    samples
}

fn resource(
    batch: &ProfileBatch,
    process: &ProcessProfile,
    configured: &ResourceAttributes,
) -> Resource {
    let info = &process.process;
    let service_name = configured
        .service_name
        .as_deref()
        .unwrap_or(&info.service_name);
    let mut attributes = vec![
        string_kv("service.name", service_name),
        int_kv("process.pid", i64::from(info.pid)),
        string_kv("process.executable.name", &info.executable_name),
    ];
    // Unknown for kernel threads (no executable): omitted, not sent empty.
    if !info.executable_path.is_empty() {
        attributes.push(string_kv("process.executable.path", &info.executable_path));
    }
    if info.parent_pid != 0 {
        attributes.push(int_kv("process.parent_pid", i64::from(info.parent_pid)));
    }
    if !info.command_line.is_empty() {
        attributes.push(string_kv("process.command_line", &info.command_line));
    }
    for (attribute, value) in info.build_ids.fields() {
        attributes.push(string_kv(attribute, value));
    }
    // Only known inside a container or pod: omitted otherwise.
    if !info.container_id.is_empty() {
        attributes.push(string_kv("container.id", &info.container_id));
    }
    if !info.container_name.is_empty() {
        attributes.push(string_kv("container.name", &info.container_name));
    }
    if !info.k8s_pod_uid.is_empty() {
        attributes.push(string_kv("k8s.pod.uid", &info.k8s_pod_uid));
    }
    for (attribute, _, value) in info.k8s.fields() {
        attributes.push(string_kv(attribute, value));
    }
    attributes.push(string_kv("host.name", &batch.host_name));
    if !batch.host.arch.is_empty() {
        attributes.push(string_kv("host.arch", &batch.host.arch));
    }
    if !batch.host.os_type.is_empty() {
        attributes.push(string_kv("os.type", &batch.host.os_type));
    }
    for (name, value) in info.labels.iter() {
        // `service_name` is service.name already (sources set it from the label).
        if &**name != "service_name" && !attributes.iter().any(|kv| kv.key == **name) {
            attributes.push(string_kv(name, value));
        }
    }
    for (key, value) in &configured.extra {
        if !attributes.iter().any(|kv| &kv.key == key) {
            attributes.push(string_kv(key, value));
        }
    }
    Resource {
        attributes,
        ..Resource::default()
    }
}

pub(crate) fn string_kv(key: &str, value: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(value.to_owned()))
}

fn int_kv(key: &str, value: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(value))
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}
