//! A pprof profile (a scraped application's) as an OTLP Profiles request:
//! one `Profile` per pprof sample type, since an OTLP profile has one (as
//! the Collector's pprof translator does), all sharing one dictionary.
//! The profile's name is the instrumentation scope's name (Parca reads it
//! there); the target's labels are resource attributes.

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, Line, Location, Mapping, Profile, ResourceProfiles, Sample, ScopeProfiles, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

use super::dict::{ATTR_BUILD_ID_GNU, AttrValue, DictBuilder};
use super::{ResourceAttributes, SCHEMA_URL, string_kv};
use crate::pprof::proto;

/// The request for `profile`, named `name`, from a source with `labels`
/// (`job`, `instance`...), which become resource attributes; `service.name`
/// is the configured one, else the `service_name` label, else `job`.
/// Sample types without a non-zero value are left out; the request may
/// thus have no `resource_profiles`.
pub fn encode_pprof_request<'a>(
    profile: &'a proto::Profile,
    name: &str,
    labels: &[(String, String)],
    scope_version: &str,
    configured: &ResourceAttributes,
) -> ExportProfilesServiceRequest {
    let mut dict: DictBuilder<'a> = DictBuilder::new();
    let string = |i: i64| -> &'a str { pprof_string(profile, i) };
    let value_type = |dict: &mut DictBuilder<'a>, t: &proto::ValueType| ValueType {
        type_strindex: dict.string(string(t.r#type)),
        unit_strindex: dict.string(string(t.unit)),
    };
    let mut stacks = Stacks::new(profile);
    let period_type = profile
        .period_type
        .as_ref()
        .map(|t| value_type(&mut dict, t));
    let time_unix_nano = u64::try_from(profile.time_nanos).unwrap_or(0);
    let duration_nano = u64::try_from(profile.duration_nanos).unwrap_or(0);

    // Sample attributes, one list per pprof sample.
    let attributes: Vec<Vec<i32>> = profile
        .sample
        .iter()
        .map(|s| {
            s.label
                .iter()
                .map(|l| {
                    if l.str != 0 {
                        dict.attribute(string(l.key), AttrValue::Str(string(l.str)))
                    } else {
                        dict.attribute_with_unit(
                            string(l.key),
                            AttrValue::Int(l.num),
                            string(l.num_unit),
                        )
                    }
                })
                .collect()
        })
        .collect();
    // Each pprof sample's stack, interned once for all its sample types
    // (none for a sample without a value: no orphans in the dictionary).
    let stack_indices: Vec<i32> = profile
        .sample
        .iter()
        .map(|s| {
            if s.value.iter().any(|&v| v != 0) {
                stacks.index(&mut dict, &s.location_id)
            } else {
                0
            }
        })
        .collect();
    let profiles: Vec<Profile> = profile
        .sample_type
        .iter()
        .enumerate()
        .filter_map(|(t, sample_type)| {
            let samples: Vec<Sample> = profile
                .sample
                .iter()
                .zip(&attributes)
                .zip(&stack_indices)
                .filter_map(|((s, attribute_indices), &stack_index)| {
                    let value = *s.value.get(t)?;
                    (value != 0).then(|| Sample {
                        stack_index,
                        attribute_indices: attribute_indices.clone(),
                        link_index: 0,
                        values: vec![value],
                        timestamps_unix_nano: Vec::new(),
                    })
                })
                .collect();
            (!samples.is_empty()).then(|| Profile {
                sample_type: Some(value_type(&mut dict, sample_type)),
                samples,
                time_unix_nano,
                duration_nano,
                period_type,
                period: profile.period,
                ..Profile::default()
            })
        })
        .collect();
    if profiles.is_empty() {
        return ExportProfilesServiceRequest {
            resource_profiles: Vec::new(),
            dictionary: Some(dict.finish()),
        };
    }
    let label = |name: &str| labels.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    let service_name = configured
        .service_name
        .as_ref()
        .or(label("service_name"))
        .or(label("job"))
        .map_or("unknown_service", String::as_str);
    let mut resource_attributes = vec![string_kv("service.name", service_name)];
    for (key, value) in labels.iter().chain(&configured.extra) {
        if key != "service_name" && !resource_attributes.iter().any(|kv| &kv.key == key) {
            resource_attributes.push(string_kv(key, value));
        }
    }
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(Resource {
                attributes: resource_attributes,
                ..Resource::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: name.to_owned(),
                    version: scope_version.to_owned(),
                    ..InstrumentationScope::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: SCHEMA_URL.to_owned(),
        }],
        dictionary: Some(dict.finish()),
    }
}

/// String `i` of `profile`'s table; "" when out of range.
fn pprof_string(profile: &proto::Profile, i: i64) -> &str {
    usize::try_from(i)
        .ok()
        .and_then(|i| profile.string_table.get(i))
        .map_or("", String::as_str)
}

/// The profile's mappings, functions and locations, put in the dictionary
/// when a sample first uses them (a delta leaves many unused, and the
/// dictionary should hold no orphans).
struct Stacks<'a> {
    profile: &'a proto::Profile,
    mappings: HashMap<u64, &'a proto::Mapping>,
    functions: HashMap<u64, &'a proto::Function>,
    locations: HashMap<u64, &'a proto::Location>,
    mapping_index: HashMap<u64, i32>,
    function_index: HashMap<u64, i32>,
    location_index: HashMap<u64, i32>,
}

impl<'a> Stacks<'a> {
    fn new(profile: &'a proto::Profile) -> Self {
        Self {
            profile,
            mappings: profile.mapping.iter().map(|m| (m.id, m)).collect(),
            functions: profile.function.iter().map(|f| (f.id, f)).collect(),
            locations: profile.location.iter().map(|l| (l.id, l)).collect(),
            mapping_index: HashMap::new(),
            function_index: HashMap::new(),
            location_index: HashMap::new(),
        }
    }

    /// The stack of `location_ids` (leaf first in both formats); an unknown
    /// ID is left out.
    fn index(&mut self, dict: &mut DictBuilder<'a>, location_ids: &[u64]) -> i32 {
        let indices = location_ids
            .iter()
            .filter_map(|&id| self.location(dict, id))
            .collect();
        dict.intern_stack(indices)
    }

    fn location(&mut self, dict: &mut DictBuilder<'a>, id: u64) -> Option<i32> {
        if let Some(&i) = self.location_index.get(&id) {
            return Some(i);
        }
        let l = *self.locations.get(&id)?;
        // pprof and OTLP both list a location's lines innermost first.
        let lines = l
            .line
            .iter()
            .map(|line| Line {
                function_index: self.function(dict, line.function_id),
                line: line.line,
                column: line.column,
            })
            .collect();
        let location = Location {
            mapping_index: self.mapping(dict, l.mapping_id),
            address: l.address,
            lines,
            attribute_indices: Vec::new(),
        };
        let index = dict.intern_location(location);
        self.location_index.insert(id, index);
        Some(index)
    }

    fn function(&mut self, dict: &mut DictBuilder<'a>, id: u64) -> i32 {
        if let Some(&i) = self.function_index.get(&id) {
            return i;
        }
        let Some(f) = self.functions.get(&id).copied() else {
            return 0;
        };
        let profile = self.profile;
        let function = Function {
            name_strindex: dict.string(pprof_string(profile, f.name)),
            system_name_strindex: dict.string(pprof_string(profile, f.system_name)),
            filename_strindex: dict.string(pprof_string(profile, f.filename)),
            start_line: f.start_line,
        };
        let index = dict.intern_function(function);
        self.function_index.insert(id, index);
        index
    }

    fn mapping(&mut self, dict: &mut DictBuilder<'a>, id: u64) -> i32 {
        if let Some(&i) = self.mapping_index.get(&id) {
            return i;
        }
        let Some(m) = self.mappings.get(&id).copied() else {
            return 0;
        };
        let build_id = pprof_string(self.profile, m.build_id);
        let attribute_indices = if build_id.is_empty() {
            Vec::new()
        } else {
            vec![dict.attribute(ATTR_BUILD_ID_GNU, AttrValue::Str(build_id))]
        };
        let mapping = Mapping {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename_strindex: dict.string(pprof_string(self.profile, m.filename)),
            attribute_indices,
        };
        let index = dict.intern_mapping(mapping);
        self.mapping_index.insert(id, index);
        index
    }
}
