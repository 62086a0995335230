//! The pods of this node, as the Kubernetes API describes them: what a
//! process's pod UID and container ID name, kept in an index the sampling
//! path reads without waiting (the API is watched elsewhere).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use serde::Deserialize;

/// What icecore keeps of a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodMeta {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `spec.nodeName`.
    pub node: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// Container ID (the hex ID, runtime prefix removed) → container name,
    /// from the init, regular and ephemeral containers' statuses.
    pub containers: HashMap<String, String>,
}

/// The pods known, by UID, and how often the set changed.
#[derive(Debug, Default)]
pub struct PodIndex {
    pods: HashMap<String, Arc<PodMeta>>,
    generation: u64,
}

/// Most pods kept: a node runs at most a few hundred; a hostile or broken
/// API answer must not grow memory without bound.
pub const MAX_PODS: usize = 4096;

impl PodIndex {
    /// The pod with `uid`.
    pub fn get(&self, uid: &str) -> Option<Arc<PodMeta>> {
        self.pods.get(uid).cloned()
    }

    /// Changes each time a pod is added, changed or removed.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Pods known.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether no pod is known.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Replaces every pod (a list).
    pub fn replace(&mut self, pods: Vec<PodMeta>) {
        self.pods = pods
            .into_iter()
            .take(MAX_PODS)
            .map(|p| (p.uid.clone(), Arc::new(p)))
            .collect();
        self.generation += 1;
    }

    /// Adds or updates one pod (a watch event).
    pub fn upsert(&mut self, pod: PodMeta) {
        if self.pods.len() >= MAX_PODS && !self.pods.contains_key(&pod.uid) {
            return;
        }
        if self.pods.get(&pod.uid).is_some_and(|p| **p == pod) {
            return;
        }
        self.pods.insert(pod.uid.clone(), Arc::new(pod));
        self.generation += 1;
    }

    /// Removes one pod (a watch event).
    pub fn remove(&mut self, uid: &str) {
        if self.pods.remove(uid).is_some() {
            self.generation += 1;
        }
    }
}

/// The index shared between the watcher and the profiler.
pub type SharedPods = Arc<RwLock<PodIndex>>;

/// `v1.PodList`, the part icecore reads.
#[derive(Debug, Deserialize)]
pub struct PodList {
    /// The list's version, to watch from.
    pub metadata: ListMeta,
    /// The pods.
    #[serde(default)]
    pub items: Vec<Pod>,
}

/// `v1.ListMeta`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    /// Where a watch continues from.
    #[serde(default)]
    pub resource_version: String,
}

/// `v1.Pod`, the part icecore reads.
#[derive(Debug, Default, Deserialize)]
pub struct Pod {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: PodSpec,
    #[serde(default)]
    status: PodStatus,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectMeta {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    resource_version: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSpec {
    #[serde(default)]
    node_name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodStatus {
    #[serde(default)]
    container_statuses: Vec<ContainerStatus>,
    #[serde(default)]
    init_container_statuses: Vec<ContainerStatus>,
    #[serde(default)]
    ephemeral_container_statuses: Vec<ContainerStatus>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerStatus {
    #[serde(default)]
    name: String,
    /// `containerd://<id>`, `cri-o://<id>`, `docker://<id>`.
    #[serde(default, rename = "containerID")]
    container_id: String,
}

/// One line of a watch stream.
#[derive(Debug, Deserialize)]
pub struct WatchEvent {
    /// `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK` or `ERROR`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The pod (or, for `ERROR`, a `Status`).
    pub object: serde_json::Value,
}

impl Pod {
    /// The pod's version (for watches that continue from it).
    pub fn resource_version(&self) -> &str {
        &self.metadata.resource_version
    }

    /// What icecore keeps of it; `None` without a UID.
    pub fn into_meta(self) -> Option<PodMeta> {
        if self.metadata.uid.is_empty() {
            return None;
        }
        let statuses = self
            .status
            .container_statuses
            .into_iter()
            .chain(self.status.init_container_statuses)
            .chain(self.status.ephemeral_container_statuses);
        let containers = statuses
            .filter_map(|c| {
                let id = c.container_id.rsplit("://").next()?.to_ascii_lowercase();
                (!id.is_empty()).then_some((id, c.name))
            })
            .collect();
        Some(PodMeta {
            uid: self.metadata.uid,
            name: self.metadata.name,
            namespace: self.metadata.namespace,
            node: self.spec.node_name,
            labels: self.metadata.labels,
            annotations: self.metadata.annotations,
            containers,
        })
    }
}

/// A label name made of what Prometheus allows (`[a-zA-Z0-9_]`), as
/// Prometheus's Kubernetes discovery writes pod labels and annotations.
pub fn sanitize_label_name(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = r#"{
      "metadata": {"uid": "7d1e3c5a-2b4f-4c6d-8e9f-0a1b2c3d4e5f", "name": "checkout-7f9", "namespace": "shop",
                   "resourceVersion": "42",
                   "labels": {"app.kubernetes.io/name": "checkout"},
                   "annotations": {"pyroscope.io/service_name": "checkout-svc"}},
      "spec": {"nodeName": "node-1"},
      "status": {"containerStatuses": [{"name": "app", "containerID": "containerd://ABCDEF"}],
                 "initContainerStatuses": [{"name": "init", "containerID": "cri-o://123"}],
                 "ephemeralContainerStatuses": [{"name": "debug", "containerID": ""}]}
    }"#;

    #[test]
    fn a_pod_keeps_names_labels_and_container_ids() {
        let pod: Pod = serde_json::from_str(POD).unwrap();
        assert_eq!(pod.resource_version(), "42");
        let meta = pod.into_meta().unwrap();
        assert_eq!(meta.name, "checkout-7f9");
        assert_eq!(meta.namespace, "shop");
        assert_eq!(meta.node, "node-1");
        assert_eq!(
            meta.containers.get("abcdef").map(String::as_str),
            Some("app")
        );
        assert_eq!(meta.containers.get("123").map(String::as_str), Some("init"));
        assert_eq!(meta.containers.len(), 2);
        assert_eq!(meta.labels["app.kubernetes.io/name"], "checkout");
    }

    #[test]
    fn index_counts_changes_and_stays_bounded() {
        let mut index = PodIndex::default();
        let pod = |uid: &str| PodMeta {
            uid: uid.into(),
            ..PodMeta::default()
        };
        index.replace(vec![pod("a"), pod("b")]);
        assert_eq!((index.len(), index.generation()), (2, 1));
        index.upsert(pod("a"));
        assert_eq!(index.generation(), 1, "an unchanged pod is no change");
        index.remove("a");
        index.remove("a");
        assert_eq!((index.len(), index.generation()), (1, 2));
        index.replace((0..MAX_PODS + 10).map(|i| pod(&i.to_string())).collect());
        assert_eq!(index.len(), MAX_PODS);
        index.upsert(pod("one-more"));
        assert_eq!(index.len(), MAX_PODS);
    }

    #[test]
    fn junk_is_refused_not_panicked_on() {
        assert!(serde_json::from_str::<Pod>("{\"metadata\": 5}").is_err());
        let empty: Pod = serde_json::from_str("{}").unwrap();
        assert!(empty.into_meta().is_none());
        assert_eq!(
            sanitize_label_name("app.kubernetes.io/name"),
            "app_kubernetes_io_name"
        );
    }
}
