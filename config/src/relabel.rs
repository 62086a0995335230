//! Prometheus relabeling (`relabel_configs`): rules checked when the config
//! is read, then applied to a process's label set, once per process.
//!
//! The semantics are Prometheus's (`model/relabel`): the source labels'
//! values joined by `separator` are matched against `regex`, anchored at
//! both ends; `replacement` and `target_label` may use the match's groups
//! (`$1`, `${name}`). The defaults are Prometheus's too: action `replace`,
//! separator `;`, regex `(.*)`, replacement `$1`.

use std::collections::BTreeMap;
use std::fmt;

use regex::Regex;

/// A label set: name → value, sorted by name.
pub type Labels = BTreeMap<String, String>;

/// What a rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelabelAction {
    /// Sets `target_label` to `replacement` when the regex matches.
    Replace,
    /// Keeps the process only if the regex matches.
    Keep,
    /// Drops the process if the regex matches.
    Drop,
    /// Keeps the process only if the joined value equals `target_label`'s.
    KeepEqual,
    /// Drops the process if the joined value equals `target_label`'s.
    DropEqual,
    /// Sets `target_label` to a hash of the joined value modulo `modulus`.
    HashMod,
    /// Copies every label whose name matches to the name `replacement` gives.
    LabelMap,
    /// Removes every label whose name matches.
    LabelDrop,
    /// Removes every label whose name does not match.
    LabelKeep,
    /// Sets `target_label` to the joined value in lower case.
    Lowercase,
    /// Sets `target_label` to the joined value in upper case.
    Uppercase,
}

impl RelabelAction {
    /// Every action, by its name in the config.
    pub const ALL: [(&'static str, RelabelAction); 11] = [
        ("replace", RelabelAction::Replace),
        ("keep", RelabelAction::Keep),
        ("drop", RelabelAction::Drop),
        ("keepequal", RelabelAction::KeepEqual),
        ("dropequal", RelabelAction::DropEqual),
        ("hashmod", RelabelAction::HashMod),
        ("labelmap", RelabelAction::LabelMap),
        ("labeldrop", RelabelAction::LabelDrop),
        ("labelkeep", RelabelAction::LabelKeep),
        ("lowercase", RelabelAction::Lowercase),
        ("uppercase", RelabelAction::Uppercase),
    ];

    /// The action named `name` (case-insensitive, as Prometheus reads it).
    pub fn parse(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        Self::ALL
            .iter()
            .find(|(n, _)| *n == lower)
            .map(|&(_, action)| action)
    }

    /// The name of the action in the config.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, a)| *a == self)
            .map_or("replace", |&(n, _)| n)
    }

    /// Whether the action can remove a process from profiling.
    pub fn filters(self) -> bool {
        matches!(
            self,
            RelabelAction::Keep
                | RelabelAction::Drop
                | RelabelAction::KeepEqual
                | RelabelAction::DropEqual
        )
    }
}

/// A rule as written, before it is checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSpec {
    /// `action`; `replace` when absent.
    pub action: Option<String>,
    /// `source_labels`.
    pub source_labels: Vec<String>,
    /// `separator`; `;` when absent.
    pub separator: Option<String>,
    /// `regex`; `(.*)` when absent.
    pub regex: Option<String>,
    /// `target_label`.
    pub target_label: Option<String>,
    /// `replacement`; `$1` when absent.
    pub replacement: Option<String>,
    /// `modulus`, for `hashmod`.
    pub modulus: Option<u64>,
}

/// Why a rule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelabelError {
    /// The action is not one Prometheus knows.
    #[error("unknown action {0:?}; expected one of {list}", list = action_list())]
    UnknownAction(String),
    /// The regex does not compile.
    #[error("invalid regex {regex:?}: {message}")]
    BadRegex {
        /// The regex as written.
        regex: String,
        /// The regex parser's complaint.
        message: String,
    },
    /// The action needs a `target_label` and has none.
    #[error("action {0} needs a target_label")]
    MissingTarget(&'static str),
    /// `target_label` is not a valid label name (or template of one).
    #[error(
        "invalid target_label {0:?}: label names are letters, digits and _, not starting with a digit"
    )]
    BadTarget(String),
    /// A source label is not a valid label name.
    #[error(
        "invalid source label {0:?}: label names are letters, digits and _, not starting with a digit"
    )]
    BadSource(String),
    /// `hashmod` without a positive `modulus`.
    #[error("action hashmod needs a modulus above 0")]
    MissingModulus,
    /// A field the action ignores was set, which is almost always a mistake.
    #[error("action {action} does not use {field}")]
    UnusedField {
        /// The action.
        action: &'static str,
        /// The field set.
        field: &'static str,
    },
}

fn action_list() -> String {
    RelabelAction::ALL
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One checked rule.
#[derive(Debug, Clone)]
pub struct RelabelRule {
    action: RelabelAction,
    source_labels: Vec<String>,
    separator: String,
    /// The regex as written, for display.
    regex_text: String,
    /// Anchored at both ends, as Prometheus anchors it.
    regex: Regex,
    target_label: String,
    replacement: String,
    modulus: u64,
}

impl PartialEq for RelabelRule {
    fn eq(&self, other: &Self) -> bool {
        self.action == other.action
            && self.source_labels == other.source_labels
            && self.separator == other.separator
            && self.regex_text == other.regex_text
            && self.target_label == other.target_label
            && self.replacement == other.replacement
            && self.modulus == other.modulus
    }
}

impl Eq for RelabelRule {}

impl fmt::Display for RelabelRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?} =~ {:?}",
            self.action.name(),
            self.source_labels,
            self.regex_text
        )?;
        if !self.target_label.is_empty() {
            write!(f, " -> {}", self.target_label)?;
        }
        Ok(())
    }
}

/// Largest regex accepted, compiled: a rule's automaton stays small.
const MAX_REGEX_BYTES: usize = 1 << 20;

impl RelabelRule {
    /// Checks a rule as written.
    pub fn new(spec: RuleSpec) -> Result<Self, RelabelError> {
        let action = match &spec.action {
            None => RelabelAction::Replace,
            Some(name) => RelabelAction::parse(name)
                .ok_or_else(|| RelabelError::UnknownAction(name.clone()))?,
        };
        let regex_text = spec.regex.clone().unwrap_or_else(|| "(.*)".to_owned());
        let regex = regex::RegexBuilder::new(&format!("^(?s:{regex_text})$"))
            .size_limit(MAX_REGEX_BYTES)
            .build()
            .map_err(|e| RelabelError::BadRegex {
                regex: regex_text.clone(),
                message: e.to_string(),
            })?;
        for source in &spec.source_labels {
            if !is_label_name(source) {
                return Err(RelabelError::BadSource(source.clone()));
            }
        }
        let target_label = spec.target_label.clone().unwrap_or_default();
        let needs_target = matches!(
            action,
            RelabelAction::Replace
                | RelabelAction::HashMod
                | RelabelAction::KeepEqual
                | RelabelAction::DropEqual
                | RelabelAction::Lowercase
                | RelabelAction::Uppercase
        );
        if needs_target && target_label.is_empty() {
            return Err(RelabelError::MissingTarget(action.name()));
        }
        if !target_label.is_empty() {
            // `replace` may build the name from the match's groups.
            let valid = if action == RelabelAction::Replace {
                is_label_template(&target_label)
            } else {
                is_label_name(&target_label)
            };
            if !valid {
                return Err(RelabelError::BadTarget(target_label));
            }
        }
        let modulus = spec.modulus.unwrap_or(0);
        if action == RelabelAction::HashMod && modulus == 0 {
            return Err(RelabelError::MissingModulus);
        }
        let unused = |field| RelabelError::UnusedField {
            action: action.name(),
            field,
        };
        if action != RelabelAction::HashMod && spec.modulus.is_some() {
            return Err(unused("modulus"));
        }
        let name_actions = matches!(
            action,
            RelabelAction::LabelMap | RelabelAction::LabelDrop | RelabelAction::LabelKeep
        );
        if name_actions && !spec.source_labels.is_empty() {
            return Err(unused("source_labels"));
        }
        if matches!(action, RelabelAction::LabelDrop | RelabelAction::LabelKeep)
            && !target_label.is_empty()
        {
            return Err(unused("target_label"));
        }
        Ok(RelabelRule {
            action,
            source_labels: spec.source_labels,
            separator: spec.separator.unwrap_or_else(|| ";".to_owned()),
            regex_text,
            regex,
            target_label,
            replacement: spec.replacement.unwrap_or_else(|| "$1".to_owned()),
            modulus,
        })
    }

    /// The rule's action.
    pub fn action(&self) -> RelabelAction {
        self.action
    }

    /// Applies the rule; false when it drops the process.
    pub fn apply(&self, labels: &mut Labels) -> bool {
        let value = self
            .source_labels
            .iter()
            .map(|name| labels.get(name).map_or("", String::as_str))
            .collect::<Vec<_>>()
            .join(&self.separator);
        match self.action {
            RelabelAction::Drop => return !self.regex.is_match(&value),
            RelabelAction::Keep => return self.regex.is_match(&value),
            RelabelAction::DropEqual => {
                return labels.get(&self.target_label).map(String::as_str) != Some(&value);
            }
            RelabelAction::KeepEqual => {
                return labels.get(&self.target_label).map(String::as_str) == Some(&value);
            }
            RelabelAction::Replace => {
                let Some(captures) = self.regex.captures(&value) else {
                    return true;
                };
                let mut target = String::new();
                captures.expand(&self.target_label, &mut target);
                if !is_label_name(&target) {
                    return true;
                }
                let mut result = String::new();
                captures.expand(&self.replacement, &mut result);
                if result.is_empty() {
                    labels.remove(&target);
                } else {
                    labels.insert(target, result);
                }
            }
            RelabelAction::Lowercase => {
                labels.insert(self.target_label.clone(), value.to_lowercase());
            }
            RelabelAction::Uppercase => {
                labels.insert(self.target_label.clone(), value.to_uppercase());
            }
            RelabelAction::HashMod => {
                let hash = hash_of(&value) % self.modulus;
                labels.insert(self.target_label.clone(), hash.to_string());
            }
            RelabelAction::LabelMap => {
                let mapped: Vec<(String, String)> = labels
                    .iter()
                    .filter_map(|(name, value)| {
                        let captures = self.regex.captures(name)?;
                        let mut new_name = String::new();
                        captures.expand(&self.replacement, &mut new_name);
                        Some((new_name, value.clone()))
                    })
                    .collect();
                for (name, value) in mapped {
                    if is_label_name(&name) {
                        labels.insert(name, value);
                    }
                }
            }
            RelabelAction::LabelDrop => labels.retain(|name, _| !self.regex.is_match(name)),
            RelabelAction::LabelKeep => labels.retain(|name, _| self.regex.is_match(name)),
        }
        true
    }
}

/// Prometheus's `hashmod` hash: the last 8 bytes of the value's MD5, big
/// endian (Go's shifts past 63 bits drop the first 8), so that a rule
/// shards processes the way the same rule shards Prometheus targets.
fn hash_of(value: &str) -> u64 {
    use md5::Digest;
    let digest = md5::Md5::digest(value.as_bytes());
    let mut tail = [0u8; 8];
    tail.copy_from_slice(&digest[8..16]);
    u64::from_be_bytes(tail)
}

/// The rules of `relabel_configs`, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelabelRules(Vec<RelabelRule>);

impl RelabelRules {
    /// Checks every rule; the error names the rule's 1-based position.
    pub fn new(specs: Vec<RuleSpec>) -> Result<Self, (usize, RelabelError)> {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, spec)| RelabelRule::new(spec).map_err(|e| (i + 1, e)))
            .collect::<Result<Vec<_>, _>>()
            .map(RelabelRules)
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[RelabelRule] {
        &self.0
    }

    /// Whether there are no rules.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether some rule can remove a process from profiling.
    pub fn filters(&self) -> bool {
        self.0.iter().any(|r| r.action.filters())
    }

    /// Whether some rule reads a label of the thread or CPU a sample was
    /// taken on ([`THREAD_LABELS`]): by name in `source_labels`, or through
    /// a `labelmap`, `labeldrop` or `labelkeep` regex matching one. Such
    /// rules are applied per thread and CPU rather than per process.
    pub fn reads_thread_labels(&self) -> bool {
        self.0.iter().any(|rule| {
            let by_name = match rule.action {
                RelabelAction::LabelMap | RelabelAction::LabelDrop | RelabelAction::LabelKeep => {
                    THREAD_LABELS.iter().any(|name| rule.regex.is_match(name))
                }
                _ => false,
            };
            by_name
                || rule
                    .source_labels
                    .iter()
                    .any(|source| THREAD_LABELS.contains(&source.as_str()))
        })
    }

    /// Applies every rule in order, then removes the labels starting with
    /// `__` (the `__meta_*` inputs and scratch labels), as Prometheus does
    /// after target relabeling. `None` when a rule drops the process.
    pub fn apply(&self, mut labels: Labels) -> Option<Labels> {
        for rule in &self.0 {
            if !rule.apply(&mut labels) {
                return None;
            }
        }
        labels.retain(|name, _| !name.starts_with("__"));
        Some(labels)
    }
}

/// The labels of the thread and CPU a sample was taken on, as Parca Agent
/// names them.
pub const THREAD_LABELS: [&str; 3] = ["__meta_thread_comm", "__meta_thread_id", "__meta_cpuid"];

/// A Prometheus label name: `[a-zA-Z_][a-zA-Z0-9_]*`.
pub fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A label name that may contain `$1` / `${name}` references.
fn is_label_template(name: &str) -> bool {
    let plain: String = name
        .chars()
        .map(|c| if matches!(c, '$' | '{' | '}') { '_' } else { c })
        .collect();
    is_label_name(&plain)
}

#[cfg(test)]
mod tests;
