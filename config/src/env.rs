//! The standard OpenTelemetry exporter variables, as the lowest-priority
//! source of settings (below flags and the config file), read the way every
//! OpenTelemetry SDK reads them. An empty variable counts as unset.
//!
//! | variable | setting |
//! |---|---|
//! | `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` | `otlp_endpoint` |
//! | `OTEL_EXPORTER_OTLP_PROFILES_HEADERS`, else `OTEL_EXPORTER_OTLP_HEADERS` | `otlp_headers` |
//! | `OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT` (ms) | `otlp_timeout` |
//! | `OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION`, else `OTEL_EXPORTER_OTLP_COMPRESSION` | `otlp_compression` |
//! | `OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE`, else `OTEL_EXPORTER_OTLP_CERTIFICATE` | `otlp_ca_file` |
//! | `…_CLIENT_CERTIFICATE`, `…_CLIENT_KEY` (same rule) | `otlp_client_cert`, `otlp_client_key` |
//! | `OTEL_SERVICE_NAME`, else `service.name` in `OTEL_RESOURCE_ATTRIBUTES` | `service_name` |
//! | `OTEL_RESOURCE_ATTRIBUTES` | `resource_attributes` |
//! | `ICECORE_OTLP_BEARER_TOKEN` | the bearer token itself |
//! | `OTEL_TRACES_EXPORTER` (`otlp` or `none`) | `self_traces` |
//! | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | where icecore's own spans go, instead of `otlp_endpoint` |

use crate::export::{self, BearerToken, EXPECTED_RESOURCE_ATTRIBUTES, Secret};
use crate::validate::{self, Invalid};
use crate::{ConfigError, Settings};

/// The variable holding a bearer token (kept out of flags, which any user
/// can read in the process list).
pub const BEARER_TOKEN_VAR: &str = "ICECORE_OTLP_BEARER_TOKEN";

/// Reads the settings the environment gives, through `get` (a variable's
/// value, `None` when unset).
pub(crate) fn settings(get: &dyn Fn(&str) -> Option<String>) -> Result<Settings, ConfigError> {
    let var = |name: &str| get(name).filter(|v| !v.trim().is_empty());
    // The profiles-specific variable wins over the generic one.
    let pick = |suffix: &str| {
        let specific = format!("OTEL_EXPORTER_OTLP_PROFILES_{suffix}");
        let generic = format!("OTEL_EXPORTER_OTLP_{suffix}");
        var(&specific)
            .map(|v| (specific, v))
            .or_else(|| var(&generic).map(|v| (generic, v)))
    };
    let otlp = parse(pick("ENDPOINT"), true, validate::otlp_endpoint)?;
    // Header values are often credentials: never repeat them in errors.
    let otlp_headers = parse(pick("HEADERS"), false, export::otel_headers)?;
    let otlp_timeout = parse(pick("TIMEOUT"), true, export::otel_timeout)?;
    let otlp_ca_file = parse(pick("CERTIFICATE"), true, export::pem_file)?;
    let otlp_client_cert = parse(pick("CLIENT_CERTIFICATE"), true, export::pem_file)?;
    let otlp_client_key = parse(pick("CLIENT_KEY"), true, export::pem_file)?;
    let otlp_compression = parse(pick("COMPRESSION"), true, export::compression)?;
    let resource =
        var("OTEL_RESOURCE_ATTRIBUTES").map(|v| ("OTEL_RESOURCE_ATTRIBUTES".to_owned(), v));
    let mut resource_attributes = parse(resource, true, |text| {
        export::key_value_list(text, EXPECTED_RESOURCE_ATTRIBUTES)
    })?;
    let service = var("OTEL_SERVICE_NAME").map(|v| ("OTEL_SERVICE_NAME".to_owned(), v));
    let mut service_name = parse(service, true, export::service_name)?;
    if let Some(attributes) = &mut resource_attributes
        && let Some(at) = attributes.iter().position(|(k, _)| k == "service.name")
    {
        let (_, name) = attributes.remove(at);
        service_name = service_name.or(Some(name));
    }
    let otlp_bearer_token =
        var(BEARER_TOKEN_VAR).map(|token| BearerToken::Value(Secret::new(token.trim())));
    let traces = |name: &str| var(name).map(|v| (name.to_owned(), v));
    let traces_endpoint = parse(
        traces("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        true,
        validate::otlp_endpoint,
    )?;
    // The SDK's variable: `otlp` sends traces, `none` does not; icecore
    // knows no other exporter.
    let self_traces = parse(traces("OTEL_TRACES_EXPORTER"), true, |value| {
        match value.trim() {
            "otlp" => Ok(true),
            "none" => Ok(false),
            _ => Err(Invalid::new("otlp or none")),
        }
    })?;
    Ok(Settings {
        otlp,
        otlp_headers,
        otlp_timeout,
        otlp_compression,
        otlp_bearer_token,
        otlp_ca_file,
        otlp_client_cert,
        otlp_client_key,
        service_name,
        resource_attributes,
        traces_endpoint,
        self_traces,
        ..Settings::default()
    })
}

/// Parses a variable's value, naming the variable in the error.
fn parse<T>(
    found: Option<(String, String)>,
    show_value: bool,
    parser: impl Fn(&str) -> Result<T, Invalid>,
) -> Result<Option<T>, ConfigError> {
    let Some((name, value)) = found else {
        return Ok(None);
    };
    parser(&value)
        .map(Some)
        .map_err(|invalid| ConfigError::InvalidEnv {
            var: name,
            value: show_value.then(|| crate::validate::redact_userinfo(&value)),
            message: invalid.flag_message(),
        })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use super::*;
    use crate::export::OtlpCompression;

    fn from(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        settings(&move |name| map.get(name).cloned())
    }

    #[test]
    fn nothing_set_sets_nothing() {
        assert_eq!(from(&[]).unwrap(), Settings::default());
        assert_eq!(
            from(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "  ")]).unwrap(),
            Settings::default()
        );
    }

    #[test]
    fn standard_variables() {
        let s = from(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4317"),
            (
                "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
                "https://profiles:4317",
            ),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=a%20b,api-key=k"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=from-attrs,env=prod",
            ),
            ("OTEL_SERVICE_NAME", "checkout"),
            (BEARER_TOKEN_VAR, " t0ken\n"),
        ])
        .unwrap();
        assert_eq!(s.otlp.unwrap().url, "https://profiles:4317");
        assert_eq!(
            s.otlp_headers.unwrap(),
            [
                ("x-tenant".to_owned(), "a b".to_owned()),
                ("api-key".to_owned(), "k".to_owned())
            ]
        );
        assert_eq!(s.otlp_timeout, Some(Duration::from_millis(2500)));
        assert_eq!(s.otlp_compression, Some(OtlpCompression::None));
        assert_eq!(s.service_name.as_deref(), Some("checkout"));
        assert_eq!(
            s.resource_attributes.unwrap(),
            [("env".to_owned(), "prod".to_owned())]
        );
        assert_eq!(
            s.otlp_bearer_token,
            Some(BearerToken::Value(Secret::new("t0ken")))
        );
        // Without OTEL_SERVICE_NAME, service.name in the attributes names the service.
        let s = from(&[("OTEL_RESOURCE_ATTRIBUTES", "service.name=shop")]).unwrap();
        assert_eq!(s.service_name.as_deref(), Some("shop"));
    }

    #[test]
    fn traces_variables_turn_self_traces_on_and_point_them() {
        let s = from(&[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4317"),
        ])
        .unwrap();
        assert_eq!(s.self_traces, Some(true));
        assert_eq!(
            s.traces_endpoint.map(|e| e.url).as_deref(),
            Some("http://traces:4317")
        );
        assert_eq!(
            from(&[("OTEL_TRACES_EXPORTER", "none")])
                .unwrap()
                .self_traces,
            Some(false)
        );
        let error = from(&[("OTEL_TRACES_EXPORTER", "jaeger")])
            .unwrap_err()
            .to_string();
        assert!(error.contains("OTEL_TRACES_EXPORTER"), "{error}");
    }

    #[test]
    fn bad_values_name_the_variable_but_not_secrets() {
        let err = from(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("OTEL_EXPORTER_OTLP_TIMEOUT"), "{err}");
        assert!(err.contains("milliseconds"), "{err}");
        let err = from(&[("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s3cret%zz")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
        let err = from(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4317")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("http://"), "{err}");
    }
}
