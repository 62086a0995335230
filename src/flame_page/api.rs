//! `/api/flamegraph`'s parameters and JSON (documented in the README).

use icecore_otlp::{
    history::{FlameNode, FlameQuery, FlameView, RangeNanos},
    model::FrameKind,
};
use serde_json::{Map, Value, json};

/// Most nodes a client may ask for.
pub const MAX_NODES: usize = 20_000;
/// Most names in a focus path (stacks are shorter).
const MAX_FOCUS: usize = 4096;
const MS: u64 = 1_000_000;

/// Why a request's parameters were refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// A parameter this API does not have.
    #[error("unknown parameter {0:?}")]
    Unknown(String),
    /// A value that does not parse or is out of range.
    #[error("{name}: {why}, got {value:?}")]
    Invalid {
        /// The parameter.
        name: &'static str,
        /// Its value.
        value: String,
        /// What was expected.
        why: &'static str,
    },
    /// Only one end of a range was given.
    #[error("{0} needs both ends")]
    HalfRange(&'static str),
}

fn decode(text: &str) -> String {
    let plus_as_space = text.replace('+', " ");
    percent_encoding::percent_decode_str(&plus_as_space)
        .decode_utf8_lossy()
        .into_owned()
}

fn invalid(name: &'static str, value: &str, why: &'static str) -> ParamError {
    ParamError::Invalid {
        name,
        value: value.chars().take(100).collect(),
        why,
    }
}

fn millis(name: &'static str, value: &str) -> Result<u64, ParamError> {
    value
        .parse::<u64>()
        .ok()
        .and_then(|ms| ms.checked_mul(MS))
        .ok_or_else(|| invalid(name, value, "expected Unix epoch milliseconds"))
}

/// Parses a query string (`a=1&b=2`, percent-encoded). `now_unix_nanos`
/// resolves `last`.
pub fn parse(query: &str, now_unix_nanos: u64) -> Result<FlameQuery, ParamError> {
    let mut q = FlameQuery::default();
    let (mut from, mut to, mut diff_from, mut diff_to) = (None, None, None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (key, value) = (decode(key), decode(value));
        let text = |name: &'static str| -> Result<Option<String>, ParamError> {
            if value.len() > 4096 {
                return Err(invalid(name, &value, "longer than 4096 bytes"));
            }
            Ok(Some(value.clone()).filter(|v| !v.is_empty()))
        };
        match key.as_str() {
            "kind" => q.kind = value.clone(),
            "from" => from = Some(millis("from", &value)?),
            "to" => to = Some(millis("to", &value)?),
            "diff_from" => diff_from = Some(millis("diff_from", &value)?),
            "diff_to" => diff_to = Some(millis("diff_to", &value)?),
            "last" => {
                let seconds = value
                    .parse::<u64>()
                    .ok()
                    .filter(|s| (1..=7 * 86_400).contains(s))
                    .ok_or_else(|| invalid("last", &value, "expected seconds, 1 to 604800"))?;
                from = Some(now_unix_nanos.saturating_sub(seconds * 1_000 * MS));
                to = Some(now_unix_nanos.saturating_add(1_000 * MS));
            }
            "pid" => {
                q.pid = Some(
                    value
                        .parse()
                        .map_err(|_| invalid("pid", &value, "expected a process ID"))?,
                );
            }
            "tid" => {
                q.tid = Some(
                    value
                        .parse()
                        .map_err(|_| invalid("tid", &value, "expected a thread ID"))?,
                );
            }
            "container" => q.container = text("container")?,
            "pod" => q.pod = text("pod")?,
            "service" => q.service = text("service")?,
            "search" => q.search = text("search")?,
            "types" => {
                let mut kinds = Vec::new();
                for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    kinds.push(FrameKind::from_otel_str(name).ok_or_else(|| {
                        invalid(
                            "types",
                            name,
                            "expected frame types: native, kernel, cpython, ruby, php, perl, jvm, v8js, dotnet",
                        )
                    })?);
                }
                if !kinds.is_empty() {
                    q.types = Some(kinds);
                }
            }
            "focus" => {
                if q.focus.len() >= MAX_FOCUS {
                    return Err(invalid("focus", &value, "more than 4096 frames"));
                }
                q.focus.push(value.clone());
            }
            "min_share" => {
                q.min_share = value
                    .parse::<f64>()
                    .ok()
                    .filter(|s| (0.0..=1.0).contains(s))
                    .ok_or_else(|| invalid("min_share", &value, "expected a number from 0 to 1"))?;
            }
            "max_nodes" => {
                q.max_nodes = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_NODES).contains(n))
                    .ok_or_else(|| invalid("max_nodes", &value, "expected 1 to 20000"))?;
            }
            _ => return Err(ParamError::Unknown(key.chars().take(100).collect())),
        }
    }
    q.range = match (from, to) {
        (Some(from), Some(to)) => Some(RangeNanos { from, to }),
        (None, None) => None,
        _ => return Err(ParamError::HalfRange("from/to")),
    };
    q.baseline = match (diff_from, diff_to) {
        (Some(from), Some(to)) => Some(RangeNanos { from, to }),
        (None, None) => None,
        _ => return Err(ParamError::HalfRange("diff_from/diff_to")),
    };
    Ok(q)
}

fn range_json(range: Option<RangeNanos>) -> Value {
    match range {
        Some(r) => json!({"from": r.from / MS, "to": r.to.div_ceil(MS)}),
        None => Value::Null,
    }
}

fn node_json(node: &FlameNode, diff: bool) -> Value {
    let mut out = Map::new();
    out.insert("name".into(), json!(&*node.name));
    out.insert(
        "type".into(),
        json!(node.kind.map_or("root", FrameKind::as_otel_str)),
    );
    out.insert("total".into(), json!(node.total));
    out.insert("self".into(), json!(node.self_value));
    if diff {
        out.insert("base_total".into(), json!(node.base_total));
        out.insert("base_self".into(), json!(node.base_self));
    }
    if node.hidden_children > 0 {
        out.insert("hidden".into(), json!(node.hidden_children));
    }
    if !node.children.is_empty() {
        out.insert(
            "children".into(),
            Value::Array(node.children.iter().map(|c| node_json(c, diff)).collect()),
        );
    }
    Value::Object(out)
}

/// The view as the API's JSON.
pub fn to_json(view: &FlameView, query: &FlameQuery) -> String {
    let diff = query.baseline.is_some();
    let facets = |list: &[icecore_otlp::history::Facet]| -> Value {
        list.iter()
            .map(|f| json!({"key": f.key, "label": f.label, "value": f.value}))
            .collect()
    };
    let body = json!({
        "kind": view.kind,
        "unit": view.unit,
        "range": range_json(view.range),
        "baseline": range_json(view.baseline),
        "total": view.total,
        "base_total": if diff { json!(view.base_total) } else { Value::Null },
        "focus": view.focus,
        "nodes": view.nodes,
        "all_nodes": view.all_nodes,
        "tree": node_json(&view.root, diff),
        "top": view.top.iter().map(|r| json!({
            "name": &*r.name,
            "type": r.kind.as_otel_str(),
            "self": r.self_value,
            "total": r.total,
        })).collect::<Vec<_>>(),
        "search": view.search.as_ref().map(|s| json!({
            "term": s.term,
            "value": s.value,
            "base_value": if diff { json!(s.base_value) } else { Value::Null },
            "matching_names": s.matches,
        })),
        "filters": {
            "processes": facets(&view.processes),
            "threads": facets(&view.threads),
            "containers": facets(&view.containers),
            "pods": facets(&view.pods),
            "services": facets(&view.services),
            "types": facets(&view.types),
        },
        "timeline": view.timeline.iter().map(|p| json!({
            "from": p.range.from / MS,
            "to": p.range.to.div_ceil(MS),
            "value": p.value,
        })).collect::<Vec<_>>(),
    });
    body.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_parameter() {
        let q = parse(
            "kind=off_cpu&from=1000&to=2000&diff_from=0&diff_to=1000&pid=7&tid=8&container=c1\
             &pod=p%2F1&service=web+api&types=cpython,native&focus=main&focus=a%26b&search=ga\
             &min_share=0.01&max_nodes=100",
            0,
        )
        .unwrap();
        assert_eq!(q.kind, "off_cpu");
        assert_eq!(
            q.range,
            Some(RangeNanos {
                from: 1000 * MS,
                to: 2000 * MS
            })
        );
        assert_eq!(q.baseline.map(|b| b.to), Some(1000 * MS));
        assert_eq!((q.pid, q.tid), (Some(7), Some(8)));
        assert_eq!(q.pod.as_deref(), Some("p/1"));
        assert_eq!(q.service.as_deref(), Some("web api"));
        assert_eq!(q.types, Some(vec![FrameKind::CPython, FrameKind::Native]));
        assert_eq!(q.focus, ["main", "a&b"]);
        assert_eq!((q.min_share, q.max_nodes), (0.01, 100));
        let last = parse("last=60", 100_000 * MS).unwrap();
        assert_eq!(last.range.map(|r| r.from), Some(40_000 * MS));
    }

    #[test]
    fn refuses_bad_parameters_clearly() {
        let err = |q: &str| parse(q, 0).unwrap_err().to_string();
        assert_eq!(err("colour=red"), "unknown parameter \"colour\"");
        assert_eq!(err("from=1"), "from/to needs both ends");
        assert!(err("from=x&to=1").contains("expected Unix epoch milliseconds"));
        assert!(err("types=cobol").contains("expected frame types"));
        assert!(err("max_nodes=0").contains("1 to 20000"));
        assert!(err("min_share=2").contains("0 to 1"));
        assert!(err("pid=-1").contains("process ID"));
        assert!(err("from=99999999999999999999&to=1").contains("milliseconds"));
        assert!(err(&format!("search={}", "x".repeat(5000))).contains("4096"));
    }
}
