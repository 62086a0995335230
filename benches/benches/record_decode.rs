//! The per-sample user-space path: decoding a ring-buffer record
//! (`RawSample::decode`) and adding it to the interval's aggregation
//! (`Aggregator::add`, which keys it by thread and stack), on records shaped
//! like a busy host's: 4 kernel frames, 12-40 user frames and, for one in
//! four, the tagged words of 6 CPython frames; 500 distinct stacks.
//!
//! `cargo bench -p icecore-benches --bench record_decode`

#![expect(
    clippy::expect_used,
    reason = "a benchmark harness: a record that does not decode is a bug in the harness"
)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use icecore_receiver::aggregate::Aggregator;
use icecore_receiver::record::RawSample;
use icecore_unwinders::{
    SampleHeader,
    python::{CPYTHON, word},
};

const RECORDS: usize = 4096;
const DISTINCT_STACKS: u64 = 500;

/// One record's bytes: header, kernel frames, user frames, interpreter words.
fn record(i: u64) -> Vec<u8> {
    let stack = i % DISTINCT_STACKS;
    let kernel: Vec<u64> = (0..4).map(|k| 0xffff_ffff_8100_0000 + k * 0x40).collect();
    let user: Vec<u64> = (0..12 + stack % 29)
        .map(|f| 0x5555_5555_0000 + (stack * 31 + f) * 0x10)
        .collect();
    let interpreter: Vec<u64> = if stack.is_multiple_of(4) {
        (0..6u64)
            .flat_map(|f| {
                [
                    CPYTHON.tags.word(word::FRAME, 0x7f00_0000_0000 + f * 0x100),
                    CPYTHON.tags.word(word::INSTR, 0x40),
                ]
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut comm = [0u8; 16];
    comm[..6].copy_from_slice(b"worker");
    let header = SampleHeader {
        ktime_ns: 1_000_000 * i,
        pid: 1000 + (stack % 50) as u32,
        tid: 1000 + (stack % 50) as u32,
        cpu: (i % 2) as u32,
        flags: 0,
        kernel_frames: kernel.len() as u32,
        user_words: (user.len() + interpreter.len()) as u32,
        off_cpu_ns: 0,
        comm,
    };
    // SAFETY: SampleHeader is repr(C), integers only, size asserted (no padding).
    let mut bytes = unsafe {
        std::slice::from_raw_parts(
            std::ptr::from_ref(&header).cast::<u8>(),
            size_of::<SampleHeader>(),
        )
    }
    .to_vec();
    for word in kernel.iter().chain(&user).chain(&interpreter) {
        bytes.extend_from_slice(&word.to_le_bytes());
    }
    bytes
}

fn bench(c: &mut Criterion) {
    let records: Vec<Vec<u8>> = (0..RECORDS as u64).map(record).collect();
    let mut group = c.benchmark_group("record");
    group.throughput(Throughput::Elements(RECORDS as u64));
    group.bench_function("decode", |b| {
        b.iter(|| {
            let mut frames = 0usize;
            for bytes in &records {
                let sample = RawSample::decode(black_box(bytes)).expect("a valid record");
                frames += sample.user_words().len();
            }
            frames
        });
    });
    group.bench_function("decode_and_aggregate", |b| {
        b.iter(|| {
            let mut aggregator = Aggregator::new(1 << 20, None, false);
            for (i, bytes) in records.iter().enumerate() {
                let sample = RawSample::decode(black_box(bytes)).expect("a valid record");
                aggregator.add(&sample, i as u64, Some(1));
            }
            aggregator.len()
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
