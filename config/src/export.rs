//! Settings of the OTLP exporter beyond its endpoint: headers, credentials,
//! timeout, compression and resource attributes, with their parsers for the
//! command line, the config file and the standard `OTEL_*` variables.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::validate::Invalid;

/// The default timeout of one OTLP export call (the OpenTelemetry default).
pub const DEFAULT_OTLP_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest accepted OTLP timeout.
pub const MAX_OTLP_TIMEOUT: Duration = Duration::from_secs(600);

pub(crate) const EXPECTED_OTLP_HEADER: &str =
    "KEY=VALUE with a header name (letters, digits, '-', '_', '.') and a printable ASCII value";
pub(crate) const EXPECTED_OTLP_HEADERS: &str =
    "a mapping of header names to printable ASCII values, like {x-scope-orgid: team-a}";
pub(crate) const EXPECTED_OTEL_HEADERS: &str =
    "comma-separated KEY=VALUE pairs with URL-encoded values, like api-key=abc,x-tenant=a%20b";
pub(crate) const EXPECTED_OTLP_TIMEOUT: &str = "a duration from 1ms to 10m, like 10s or 500ms";
pub(crate) const EXPECTED_OTEL_TIMEOUT: &str =
    "a whole number of milliseconds from 1 to 600000, like 10000";
pub(crate) const EXPECTED_COMPRESSION: &str = "gzip or none";
pub(crate) const EXPECTED_TOKEN_FILE: &str = "a non-empty file path";
pub(crate) const EXPECTED_SERVICE_NAME: &str = "a non-empty service name";
pub(crate) const EXPECTED_RESOURCE_ATTRIBUTES: &str = "comma-separated KEY=VALUE pairs with URL-encoded values, like deployment.environment.name=prod";

/// How OTLP requests are compressed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OtlpCompression {
    /// gzip, which every collector accepts.
    #[default]
    Gzip,
    /// No compression.
    None,
}

/// A secret that never appears in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Where the bearer token sent as `authorization: Bearer …` comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BearerToken {
    /// Read from this file when the agent starts (surrounding whitespace
    /// removed), so the token stays out of the process list and the config.
    File(PathBuf),
    /// Given in the `ICECORE_OTLP_BEARER_TOKEN` environment variable.
    Value(Secret),
}

/// TLS settings of the OTLP exporter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OtlpTls {
    /// PEM file of the CA certificates to trust instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate, for mutual TLS.
    pub client_cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    pub client_key: Option<PathBuf>,
    /// Accept any server certificate (tests against self-signed endpoints only).
    pub insecure_skip_verify: bool,
}

pub(crate) const EXPECTED_PEM_FILE: &str = "a non-empty path of a PEM file";

/// Checks a PEM file path.
pub(crate) fn pem_file(text: &str) -> Result<PathBuf, Invalid> {
    if text.trim().is_empty() || text.contains('\0') {
        return Err(Invalid::new(EXPECTED_PEM_FILE));
    }
    Ok(PathBuf::from(text))
}

pub(crate) const EXPECTED_LISTEN_ADDRESS: &str =
    "an IP socket address like 127.0.0.1:4317, or a port alone (then on 127.0.0.1)";

/// Parses the OTLP receiver's listen address; a bare port (`4317` or
/// `:4317`) binds loopback, so exposing the receiver is always explicit.
pub(crate) fn listen_address(text: &str) -> Result<std::net::SocketAddr, Invalid> {
    let text = text.trim();
    let port = text.strip_prefix(':').unwrap_or(text);
    if let Ok(port) = port.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse()
        .map_err(|_| Invalid::new(EXPECTED_LISTEN_ADDRESS))
}

/// Parses a `--otlp-header KEY=VALUE`.
pub(crate) fn otlp_header(text: &str) -> Result<(String, String), Invalid> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(Invalid::because(EXPECTED_OTLP_HEADER, "there is no '='"));
    };
    header(key.trim(), value.trim(), EXPECTED_OTLP_HEADER)
}

/// Checks one header name and value.
pub(crate) fn header(
    key: &str,
    value: &str,
    expected: &'static str,
) -> Result<(String, String), Invalid> {
    if key.is_empty() {
        return Err(Invalid::because(expected, "the header name is empty"));
    }
    if !key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(Invalid::because(
            expected,
            format!("{key:?} is not a valid header name"),
        ));
    }
    if key.to_ascii_lowercase().ends_with("-bin") {
        return Err(Invalid::because(
            expected,
            format!("{key:?} is binary gRPC metadata, which is not supported"),
        ));
    }
    if !value.chars().all(|c| c == ' ' || c.is_ascii_graphic()) {
        return Err(Invalid::because(
            expected,
            format!("the value of {key:?} is not printable ASCII"),
        ));
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// Parses `OTEL_EXPORTER_OTLP_HEADERS` / `OTEL_RESOURCE_ATTRIBUTES`:
/// comma-separated `key=value` pairs whose values are percent-encoded (the
/// W3C Baggage format the OpenTelemetry specification prescribes).
pub(crate) fn key_value_list(
    text: &str,
    expected: &'static str,
) -> Result<Vec<(String, String)>, Invalid> {
    let mut pairs = Vec::new();
    // Details name pairs by position and key only: values may be credentials.
    for (index, part) in text
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .enumerate()
    {
        let n = index + 1;
        let Some((key, value)) = part.split_once('=') else {
            return Err(Invalid::because(expected, format!("pair {n} has no '='")));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(Invalid::because(expected, format!("pair {n} has no key")));
        }
        let value = percent_decode(value.trim()).ok_or_else(|| {
            Invalid::because(
                expected,
                format!("the value of {key:?} is badly URL-encoded"),
            )
        })?;
        pairs.push((key.to_owned(), value));
    }
    Ok(pairs)
}

/// Decodes `%XX` escapes; `None` for a malformed escape or invalid UTF-8.
pub(crate) fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Parses `OTEL_EXPORTER_OTLP_HEADERS`, checking each header.
pub(crate) fn otel_headers(text: &str) -> Result<Vec<(String, String)>, Invalid> {
    key_value_list(text, EXPECTED_OTEL_HEADERS)?
        .into_iter()
        .map(|(k, v)| header(&k, &v, EXPECTED_OTEL_HEADERS))
        .collect()
}

/// Parses `--otlp-timeout`: a duration from 1ms to 10m.
pub(crate) fn otlp_timeout(text: &str) -> Result<Duration, Invalid> {
    let timeout = humantime::parse_duration(text.trim())
        .map_err(|e| Invalid::because(EXPECTED_OTLP_TIMEOUT, e.to_string()))?;
    if timeout < Duration::from_millis(1) || timeout > MAX_OTLP_TIMEOUT {
        return Err(Invalid::because(
            EXPECTED_OTLP_TIMEOUT,
            "out of range".to_owned(),
        ));
    }
    Ok(timeout)
}

/// Parses `OTEL_EXPORTER_OTLP_TIMEOUT`: whole milliseconds.
pub(crate) fn otel_timeout(text: &str) -> Result<Duration, Invalid> {
    let text = text.trim();
    match text.parse::<u64>() {
        Ok(ms) if ms >= 1 && Duration::from_millis(ms) <= MAX_OTLP_TIMEOUT => {
            Ok(Duration::from_millis(ms))
        }
        _ => Err(Invalid::new(EXPECTED_OTEL_TIMEOUT)),
    }
}

/// Parses a compression name.
pub(crate) fn compression(text: &str) -> Result<OtlpCompression, Invalid> {
    match text.trim().to_ascii_lowercase().as_str() {
        "gzip" => Ok(OtlpCompression::Gzip),
        "none" => Ok(OtlpCompression::None),
        _ => Err(Invalid::new(EXPECTED_COMPRESSION)),
    }
}

/// Checks a bearer token file path.
pub(crate) fn token_file(text: &str) -> Result<PathBuf, Invalid> {
    if text.trim().is_empty() || text.contains('\0') {
        return Err(Invalid::new(EXPECTED_TOKEN_FILE));
    }
    Ok(PathBuf::from(text))
}

/// Checks a service name.
pub(crate) fn service_name(text: &str) -> Result<String, Invalid> {
    let name = text.trim();
    if name.is_empty() {
        return Err(Invalid::new(EXPECTED_SERVICE_NAME));
    }
    Ok(name.to_owned())
}

const EXPECTED_TENANT_ID: &str = "1 to 150 letters, digits or !-_.*'(), like team-a";

/// A tenant ID as Grafana's multi-tenant servers accept it in
/// `X-Scope-OrgID`.
pub(crate) fn tenant_id(value: &str) -> Result<String, Invalid> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "!-_.*'()".contains(c);
    if value.is_empty() || value.len() > 150 || !value.chars().all(allowed) {
        return Err(Invalid::new(EXPECTED_TENANT_ID));
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_from_flags() {
        assert_eq!(
            otlp_header("X-Scope-OrgID=team-a"),
            Ok(("X-Scope-OrgID".into(), "team-a".into()))
        );
        assert_eq!(
            otlp_header("authorization = Bearer abc=="),
            Ok(("authorization".into(), "Bearer abc==".into()))
        );
        for bad in ["novalue", "=x", "bad key=x", "x-bin=a", "x=tab\there"] {
            let err = otlp_header(bad).unwrap_err();
            assert_eq!(err.expected, EXPECTED_OTLP_HEADER, "{bad}");
        }
    }

    #[test]
    fn otel_header_and_attribute_lists() {
        assert_eq!(
            otel_headers("api-key=abc%3D%3D, x-tenant=a%20b,,").unwrap(),
            [
                ("api-key".to_owned(), "abc==".to_owned()),
                ("x-tenant".to_owned(), "a b".to_owned())
            ]
        );
        assert_eq!(otel_headers("").unwrap(), []);
        assert!(otel_headers("a=%zz").is_err());
        assert!(otel_headers("a=%e2%28").is_err(), "invalid UTF-8");
        assert!(otel_headers("just-a-key").is_err());
        assert_eq!(
            key_value_list(
                "service.namespace=shop,k8s.node.name=n%C3%B6de",
                EXPECTED_RESOURCE_ATTRIBUTES
            )
            .unwrap(),
            [
                ("service.namespace".to_owned(), "shop".to_owned()),
                ("k8s.node.name".to_owned(), "nöde".to_owned())
            ]
        );
    }

    #[test]
    fn listen_addresses_default_to_loopback() {
        assert_eq!(
            listen_address("4317").unwrap().to_string(),
            "127.0.0.1:4317"
        );
        assert_eq!(
            listen_address(":4318").unwrap().to_string(),
            "127.0.0.1:4318"
        );
        assert_eq!(
            listen_address("0.0.0.0:4317").unwrap().to_string(),
            "0.0.0.0:4317"
        );
        assert_eq!(
            listen_address("[::1]:4317").unwrap().to_string(),
            "[::1]:4317"
        );
        assert!(listen_address("localhost:4317").is_err());
        assert!(listen_address("99999").is_err());
    }

    #[test]
    fn timeouts_and_compression() {
        assert_eq!(otlp_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert!(otlp_timeout("0s").is_err());
        assert!(otlp_timeout("11m").is_err());
        assert!(otlp_timeout("ten").is_err());
        assert_eq!(otel_timeout("10000"), Ok(Duration::from_secs(10)));
        for bad in ["0", "-5", "1.5", "600001", ""] {
            assert!(otel_timeout(bad).is_err(), "{bad}");
        }
        assert_eq!(compression("GZIP"), Ok(OtlpCompression::Gzip));
        assert_eq!(compression("none"), Ok(OtlpCompression::None));
        assert!(compression("zstd").is_err());
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let token = BearerToken::Value(Secret("hunter2".into()));
        assert!(!format!("{token:?}").contains("hunter2"));
        let BearerToken::Value(secret) = token else {
            unreachable!()
        };
        assert_eq!(secret.expose(), "hunter2");
    }
}
