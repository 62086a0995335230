//! Checks and parsers shared by the command line and the config file.
//!
//! Each parser takes the text a user wrote and returns the typed value or an
//! [`Invalid`] that says which form is accepted, so that both front ends can
//! word their errors the same way.

use std::net::{Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;

use crate::OtlpEndpoint;
use crate::export::Secret;

/// The lowest accepted sampling frequency, in samples per second.
pub const MIN_SAMPLING_FREQUENCY_HZ: u32 = 1;
/// The highest accepted sampling frequency, in samples per second.
pub const MAX_SAMPLING_FREQUENCY_HZ: u32 = 10_000;
/// The shortest accepted reporter interval.
pub const MIN_REPORTER_INTERVAL: Duration = Duration::from_secs(1);
/// The longest accepted reporter interval.
pub const MAX_REPORTER_INTERVAL: Duration = Duration::from_secs(3600);
/// The shortest accepted flame graph history (other than 0, which turns it off).
pub const MIN_FLAMEGRAPH_HISTORY: Duration = Duration::from_secs(60);
/// The longest accepted flame graph history.
pub const MAX_FLAMEGRAPH_HISTORY: Duration = Duration::from_secs(24 * 3600);
/// The largest accepted debug-information memory budget (16 GiB).
pub const MAX_DEBUG_INFO_MEMORY: u64 = 16 << 30;
/// The highest accepted process ID (`pid_t` is a signed 32-bit integer).
const MAX_PID: u64 = i32::MAX as u64;

pub(crate) const EXPECTED_OTLP_ENDPOINT: &str =
    "an http:// (plaintext) or https:// (TLS) URL with a host, like http://localhost:4317";
pub(crate) const EXPECTED_PPROF_DIR: &str = "a non-empty directory path";
pub(crate) const EXPECTED_SAMPLING_FREQUENCY: &str =
    "an integer number of samples per second from 1 to 10000";
pub(crate) const EXPECTED_REPORTER_INTERVAL: &str =
    "a duration from 1s to 1h, like 10s, 1m30s or 5m";
pub(crate) const EXPECTED_FLAMEGRAPH_HISTORY: &str =
    "a duration from 1m to 24h, like 15m or 2h, or 0 to turn the flame graph history off";
pub(crate) const EXPECTED_DURATION: &str = "a duration greater than zero, like 30s, 5m or 1h30m";
pub(crate) const EXPECTED_MEMORY_SIZE: &str =
    "a size in bytes up to 16GiB, like 64MiB, 512KiB or 0 (a plain number is bytes)";
pub(crate) const EXPECTED_MEMORY_BUDGET: &str =
    "a size from 1MiB to 16GiB, like 128MiB or 1GiB (a plain number is bytes)";
pub(crate) const EXPECTED_QUEUE_BOUND: &str =
    "a size from 1 byte to 16GiB, like 320MiB or 64KiB (a plain number is bytes)";
pub(crate) const EXPECTED_FILE_COUNT: &str = "a number of files from 0 (no limit) to 100000000";
pub(crate) const EXPECTED_RUNTIMES: &str =
    "`all`, `none`, or a comma-separated list of cpython, cruby, hotspot, v8, php, perl, perf-map";
pub(crate) const EXPECTED_PID: &str = "a process ID, an integer from 1 to 2147483647";
pub(crate) const EXPECTED_PIDS: &str =
    "a list of process IDs, integers from 1 to 2147483647, like [1234, 5678]";
pub(crate) const EXPECTED_HTTP_ADDRESS: &str =
    "an IP socket address like 127.0.0.1:7071 or [::1]:7071";
pub(crate) const EXPECTED_LOG_LEVEL: &str = "a level (error, warn, info, debug or trace) \
     or a comma-separated filter of level and target=level parts, like info,icecore_receiver=debug";

/// The levels a log filter part may name (`off` disables a target).
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// A value outside its setting's accepted form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Invalid {
    /// The accepted form, worded to follow "expected ".
    pub expected: &'static str,
    /// What in particular is wrong, when more can be said than the form.
    pub detail: Option<String>,
}

/// The runtimes to unwind: `all`, `none`, or names from [`crate::RUNTIME_NAMES`].
pub(crate) fn runtimes(text: &str) -> Result<Vec<String>, Invalid> {
    let text = text.trim();
    match text {
        "all" => return Ok(crate::RUNTIME_NAMES.iter().map(|&n| n.to_owned()).collect()),
        "none" => return Ok(Vec::new()),
        _ => {}
    }
    let mut names: Vec<String> = Vec::new();
    for name in text.split(',').map(str::trim) {
        if !crate::RUNTIME_NAMES.contains(&name) {
            return Err(Invalid::because(
                EXPECTED_RUNTIMES,
                format!("{name:?} is not a runtime icecore knows"),
            ));
        }
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

impl Invalid {
    pub(crate) fn new(expected: &'static str) -> Self {
        Self {
            expected,
            detail: None,
        }
    }

    pub(crate) fn because(expected: &'static str, detail: impl Into<String>) -> Self {
        Self {
            expected,
            detail: Some(detail.into()),
        }
    }

    /// `expected FORM` plus the detail, for a command-line flag.
    pub fn flag_message(&self) -> String {
        match &self.detail {
            Some(detail) => format!("expected {} ({detail})", self.expected),
            None => format!("expected {}", self.expected),
        }
    }

    /// `expected FORM, got VALUE` plus the detail, for a config file key.
    pub fn file_message(&self, got: &str) -> String {
        match &self.detail {
            Some(detail) => format!("expected {}, got {got} ({detail})", self.expected),
            None => format!("expected {}, got {got}", self.expected),
        }
    }
}

/// Parses an OTLP endpoint URL: `http://` or `https://`, a host and an
/// optional port; any path is kept as written.
pub(crate) fn otlp_endpoint(text: &str) -> Result<OtlpEndpoint, Invalid> {
    let fail = |detail: String| Invalid::because(EXPECTED_OTLP_ENDPOINT, detail);
    if text.is_empty() {
        return Err(fail("the URL is empty".into()));
    }
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(fail("the URL contains whitespace".into()));
    }
    let Some((scheme, rest)) = text.split_once("://") else {
        return Err(fail("the URL has no http:// or https:// scheme".into()));
    };
    let tls = if scheme.eq_ignore_ascii_case("http") {
        false
    } else if scheme.eq_ignore_ascii_case("https") {
        true
    } else {
        return Err(fail(format!("unsupported scheme {scheme:?}")));
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // Credentials, if any, precede the last '@'.
    let (userinfo, host_port) = match authority.rsplit_once('@') {
        Some((userinfo, host_port)) => (Some(userinfo), host_port),
        None => (None, authority),
    };
    let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
        let Some((ip, after)) = bracketed.split_once(']') else {
            return Err(fail("the IPv6 host has no closing ']'".into()));
        };
        if ip.parse::<Ipv6Addr>().is_err() {
            return Err(fail(format!("{ip:?} is not an IPv6 address")));
        }
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => return Err(fail(format!("unexpected {after:?} after the host"))),
            },
        };
        (ip, port)
    } else {
        match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    if host.is_empty() {
        return Err(fail("the URL has no host".into()));
    }
    if !host_port.starts_with('[')
        && !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '%'))
    {
        return Err(fail(format!("{host:?} is not a valid host")));
    }
    if let Some(port) = port
        && !matches!(port.parse::<u16>(), Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(fail(format!(
            "{port:?} is not a port number from 1 to 65535"
        )));
    }
    // The URL keeps no credentials: it is logged, and gRPC clients would
    // not send them anyway. They become a basic-auth header instead.
    let basic_auth = match userinfo {
        Some(userinfo) => Some(basic_auth(userinfo).map_err(fail)?),
        None => None,
    };
    let path = &rest[authority.len()..];
    Ok(OtlpEndpoint {
        url: format!("{scheme}://{host_port}{path}"),
        basic_auth,
        tls,
    })
}

/// `authorization: Basic …` for a URL's `user:password` (percent-encoded).
fn basic_auth(userinfo: &str) -> Result<Secret, String> {
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let decode = |part: &str| {
        crate::export::percent_decode(part)
            .ok_or_else(|| "the URL's credentials have a malformed %-escape".to_owned())
    };
    let (user, password) = (decode(user)?, decode(password)?);
    if user.is_empty() {
        return Err("the URL's credentials have an empty user name".to_owned());
    }
    if user.contains(':') || format!("{user}{password}").chars().any(char::is_control) {
        return Err("the URL's credentials hold a character basic auth cannot carry".to_owned());
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    Ok(Secret::new(format!("Basic {encoded}")))
}

/// `text` with the credentials of a `scheme://user:password@host` URL
/// replaced, so a value that may hold them can be shown in errors.
pub fn redact_userinfo(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://<redacted>@{}", &rest[at + 1..]),
        None => text.to_owned(),
    }
}

/// Checks a pprof output directory: any non-empty path without NUL bytes.
pub(crate) fn pprof_dir(path: PathBuf) -> Result<PathBuf, Invalid> {
    if path.as_os_str().is_empty() {
        return Err(Invalid::because(EXPECTED_PPROF_DIR, "the path is empty"));
    }
    if path.as_os_str().as_encoded_bytes().contains(&0) {
        return Err(Invalid::because(
            EXPECTED_PPROF_DIR,
            "the path contains a NUL byte",
        ));
    }
    Ok(path)
}

/// Parses a sampling frequency written as text.
pub(crate) fn sampling_frequency(text: &str) -> Result<u32, Invalid> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Invalid::new(EXPECTED_SAMPLING_FREQUENCY));
    }
    match text.parse::<u64>() {
        Ok(n) => sampling_frequency_number(n),
        Err(_) => Err(Invalid::because(
            EXPECTED_SAMPLING_FREQUENCY,
            "the number is too large",
        )),
    }
}

/// Checks a sampling frequency given as a number.
pub(crate) fn sampling_frequency_number(n: u64) -> Result<u32, Invalid> {
    match u32::try_from(n) {
        Ok(hz) if (MIN_SAMPLING_FREQUENCY_HZ..=MAX_SAMPLING_FREQUENCY_HZ).contains(&hz) => Ok(hz),
        _ => Err(Invalid::new(EXPECTED_SAMPLING_FREQUENCY)),
    }
}

/// Parses a humantime duration, with humantime's complaint as the detail.
fn humantime_duration(text: &str, expected: &'static str) -> Result<Duration, Invalid> {
    humantime::parse_duration(text.trim()).map_err(|e| Invalid::because(expected, e.to_string()))
}

/// Parses the reporter interval: a duration from 1s to 1h.
pub(crate) fn reporter_interval(text: &str) -> Result<Duration, Invalid> {
    let interval = humantime_duration(text, EXPECTED_REPORTER_INTERVAL)?;
    if interval < MIN_REPORTER_INTERVAL {
        return Err(Invalid::because(
            EXPECTED_REPORTER_INTERVAL,
            "below the minimum of 1s",
        ));
    }
    if interval > MAX_REPORTER_INTERVAL {
        return Err(Invalid::because(
            EXPECTED_REPORTER_INTERVAL,
            "above the maximum of 1h",
        ));
    }
    Ok(interval)
}

/// Parses the flame graph history: 0 (off) or a duration from 1m to 24h.
pub(crate) fn flamegraph_history(text: &str) -> Result<Duration, Invalid> {
    let history = humantime_duration(text, EXPECTED_FLAMEGRAPH_HISTORY)?;
    if history.is_zero() {
        return Ok(history);
    }
    if history < MIN_FLAMEGRAPH_HISTORY {
        return Err(Invalid::because(
            EXPECTED_FLAMEGRAPH_HISTORY,
            "below the minimum of 1m",
        ));
    }
    if history > MAX_FLAMEGRAPH_HISTORY {
        return Err(Invalid::because(
            EXPECTED_FLAMEGRAPH_HISTORY,
            "above the maximum of 24h",
        ));
    }
    Ok(history)
}

/// Parses a memory size: a whole number with an optional binary unit (B,
/// KiB, MiB, GiB; K, M and G mean the same), at most
/// [`MAX_DEBUG_INFO_MEMORY`].
pub(crate) fn memory_size(text: &str) -> Result<u64, Invalid> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        other => {
            return Err(Invalid::because(
                EXPECTED_MEMORY_SIZE,
                format!("unknown unit {other:?}"),
            ));
        }
    };
    let number: u64 = number
        .parse()
        .map_err(|_| Invalid::new(EXPECTED_MEMORY_SIZE))?;
    let bytes = number
        .checked_mul(1 << shift)
        .ok_or_else(|| Invalid::because(EXPECTED_MEMORY_SIZE, "too large"))?;
    memory_size_number(bytes)
}

/// Checks a memory size given as a plain number of bytes.
pub(crate) fn memory_size_number(bytes: u64) -> Result<u64, Invalid> {
    if bytes > MAX_DEBUG_INFO_MEMORY {
        return Err(Invalid::because(
            EXPECTED_MEMORY_SIZE,
            "above the maximum of 16GiB",
        ));
    }
    Ok(bytes)
}

/// Parses a memory budget (the receiver's, the unwind tables'): a memory
/// size of at least 1 MiB (below that, not even a small request or a large
/// library's table fits).
pub(crate) fn memory_budget(text: &str) -> Result<u64, Invalid> {
    memory_size(text)
        .map_err(|e| Invalid {
            expected: EXPECTED_MEMORY_BUDGET,
            detail: e.detail,
        })
        .and_then(memory_budget_number)
}

/// Checks the receiver's memory budget given as a number of bytes.
pub(crate) fn memory_budget_number(bytes: u64) -> Result<u64, Invalid> {
    if !(1 << 20..=MAX_DEBUG_INFO_MEMORY).contains(&bytes) {
        return Err(Invalid::new(EXPECTED_MEMORY_BUDGET));
    }
    Ok(bytes)
}

/// Parses an export queue's bound: a memory size above 0 (a queue of 0
/// bytes would drop every request it is handed).
pub(crate) fn queue_bound(text: &str) -> Result<u64, Invalid> {
    memory_size(text)
        .map_err(|e| Invalid {
            expected: EXPECTED_QUEUE_BOUND,
            detail: e.detail,
        })
        .and_then(queue_bound_number)
}

/// Checks an export queue's bound given as a number of bytes.
pub(crate) fn queue_bound_number(bytes: u64) -> Result<u64, Invalid> {
    if bytes == 0 {
        return Err(Invalid::because(
            EXPECTED_QUEUE_BOUND,
            "0 would drop every request",
        ));
    }
    memory_size_number(bytes).map_err(|e| Invalid {
        expected: EXPECTED_QUEUE_BOUND,
        detail: e.detail,
    })
}

/// Parses a file count (0: no limit).
pub(crate) fn file_count(text: &str) -> Result<u64, Invalid> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Invalid::new(EXPECTED_FILE_COUNT));
    }
    text.parse::<u64>()
        .map_err(|_| Invalid::new(EXPECTED_FILE_COUNT))
        .and_then(file_count_number)
}

/// Checks a file count given as a number.
pub(crate) fn file_count_number(n: u64) -> Result<u64, Invalid> {
    if n > 100_000_000 {
        return Err(Invalid::new(EXPECTED_FILE_COUNT));
    }
    Ok(n)
}

/// Parses the run duration: any duration greater than zero.
pub(crate) fn run_duration(text: &str) -> Result<Duration, Invalid> {
    let duration = humantime_duration(text, EXPECTED_DURATION)?;
    if duration.is_zero() {
        return Err(Invalid::because(EXPECTED_DURATION, "the duration is zero"));
    }
    Ok(duration)
}

/// Parses a process ID written as text.
pub(crate) fn pid(text: &str) -> Result<u32, Invalid> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Invalid::new(EXPECTED_PID));
    }
    text.parse::<u64>()
        .map_err(|_| Invalid::new(EXPECTED_PID))
        .and_then(pid_number)
}

/// Checks a process ID given as a number.
pub(crate) fn pid_number(n: u64) -> Result<u32, Invalid> {
    if n == 0 || n > MAX_PID {
        return Err(Invalid::new(EXPECTED_PID));
    }
    u32::try_from(n).map_err(|_| Invalid::new(EXPECTED_PID))
}

/// Parses the HTTP listen address.
pub(crate) fn http_address(text: &str) -> Result<SocketAddr, Invalid> {
    text.trim()
        .parse::<SocketAddr>()
        .map_err(|_| Invalid::new(EXPECTED_HTTP_ADDRESS))
}

pub(crate) const EXPECTED_USER: &str = "a user name or a numeric user ID";

/// Checks `--user`: a name or UID (whether it exists is checked when the
/// agent starts, on the host it runs on).
pub(crate) fn user(text: &str) -> Result<String, Invalid> {
    let text = text.trim();
    if text.is_empty()
        || text.len() > 256
        || text.contains(|c: char| c.is_whitespace() || c.is_control() || c == ':' || c == '/')
    {
        return Err(Invalid::new(EXPECTED_USER));
    }
    Ok(text.to_owned())
}

/// A log format: `text`, `json` or `logfmt`.
pub(crate) fn log_format(text: &str) -> Result<crate::LogFormat, Invalid> {
    match text.trim() {
        "text" => Ok(crate::LogFormat::Text),
        "json" => Ok(crate::LogFormat::Json),
        "logfmt" => Ok(crate::LogFormat::Logfmt),
        _ => Err(Invalid::new("text, json or logfmt")),
    }
}

/// Checks a log filter: `level` or `target=level` parts separated by commas.
/// Returns the filter with surrounding whitespace removed.
pub(crate) fn log_level(text: &str) -> Result<String, Invalid> {
    let fail = |detail: String| Invalid::because(EXPECTED_LOG_LEVEL, detail);
    let trimmed = text.trim();
    let mut parts = 0;
    for part in trimmed.split(',').map(str::trim) {
        if part.is_empty() {
            continue;
        }
        parts += 1;
        let level = match part.split_once('=') {
            Some((target, level)) => {
                let target = target.trim();
                if target.is_empty() {
                    return Err(fail(format!("{part:?} has no target before '='")));
                }
                if !target
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-' | '.'))
                {
                    return Err(fail(format!("{target:?} is not a valid target")));
                }
                level.trim()
            }
            None => part,
        };
        if !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(level)) {
            return Err(fail(format!("unknown level {level:?}")));
        }
    }
    if parts == 0 {
        return Err(fail("the filter is empty".into()));
    }
    Ok(trimmed.to_owned())
}

/// The form of `--external-label`.
pub(crate) const EXPECTED_EXTERNAL_LABEL: &str =
    "NAME=VALUE, NAME a Prometheus label name (letters, digits, _) not starting with __ or a digit";

/// One external label as `NAME=VALUE`.
pub(crate) fn external_label(text: &str) -> Result<(String, String), Invalid> {
    let Some((name, value)) = text.split_once('=') else {
        return Err(Invalid::because(EXPECTED_EXTERNAL_LABEL, "there is no '='"));
    };
    external_label_pair(name.trim(), value.trim())
}

/// One external label's name and value.
pub(crate) fn external_label_pair(name: &str, value: &str) -> Result<(String, String), Invalid> {
    if !crate::relabel::is_label_name(name) || name.starts_with("__") {
        return Err(Invalid::because(
            EXPECTED_EXTERNAL_LABEL,
            format!("{name:?} is not such a name"),
        ));
    }
    if value.is_empty() {
        return Err(Invalid::because(
            EXPECTED_EXTERNAL_LABEL,
            "the value is empty",
        ));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// The form of `--kubernetes-api`.
pub(crate) const EXPECTED_KUBERNETES_API: &str =
    "https://HOST:PORT (or http:// for a local proxy), or `off`";

/// Parses `--kubernetes-api`.
pub(crate) fn kubernetes_api(text: &str) -> Result<crate::KubernetesApi, Invalid> {
    let text = text.trim();
    if text == "off" {
        return Ok(crate::KubernetesApi::Off);
    }
    pod_source_url(text, EXPECTED_KUBERNETES_API).map(crate::KubernetesApi::Url)
}

/// The form of `--kubelet-url`.
pub(crate) const EXPECTED_KUBELET_URL: &str =
    "http://HOST:10255 (the kubelet's read-only port) or https://HOST:10250";

/// Parses `--kubelet-url`.
pub(crate) fn kubelet_url(text: &str) -> Result<crate::KubernetesApi, Invalid> {
    pod_source_url(text.trim(), EXPECTED_KUBELET_URL).map(crate::KubernetesApi::Kubelet)
}

/// `http(s)://HOST[:PORT]`, without a trailing `/`.
fn pod_source_url(text: &str, expected: &'static str) -> Result<String, Invalid> {
    let rest = text
        .strip_prefix("https://")
        .or_else(|| text.strip_prefix("http://"))
        .ok_or_else(|| Invalid::new(expected))?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty()
        || authority.contains(['/', '?', '#', '@'])
        || authority.contains(char::is_whitespace)
    {
        return Err(Invalid::because(
            expected,
            "HOST:PORT only, without a path or credentials",
        ));
    }
    Ok(text.trim_end_matches('/').to_owned())
}

/// The form of `--node-name`.
pub(crate) const EXPECTED_NODE_NAME: &str =
    "a Kubernetes node name (a DNS name, at most 253 characters)";

/// Checks `--node-name`.
pub(crate) fn node_name(text: &str) -> Result<String, Invalid> {
    let name = text.trim();
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if ok {
        Ok(name.to_owned())
    } else {
        Err(Invalid::new(EXPECTED_NODE_NAME))
    }
}

/// The form of `--docker-socket`.
pub(crate) const EXPECTED_DOCKER_SOCKET: &str =
    "the path of the Docker Engine's Unix socket, or `off`";

/// Parses `--docker-socket`.
pub(crate) fn docker_socket(text: &str) -> Result<crate::DockerSocket, Invalid> {
    let text = text.trim();
    if text == "off" {
        return Ok(crate::DockerSocket::Off);
    }
    if !text.starts_with('/') || text.contains('\0') {
        return Err(Invalid::because(
            EXPECTED_DOCKER_SOCKET,
            "not an absolute path",
        ));
    }
    Ok(crate::DockerSocket::Path(PathBuf::from(text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_endpoints() {
        let ok = |s: &str, tls: bool| {
            assert_eq!(
                otlp_endpoint(s),
                Ok(OtlpEndpoint {
                    url: s.into(),
                    basic_auth: None,
                    tls
                }),
                "{s}"
            );
        };
        ok("http://localhost:4317", false);
        ok("https://collector.example.com", true);
        ok("HTTPS://collector.example.com:443/v1", true);
        ok("http://127.0.0.1:4317/", false);
        ok("http://[::1]:4317", false);
        ok("https://[2001:db8::1]", true);
        let with_credentials = otlp_endpoint("http://us%40er:p%3Aw@host:4317/v1").unwrap();
        assert_eq!(with_credentials.url, "http://host:4317/v1");
        assert_eq!(
            with_credentials.basic_auth.as_ref().map(Secret::expose),
            // base64("us@er:p:w")
            Some("Basic dXNAZXI6cDp3")
        );
        assert!(!format!("{with_credentials:?}").contains("p%3Aw"));
        assert_eq!(
            redact_userinfo("https://u:secret@host/x?y=@"),
            "https://<redacted>@host/x?y=@"
        );
        assert_eq!(redact_userinfo("http://host:1"), "http://host:1");
        for bad in [
            "",
            "localhost:4317",
            "ftp://host",
            "grpc://host:4317",
            "http://",
            "http:///path",
            "http://:4317",
            "http://host:",
            "http://host:0",
            "http://host:99999",
            "http://host:12a",
            "http://[::1",
            "http://[zz]:1",
            "http://[::1]x",
            "http://ho st",
            " http://host",
            "http://ho$t",
            "http://:pw@host",
            "http://u%zz:pw@host",
        ] {
            let err = otlp_endpoint(bad).expect_err(bad);
            assert_eq!(err.expected, EXPECTED_OTLP_ENDPOINT);
            assert!(err.detail.is_some(), "{bad}");
        }
    }

    #[test]
    fn frequencies() {
        assert_eq!(sampling_frequency("1"), Ok(1));
        assert_eq!(sampling_frequency("19"), Ok(19));
        assert_eq!(sampling_frequency("10000"), Ok(10_000));
        for bad in [
            "",
            "0",
            "10001",
            "-1",
            "+5",
            "1.5",
            "abc",
            " 19",
            "99999999999999999999999",
        ] {
            assert!(sampling_frequency(bad).is_err(), "{bad}");
        }
        assert!(sampling_frequency_number(u64::MAX).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(reporter_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(memory_size("64MiB"), Ok(64 << 20));
        assert_eq!(memory_size(" 512 KiB "), Ok(512 << 10));
        assert_eq!(memory_size("0"), Ok(0));
        assert_eq!(memory_size("1G"), Ok(1 << 30));
        assert_eq!(memory_size("4096"), Ok(4096));
        assert_eq!(memory_size("16GiB"), Ok(16 << 30));
        for bad in [
            "",
            "MiB",
            "-1",
            "1.5MiB",
            "64MB",
            "17GiB",
            "99999999999999999999G",
        ] {
            assert!(memory_size(bad).is_err(), "{bad}");
        }
        assert_eq!(reporter_interval("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(reporter_interval("1m 30s"), Ok(Duration::from_secs(90)));
        for bad in ["", "999ms", "1h 1s", "10", "ten seconds", "-1s"] {
            assert!(reporter_interval(bad).is_err(), "{bad}");
        }
        assert_eq!(flamegraph_history("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(flamegraph_history("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(
            flamegraph_history(" 2h 30m "),
            Ok(Duration::from_secs(9000))
        );
        assert_eq!(flamegraph_history("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(flamegraph_history("1day"), Ok(Duration::from_secs(86_400)));
        for off in ["0", "0s", "0m", " 0 "] {
            assert_eq!(flamegraph_history(off), Ok(Duration::ZERO), "{off}");
        }
        for bad in [
            "",
            "59s",
            "1ns",
            "24h 1s",
            "2days",
            "15",
            "fifteen minutes",
            "-15m",
            "15 parsecs",
        ] {
            let err = flamegraph_history(bad).expect_err(bad);
            assert_eq!(err.expected, EXPECTED_FLAMEGRAPH_HISTORY, "{bad}");
        }
        assert_eq!(
            flamegraph_history("30s").map_err(|e| e.detail),
            Err(Some("below the minimum of 1m".to_owned()))
        );
        assert_eq!(
            flamegraph_history("25h").map_err(|e| e.detail),
            Err(Some("above the maximum of 24h".to_owned()))
        );
        assert_eq!(run_duration("1ns"), Ok(Duration::from_nanos(1)));
        assert_eq!(run_duration("2days"), Ok(Duration::from_secs(2 * 86_400)));
        for bad in ["", "0s", "0", "5", "soon"] {
            assert!(run_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pids_and_addresses() {
        assert_eq!(pid("1"), Ok(1));
        assert_eq!(pid("2147483647"), Ok(2_147_483_647));
        for bad in ["", "0", "-3", "2147483648", "abc", "1.0"] {
            assert!(pid(bad).is_err(), "{bad}");
        }
        assert!(pid_number(0).is_err());
        assert_eq!(
            http_address("0.0.0.0:80"),
            Ok("0.0.0.0:80".parse().expect("literal"))
        );
        assert!(http_address("[::1]:7071").is_ok());
        assert_eq!(user(" nobody "), Ok("nobody".to_owned()));
        assert_eq!(user("65534"), Ok("65534".to_owned()));
        for bad in ["", " ", "a b", "a:b", "../x", "a\0"] {
            assert!(user(bad).is_err(), "{bad}");
        }
        for bad in [
            "",
            "localhost:7071",
            "127.0.0.1",
            "127.0.0.1:99999",
            ":7071",
        ] {
            assert!(http_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn log_levels() {
        for ok in [
            "info",
            "TRACE",
            "off",
            "info,icecore_receiver=debug",
            "warn, icecore::otlp = trace",
            "h2=off,info,",
        ] {
            assert!(log_level(ok).is_ok(), "{ok}");
        }
        assert_eq!(log_level("  debug ").as_deref(), Ok("debug"));
        for bad in [
            "",
            " , ",
            "verbose",
            "info,foo=loud",
            "=debug",
            "foo[span]=debug",
            "icecore",
        ] {
            let err = log_level(bad).expect_err(bad);
            assert_eq!(err.expected, EXPECTED_LOG_LEVEL);
        }
    }

    #[test]
    fn messages() {
        let bad = sampling_frequency("0").expect_err("zero");
        assert_eq!(
            bad.flag_message(),
            "expected an integer number of samples per second from 1 to 10000"
        );
        assert_eq!(
            bad.file_message("0"),
            "expected an integer number of samples per second from 1 to 10000, got 0"
        );
        let bad = flamegraph_history("2d").expect_err("long");
        assert_eq!(
            bad.flag_message(),
            "expected a duration from 1m to 24h, like 15m or 2h, \
             or 0 to turn the flame graph history off (above the maximum of 24h)"
        );
        let bad = reporter_interval("10ms").expect_err("short");
        assert!(
            bad.file_message("\"10ms\"")
                .ends_with("(below the minimum of 1s)")
        );
        assert!(pprof_dir(PathBuf::new()).is_err());
        assert!(pprof_dir(PathBuf::from("a\0b")).is_err());
        assert!(pprof_dir(PathBuf::from("out")).is_ok());
    }
}
