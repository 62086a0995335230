//! A process's `__meta_*` labels, as relabeling reads them, and the hook
//! through which the agent decides, once per process image, the labels a
//! process is profiled with or that it is not profiled at all.
//!
//! The names follow Parca Agent's where icecore knows the same fact
//! (`__meta_process_pid`, `__meta_process_executable_name`,
//! `__meta_system_kernel_release`...), and Alloy's `__container_id__`.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use icecore_otlp::model::{K8sNames, ProcessInfo};

use super::docker::DockerContainer;
use super::pods::{PodMeta, sanitize_label_name};

/// Label name → value.
pub type LabelSet = BTreeMap<String, String>;

/// Decides a process's labels from its `__meta_*` labels.
pub trait ProcessLabeler: Send + Sync + std::fmt::Debug {
    /// The labels to profile the process with (names starting with `__`
    /// are not exported), or `None` when it is not to be profiled.
    fn label(&self, meta: LabelSet) -> Option<LabelSet>;
    /// Whether [`Self::label`] may return `None`: then BPF is asked to skip
    /// the processes it excludes.
    fn may_exclude(&self) -> bool;
    /// Whether labels also depend on the thread and CPU of a sample
    /// (`__meta_thread_comm`, `__meta_thread_id`, `__meta_cpuid`): then
    /// [`Self::label_thread`] is asked for each thread and CPU of a batch.
    fn per_thread(&self) -> bool {
        false
    }
    /// The labels of samples taken on one thread and CPU, from the process's
    /// `__meta_*` labels and [`THREAD_LABELS`]; `None` drops those samples.
    fn label_thread(&self, meta: LabelSet) -> Option<LabelSet> {
        Some(meta)
    }
}

/// The labels of a sample's thread and CPU, as Parca Agent names them.
pub const THREAD_LABELS: [&str; 3] = ["__meta_thread_comm", "__meta_thread_id", "__meta_cpuid"];

/// `meta` with the thread and CPU labels of a sample added.
pub fn with_thread_labels(mut meta: LabelSet, comm: &str, tid: u32, cpu: u32) -> LabelSet {
    let [comm_label, tid_label, cpu_label] = THREAD_LABELS;
    meta.insert(comm_label.to_owned(), comm.to_owned());
    meta.insert(tid_label.to_owned(), tid.to_string());
    meta.insert(cpu_label.to_owned(), cpu.to_string());
    meta
}

/// What is known of a process beyond [`ProcessInfo`], for its labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessFacts {
    /// `/proc/PID/cmdline`, arguments joined by spaces, at most
    /// [`MAX_CMDLINE_BYTES`].
    pub cmdline: String,
    /// The cgroup v2 path (or the first v1 path) of the process.
    pub cgroup_path: String,
    /// The systemd unit of a host service.
    pub systemd_unit: String,
}

/// Longest command line kept; longer ones are cut at a character boundary.
pub const MAX_CMDLINE_BYTES: usize = 4096;

impl ProcessFacts {
    /// Reads what `/proc` tells of `pid`; empty fields where it cannot.
    pub fn read(pid: u32, cgroup: &super::cgroup::CgroupIdentity) -> Self {
        ProcessFacts {
            cmdline: read_cmdline(pid),
            cgroup_path: cgroup.path.clone().unwrap_or_default(),
            systemd_unit: cgroup.systemd_unit.clone().unwrap_or_default(),
        }
    }
}

fn read_cmdline(pid: u32) -> String {
    use std::io::Read;
    let Ok(file) = std::fs::File::open(format!("/proc/{pid}/cmdline")) else {
        return String::new();
    };
    let mut bytes = Vec::with_capacity(256);
    if file
        .take(MAX_CMDLINE_BYTES as u64)
        .read_to_end(&mut bytes)
        .is_err()
    {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    text.trim_end_matches('\0').replace('\0', " ")
}

/// What runs a process, as far as icecore learned it: its Kubernetes pod
/// (by `k8s_pod_uid`) and its Docker container (by `container_id`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Workload<'a> {
    /// The pod, from the Kubernetes API.
    pub pod: Option<&'a PodMeta>,
    /// The container, from the Docker Engine.
    pub docker: Option<&'a DockerContainer>,
}

/// Fills the process's Kubernetes and container names from `workload`, and
/// its default `service.name` as Grafana Alloy infers it: the pod's
/// `pyroscope.io/service_name` annotation, else `NAMESPACE/CONTAINER`, else
/// the Docker container's name, else the executable's name.
pub fn apply_workload(info: &mut ProcessInfo, workload: Workload<'_>) {
    info.container_name = workload
        .docker
        .map_or_else(Arc::default, |c| Arc::from(c.name.as_str()));
    let Some(pod) = workload.pod else {
        info.k8s = Arc::default();
        info.service_name = if info.container_name.is_empty() {
            info.executable_name.clone()
        } else {
            info.container_name.clone()
        };
        return;
    };
    let container = pod
        .containers
        .get(&*info.container_id)
        .cloned()
        .unwrap_or_default();
    info.service_name = match pod.annotations.get(SERVICE_NAME_ANNOTATION) {
        Some(name) if !name.is_empty() => Arc::from(name.as_str()),
        _ if !container.is_empty() => Arc::from(format!("{}/{container}", pod.namespace)),
        _ if !info.container_name.is_empty() => info.container_name.clone(),
        _ => info.executable_name.clone(),
    };
    info.k8s = Arc::new(K8sNames {
        pod: Arc::from(pod.name.as_str()),
        namespace: Arc::from(pod.namespace.as_str()),
        container: Arc::from(container),
        node: Arc::from(pod.node.as_str()),
    });
}

/// The pod annotation naming a service, as Alloy and Pyroscope read it.
pub const SERVICE_NAME_ANNOTATION: &str = "pyroscope.io/service_name";

/// The `__meta_*` labels of a process (with its pod's and container's,
/// when known).
pub fn meta_labels(info: &ProcessInfo, facts: &ProcessFacts, workload: Workload<'_>) -> LabelSet {
    let mut labels = LabelSet::new();
    let mut set = |name: &str, value: &str| {
        if !value.is_empty() {
            labels.insert(name.to_owned(), value.to_owned());
        }
    };
    set("__meta_process_pid", &info.pid.to_string());
    if info.parent_pid != 0 {
        set("__meta_process_ppid", &info.parent_pid.to_string());
    }
    set("__meta_process_executable_name", &info.executable_name);
    set("__meta_process_executable_path", &info.executable_path);
    let build_id = if info.build_ids.gnu.is_empty() {
        &info.build_ids.go
    } else {
        &info.build_ids.gnu
    };
    set("__meta_process_executable_build_id", build_id);
    set("__meta_process_cmdline", &facts.cmdline);
    set("__meta_process_cgroup", &facts.cgroup_path);
    set("__meta_systemd_unit", &facts.systemd_unit);
    set("__meta_container_id", &info.container_id);
    set("__container_id__", &info.container_id);
    set("__meta_kubernetes_pod_uid", &info.k8s_pod_uid);
    if let Some(docker) = workload.docker {
        set("__meta_docker_container_id", &info.container_id);
        set("__meta_docker_container_name", &docker.name);
        set("__meta_docker_container_image", &docker.image);
        for (name, value) in &docker.labels {
            let name = sanitize_label_name(name);
            set(&format!("__meta_docker_container_label_{name}"), value);
        }
    }
    if let Some(pod) = workload.pod {
        set("__meta_kubernetes_namespace", &pod.namespace);
        set("__meta_kubernetes_pod_name", &pod.name);
        set("__meta_kubernetes_pod_node_name", &pod.node);
        set("__meta_kubernetes_pod_container_name", &info.k8s.container);
        set("__meta_kubernetes_pod_container_id", &info.container_id);
        for (name, value) in &pod.labels {
            let name = sanitize_label_name(name);
            set(&format!("__meta_kubernetes_pod_label_{name}"), value);
            set(
                &format!("__meta_kubernetes_pod_labelpresent_{name}"),
                "true",
            );
        }
        for (name, value) in &pod.annotations {
            let name = sanitize_label_name(name);
            set(&format!("__meta_kubernetes_pod_annotation_{name}"), value);
            set(
                &format!("__meta_kubernetes_pod_annotationpresent_{name}"),
                "true",
            );
        }
    }
    let system = system();
    set("__meta_system_kernel_release", &system.kernel_release);
    set("__meta_system_kernel_machine", &system.machine);
    set("__meta_system_hostname", &system.host_name);
    labels
}

/// Applies a labeler's answer to `info`: its exported labels, and
/// `service.name` from a `service_name` label. `false` when the process is
/// not to be profiled.
pub fn apply(
    labeler: &dyn ProcessLabeler,
    info: &mut ProcessInfo,
    facts: &ProcessFacts,
    workload: Workload<'_>,
) -> bool {
    let Some(labels) = labeler.label(meta_labels(info, facts, workload)) else {
        return false;
    };
    let labels: Vec<(Arc<str>, Arc<str>)> = labels
        .into_iter()
        .filter(|(name, _)| !name.starts_with("__"))
        .map(|(name, value)| (Arc::from(name), Arc::from(value)))
        .collect();
    if let Some((_, service)) = labels.iter().find(|(n, _)| &**n == "service_name") {
        info.service_name = service.clone();
    }
    info.labels = labels.into();
    true
}

/// The host's identity, read once.
struct System {
    kernel_release: String,
    machine: String,
    host_name: String,
}

fn system() -> &'static System {
    static SYSTEM: OnceLock<System> = OnceLock::new();
    SYSTEM.get_or_init(|| {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        };
        System {
            kernel_release: read("/proc/sys/kernel/osrelease"),
            machine: std::env::consts::ARCH.to_owned(),
            host_name: crate::host::host_name(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct KeepNamed(&'static str);

    impl ProcessLabeler for KeepNamed {
        fn label(&self, meta: LabelSet) -> Option<LabelSet> {
            let name = meta.get("__meta_process_executable_name")?;
            (name == self.0).then(|| {
                let mut out = LabelSet::new();
                out.insert("service_name".into(), format!("svc-{name}"));
                out.insert("pid_seen".into(), meta["__meta_process_pid"].clone());
                out.insert("__scratch".into(), "x".into());
                out
            })
        }

        fn may_exclude(&self) -> bool {
            true
        }
    }

    fn info(name: &str) -> ProcessInfo {
        ProcessInfo {
            pid: 42,
            executable_name: name.into(),
            executable_path: format!("/usr/bin/{name}").into(),
            service_name: name.into(),
            parent_pid: 1,
            ..ProcessInfo::default()
        }
    }

    #[test]
    fn meta_labels_name_what_is_known_and_skip_what_is_not() {
        let facts = ProcessFacts {
            cmdline: "app --flag".into(),
            cgroup_path: "/system.slice/app.service".into(),
            systemd_unit: "app.service".into(),
        };
        let meta = meta_labels(&info("app"), &facts, Workload::default());
        assert_eq!(meta["__meta_process_pid"], "42");
        assert_eq!(meta["__meta_process_ppid"], "1");
        assert_eq!(meta["__meta_process_executable_path"], "/usr/bin/app");
        assert_eq!(meta["__meta_process_cmdline"], "app --flag");
        assert_eq!(meta["__meta_systemd_unit"], "app.service");
        assert!(!meta.contains_key("__meta_container_id"));
        assert_eq!(meta["__meta_system_kernel_machine"], std::env::consts::ARCH);
    }

    #[test]
    fn apply_sets_labels_and_service_name_or_excludes() {
        let labeler = KeepNamed("app");
        let mut kept = info("app");
        assert!(apply(
            &labeler,
            &mut kept,
            &ProcessFacts::default(),
            Workload::default()
        ));
        assert_eq!(&*kept.service_name, "svc-app");
        let names: Vec<&str> = kept.labels.iter().map(|(n, _)| &**n).collect();
        assert_eq!(names, ["pid_seen", "service_name"]);
        let mut dropped = info("other");
        assert!(!apply(
            &labeler,
            &mut dropped,
            &ProcessFacts::default(),
            Workload::default()
        ));
    }

    #[test]
    fn pods_name_the_process_and_its_service_as_alloy_does() {
        let mut pod = PodMeta {
            uid: "u".into(),
            name: "checkout-1".into(),
            namespace: "shop".into(),
            node: "node-1".into(),
            ..PodMeta::default()
        };
        pod.containers.insert("c0ffee".into(), "app".into());
        pod.labels
            .insert("app.kubernetes.io/name".into(), "checkout".into());
        let mut process = info("java");
        process.container_id = "c0ffee".into();
        let in_pod = |pod| Workload {
            pod: Some(pod),
            docker: None,
        };
        apply_workload(&mut process, in_pod(&pod));
        assert_eq!(&*process.service_name, "shop/app");
        assert_eq!(&*process.k8s.container, "app");
        let meta = meta_labels(&process, &ProcessFacts::default(), in_pod(&pod));
        assert_eq!(
            meta["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
            "checkout"
        );
        assert_eq!(meta["__meta_kubernetes_pod_container_name"], "app");
        let mut annotated = pod.clone();
        annotated
            .annotations
            .insert(SERVICE_NAME_ANNOTATION.into(), "checkout-svc".into());
        apply_workload(&mut process, in_pod(&annotated));
        assert_eq!(&*process.service_name, "checkout-svc");
        apply_workload(&mut process, Workload::default());
        assert_eq!(&*process.service_name, "java");
        assert!(process.k8s.pod.is_empty());
        // Docker: the container's name, when no pod names the service.
        let web = DockerContainer {
            name: "web-1".into(),
            ..DockerContainer::default()
        };
        let in_docker = Workload {
            pod: None,
            docker: Some(&web),
        };
        apply_workload(&mut process, in_docker);
        assert_eq!(&*process.service_name, "web-1");
        assert_eq!(&*process.container_name, "web-1");
        let meta = meta_labels(&process, &ProcessFacts::default(), in_docker);
        assert_eq!(meta["__meta_docker_container_name"], "web-1");
    }

    #[test]
    fn cmdline_of_this_process_is_read_with_spaces() {
        let line = read_cmdline(std::process::id());
        assert!(!line.is_empty() && !line.contains('\0'), "{line:?}");
    }
}
