//! The config's `targets` and `relabel_configs` as the profiler's process
//! labeler: applied once per process image to its `__meta_*` labels, and
//! again when its container or pod metadata arrives.

use icecore_config::relabel::RelabelRules;
use icecore_config::targets::{TargetFacts, Targets};
use icecore_receiver::metadata::labels::{LabelSet, ProcessLabeler};
use icecore_receiver::metadata::pods::sanitize_label_name;

/// The configured targets, then the rules in order.
#[derive(Debug)]
pub struct Relabeler {
    targets: Targets,
    rules: RelabelRules,
    /// The rules read thread or CPU labels.
    per_thread: bool,
}

impl Relabeler {
    /// A labeler keeping what `targets` select, then applying `rules`.
    pub fn new(targets: Targets, rules: RelabelRules) -> Self {
        let per_thread = rules.reads_thread_labels();
        Relabeler {
            targets,
            rules,
            per_thread,
        }
    }
}

impl ProcessLabeler for Relabeler {
    fn label(&self, meta: LabelSet) -> Option<LabelSet> {
        if !self.targets.selects(&MetaFacts(&meta)) {
            return None;
        }
        if self.per_thread {
            // Rules reading thread labels decide per thread: without those
            // labels, a `keep` or `drop` here says nothing of the process.
            return Some(self.rules.apply(meta).unwrap_or_default());
        }
        self.rules.apply(meta)
    }

    fn may_exclude(&self) -> bool {
        self.targets.filters() || (self.rules.filters() && !self.per_thread)
    }

    fn per_thread(&self) -> bool {
        self.per_thread
    }

    fn label_thread(&self, meta: LabelSet) -> Option<LabelSet> {
        self.rules.apply(meta)
    }
}

/// A process's `__meta_*` labels read as targets read a process.
struct MetaFacts<'a>(&'a LabelSet);

impl MetaFacts<'_> {
    fn get(&self, name: &str) -> &str {
        self.0.get(name).map_or("", String::as_str)
    }
}

impl TargetFacts for MetaFacts<'_> {
    fn pid(&self) -> u32 {
        self.get("__meta_process_pid").parse().unwrap_or(0)
    }

    fn executable_path(&self) -> &str {
        self.get("__meta_process_executable_path")
    }

    fn executable_name(&self) -> &str {
        self.get("__meta_process_executable_name")
    }

    fn cgroup(&self) -> &str {
        self.get("__meta_process_cgroup")
    }

    fn container_id(&self) -> &str {
        self.get("__container_id__")
    }

    fn kubernetes_namespace(&self) -> Option<&str> {
        self.0
            .get("__meta_kubernetes_namespace")
            .map(String::as_str)
    }

    fn kubernetes_pod_label(&self, name: &str) -> Option<&str> {
        let key = format!("__meta_kubernetes_pod_label_{}", sanitize_label_name(name));
        self.0.get(&key).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use icecore_config::targets::Target;

    fn meta(pairs: &[(&str, &str)]) -> LabelSet {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn target(key: &str, value: &str) -> Target {
        let mut target = Target::default();
        target.set(key, value).expect("valid");
        target
    }

    #[test]
    fn targets_read_the_meta_labels_relabeling_reads() {
        let pod = meta(&[
            ("__meta_process_pid", "42"),
            ("__meta_process_executable_path", "/usr/bin/python3.11"),
            ("__meta_process_executable_name", "python3.11"),
            (
                "__meta_process_cgroup",
                "/kubepods.slice/pod.slice/cri-containerd-ab.scope",
            ),
            ("__container_id__", "0123456789abcdef0123"),
            ("__meta_kubernetes_namespace", "shop"),
            (
                "__meta_kubernetes_pod_label_app_kubernetes_io_name",
                "checkout",
            ),
        ]);
        let host = meta(&[
            ("__meta_process_pid", "7"),
            ("__meta_process_executable_path", "/usr/sbin/nginx"),
            ("__meta_process_executable_name", "nginx"),
            ("__meta_process_cgroup", "/system.slice/nginx.service"),
        ]);
        let selects = |t: Target, m: &LabelSet| {
            Relabeler::new(
                Targets::new(vec![t]).expect("valid"),
                RelabelRules::default(),
            )
            .label(m.clone())
            .is_some()
        };
        for (key, value) in [
            ("pid", "42"),
            ("executable", "/usr/bin/python3*"),
            ("executable", "python3*"),
            ("cgroup", "/kubepods.slice/**"),
            ("container_id", "0123456789ab"),
            ("kubernetes_namespace", "shop"),
            ("kubernetes_pod_label", "app.kubernetes.io/name=check*"),
        ] {
            assert!(
                selects(target(key, value), &pod),
                "{key}={value} selects the pod's process"
            );
            assert!(
                !selects(target(key, value), &host),
                "{key}={value} leaves nginx out"
            );
        }
        assert!(selects(target("cgroup", "/system.slice/*.service"), &host));
    }

    #[test]
    fn without_targets_rules_alone_decide() {
        let labeler = Relabeler::new(Targets::default(), RelabelRules::default());
        assert!(!labeler.may_exclude());
        assert!(
            labeler
                .label(meta(&[("__meta_process_pid", "1")]))
                .is_some()
        );
        let filtering = Relabeler::new(
            Targets::new(vec![target("pid", "1")]).expect("valid"),
            RelabelRules::default(),
        );
        assert!(filtering.may_exclude());
    }
}
