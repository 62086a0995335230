//! The settings that are lists of structured items: `relabel_configs` and
//! `targets`. An error names the item by its position (from 1).

use serde_norway::Value;

use super::{Reader, scalar_text};
use crate::ConfigError;
use crate::relabel::{RelabelRules, RuleSpec};
use crate::targets::{TARGET_KEYS, Target, TargetError, Targets};
use crate::validate::Invalid;

const EXPECTED_RELABEL_CONFIGS: &str = "a list of Prometheus relabel rules";
const EXPECTED_RELABEL_RULE: &str = "a Prometheus relabel rule";
const RELABEL_RULE_KEYS: &str =
    "action, source_labels, separator, regex, target_label, replacement, modulus";
const EXPECTED_TARGETS: &str = "a list of targets";
const EXPECTED_TARGET_ITEM: &str = "a target";

impl Reader<'_> {
    /// `relabel_configs`: a list of Prometheus relabel rules, each checked;
    /// an error names the rule by its position.
    pub(super) fn relabel_configs(&self) -> Result<Option<RelabelRules>, ConfigError> {
        const KEY: &str = "relabel_configs";
        let Some(value) = self.get(KEY) else {
            return Ok(None);
        };
        let Value::Sequence(items) = value else {
            return Err(self.invalid(KEY, value, &Invalid::new(EXPECTED_RELABEL_CONFIGS)));
        };
        let rule_error = |index: usize, item: &Value, detail: String| {
            self.invalid(
                KEY,
                item,
                &Invalid::because(EXPECTED_RELABEL_RULE, format!("rule {index}: {detail}")),
            )
        };
        let mut specs = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let index = i + 1;
            let Value::Mapping(fields) = item else {
                return Err(rule_error(index, item, "not a mapping".to_owned()));
            };
            let mut spec = RuleSpec::default();
            for (name, field) in fields {
                let Value::String(name) = name else {
                    return Err(rule_error(index, item, "a key is not a string".to_owned()));
                };
                let text = || {
                    scalar_text(field)
                        .ok_or_else(|| rule_error(index, item, format!("{name} is not a string")))
                };
                match name.as_str() {
                    "action" => spec.action = Some(text()?),
                    "separator" => spec.separator = Some(text()?),
                    "regex" => spec.regex = Some(text()?),
                    "target_label" => spec.target_label = Some(text()?),
                    "replacement" => spec.replacement = Some(text()?),
                    "modulus" => {
                        spec.modulus = Some(field.as_u64().ok_or_else(|| {
                            rule_error(index, item, "modulus is not a whole number".to_owned())
                        })?);
                    }
                    "source_labels" => {
                        let Value::Sequence(names) = field else {
                            return Err(rule_error(
                                index,
                                item,
                                "source_labels is not a list of label names".to_owned(),
                            ));
                        };
                        for label in names {
                            let Value::String(label) = label else {
                                return Err(rule_error(
                                    index,
                                    item,
                                    "source_labels is not a list of label names".to_owned(),
                                ));
                            };
                            spec.source_labels.push(label.clone());
                        }
                    }
                    other => {
                        return Err(rule_error(
                            index,
                            item,
                            format!("unknown key {other:?}; expected {RELABEL_RULE_KEYS}"),
                        ));
                    }
                }
            }
            specs.push(spec);
        }
        RelabelRules::new(specs)
            .map(Some)
            .map_err(|(index, e)| rule_error(index, &items[index - 1], e.to_string()))
    }

    /// `targets`: a list of mappings of target fields; an error names the
    /// target by its position.
    pub(super) fn targets(&self) -> Result<Option<Targets>, ConfigError> {
        const KEY: &str = "targets";
        let Some(value) = self.get(KEY) else {
            return Ok(None);
        };
        let Value::Sequence(items) = value else {
            return Err(self.invalid(KEY, value, &Invalid::new(EXPECTED_TARGETS)));
        };
        let target_error = |index: usize, item: &Value, detail: String| {
            self.invalid(
                KEY,
                item,
                &Invalid::because(EXPECTED_TARGET_ITEM, format!("target {index}: {detail}")),
            )
        };
        let mut targets = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let index = i + 1;
            let Value::Mapping(fields) = item else {
                return Err(target_error(
                    index,
                    item,
                    format!("not a mapping of {TARGET_KEYS}"),
                ));
            };
            let mut target = Target::default();
            for (name, field) in fields {
                let Value::String(name) = name else {
                    return Err(target_error(
                        index,
                        item,
                        "a key is not a string".to_owned(),
                    ));
                };
                let set = match (name.as_str(), field) {
                    ("kubernetes_pod_labels", Value::Mapping(labels)) => {
                        labels.iter().try_for_each(|(label, glob)| {
                            match (scalar_text(label), scalar_text(glob)) {
                                (Some(label), Some(glob)) => target.add_pod_label(&label, &glob),
                                _ => Err(TargetError::BadPodLabel(describe_pair(label, glob))),
                            }
                        })
                    }
                    ("kubernetes_pod_labels", _) => Err(TargetError::PodLabelsNotAMapping),
                    (name, field) => match scalar_text(field) {
                        Some(text) => target.set(name, &text),
                        None => Err(TargetError::NotAScalar(name.to_owned())),
                    },
                };
                set.map_err(|e| target_error(index, item, e.to_string()))?;
            }
            targets.push(target);
        }
        Targets::new(targets)
            .map(Some)
            .map_err(|(index, e)| target_error(index, &items[index - 1], e.to_string()))
    }
}

/// A pod label entry as an error shows it.
fn describe_pair(label: &Value, glob: &Value) -> String {
    format!("{}: {}", super::describe(label), super::describe(glob))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{error, parse_text};

    #[test]
    fn relabel_configs_are_read_and_bad_rules_named_by_position() {
        let settings = parse_text(
            "relabel_configs:\n\
             - source_labels: [__meta_process_executable_name]\n\
             \x20 regex: python.*\n\
             \x20 action: keep\n\
             - source_labels: [__meta_process_pid]\n\
             \x20 target_label: pid_label\n\
             - action: hashmod\n\
             \x20 source_labels: [__meta_process_pid]\n\
             \x20 target_label: shard\n\
             \x20 modulus: 4\n",
        )
        .expect("valid rules");
        let rules = settings.relabel_configs.expect("rules");
        assert_eq!(rules.rules().len(), 3);
        assert!(rules.filters());
        let bad_regex =
            error("relabel_configs:\n- target_label: a\n- target_label: b\n  regex: \"(oops\"\n");
        assert!(bad_regex.contains("relabel_configs"), "{bad_regex}");
        assert!(
            bad_regex.contains("rule 2: invalid regex \"(oops\""),
            "{bad_regex}"
        );
        let bad_action = error("relabel_configs:\n- action: rename\n  target_label: a\n");
        assert!(
            bad_action.contains("rule 1: unknown action \"rename\""),
            "{bad_action}"
        );
        let bad_key = error("relabel_configs:\n- target_label: a\n  regexp: x\n");
        assert!(
            bad_key.contains("rule 1: unknown key \"regexp\""),
            "{bad_key}"
        );
        let not_a_list = error("relabel_configs: {action: keep}\n");
        assert!(
            not_a_list.contains("a list of Prometheus relabel rules"),
            "{not_a_list}"
        );
        let bad_sources = error("relabel_configs:\n- source_labels: a\n  target_label: b\n");
        assert!(
            bad_sources.contains("rule 1: source_labels is not a list"),
            "{bad_sources}"
        );
    }

    #[test]
    fn targets_are_read_and_bad_ones_named_by_position() {
        let settings = parse_text(
            "targets:\n\
             - executable: \"python3*\"\n\
             \x20 cgroup: /system.slice/**\n\
             - pid: 42\n\
             - kubernetes_namespace: shop\n\
             \x20 kubernetes_pod_labels: {app: checkout, tier: \"web*\"}\n",
        )
        .expect("targets");
        let targets = settings.targets.expect("targets");
        let [python, pid, pod] = targets.as_slice() else {
            panic!("{targets:?}");
        };
        assert_eq!(
            python.executable.as_ref().map(|g| g.as_str()),
            Some("python3*")
        );
        assert_eq!(
            python.cgroup.as_ref().map(|g| g.as_str()),
            Some("/system.slice/**")
        );
        assert_eq!(pid.pid, Some(42));
        assert_eq!(pod.kubernetes_pod_labels.len(), 2);

        let bad_glob = error("targets:\n- pid: 1\n- executable: \"[oops\"\n");
        assert!(bad_glob.contains("target 2"), "{bad_glob}");
        assert!(bad_glob.contains("is not a glob"), "{bad_glob}");
        let unknown = error("targets:\n- comm: nginx\n");
        assert!(
            unknown.contains("target 1") && unknown.contains("unknown key \"comm\""),
            "{unknown}"
        );
        let empty = error("targets:\n- {}\n");
        assert!(empty.contains("names nothing to match"), "{empty}");
        let labels = error("targets:\n- kubernetes_pod_labels: [app]\n");
        assert!(labels.contains("not a mapping"), "{labels}");
        let list = error("targets:\n- pid: [1, 2]\n");
        assert!(list.contains("pid is not a string"), "{list}");
        assert!(error("targets: {pid: 1}\n").contains("a list of targets"));
    }

    #[test]
    fn kubelet_or_api_server_not_both() {
        let kubelet = parse_text("kubelet_url: http://node:10255\n").expect("kubelet");
        assert_eq!(
            kubelet.kubernetes_api,
            Some(crate::KubernetesApi::Kubelet("http://node:10255".into()))
        );
        let both = error("kubelet_url: http://node:10255\nkubernetes_api: off\n");
        assert!(both.contains("not both"), "{both}");
    }
}
