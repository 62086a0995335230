//! Container and pod identity from a process's cgroup path, as container
//! runtimes name their cgroups: Docker, containerd (Kubernetes' CRI plugin
//! and plain), CRI-O and Podman, with the systemd cgroup driver
//! (`docker-<id>.scope`, `kubepods-burstable-pod<uid>.slice`) and the
//! cgroupfs one (`/docker/<id>`, `/kubepods/burstable/pod<uid>/<id>`), on
//! cgroup v1 and v2. No runtime is asked anything: the path says it all.

/// What a cgroup path tells of the process's container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupIdentity {
    /// The container's full ID (64 hex digits), OTel `container.id`.
    pub container_id: Option<String>,
    /// The Kubernetes pod's UID (`k8s.pod.uid`), dashes restored where the
    /// systemd driver wrote underscores.
    pub pod_uid: Option<String>,
    /// The systemd unit of a host service (`nginx.service`), when the
    /// process is in no container.
    pub systemd_unit: Option<String>,
    /// The cgroup path the identity was read from: the v2 one, else the v1
    /// one naming a container, else the first.
    pub path: Option<String>,
}

/// Prefixes runtimes put before a container ID in a cgroup's name.
const ID_PREFIXES: [&str; 6] = [
    "docker-",
    "cri-containerd-",
    "crio-",
    "libpod-",
    "containerd-",
    "crio-conmon-",
];

/// The identity in the contents of `/proc/PID/cgroup`: the v2 line (`0::`)
/// when there is one, else the first v1 line that names a container.
pub fn identity_of(proc_cgroup: &str) -> CgroupIdentity {
    let paths: Vec<&str> = proc_cgroup
        .lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .collect();
    let unified = proc_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"));
    let mut found = unified.map(path_identity).unwrap_or_default();
    found.path = unified.or(paths.first().copied()).map(str::to_owned);
    if found.container_id.is_none() {
        // cgroup v1 (or a v2 path that names no container: a hybrid host
        // whose runtime only set up the v1 hierarchies).
        if let Some(v1) = paths
            .iter()
            .map(|p| (*p, path_identity(p)))
            .find(|(_, i)| i.container_id.is_some())
        {
            found = CgroupIdentity {
                path: Some(v1.0.to_owned()),
                ..v1.1
            };
        }
    }
    found
}

/// The identity one cgroup path names.
pub fn path_identity(path: &str) -> CgroupIdentity {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // The innermost segment naming a container: a container running
    // systemd nests `init.scope` and more below its own.
    let container_id = segments.iter().rev().find_map(|s| container_id_in(s));
    let pod_uid = segments.iter().rev().find_map(|s| pod_uid_in(s));
    let systemd_unit = if container_id.is_none() {
        segments
            .iter()
            .rev()
            .find(|s| s.ends_with(".service"))
            .map(|s| (*s).to_owned())
    } else {
        None
    };
    CgroupIdentity {
        container_id,
        pod_uid,
        systemd_unit,
        path: None,
    }
}

/// A container ID in one segment: `<64 hex>`, or a runtime's prefix before
/// it and `.scope` after it.
fn container_id_in(segment: &str) -> Option<String> {
    let name = segment.strip_suffix(".scope").unwrap_or(segment);
    let id = ID_PREFIXES
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))
        .unwrap_or(name);
    is_container_id(id).then(|| id.to_ascii_lowercase())
}

fn is_container_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A pod UID in one segment: `kubepods-<qos>-pod<uid>.slice` (systemd,
/// underscores for dashes) or `pod<uid>` (cgroupfs).
fn pod_uid_in(segment: &str) -> Option<String> {
    let name = segment.strip_suffix(".slice").unwrap_or(segment);
    let uid = match name.rfind("-pod") {
        Some(at) if name.starts_with("kubepods") => &name[at + 4..],
        _ => name.strip_prefix("pod")?,
    };
    let uid = uid.replace('_', "-");
    is_uid(&uid).then_some(uid)
}

/// `8-4-4-4-12` hex digits.
fn is_uid(uid: &str) -> bool {
    let parts: Vec<&str> = uid.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(part, len)| part.len() == len && part.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Reads `/proc/PID/cgroup`; the default identity when it cannot be read.
pub fn read_identity(pid: u32) -> CgroupIdentity {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|text| identity_of(&text))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899";
    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

    fn id() -> Option<String> {
        Some(ID.to_owned())
    }

    #[test]
    fn container_runtimes_and_drivers() {
        let uid_ = UID.replace('-', "_");
        let cases = [
            // Docker: systemd driver (v2), cgroupfs driver (v1 and v2).
            (format!("0::/system.slice/docker-{ID}.scope"), id(), None),
            (
                format!("12:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}"),
                id(),
                None,
            ),
            (format!("0::/docker/{ID}"), id(), None),
            // Kubernetes with containerd: systemd and cgroupfs drivers.
            (
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope"
                ),
                id(),
                Some(UID.to_owned()),
            ),
            (
                format!("0::/kubepods/burstable/pod{UID}/{ID}"),
                id(),
                Some(UID.to_owned()),
            ),
            (
                format!("0::/kubepods.slice/kubepods-pod{uid_}.slice/cri-containerd-{ID}.scope"),
                id(),
                Some(UID.to_owned()),
            ),
            // CRI-O.
            (
                format!(
                    "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-{ID}.scope"
                ),
                id(),
                Some(UID.to_owned()),
            ),
            (
                format!("0::/kubepods/besteffort/pod{UID}/crio-{ID}"),
                id(),
                Some(UID.to_owned()),
            ),
            // Podman, rootful and rootless.
            (format!("0::/machine.slice/libpod-{ID}.scope"), id(), None),
            (
                format!(
                    "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"
                ),
                id(),
                None,
            ),
            // containerd without Kubernetes (nerdctl, cgroupfs driver).
            (format!("0::/default/{ID}"), id(), None),
            // A container running systemd: the innermost container wins.
            (
                format!("0::/system.slice/docker-{ID}.scope/init.scope"),
                id(),
                None,
            ),
        ];
        for (text, container_id, pod_uid) in cases {
            let found = identity_of(&text);
            assert_eq!(found.container_id, container_id, "{text}");
            assert_eq!(found.pod_uid, pod_uid, "{text}");
            assert_eq!(found.systemd_unit, None, "{text}");
        }
    }

    #[test]
    fn host_processes_have_a_unit_or_nothing() {
        let nginx = identity_of("0::/system.slice/nginx.service");
        assert_eq!(nginx.container_id, None);
        assert_eq!(nginx.systemd_unit.as_deref(), Some("nginx.service"));
        let mut shell = identity_of("0::/user.slice/user-0.slice/session-3.scope");
        assert_eq!(
            shell.path.take().as_deref(),
            Some("/user.slice/user-0.slice/session-3.scope")
        );
        assert_eq!(shell, CgroupIdentity::default());
        // Hybrid hierarchy: v2 says nothing, v1 names the container.
        let hybrid = identity_of(&format!("12:cpu,cpuacct:/docker/{ID}\n0::/"));
        assert_eq!(hybrid.container_id, id());
        assert_eq!(hybrid.path, Some(format!("/docker/{ID}")));
        for junk in [
            "",
            "garbage",
            "0::",
            "::::",
            "0::/docker/xyz",
            "0::/kubepods/podnot-a-uid/abc",
        ] {
            let mut found = identity_of(junk);
            found.path = None;
            assert_eq!(found, CgroupIdentity::default(), "{junk:?}");
        }
        // A 64-character name that is not hex is no container ID.
        let not_hex = "g".repeat(64);
        assert_eq!(
            identity_of(&format!("0::/docker/{not_hex}")).container_id,
            None
        );
    }
}
