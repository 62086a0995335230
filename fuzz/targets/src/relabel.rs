//! Prometheus relabeling (`relabel_configs`): rules checked by
//! `RelabelRules::new` (the regex compiled, names and fields checked), then
//! applied to a label set as the agent applies them to each process.
//!
//! The input is text, so that seeds are readable and mutations land in the
//! regexes and templates. Lines up to the first empty line are rules, seven
//! tab-separated fields each:
//!
//! ```text
//! action  source_labels(comma-separated)  separator  regex  target_label  replacement  modulus
//! ```
//!
//! An empty field is an absent one (the default); `""` is an empty string.
//! Lines after the empty line are labels, `name=value`. (The YAML shape of
//! the same rules goes through the `config_file` target.)

use icecore_config::relabel::{Labels, RelabelRules, RuleSpec, is_label_name};

/// Rules and labels read; more are ignored (inputs are short anyway).
const MAX_RULES: usize = 32;
const MAX_LABELS: usize = 64;

fn field(text: Option<&str>) -> Option<String> {
    match text {
        None | Some("") => None,
        Some("\"\"") => Some(String::new()),
        Some(t) => Some(t.to_owned()),
    }
}

fn rule(line: &str) -> RuleSpec {
    let mut fields = line.split('\t');
    let action = field(fields.next());
    let source_labels = fields
        .next()
        .filter(|s| !s.is_empty())
        .map(|s| s.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    RuleSpec {
        action,
        source_labels,
        separator: field(fields.next()),
        regex: field(fields.next()),
        target_label: field(fields.next()),
        replacement: field(fields.next()),
        modulus: fields.next().and_then(|m| m.trim().parse().ok()),
    }
}

/// Runs one input through the entry points above; panics are the bugs
/// looked for (errors are expected answers to bad input).
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (rules_text, labels_text) = text.split_once("\n\n").unwrap_or((text, ""));
    let specs: Vec<RuleSpec> = rules_text.lines().take(MAX_RULES).map(rule).collect();
    let labels: Labels = labels_text
        .lines()
        .take(MAX_LABELS)
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let rules = match RelabelRules::new(specs) {
        Ok(rules) => rules,
        Err((position, error)) => {
            let _ = format!("rule {position}: {error}");
            return;
        }
    };
    let _ = rules.filters();
    let _ = rules.reads_thread_labels();
    for rule in rules.rules() {
        let _ = rule.to_string();
    }
    if let Some(out) = rules.apply(labels) {
        // What the agent exports: names starting with `__` are gone, and
        // every name a rule wrote was checked to be a label name.
        for name in out.keys() {
            let _ = is_label_name(name);
        }
    }
}
