use std::collections::BTreeMap;

use super::*;

#[derive(Default)]
struct Facts {
    pid: u32,
    path: &'static str,
    cgroup: &'static str,
    container: &'static str,
    namespace: Option<&'static str>,
    labels: BTreeMap<&'static str, &'static str>,
}

impl TargetFacts for Facts {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn executable_path(&self) -> &str {
        self.path
    }
    fn executable_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or_default()
    }
    fn cgroup(&self) -> &str {
        self.cgroup
    }
    fn container_id(&self) -> &str {
        self.container
    }
    fn kubernetes_namespace(&self) -> Option<&str> {
        self.namespace
    }
    fn kubernetes_pod_label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).copied()
    }
}

fn target(fields: &[(&str, &str)]) -> Target {
    let mut target = Target::default();
    for (key, value) in fields {
        target.set(key, value).expect("valid field");
    }
    target
}

const ID: &str = "4f3c2b1a0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b";

fn python() -> Facts {
    Facts {
        pid: 42,
        path: "/usr/bin/python3.11",
        cgroup: "/kubepods.slice/kubepods-burstable.slice/cri-containerd-x.scope",
        container: ID,
        namespace: Some("shop"),
        labels: [("app", "checkout")].into(),
    }
}

#[test]
fn executable_globs_match_the_name_or_with_a_slash_the_path() {
    let p = python();
    assert!(target(&[("executable", "python3*")]).matches(&p));
    assert!(target(&[("executable", "/usr/bin/python3.*")]).matches(&p));
    assert!(target(&[("executable", "/usr/**/python3.1?")]).matches(&p));
    // `*` stays within one path component.
    assert!(!target(&[("executable", "/*/python3.11")]).matches(&p));
    assert!(!target(&[("executable", "node")]).matches(&p));
    assert!(target(&[("executable", "{node,python3.11}")]).matches(&p));
}

#[test]
fn every_field_of_a_target_must_match() {
    let p = python();
    assert!(target(&[("pid", "42"), ("executable", "python*")]).matches(&p));
    assert!(!target(&[("pid", "43"), ("executable", "python*")]).matches(&p));
    assert!(target(&[("cgroup", "/kubepods.slice/**")]).matches(&p));
    assert!(!target(&[("cgroup", "/system.slice/**")]).matches(&p));
    assert!(target(&[("container_id", &ID[..12])]).matches(&p));
    assert!(target(&[("container_id", &ID.to_ascii_uppercase())]).matches(&p));
    assert!(!target(&[("container_id", "000000000000")]).matches(&p));
    assert!(
        target(&[
            ("kubernetes_namespace", "sh*"),
            ("kubernetes_pod_label", "app=check*")
        ])
        .matches(&p)
    );
    assert!(!target(&[("kubernetes_pod_label", "tier=web")]).matches(&p));
}

#[test]
fn kubernetes_targets_do_not_match_before_the_pod_is_known() {
    let host = Facts {
        pid: 7,
        path: "/usr/sbin/nginx",
        ..Facts::default()
    };
    assert!(!target(&[("kubernetes_namespace", "*")]).matches(&host));
    assert!(!target(&[("container_id", &ID[..12])]).matches(&host));
    assert!(target(&[("kubernetes_namespace", "*")]).needs_kubernetes());
}

#[test]
fn any_target_selects_and_none_selects_all() {
    let p = python();
    assert!(Targets::default().selects(&p));
    assert!(!Targets::default().filters());
    let targets = Targets::new(vec![
        target(&[("pid", "1")]),
        target(&[("executable", "python*")]),
    ])
    .expect("valid");
    assert!(targets.filters());
    assert!(targets.selects(&p));
    let other = Targets::new(vec![target(&[("pid", "1")])]).expect("valid");
    assert!(!other.selects(&p));
}

#[test]
fn bad_targets_are_refused_with_the_reason() {
    let mut t = Target::default();
    assert_eq!(t.set("pid", "0"), Err(TargetError::BadPid("0".into())));
    assert_eq!(t.set("pid", "x"), Err(TargetError::BadPid("x".into())));
    assert!(matches!(
        t.set("executable", "[a"),
        Err(TargetError::BadGlob(..))
    ));
    assert_eq!(t.set("executable", ""), Err(TargetError::EmptyPattern));
    assert!(matches!(
        t.set("container_id", "abc"),
        Err(TargetError::BadContainerId(_))
    ));
    assert!(matches!(
        t.set("container_id", "zzzzzzzzzzzzzz"),
        Err(TargetError::BadContainerId(_))
    ));
    assert_eq!(
        t.set("comm", "x"),
        Err(TargetError::UnknownKey("comm".into()))
    );
    assert!(matches!(
        t.set("kubernetes_pod_label", "=x"),
        Err(TargetError::BadPodLabel(_))
    ));
    assert!(matches!(
        t.set("kubernetes_pod_label", "app"),
        Err(TargetError::BadPodLabel(_))
    ));
    assert_eq!(
        Targets::new(vec![target(&[("pid", "1")]), Target::default()]),
        Err((2, TargetError::Empty))
    );
    let message = TargetError::UnknownKey("comm".into()).to_string();
    assert!(message.contains("executable"), "{message}");
}
