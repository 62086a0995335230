//! Writes the binary seeds of the OTLP and pprof targets, made with
//! icecore's own encoders from a small batch like the unit tests' fixture
//! (`otlp/src/test_fixtures.rs`) and a Go-like heap profile like the
//! scrape tests' (`otlp/src/scrape/tests.rs`):
//!
//! ```sh
//! AYA_BUILD_SKIP=1 cargo run --manifest-path fuzz/Cargo.toml --example make_seeds -- fuzz/corpus
//! ```
//!
//! (`fuzz/seeds/make_seeds.sh` runs it with the other seed generators.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use icecore_otlp::model::{
    Frame, FrameKind, HostInfo, Line, Mapping, ProcessInfo, ProcessProfile, ProfileBatch,
    ProfileKind, SampleGroup, Stack,
};
use icecore_otlp::pprof::Profile;
use icecore_otlp::pprof::proto::{Function, Label, Location, Sample, ValueType};
use icecore_otlp::prost::Message;

const START: u64 = 1_795_324_440_000_000_000;

fn line(name: &str, file: Option<&str>, line: u32) -> Line {
    Line {
        function_name: name.into(),
        system_name: format!("_Z{name}").into(),
        filename: file.map(Into::into),
        line,
        column: 0,
    }
}

/// Two processes sharing libc; inlined frames, a kernel frame, an
/// unsymbolized one, a Python frame, labels on a group.
fn batch(kind: ProfileKind) -> ProfileBatch {
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
    let frame = |kind, address, mapping: Option<&Arc<Mapping>>, lines| {
        Arc::new(Frame {
            kind,
            address,
            mapping: mapping.cloned(),
            lines,
        })
    };
    let read = frame(
        FrameKind::Native,
        0x7f00_0000_1234,
        Some(&libc),
        vec![line("read", None, 0)],
    );
    let inlined = frame(
        FrameKind::Native,
        0x5555_0000_0100,
        Some(&exe),
        vec![
            line("inner", Some("app.c"), 12),
            line("outer", Some("app.c"), 40),
        ],
    );
    let main = frame(
        FrameKind::Native,
        0x5555_0000_0200,
        Some(&exe),
        vec![line("main", Some("app.c"), 3)],
    );
    let unsymbolized = frame(FrameKind::Native, 0x1000, None, vec![]);
    let sys_read = frame(
        FrameKind::Kernel,
        0xffff_ffff_8100_1000,
        Some(&kernel),
        vec![line("ksys_read", None, 0)],
    );
    let python = frame(
        FrameKind::CPython,
        0,
        None,
        vec![line("handle", Some("/srv/app.py"), 7)],
    );
    let stack_a: Stack = vec![read.clone(), inlined, main.clone()].into();
    let stack_b: Stack = vec![sys_read, read, main.clone()].into();
    let stack_c: Stack = vec![unsymbolized, python, main].into();
    let weighted = !matches!(kind, ProfileKind::Cpu);
    let group = |stack: &Stack, tid: u32, name: &str, ts: &[u64]| {
        let group = if weighted {
            let samples: Vec<(u64, u64)> = ts.iter().map(|t| (START + t, 1_000_000 * t)).collect();
            SampleGroup::weighted(stack.clone(), tid, name.into(), &samples)
        } else {
            SampleGroup::timed(
                stack.clone(),
                tid,
                name.into(),
                ts.iter().map(|t| START + t).collect(),
            )
        };
        group.on_cpu(tid % 2)
    };
    let info = |pid, name: &str| ProcessInfo {
        pid,
        executable_name: name.into(),
        executable_path: format!("/usr/bin/{name}").into(),
        service_name: name.into(),
        ..ProcessInfo::default()
    };
    let mut labelled = group(&stack_a, 101, "worker", &[4]);
    labelled.labels = vec![(Arc::from("shard"), Arc::from("2"))].into();
    ProfileBatch {
        kind,
        start_unix_nanos: START,
        duration_nanos: 5_000_000_000,
        period_nanos: 1_000_000_000 / 19,
        host_name: "testhost".into(),
        host: HostInfo {
            arch: "amd64".into(),
            os_type: "linux".into(),
        },
        processes: vec![
            ProcessProfile {
                process: ProcessInfo {
                    container_id:
                        "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899".into(),
                    k8s_pod_uid: "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into(),
                    parent_pid: 1,
                    labels: vec![(Arc::from("env"), Arc::from("prod"))].into(),
                    ..info(100, "app")
                },
                samples: vec![
                    group(&stack_a, 100, "app", &[1, 2]),
                    labelled,
                    group(&stack_b, 100, "app", &[5, 6, 7]),
                ],
            },
            ProcessProfile {
                process: info(200, "python3"),
                samples: vec![group(&stack_c, 200, "python3", &[9])],
            },
        ],
    }
}

/// A Go-like heap profile: cumulative `alloc_*` and gauge `inuse_*` values.
fn heap() -> Profile {
    let strings = [
        "",
        "alloc_objects",
        "count",
        "alloc_space",
        "bytes",
        "inuse_objects",
        "inuse_space",
        "space",
        "main.alloc",
        "main.main",
        "main.other",
        "main.go",
        "bytes",
    ];
    let vt = |t: i64, u: i64| ValueType { r#type: t, unit: u };
    let function = |id: u64, name: i64| Function {
        id,
        name,
        system_name: name,
        filename: 11,
        start_line: 1,
    };
    let location = |id: u64, address: u64, function_id: u64, line: i64| Location {
        id,
        mapping_id: 0,
        address,
        line: vec![icecore_otlp::pprof::proto::Line {
            function_id,
            line,
            column: 0,
        }],
        is_folded: false,
    };
    Profile {
        sample_type: vec![vt(1, 2), vt(3, 4), vt(5, 2), vt(6, 4)],
        sample: vec![
            Sample {
                location_id: vec![1, 2],
                value: vec![10, 640, 2, 128],
                label: vec![Label {
                    key: 12,
                    num: 64,
                    ..Label::default()
                }],
            },
            Sample {
                location_id: vec![3],
                value: vec![3, 96, 1, 32],
                label: Vec::new(),
            },
        ],
        location: vec![
            location(1, 0x1000, 1, 10),
            location(2, 0x2000, 2, 20),
            location(3, 0x3000, 3, 30),
        ],
        function: vec![function(1, 8), function(2, 9), function(3, 10)],
        string_table: strings.iter().map(|s| (*s).to_owned()).collect(),
        time_nanos: START as i64,
        period_type: Some(vt(7, 4)),
        period: 512 * 1024,
        ..Profile::default()
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

/// A gRPC message: compressed flag, big-endian length, message.
fn grpc_frame(compressed: bool, message: &[u8]) -> Vec<u8> {
    let mut out = vec![u8::from(compressed)];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

fn write(dir: &Path, target: &str, name: &str, data: &[u8]) {
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), data).unwrap();
    println!("{target}/{name}: {} bytes", data.len());
}

fn main() {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "corpus".to_owned());
    let out = Path::new(&out);

    let cpu = icecore_otlp::encode_request(&batch(ProfileKind::Cpu), "0.1.0").encode_to_vec();
    let off_cpu =
        icecore_otlp::encode_request(&batch(ProfileKind::OffCpu { one_in: 100 }), "0.1.0")
            .encode_to_vec();
    let scraped = icecore_otlp::otlp_encode::encode_pprof_request(
        &heap(),
        "memory",
        &[("job".to_owned(), "shop".to_owned())],
        "0.1.0",
        &icecore_otlp::ResourceAttributes::default(),
    )
    .encode_to_vec();
    write(out, "otlp_request", "cpu.pb", &cpu);
    write(out, "otlp_request", "off-cpu.pb", &off_cpu);
    write(out, "otlp_request", "scraped-heap.pb", &scraped);

    // otlp_receiver: the mode byte (see the target), then the body.
    let with_mode = |mode: u8, body: &[u8]| [&[mode][..], body].concat();
    let receiver = "otlp_receiver";
    write(out, receiver, "http-cpu", &with_mode(0b100, &cpu));
    write(
        out,
        receiver,
        "http-gzip-chunked",
        &with_mode(1 | 3 << 3, &gzip(&off_cpu)),
    );
    write(
        out,
        receiver,
        "grpc-cpu",
        &with_mode(2 | 0b100, &grpc_frame(false, &cpu)),
    );
    write(
        out,
        receiver,
        "grpc-gzip-chunked",
        &with_mode(3 | 1 << 3, &grpc_frame(true, &gzip(&scraped))),
    );

    let cpu_pprof = icecore_otlp::encode_profile(&batch(ProfileKind::Cpu)).encode_to_vec();
    let heap_pprof = heap().encode_to_vec();
    write(out, "pprof_scrape", "cpu.pprof", &cpu_pprof);
    write(out, "pprof_scrape", "heap.pprof.gz", &gzip(&heap_pprof));
    write(out, "pprof_scrape", "heap.pprof", &heap_pprof);
}
