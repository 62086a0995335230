//! Encoding benchmarks: OTLP request building (+ protobuf serialization) and
//! gzipped pprof, on a synthetic batch shaped like a busy host's 5 s window:
//! 50 processes, 2000 distinct stacks of depth 10-60 sharing frames, 20k samples.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use icecore_benches::Rng;
use icecore_otlp::model::{
    Frame, FrameKind, Line, Mapping, ProcessInfo, ProcessProfile, ProfileBatch, SampleGroup, Stack,
};
use icecore_otlp::prost::Message;
use icecore_otlp::{encode_gzip, encode_request};

const PROCESSES: usize = 50;
const STACKS: usize = 2000;
const SAMPLES: usize = 20_000;
const START: u64 = 1_795_324_440_000_000_000;
const DURATION: u64 = 5_000_000_000;

fn mapping(name: &str, start: u64, build_id: Option<&str>) -> Arc<Mapping> {
    Arc::new(Mapping {
        memory_start: start,
        memory_limit: start + 0x40_0000,
        file_offset: 0x1000,
        filename: name.into(),
        build_id: build_id.map(Into::into),
    })
}

fn line(name: String, file: &str, line: u32) -> Line {
    let name: Arc<str> = name.into();
    Line {
        system_name: format!("_ZN{}{name}E", name.len()).into(),
        function_name: name,
        filename: Some(file.into()),
        line,
        column: 0,
    }
}

/// A pool of frames over a few shared libraries plus the kernel; about one in
/// five has an inlined callee, so locations carry one or two lines.
fn frame_pool(rng: &mut Rng) -> Vec<Arc<Frame>> {
    let libs = [
        mapping(
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            0x7f10_0000_0000,
            Some("a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"),
        ),
        mapping(
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
            0x7f20_0000_0000,
            Some("0f1e2d3c4b5a69788796a5b4c3d2e1f000112233"),
        ),
        mapping(
            "/usr/lib/x86_64-linux-gnu/libssl.so.3",
            0x7f30_0000_0000,
            None,
        ),
        mapping(
            "/usr/bin/server",
            0x5555_0000_0000,
            Some("deadbeefdeadbeefdeadbeefdeadbeefdeadbeef"),
        ),
    ];
    let kernel = mapping("[kernel.kallsyms]", 0xffff_ffff_8100_0000, None);
    (0..3000u64)
        .map(|i| {
            let (kind, mapping) = if i % 10 == 0 {
                (FrameKind::Kernel, &kernel)
            } else {
                (FrameKind::Native, &libs[rng.below(libs.len())])
            };
            let mut lines = vec![line(
                format!("module{}::function_{i}", i % 37),
                "src/lib.rs",
                10 + (i % 500) as u32,
            )];
            if i % 5 == 0 {
                lines.insert(0, line(format!("inlined_helper_{i}"), "src/util.rs", 3));
            }
            Arc::new(Frame {
                kind,
                address: mapping.memory_start + 0x1000 + i * 0x40,
                mapping: Some(mapping.clone()),
                lines,
            })
        })
        .collect()
}

/// Stacks share a common root (`_start` → `main` → …) and a pool of frames,
/// like real programs do; depths are 10..=60.
fn stacks(rng: &mut Rng, pool: &[Arc<Frame>]) -> Vec<Stack> {
    let roots = &pool[1..6];
    (0..STACKS)
        .map(|_| {
            let depth = 10 + rng.below(51);
            let mut frames: Vec<Arc<Frame>> = (0..depth - roots.len())
                .map(|_| pool[rng.below(pool.len())].clone())
                .collect();
            frames.extend(roots.iter().rev().cloned());
            frames.into()
        })
        .collect()
}

fn batch() -> ProfileBatch {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let pool = frame_pool(&mut rng);
    let stacks = stacks(&mut rng, &pool);
    let threads: Vec<Arc<str>> = (0..8).map(|t| format!("worker-{t}").into()).collect();
    let mut processes: Vec<ProcessProfile> = (0..PROCESSES)
        .map(|p| {
            let name: Arc<str> = format!("server{p}").into();
            ProcessProfile {
                process: ProcessInfo {
                    pid: 1000 + p as u32,
                    executable_path: format!("/usr/bin/{name}").into(),
                    service_name: name.clone(),
                    executable_name: name,
                    ..ProcessInfo::default()
                },
                samples: Vec::new(),
            }
        })
        .collect();
    let mut remaining = SAMPLES;
    while remaining > 0 {
        let n = (1 + rng.below(4)).min(remaining);
        remaining -= n;
        let process = rng.below(PROCESSES);
        let thread = rng.below(threads.len());
        processes[process].samples.push(
            SampleGroup::timed(
                stacks[rng.below(stacks.len())].clone(),
                1000 + (process * 100 + thread) as u32,
                threads[thread].clone(),
                (0..n).map(|_| START + rng.next_u64() % DURATION).collect(),
            )
            // An 8-CPU host.
            .on_cpu(rng.below(8) as u32),
        );
    }
    ProfileBatch {
        kind: icecore_otlp::model::ProfileKind::Cpu,
        start_unix_nanos: START,
        duration_nanos: DURATION,
        period_nanos: 1_000_000_000 / 19,
        host_name: "bench-host".into(),
        host: icecore_otlp::model::HostInfo::this_host(),
        processes,
    }
}

/// Prints the bytes one batch takes in each push sink's export queue (the
/// encoded request before compression, as the queue holds it), from which
/// the README sizes the default queue bound: the batch has more samples
/// (20,000) than a 10 s batch of a 64-CPU host at the default 19 Hz
/// (12,160), so per-minute figures taken from it err on the large side.
fn queue_bytes(batch: &ProfileBatch) {
    use icecore_otlp::export::RequestSender;
    use icecore_otlp::{ParcaExporter, ParcaOptions, PyroscopeExporter, PyroscopeOptions};
    let otlp = encode_request(batch, "0.1.0").encode_to_vec().len();
    let parca = ParcaExporter::new(&ParcaOptions::new("http://127.0.0.1:7070"))
        .map(|e| e.encode_batch(batch).len());
    let pyroscope = PyroscopeExporter::new(&PyroscopeOptions::new("http://127.0.0.1:4040"))
        .map(|e| e.encode_batch(batch).len());
    match (parca, pyroscope) {
        (Ok(parca), Ok(pyroscope)) => println!(
            "queue bytes of one batch ({} samples): OTLP {otlp}, Parca {parca}, Pyroscope {pyroscope}",
            batch.sample_count()
        ),
        (parca, pyroscope) => {
            println!("queue bytes: cannot build the exporters: {parca:?} {pyroscope:?}")
        }
    }
}

fn encode(c: &mut Criterion) {
    let batch = batch();
    queue_bytes(&batch);
    let mut group = c.benchmark_group("encode");
    group.throughput(Throughput::Elements(batch.sample_count()));
    group.bench_function("otlp_request", |b| {
        b.iter(|| encode_request(black_box(&batch), "0.1.0"))
    });
    group.bench_function("otlp_request_and_prost", |b| {
        b.iter(|| encode_request(black_box(&batch), "0.1.0").encode_to_vec())
    });
    group.bench_function("pprof_gzip", |b| b.iter(|| encode_gzip(black_box(&batch))));
    group.finish();
}

criterion_group!(benches, encode);
criterion_main!(benches);
