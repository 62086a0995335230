// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end test of `--target`: only the processes a target selects are
//! profiled, the others are skipped in BPF, and a process whose pod is not
//! known yet joins once the pod's labels arrive from the API server.
//!
//!     sudo -E cargo test --release --test integration -- targets:: --test-threads=1 --nocapture

use crate::support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, UNIX_EPOCH};

use support::kube::{
    Cgroups, FakeApiServer, cgroup2_root, containerd_pod_cgroup, pod_json, pod_list, spawn_in,
};
use support::native::{C_FLAGS, compile_native_c, temp_dir};
use support::pprof;
use support::run::SystemWideRun;
use support::summary::{DecodedSample, total};
use support::{prerequisite, require_root, serial};

const HZ: u32 = 199;
/// When the fake API server announces the pod, after its watch started.
const POD_ARRIVES: Duration = Duration::from_secs(3);

/// Three copies of one busy program: `keepme` (selected by its name),
/// `other` (selected by nothing) and `podapp` in a containerd pod's cgroup
/// (selected by a pod label the API server only announces after
/// [`POD_ARRIVES`]). `keepme` is profiled throughout; `other` never reaches
/// an output and its samples are filtered out in BPF; `podapp` is profiled
/// from when its pod's labels arrive, and every one of its samples carries
/// the pod's name. `keepme`'s resource names its GNU build ID as `readelf`
/// reads it.
#[test]
fn targets_choose_what_is_profiled_and_pods_join_when_their_labels_arrive() {
    const TEST: &str = "targets_choose_what_is_profiled_and_pods_join_when_their_labels_arrive";
    const CONTAINER: &str = "5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d";
    const POD: &str = "0a4b6f8d-5e7c-4f9a-b1c2-d3e4f5a6b7c8";
    if !require_root(TEST) {
        return;
    }
    let Some(root) = cgroup2_root() else {
        prerequisite(TEST, false, "no cgroup v2 hierarchy mounted");
        return;
    };
    let _serial = serial();
    let cgroup = containerd_pod_cgroup(POD, CONTAINER);
    let _made = Cgroups::make(&root, [cgroup.as_str()]);
    let pod = pod_json(
        POD,
        "checkout-7f9",
        "shop",
        r#"{"app":"checkout"}"#,
        CONTAINER,
    );
    let api = FakeApiServer::with_events(
        pod_list(&[]),
        vec![(POD_ARRIVES, format!(r#"{{"type":"ADDED","object":{pod}}}"#))],
    );

    let tmp = temp_dir();
    let keep = compile_native_c(C_FLAGS, tmp.path(), "keepme");
    let other = tmp.path().join("other");
    let podapp = tmp.path().join("podapp");
    std::fs::copy(&keep, &other).unwrap();
    std::fs::copy(&keep, &podapp).unwrap();
    let args: Vec<String> = [
        "--kubernetes-api",
        &format!("http://127.0.0.1:{}", api.port),
        "--node-name",
        "test-node",
        "--target",
        "executable=keepme",
        "--target",
        "kubernetes_pod_label=app=check*",
    ]
    .map(str::to_owned)
    .to_vec();
    let mut run = SystemWideRun::spawn(tmp, HZ, &args);
    let mut children: Vec<Child> = vec![
        spawn(&keep),
        spawn(&other),
        spawn_in(&root.join(&cgroup), &podapp),
    ];
    let (metrics, pids) = profile_for(
        &mut run,
        POD_ARRIVES + Duration::from_secs(5),
        &mut children,
    );
    let logs = run.icecore.output();
    let otlp = run.otlp_of(pids[0]).samples;
    let pprof_samples = pprof::all_samples(&pprof::decode_dir(&run.pprof_dir));
    let arrived = api
        .events_sent
        .lock()
        .unwrap()
        .first()
        .copied()
        .expect("the pod was announced")
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;

    let of = |samples: &[DecodedSample], pid: u32| -> Vec<DecodedSample> {
        samples
            .iter()
            .filter(|s| s.pid == Some(i64::from(pid)))
            .cloned()
            .collect()
    };
    let build_id = gnu_build_id(&keep);
    let filtered = metrics.bpf_event("filtered_out");
    for (sink, samples) in [("OTLP", &otlp), ("pprof", &pprof_samples)] {
        let (kept, others, in_pod) = (
            of(samples, pids[0]),
            of(samples, pids[1]),
            of(samples, pids[2]),
        );
        let in_pod: Vec<DecodedSample> = in_pod
            .into_iter()
            .filter(|s| s.comm.as_deref() == Some("podapp"))
            .collect();
        let first_in_pod = in_pod.iter().flat_map(|s| &s.timestamps).min().copied();
        println!(
            "{TEST}: {sink}: keepme {}, other {}, podapp {} samples (first {} ms after the pod \
             was announced); BPF filtered out {filtered}",
            total(&kept),
            total(&others),
            total(&in_pod),
            first_in_pod.map_or(0, |t| (t as i64 - arrived as i64) / 1_000_000),
        );
        assert!(
            total(&kept) > 0,
            "{TEST}: {sink}: keepme not profiled\n{logs}"
        );
        if sink == "OTLP" {
            for s in &kept {
                assert_eq!(
                    s.labels.get("process.executable.build_id.gnu"),
                    Some(&build_id),
                    "{TEST}: keepme's resource: {:?}",
                    s.labels
                );
            }
        }
        assert_eq!(total(&others), 0, "{TEST}: {sink}: other was profiled");
        assert!(
            total(&in_pod) > 0,
            "{TEST}: {sink}: podapp not profiled after its pod arrived\n{logs}"
        );
        let pod_name = if sink == "OTLP" {
            "k8s.pod.name"
        } else {
            "pod"
        };
        for s in &in_pod {
            assert_eq!(
                s.labels.get(pod_name).map(String::as_str),
                Some("checkout-7f9"),
                "{TEST}: {sink}: a podapp sample without its pod's name: {:?}",
                s.labels
            );
        }
        // Profiled only once its labels were known (timestamps are taken in
        // BPF; 50 ms covers the clocks' conversion).
        if let Some(first) = first_in_pod {
            assert!(
                first + 50_000_000 >= arrived,
                "{TEST}: {sink}: podapp sampled {} ms before its pod was announced",
                (arrived - first) / 1_000_000
            );
        }
    }
    // `other` burns a CPU for the whole run: its samples stop in BPF.
    assert!(
        filtered > u64::from(HZ),
        "{TEST}: BPF filtered out {filtered} samples; `other` alone should be over {HZ}"
    );
}

/// The GNU build ID of `exe` as binutils' `readelf -n` prints it.
fn gnu_build_id(exe: &std::path::Path) -> String {
    let out = Command::new("readelf").arg("-n").arg(exe).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("readelf -n {} shows no build ID", exe.display()))
}

/// Relabeling by thread and CPU, as Parca Agent's `__meta_thread_comm` and
/// `__meta_cpuid`: a rule dropping one program's thread by its name drops
/// its samples (counted; such rules never exclude a process in BPF), and a
/// rule copying the CPU into a label gives each sample of the other the CPU
/// it ran on, which the sample's own CPU attribute and label confirm.
#[test]
fn relabeling_by_thread_and_cpu_labels_each_sample() {
    const TEST: &str = "relabeling_by_thread_and_cpu_labels_each_sample";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir();
    let keep = compile_native_c(C_FLAGS, tmp.path(), "threadkeep");
    let drop_exe = tmp.path().join("threaddrop");
    std::fs::copy(&keep, &drop_exe).unwrap();
    let config = tmp.path().join("icecore.yaml");
    std::fs::write(
        &config,
        "relabel_configs:\n\
         - source_labels: [__meta_thread_comm]\n\
         \x20 regex: threaddrop\n\
         \x20 action: drop\n\
         - source_labels: [__meta_cpuid]\n\
         \x20 target_label: core\n\
         - source_labels: [__meta_process_executable_name]\n\
         \x20 target_label: program\n",
    )
    .unwrap();
    let args = ["--config".to_owned(), config.display().to_string()];
    let mut run = SystemWideRun::spawn(tmp, HZ, &args);
    let mut children = [spawn(&keep), spawn(&drop_exe)];
    let (metrics, pids) = profile_for(&mut run, Duration::from_secs(5), &mut children);
    let otlp = run.otlp_of(pids[0]).samples;
    let pprof_samples = pprof::all_samples(&pprof::decode_dir(&run.pprof_dir));
    let dropped = metrics.value("icecore_samples_relabel_dropped_total");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as i64;
    for (sink, samples) in [("OTLP", &otlp), ("pprof", &pprof_samples)] {
        let of = |pid: u32| -> Vec<&DecodedSample> {
            samples
                .iter()
                .filter(|s| s.pid == Some(i64::from(pid)))
                .collect()
        };
        let (kept, gone) = (of(pids[0]), of(pids[1]));
        let on_cpu: std::collections::BTreeMap<i64, u64> =
            kept.iter().fold(Default::default(), |mut m, s| {
                *m.entry(s.cpu.unwrap_or(-1)).or_default() += s.count;
                m
            });
        println!(
            "{TEST}: {sink}: threadkeep {} samples by CPU {on_cpu:?}, threaddrop {}; \
             relabeling dropped {dropped}",
            kept.iter().map(|s| s.count).sum::<u64>(),
            gone.iter().map(|s| s.count).sum::<u64>(),
        );
        assert!(!kept.is_empty(), "{TEST}: {sink}: threadkeep not profiled");
        assert!(
            gone.is_empty(),
            "{TEST}: {sink}: threaddrop's thread was not dropped"
        );
        for s in &kept {
            let cpu = s
                .cpu
                .unwrap_or_else(|| panic!("{TEST}: {sink}: a sample without CPU"));
            assert!((0..cpus).contains(&cpu), "{TEST}: {sink}: CPU {cpu}");
            let core = if sink == "OTLP" {
                s.sample_labels.get("core")
            } else {
                s.labels.get("core")
            };
            assert_eq!(
                core,
                Some(&cpu.to_string()),
                "{TEST}: {sink}: label core is not the sample's CPU"
            );
            assert_eq!(
                s.labels.get("program").map(String::as_str),
                Some("threadkeep"),
                "{TEST}: {sink}: process label lost: {:?}",
                s.labels
            );
        }
    }
    // threaddrop burns a CPU for the whole run.
    assert!(
        dropped > f64::from(HZ),
        "{TEST}: relabeling dropped {dropped} samples, expected threaddrop's"
    );
}

/// `exe cycle 300`, a busy program.
fn spawn(exe: &std::path::Path) -> Child {
    Command::new(exe)
        .args(["cycle", "300"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the fixture")
}

/// Lets `run` profile `children` for `how_long`, then stops icecore and
/// them; the metrics after the last batch, and the children's pids.
fn profile_for(
    run: &mut SystemWideRun,
    how_long: Duration,
    children: &mut [Child],
) -> (support::metrics::Metrics, Vec<u32>) {
    std::thread::sleep(how_long);
    let metrics = run
        .icecore
        .metrics_after_next_batch(Duration::from_secs(30));
    run.icecore.stop();
    let pids = children.iter().map(Child::id).collect();
    for child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
    (metrics, pids)
}
