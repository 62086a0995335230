//! User-space cost of a new process's identity and labels, paid once per
//! process image (never per sample): reading what `/proc` says of it
//! (`ImageSnapshot::read`: mappings, executable, cgroup, start time, parent,
//! command line; here of this benchmark's own process, which maps about 30
//! files), building its `__meta_*` labels (in a pod with five labels and
//! three annotations), and applying a five-rule
//! `relabel_configs` (keep, replace with groups, labelmap, hashmod, drop) to
//! them.
//!
//! `cargo bench -p icecore-benches --bench process_metadata`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use icecore_config::relabel::{RelabelRules, RuleSpec};
use icecore_receiver::metadata::labels::{ProcessFacts, Workload, meta_labels};
use icecore_receiver::metadata::pods::PodMeta;
use icecore_receiver::processes::ImageSnapshot;

fn rules() -> RelabelRules {
    let sources = |names: &[&str]| names.iter().map(|s| (*s).to_owned()).collect();
    let specs = vec![
        RuleSpec {
            action: Some("keep".into()),
            source_labels: sources(&["__meta_process_executable_name"]),
            regex: Some("process_metadata.*|python3.*|java".into()),
            ..RuleSpec::default()
        },
        RuleSpec {
            source_labels: sources(&["__meta_process_cmdline"]),
            regex: Some(r"(\S*/)?([^/ ]+)( .*)?".into()),
            target_label: Some("service_name".into()),
            replacement: Some("$2".into()),
            ..RuleSpec::default()
        },
        RuleSpec {
            action: Some("labelmap".into()),
            regex: Some("__meta_system_(.+)".into()),
            ..RuleSpec::default()
        },
        RuleSpec {
            action: Some("hashmod".into()),
            source_labels: sources(&["__meta_process_pid"]),
            target_label: Some("shard".into()),
            modulus: Some(8),
            ..RuleSpec::default()
        },
        RuleSpec {
            action: Some("drop".into()),
            source_labels: sources(&["__meta_container_id"]),
            regex: Some("deadbeef.*".into()),
            ..RuleSpec::default()
        },
    ];
    RelabelRules::new(specs).unwrap_or_default()
}

/// A pod with the labels and annotations a Helm-deployed service has.
fn pod() -> PodMeta {
    let mut pod = PodMeta {
        uid: "9f3a5e7c-4d6b-4e8f-a0b1-c2d3e4f5a6b7".into(),
        name: "checkout-7f9c8d6b5-x2x4q".into(),
        namespace: "shop".into(),
        node: "node-1".into(),
        ..PodMeta::default()
    };
    for (k, v) in [
        ("app.kubernetes.io/name", "checkout"),
        ("app.kubernetes.io/instance", "checkout-prod"),
        ("app.kubernetes.io/version", "1.42.0"),
        ("helm.sh/chart", "checkout-3.1.0"),
        ("pod-template-hash", "7f9c8d6b5"),
    ] {
        pod.labels.insert(k.into(), v.into());
    }
    for (k, v) in [
        ("kubectl.kubernetes.io/restartedAt", "2026-11-20T10:00:00Z"),
        ("prometheus.io/scrape", "true"),
        ("pyroscope.io/service_name", "checkout"),
    ] {
        pod.annotations.insert(k.into(), v.into());
    }
    pod.containers.insert("c0ffee".into(), "app".into());
    pod
}

fn process_metadata(c: &mut Criterion) {
    let pid = std::process::id();
    let mut group = c.benchmark_group("process_metadata");
    group.bench_function("snapshot_from_proc", |b| {
        b.iter(|| black_box(ImageSnapshot::read(black_box(pid), "bench")))
    });
    let snapshot = ImageSnapshot::read(pid, "bench");
    let pod = pod();
    group.bench_function("meta_labels_in_a_pod", |b| {
        b.iter(|| {
            black_box(meta_labels(
                black_box(&snapshot.info),
                &snapshot.facts,
                Workload {
                    pod: Some(&pod),
                    docker: None,
                },
            ))
        })
    });
    let rules = rules();
    assert_eq!(rules.rules().len(), 5, "the rules are valid");
    let in_pod = Workload {
        pod: Some(&pod),
        docker: None,
    };
    let meta = meta_labels(&snapshot.info, &snapshot.facts, in_pod);
    group.bench_function("relabel_five_rules", |b| {
        b.iter(|| black_box(rules.apply(black_box(meta.clone()))))
    });
    group.bench_function("cmdline_from_proc", |b| {
        b.iter(|| black_box(ProcessFacts::read(black_box(pid), &Default::default())))
    });
    group.finish();
}

criterion_group!(benches, process_metadata);
criterion_main!(benches);
