//! The YAML config file: reading, key checks and value checks into
//! [`Settings`].

use std::path::{Path, PathBuf};

use serde_norway::{Mapping, Value};

use crate::export::{self, BearerToken, EXPECTED_OTLP_HEADERS};
use crate::validate::{self, EXPECTED_PIDS, Invalid};

const EXPECTED_RESOURCE_MAPPING: &str =
    "a mapping of attribute names to string values, like {deployment.environment.name: prod}";
use crate::{ConfigError, Settings};

mod lists;
mod scrape;

/// The keys a config file may have, in the order the docs list them.
pub const KEYS: [&str; 57] = [
    "otlp_endpoint",
    "otlp_headers",
    "otlp_bearer_token_file",
    "otlp_ca_file",
    "otlp_client_cert",
    "otlp_client_key",
    "otlp_insecure_skip_verify",
    "otlp_timeout",
    "otlp_compression",
    "service_name",
    "resource_attributes",
    "external_labels",
    "relabel_configs",
    "targets",
    "scrape_configs",
    "kubernetes_api",
    "kubelet_url",
    "node_name",
    "kubernetes_token_file",
    "kubernetes_ca_file",
    "command_line_attribute",
    "docker_socket",
    "otlp_listen",
    "otlp_listen_bearer_token_file",
    "otlp_listen_memory",
    "parca_endpoint",
    "parca_bearer_token_file",
    "parca_timeout",
    "pyroscope_endpoint",
    "pyroscope_bearer_token_file",
    "pyroscope_tenant_id",
    "pyroscope_timeout",
    "pprof_dir",
    "pprof_max_files",
    "pprof_max_bytes",
    "export_queue_bytes",
    "sampling_frequency",
    "reporter_interval",
    "debug_info_memory",
    "unwind_table_memory",
    "duration",
    "off_cpu_threshold",
    "off_cpu_min_duration",
    "wall_clock",
    "pids",
    "runtimes",
    "http_address",
    "http_bearer_token_file",
    "http_tls_cert",
    "http_tls_key",
    "user",
    "keep_capabilities",
    "flamegraph_history",
    "flamegraph_max_bytes",
    "log_level",
    "log_format",
    "self_traces",
];

/// Largest config file read: a real one is a few hundred bytes, and
/// `/dev/zero` or a log file given by mistake must not fill memory.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Deepest nesting of collections accepted: settings are at most two
/// levels deep, and the YAML parser's time grows with the depth.
pub const MAX_NESTING: usize = 16;

/// Reads, parses and checks the config file at `path`.
pub(crate) fn load(path: &Path) -> Result<Settings, ConfigError> {
    use std::io::Read;
    let read_error = |source| ConfigError::FileRead {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    let syntax = |message: String| ConfigError::FileSyntax {
        path: path.to_owned(),
        message,
    };
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(syntax(format!(
            "the file is over {} KiB; a config file is a short YAML mapping",
            MAX_FILE_BYTES >> 10
        )));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        syntax(format!(
            "not UTF-8 text (byte {})",
            e.utf8_error().valid_up_to()
        ))
    })?;
    parse(path, &text)
}

/// The deepest nesting of YAML collections in `text`, counted before the
/// parser sees it: flow brackets outside quoted scalars and comments, and
/// block levels by indentation (a `- ` item opens a level too).
fn nesting_depth(text: &str) -> usize {
    let mut deepest = 0;
    let mut flow = 0usize;
    let mut indents: Vec<usize> = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start_matches([' ', '\t']);
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if flow == 0 {
            let indent = line.len() - trimmed.len();
            while indents.last().is_some_and(|&i| i > indent) {
                indents.pop();
            }
            if indents.last() != Some(&indent) {
                indents.push(indent);
            }
            // Each `- ` starts a nested item on the same line.
            let dashes = trimmed
                .split_inclusive(' ')
                .take_while(|part| part.trim() == "-")
                .count();
            deepest = deepest.max(indents.len() + dashes);
        }
        let mut quote: Option<char> = None;
        for c in trimmed.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '\'' | '"') => quote = Some(c),
                (None, '#') => break,
                (None, '[' | '{') => {
                    flow += 1;
                    deepest = deepest.max(indents.len() + flow);
                }
                (None, ']' | '}') => flow = flow.saturating_sub(1),
                _ => {}
            }
        }
    }
    deepest
}

/// Parses and checks config file text; `path` only names the file in errors.
pub(crate) fn parse(path: &Path, text: &str) -> Result<Settings, ConfigError> {
    let syntax = |message: String| ConfigError::FileSyntax {
        path: path.to_owned(),
        message,
    };
    let depth = nesting_depth(text);
    if depth > MAX_NESTING {
        return Err(syntax(format!(
            "collections nested {depth} deep; settings nest at most {MAX_NESTING} deep"
        )));
    }
    let document: Value =
        serde_norway::from_str(text).map_err(|e| syntax(format!("invalid YAML: {e}")))?;
    let mapping = match document {
        // An empty file, or one with only comments, sets nothing.
        Value::Null => Mapping::new(),
        Value::Mapping(mapping) => mapping,
        other => {
            return Err(syntax(format!(
                "expected a mapping of settings (one `key: value` per line), got {}",
                describe(&other)
            )));
        }
    };
    for key in mapping.keys() {
        let name = match key {
            Value::String(k) if KEYS.contains(&k.as_str()) => continue,
            Value::String(k) => k.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            other => {
                return Err(syntax(format!(
                    "expected setting names as keys, got {}",
                    describe(other)
                )));
            }
        };
        return Err(ConfigError::UnknownKey {
            path: path.to_owned(),
            line: line_of_key(text, &name),
            key: name,
        });
    }
    let reader = Reader { path, mapping };
    Ok(Settings {
        otlp: reader.string("otlp_endpoint", validate::otlp_endpoint)?,
        otlp_headers: reader.mapping("otlp_headers", EXPECTED_OTLP_HEADERS, |k, v| {
            export::header(k, v, EXPECTED_OTLP_HEADERS)
        })?,
        otlp_bearer_token: reader
            .string("otlp_bearer_token_file", export::token_file)?
            .map(BearerToken::File),
        otlp_ca_file: reader.string("otlp_ca_file", export::pem_file)?,
        otlp_client_cert: reader.string("otlp_client_cert", export::pem_file)?,
        otlp_client_key: reader.string("otlp_client_key", export::pem_file)?,
        otlp_insecure_skip_verify: reader.boolean("otlp_insecure_skip_verify")?,
        otlp_timeout: reader.string("otlp_timeout", export::otlp_timeout)?,
        otlp_compression: reader.string("otlp_compression", export::compression)?,
        service_name: reader.string("service_name", export::service_name)?,
        resource_attributes: reader.mapping(
            "resource_attributes",
            EXPECTED_RESOURCE_MAPPING,
            |k, v| Ok((k.to_owned(), v.to_owned())),
        )?,
        external_labels: reader.mapping(
            "external_labels",
            validate::EXPECTED_EXTERNAL_LABEL,
            validate::external_label_pair,
        )?,
        relabel_configs: reader.relabel_configs()?,
        targets: reader.targets()?,
        scrape_configs: reader.scrape_configs()?,
        kubernetes_api: reader.pod_source()?,
        node_name: reader.string("node_name", validate::node_name)?,
        kubernetes_token_file: reader.string("kubernetes_token_file", export::token_file)?,
        kubernetes_ca_file: reader.string("kubernetes_ca_file", export::pem_file)?,
        command_line_attribute: reader.boolean("command_line_attribute")?,
        docker_socket: reader.string("docker_socket", validate::docker_socket)?,
        otlp_listen: reader.string("otlp_listen", export::listen_address)?,
        parca: reader.string("parca_endpoint", validate::otlp_endpoint)?,
        parca_bearer_token_file: reader.string("parca_bearer_token_file", export::token_file)?,
        pyroscope: reader.string("pyroscope_endpoint", validate::otlp_endpoint)?,
        pyroscope_bearer_token_file: reader
            .string("pyroscope_bearer_token_file", export::token_file)?,
        pyroscope_tenant_id: reader.string("pyroscope_tenant_id", export::tenant_id)?,
        parca_timeout: reader.string("parca_timeout", export::otlp_timeout)?,
        pyroscope_timeout: reader.string("pyroscope_timeout", export::otlp_timeout)?,
        otlp_listen_bearer_token_file: reader
            .string("otlp_listen_bearer_token_file", export::token_file)?,
        otlp_listen_memory_bytes: reader.integer(
            "otlp_listen_memory",
            validate::memory_budget,
            validate::memory_budget_number,
        )?,
        pprof_dir: reader.string("pprof_dir", |s| validate::pprof_dir(PathBuf::from(s)))?,
        pprof_max_files: reader.integer(
            "pprof_max_files",
            validate::file_count,
            validate::file_count_number,
        )?,
        pprof_max_bytes: reader.integer(
            "pprof_max_bytes",
            validate::memory_size,
            validate::memory_size_number,
        )?,
        export_queue_bytes: reader.integer(
            "export_queue_bytes",
            validate::queue_bound,
            validate::queue_bound_number,
        )?,
        sampling_frequency_hz: reader.integer(
            "sampling_frequency",
            validate::sampling_frequency,
            validate::sampling_frequency_number,
        )?,
        reporter_interval: reader.string("reporter_interval", validate::reporter_interval)?,
        debug_info_memory_bytes: reader.integer(
            "debug_info_memory",
            validate::memory_size,
            validate::memory_size_number,
        )?,
        unwind_table_memory_bytes: reader.integer(
            "unwind_table_memory",
            validate::memory_budget,
            validate::memory_budget_number,
        )?,
        duration: reader.string("duration", validate::run_duration)?,
        off_cpu_threshold: reader.string("off_cpu_threshold", crate::off_cpu::threshold)?,
        off_cpu_min_duration: reader
            .string("off_cpu_min_duration", crate::off_cpu::min_duration)?,
        wall_clock: reader.boolean("wall_clock")?,
        pids: reader.pids()?,
        runtimes: reader.runtimes()?,
        http_address: reader.string("http_address", validate::http_address)?,
        http_bearer_token_file: reader.string("http_bearer_token_file", export::token_file)?,
        http_tls_cert: reader.string("http_tls_cert", export::pem_file)?,
        http_tls_key: reader.string("http_tls_key", export::pem_file)?,
        user: reader.string("user", validate::user)?,
        keep_capabilities: reader.boolean("keep_capabilities")?,
        flamegraph_history: reader.string("flamegraph_history", validate::flamegraph_history)?,
        flamegraph_max_bytes: reader.integer(
            "flamegraph_max_bytes",
            validate::memory_size,
            validate::memory_size_number,
        )?,
        log_level: reader.string("log_level", validate::log_level)?,
        log_format: reader.string("log_format", validate::log_format)?,
        self_traces: reader.boolean("self_traces")?,
        traces_endpoint: None,
    })
}

/// Looks settings up in the file's top-level mapping.
struct Reader<'a> {
    path: &'a Path,
    mapping: Mapping,
}

impl Reader<'_> {
    /// The value under `key`; a missing key and `null` both mean unset.
    fn get(&self, key: &str) -> Option<&Value> {
        self.mapping.get(key).filter(|v| !v.is_null())
    }

    fn invalid(&self, key: &'static str, got: &Value, invalid: &Invalid) -> ConfigError {
        ConfigError::InvalidFileValue {
            path: self.path.to_owned(),
            key,
            message: invalid.file_message(&describe(got)),
        }
    }

    /// A setting written as a YAML string.
    fn string<T>(
        &self,
        key: &'static str,
        parse: impl Fn(&str) -> Result<T, Invalid>,
    ) -> Result<Option<T>, ConfigError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let result = match value {
            Value::String(text) => parse(text),
            // Give the parser the written form so the message says what is
            // missing (a unit, a scheme...), but report the value as written.
            Value::Number(n) => parse(&n.to_string()),
            _ => parse("").map_err(|e| Invalid {
                expected: e.expected,
                detail: None,
            }),
        };
        result.map(Some).map_err(|e| self.invalid(key, value, &e))
    }

    /// A setting written as a YAML integer (or a string holding one).
    fn integer<T>(
        &self,
        key: &'static str,
        parse_text: impl Fn(&str) -> Result<T, Invalid>,
        check_number: impl Fn(u64) -> Result<T, Invalid>,
    ) -> Result<Option<T>, ConfigError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        integer_value(value, &parse_text, &check_number)
            .map(Some)
            .map_err(|e| self.invalid(key, value, &e))
    }

    /// A setting written as a YAML boolean.
    fn boolean(&self, key: &'static str) -> Result<Option<bool>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.invalid(key, other, &Invalid::new("true or false"))),
        }
    }

    /// A mapping of names to scalar values, each pair checked by `check`.
    fn mapping(
        &self,
        key: &'static str,
        expected: &'static str,
        check: impl Fn(&str, &str) -> Result<(String, String), Invalid>,
    ) -> Result<Option<Vec<(String, String)>>, ConfigError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let Value::Mapping(entries) = value else {
            return Err(self.invalid(key, value, &Invalid::new(expected)));
        };
        let mut pairs = Vec::with_capacity(entries.len());
        for (name, item) in entries {
            let (Value::String(name), Some(text)) = (name, scalar_text(item)) else {
                return Err(self.invalid(
                    key,
                    item,
                    &Invalid::because(expected, format!("under {}", describe(name))),
                ));
            };
            pairs.push(check(name, &text).map_err(|e| self.invalid(key, item, &e))?);
        }
        Ok(Some(pairs))
    }

    /// The `runtimes` setting: a list of names, or a string (`all`, `none`,
    /// or names separated by commas).
    fn runtimes(&self) -> Result<Option<Vec<String>>, ConfigError> {
        let Some(value) = self.get("runtimes") else {
            return Ok(None);
        };
        let text = match value {
            Value::String(text) => text.clone(),
            Value::Sequence(items) if items.is_empty() => "none".to_owned(),
            Value::Sequence(items) => {
                let mut names = Vec::with_capacity(items.len());
                for item in items {
                    let Value::String(name) = item else {
                        return Err(self.invalid(
                            "runtimes",
                            item,
                            &Invalid::new(validate::EXPECTED_RUNTIMES),
                        ));
                    };
                    names.push(name.clone());
                }
                names.join(",")
            }
            other => {
                return Err(self.invalid(
                    "runtimes",
                    other,
                    &Invalid::new(validate::EXPECTED_RUNTIMES),
                ));
            }
        };
        validate::runtimes(&text)
            .map(Some)
            .map_err(|e| self.invalid("runtimes", value, &e))
    }

    /// `kubernetes_api` or `kubelet_url`, not both.
    fn pod_source(&self) -> Result<Option<crate::KubernetesApi>, ConfigError> {
        let api = self.string("kubernetes_api", validate::kubernetes_api)?;
        let kubelet = self.string("kubelet_url", validate::kubelet_url)?;
        match (api, kubelet) {
            (Some(_), Some(_)) => Err(ConfigError::InvalidFileValue {
                path: self.path.to_owned(),
                key: "kubelet_url",
                message: "set kubernetes_api or kubelet_url, not both".to_owned(),
            }),
            (api, kubelet) => Ok(kubelet.or(api)),
        }
    }

    /// The `pids` list; an empty list means every process.
    fn pids(&self) -> Result<Option<Vec<u32>>, ConfigError> {
        let Some(value) = self.get("pids") else {
            return Ok(None);
        };
        let Value::Sequence(items) = value else {
            return Err(self.invalid(
                "pids",
                value,
                &Invalid {
                    expected: EXPECTED_PIDS,
                    detail: None,
                },
            ));
        };
        let mut pids = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let pid = integer_value(item, &validate::pid, &validate::pid_number).map_err(|_| {
                self.invalid(
                    "pids",
                    item,
                    &Invalid {
                        expected: EXPECTED_PIDS,
                        detail: Some(format!("item {} of the list", index + 1)),
                    },
                )
            })?;
            pids.push(pid);
        }
        Ok(Some(pids))
    }
}

/// Reads an integer from a YAML number or a string holding digits.
fn integer_value<T>(
    value: &Value,
    parse_text: &impl Fn(&str) -> Result<T, Invalid>,
    check_number: &impl Fn(u64) -> Result<T, Invalid>,
) -> Result<T, Invalid> {
    match value {
        Value::Number(n) => match n.as_u64() {
            Some(n) => check_number(n),
            // Negative or fractional: the text parser rejects its digits.
            None => parse_text(&n.to_string()),
        },
        Value::String(text) => parse_text(text),
        _ => parse_text(""),
    }
}

/// A string, number or boolean as text; `None` for anything else.
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// How a YAML value reads in an error message.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{:?}", validate::redact_userinfo(s)),
        Value::Sequence(_) => "a list".to_owned(),
        Value::Mapping(_) => "a mapping".to_owned(),
        Value::Tagged(tagged) => format!("a value tagged {}", tagged.tag),
    }
}

/// The 1-based line on which top-level `key` is written, if it can be found.
fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|line| {
            let line = line.trim_end();
            [key.to_owned(), format!("\"{key}\""), format!("'{key}'")]
                .iter()
                .any(|written| {
                    line.strip_prefix(written.as_str())
                        .is_some_and(|rest| rest.trim_start().starts_with(':'))
                })
        })
        .map(|index| index + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn parse_text(text: &str) -> Result<Settings, ConfigError> {
        parse(Path::new("/etc/icecore.yaml"), text)
    }

    pub(super) fn error(text: &str) -> String {
        match parse_text(text) {
            Ok(settings) => panic!("{text:?} parsed as {settings:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn empty_and_null() {
        assert_eq!(parse_text("").expect("empty"), Settings::default());
        assert_eq!(
            parse_text("# only a comment\n").expect("comment"),
            Settings::default()
        );
        assert_eq!(
            parse_text("pprof_dir: ~\npids: null\n").expect("nulls"),
            Settings::default()
        );
    }

    #[test]
    fn runtimes_as_a_list_or_a_string() {
        let runtimes = |text: &str| parse_text(text).expect(text).runtimes;
        assert_eq!(
            runtimes("runtimes: [cpython]"),
            Some(vec!["cpython".to_owned()])
        );
        assert_eq!(runtimes("runtimes: []"), Some(vec![]));
        assert_eq!(runtimes("runtimes: none"), Some(vec![]));
        assert_eq!(
            runtimes("runtimes: all").map(|r| r.len()),
            Some(crate::RUNTIME_NAMES.len())
        );
        assert_eq!(
            runtimes("runtimes: \"perf-map, cpython\""),
            Some(vec!["perf-map".to_owned(), "cpython".to_owned()])
        );
        assert!(error("runtimes: [lua]").contains("\"lua\" is not a runtime icecore knows"));
        assert!(error("runtimes: 5").contains("runtimes: expected `all`, `none`"));
    }

    #[test]
    fn external_labels_need_label_names_and_values() {
        let settings = parse_text("external_labels:\n  cluster: east\n  zone: 2\n").expect("ok");
        assert_eq!(
            settings.external_labels,
            Some(vec![
                ("cluster".to_owned(), "east".to_owned()),
                ("zone".to_owned(), "2".to_owned())
            ])
        );
        assert!(
            error("external_labels:\n  bad-name: x\n").contains("\"bad-name\" is not such a name")
        );
        assert!(error("external_labels:\n  __meta_x: x\n").contains("is not such a name"));
        assert!(error("external_labels:\n  empty: \"\"\n").contains("the value is empty"));
    }

    #[test]
    fn strings_for_numbers_and_empty_pid_list() {
        let settings =
            parse_text("sampling_frequency: \"99\"\npids: [\"12\", 34]\n").expect("quoted numbers");
        assert_eq!(settings.sampling_frequency_hz, Some(99));
        assert_eq!(settings.pids, Some(vec![12, 34]));
        assert_eq!(parse_text("pids: []").expect("empty").pids, Some(vec![]));
    }

    #[test]
    fn wrong_types_name_key_and_form() {
        assert_eq!(
            error("sampling_frequency: 0"),
            "config file /etc/icecore.yaml: sampling_frequency: expected an integer number \
             of samples per second from 1 to 10000, got 0"
        );
        assert!(error("sampling_frequency: 1.5").contains("got 1.5"));
        assert!(error("sampling_frequency: -3").contains("got -3"));
        assert!(error("sampling_frequency: [1]").contains("got a list"));
        assert!(error("reporter_interval: 10").contains("reporter_interval: expected a duration"));
        assert!(error("duration: true").contains("duration: expected a duration greater"));
        assert!(error("pids: 5").contains("pids: expected a list of process IDs"));
        assert!(error("pids: [1, 0]").contains("got 0 (item 2 of the list)"));
        assert!(error("pids: [{a: 1}]").contains("got a mapping"));
        assert!(error("http_address: {a: b}").contains("http_address: expected an IP socket"));
        assert!(error("log_level: !custom x").contains("got a value tagged !custom"));
        assert!(error("otlp_endpoint: 4317").contains("otlp_endpoint: expected an http://"));
    }

    #[test]
    fn flamegraph_history_and_memory() {
        let settings =
            parse_text("flamegraph_history: 2h\nflamegraph_max_bytes: 128MiB\n").expect("valid");
        assert_eq!(
            settings.flamegraph_history,
            Some(std::time::Duration::from_secs(7200))
        );
        assert_eq!(settings.flamegraph_max_bytes, Some(128 << 20));
        // A YAML integer 0 turns either off; so does a string.
        let off = parse_text("flamegraph_history: 0\nflamegraph_max_bytes: 0\n").expect("zeros");
        assert_eq!(off.flamegraph_history, Some(std::time::Duration::ZERO));
        assert_eq!(off.flamegraph_max_bytes, Some(0));
        let off = parse_text("flamegraph_history: \"0s\"\nflamegraph_max_bytes: \"0\"\n")
            .expect("quoted zeros");
        assert_eq!(off.flamegraph_history, Some(std::time::Duration::ZERO));
        assert_eq!(off.flamegraph_max_bytes, Some(0));
        assert_eq!(
            error("flamegraph_history: 30s"),
            "config file /etc/icecore.yaml: flamegraph_history: expected a duration from 1m \
             to 24h, like 15m or 2h, or 0 to turn the flame graph history off, got \"30s\" \
             (below the minimum of 1m)"
        );
        assert!(error("flamegraph_history: 25h").contains("(above the maximum of 24h)"));
        assert!(error("flamegraph_history: 15").contains("got 15"));
        assert!(error("flamegraph_history: [15m]").contains("got a list"));
        assert!(
            error("flamegraph_max_bytes: 64MB")
                .contains("flamegraph_max_bytes: expected a size in bytes up to 16GiB")
        );
        assert!(error("flamegraph_max_bytes: -1").contains("got -1"));
        assert!(error("flamegraph_max_bytes: 17GiB").contains("above the maximum of 16GiB"));
    }

    #[test]
    fn shape_and_syntax_errors() {
        assert!(error("- a\n- b\n").contains("expected a mapping of settings"));
        assert!(error("just text").contains("got \"just text\""));
        let message = error("pids: [1, 2\nlog_level: info\n");
        assert!(message.contains("invalid YAML"), "{message}");
        assert!(message.contains("line"), "{message}");
        assert!(error("log_level: a\nlog_level: b\n").contains("duplicate"));
    }

    #[test]
    fn unknown_keys() {
        assert_eq!(
            error("log_level: info\n\n\"sampling_rate\" : 3\n"),
            format!(
                "config file /etc/icecore.yaml: unknown key \"sampling_rate\" at line 3; \
                 accepted keys: {}",
                KEYS.join(", ")
            )
        );
        assert!(error("1: 2").contains("unknown key \"1\""));
        assert!(error("? [a]\n: 2").contains("expected setting names as keys, got a list"));
    }
}
