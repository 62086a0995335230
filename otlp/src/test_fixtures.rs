//! Small hand-made batches shared by the unit tests.

use std::sync::Arc;

use crate::model::{
    Frame, FrameKind, Line, Mapping, ProcessInfo, ProcessProfile, ProfileBatch, SampleGroup, Stack,
};

/// Window start of [`batch`]: 2026-11-22T05:14:00Z.
pub(crate) const START: u64 = 1_795_324_440_000_000_000;
/// Window length of [`batch`]: 5 s.
pub(crate) const DURATION: u64 = 5_000_000_000;
/// Sampling period of [`batch`]: 19 Hz.
pub(crate) const PERIOD: i64 = 1_000_000_000 / 19;
/// Process 100's container.
pub(crate) const CONTAINER_ID: &str =
    "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899";
/// Process 100's pod.
pub(crate) const POD_UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

pub(crate) fn line(name: &str, file: Option<&str>, line: u32) -> Line {
    Line {
        function_name: name.into(),
        system_name: format!("_Z{name}").into(),
        filename: file.map(Into::into),
        line,
        column: 0,
    }
}

/// Two processes sharing libc. Process 1 has two groups with the same stack
/// and thread (to be merged), a group on another thread, and a kernel stack;
/// frames are deliberately rebuilt as distinct but equal `Arc`s in places so
/// value dedup (not just pointer dedup) is exercised.
pub(crate) fn batch() -> ProfileBatch {
    let libc = Arc::new(Mapping {
        memory_start: 0x7f00_0000_0000,
        memory_limit: 0x7f00_0020_0000,
        file_offset: 0x28000,
        filename: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
        build_id: Some("0123456789abcdef0123456789abcdef01234567".into()),
    });
    let exe = Arc::new(Mapping {
        memory_start: 0x5555_0000_0000,
        memory_limit: 0x5555_0010_0000,
        file_offset: 0,
        filename: "/usr/bin/app".into(),
        build_id: None,
    });
    let kernel = Arc::new(Mapping {
        memory_start: 0xffff_ffff_8100_0000,
        memory_limit: 0xffff_ffff_8300_0000,
        file_offset: 0,
        filename: "[kernel.kallsyms]".into(),
        build_id: None,
    });
    let frame = |kind, address, mapping: &Arc<Mapping>, lines| {
        Arc::new(Frame {
            kind,
            address,
            mapping: Some(mapping.clone()),
            lines,
        })
    };
    let read = frame(
        FrameKind::Native,
        0x7f00_0000_1234,
        &libc,
        vec![line("read", None, 0)],
    );
    let inlined = frame(
        FrameKind::Native,
        0x5555_0000_0100,
        &exe,
        vec![
            line("inner", Some("app.c"), 12),
            line("outer", Some("app.c"), 40),
        ],
    );
    let main = frame(
        FrameKind::Native,
        0x5555_0000_0200,
        &exe,
        vec![line("main", Some("app.c"), 3)],
    );
    let unsymbolized = Arc::new(Frame {
        kind: FrameKind::Native,
        address: 0x1000,
        mapping: None,
        lines: vec![],
    });
    let sys_read = frame(
        FrameKind::Kernel,
        0xffff_ffff_8100_1000,
        &kernel,
        vec![line("ksys_read", None, 0)],
    );
    let stack_a: Stack = vec![read.clone(), inlined.clone(), main.clone()].into();
    // Equal by value to stack_a but built from fresh Arcs.
    let read_copy = Arc::new((*read).clone());
    let stack_a_copy: Stack = vec![read_copy, inlined.clone(), main.clone()].into();
    let stack_b: Stack = vec![sys_read, read.clone(), main.clone()].into();
    let stack_c: Stack = vec![unsymbolized, main.clone()].into();

    let group = |stack: &Stack, tid, name: &str, ts: &[u64]| {
        SampleGroup::timed(
            stack.clone(),
            tid,
            name.into(),
            ts.iter().map(|t| START + t).collect(),
        )
        .on_cpu(tid % 2)
    };
    let info = |pid, name: &str| ProcessInfo {
        pid,
        executable_name: name.into(),
        executable_path: format!("/usr/bin/{name}").into(),
        service_name: name.into(),
        ..ProcessInfo::default()
    };
    ProfileBatch {
        kind: crate::model::ProfileKind::Cpu,
        start_unix_nanos: START,
        duration_nanos: DURATION,
        period_nanos: PERIOD,
        host_name: "testhost".into(),
        host: crate::model::HostInfo {
            arch: "amd64".into(),
            os_type: "linux".into(),
        },
        processes: vec![
            ProcessProfile {
                // In a Kubernetes pod's container.
                process: ProcessInfo {
                    container_id: CONTAINER_ID.into(),
                    k8s_pod_uid: POD_UID.into(),
                    parent_pid: 1,
                    build_ids: crate::model::ExecutableBuildIds {
                        gnu: "0123456789abcdef0123456789abcdef01234567".into(),
                        go: "aB3_-x/yZ9".into(),
                    },
                    ..info(100, "app")
                },
                samples: vec![
                    group(&stack_a, 100, "app", &[1, 2]),
                    group(&stack_a_copy, 100, "app", &[3]),
                    group(&stack_a, 101, "worker", &[4]),
                    group(&stack_b, 100, "app", &[5, 6, 7]),
                ],
            },
            ProcessProfile {
                process: info(200, "other"),
                samples: vec![group(&stack_c, 200, "other", &[DURATION - 1])],
            },
            ProcessProfile {
                process: info(300, "idle"),
                samples: vec![],
            },
        ],
    }
}

/// [`batch`] as an off-CPU batch recorded at 1 in 100 switches: every
/// sample weighs 1 ms times its position in its group, plus one.
pub(crate) fn off_cpu_batch() -> ProfileBatch {
    let mut batch = batch();
    batch.kind = crate::model::ProfileKind::OffCpu { one_in: 100 };
    for process in &mut batch.processes {
        for group in &mut process.samples {
            group.weights_nanos = (1..=group.timestamps_unix_nanos.len() as u64)
                .map(|i| i * 1_000_000)
                .collect();
        }
    }
    batch
}
