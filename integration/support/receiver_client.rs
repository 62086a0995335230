//! A client of icecore's OTLP receiver: a remote process's CPU profile
//! built from the proto types, and a gRPC export of it.

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, Line, Location, Profile, ProfilesDictionary, ResourceProfiles, Sample, ScopeProfiles,
    Stack, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

pub const REMOTE_PID: i64 = 4242;
pub const SAMPLES_PER_REQUEST: usize = 50;

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

/// A CPU profile of a process that is not on this host, built directly
/// from the proto types: `remote_main -> remote_leaf`, 50 samples.
pub fn remote_request() -> ExportProfilesServiceRequest {
    let strings = [
        "",
        "samples",
        "count",
        "cpu",
        "nanoseconds",
        "remote_main",
        "remote_leaf",
    ];
    let now = super::now_unix_nanos();
    let dictionary = ProfilesDictionary {
        string_table: strings.iter().map(|s| (*s).to_owned()).collect(),
        function_table: vec![
            Function::default(),
            Function {
                name_strindex: 5,
                ..Function::default()
            },
            Function {
                name_strindex: 6,
                ..Function::default()
            },
        ],
        location_table: vec![
            Location::default(),
            Location {
                lines: vec![Line {
                    function_index: 1,
                    ..Line::default()
                }],
                ..Location::default()
            },
            Location {
                lines: vec![Line {
                    function_index: 2,
                    ..Line::default()
                }],
                ..Location::default()
            },
        ],
        stack_table: vec![
            Stack::default(),
            Stack {
                location_indices: vec![2, 1],
            },
        ],
        mapping_table: vec![Default::default()],
        link_table: vec![Default::default()],
        attribute_table: vec![Default::default()],
    };
    let profile = Profile {
        sample_type: Some(ValueType {
            type_strindex: 1,
            unit_strindex: 2,
        }),
        period_type: Some(ValueType {
            type_strindex: 3,
            unit_strindex: 4,
        }),
        period: 10_000_000,
        time_unix_nano: now - 1_000_000_000,
        duration_nano: 1_000_000_000,
        samples: vec![Sample {
            stack_index: 1,
            timestamps_unix_nano: (0..SAMPLES_PER_REQUEST as u64)
                .map(|i| now - 1_000_000_000 + i * 10_000_000)
                .collect(),
            ..Sample::default()
        }],
        ..Profile::default()
    };
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![
                    kv(
                        "service.name",
                        any_value::Value::StringValue("remote-app".into()),
                    ),
                    kv("process.pid", any_value::Value::IntValue(REMOTE_PID)),
                    kv(
                        "process.executable.name",
                        any_value::Value::StringValue("remote".into()),
                    ),
                ],
                ..Resource::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                profiles: vec![profile],
                ..ScopeProfiles::default()
            }],
            ..ResourceProfiles::default()
        }],
        dictionary: Some(dictionary),
    }
}

/// Sends `request` with an optional bearer token; the gRPC status code.
pub async fn send(
    url: &str,
    request: ExportProfilesServiceRequest,
    token: Option<&str>,
) -> tonic::Code {
    let mut client = ProfilesServiceClient::connect(url.to_owned())
        .await
        .expect("connect to icecore's receiver")
        .max_encoding_message_size(64 << 20);
    let mut request = tonic::Request::new(request);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    match client.export(request).await {
        Ok(_) => tonic::Code::Ok,
        Err(status) => {
            println!("refused: {:?} {}", status.code(), status.message());
            status.code()
        }
    }
}
