//! The flame graph history's memory estimate (what its byte cap bounds)
//! against what it really holds, and its peak while it evicts, measured by
//! a counting allocator (its own test binary, so the allocator sees
//! nothing else).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use icecore_otlp::history::{History, HistoryLimits};
use icecore_otlp::model::{
    Frame, FrameKind, HostInfo, Line, Mapping, ProcessInfo, ProcessProfile, ProfileBatch,
    ProfileKind, SampleGroup, Stack,
};

mod common;

use common::{LIVE, PEAK};

#[global_allocator]
static ALLOCATOR: common::Counting = common::Counting;

const T0: u64 = 1_795_324_440_000_000_000;
const SEC: u64 = 1_000_000_000;

/// A small deterministic generator.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Function names as the symbolizer shares them (one allocation each).
struct Names {
    function: Vec<Arc<str>>,
    system: Vec<Arc<str>>,
    file: Vec<Arc<str>>,
}

impl Names {
    fn new() -> Self {
        Names {
            function: (0..FUNCTIONS)
                .map(|i| format!("module{}::function_{i}", i % 37).into())
                .collect(),
            system: (0..FUNCTIONS)
                .map(|i| format!("_ZN6module{}10function_{i}E", i % 37).into())
                .collect(),
            file: (0..37)
                .map(|m| format!("src/module{m}.rs").into())
                .collect(),
        }
    }
}

const FUNCTIONS: usize = 2000;
/// Stack shapes (function indices) batches draw from.
const SHAPES: usize = 20_000;
/// Stacks per batch.
const STACKS_PER_BATCH: usize = 400;

/// One batch as the profiler hands it for a process it has not seen: its
/// frames are allocations of their own (another load address), their
/// names the symbolizer's shared ones; 400 stacks drawn from 20,000
/// shapes, so some recur and some are new.
fn batch(at: u64, rng: &mut Rng, names: &Names, shapes: &[Vec<usize>]) -> ProfileBatch {
    let pid = 1000 + at as u32;
    let bias = 0x1000 * (at % 512);
    let mapping = Arc::new(Mapping {
        memory_start: 0x40_0000 + bias,
        memory_limit: 0x80_0000 + bias,
        file_offset: 0,
        filename: names.file[(at % 7) as usize].clone(),
        build_id: None,
    });
    let mut frames: std::collections::HashMap<usize, Arc<Frame>> = Default::default();
    let samples: Vec<SampleGroup> = (0..STACKS_PER_BATCH)
        .map(|_| {
            let stack: Stack = shapes[rng.below(SHAPES)]
                .iter()
                .map(|&i| {
                    frames
                        .entry(i)
                        .or_insert_with(|| {
                            Arc::new(Frame {
                                kind: FrameKind::Native,
                                address: 0x40_0000 + bias + i as u64 * 64,
                                mapping: Some(mapping.clone()),
                                lines: vec![Line {
                                    function_name: names.function[i].clone(),
                                    system_name: names.system[i].clone(),
                                    filename: Some(names.file[i % 37].clone()),
                                    line: (i % 400) as u32,
                                    column: 0,
                                }],
                            })
                        })
                        .clone()
                })
                .collect();
            SampleGroup::timed(
                stack,
                pid,
                "worker".into(),
                vec![T0 + at * SEC; 1 + rng.below(3)],
            )
        })
        .collect();
    ProfileBatch {
        kind: ProfileKind::Cpu,
        start_unix_nanos: T0 + at * SEC,
        duration_nanos: SEC,
        period_nanos: 10_000_000,
        host_name: "host".into(),
        host: HostInfo::default(),
        processes: vec![ProcessProfile {
            process: ProcessInfo {
                pid,
                executable_name: format!("app{}", at % 7).into(),
                service_name: format!("app{}", at % 7).into(),
                ..ProcessInfo::default()
            },
            samples,
        }],
    }
}

#[test]
fn the_byte_cap_bounds_what_the_history_really_holds() {
    const CAP: u64 = 8 << 20;
    let mut rng = Rng(0x5eed_0123_4567_89ab);
    let names = Names::new();
    let shapes: Vec<Vec<usize>> = (0..SHAPES)
        .map(|_| {
            (0..10 + rng.below(21))
                .map(|_| rng.below(FUNCTIONS))
                .collect()
        })
        .collect();
    let mut history = History::new(HistoryLimits {
        retention: Duration::from_secs(24 * 3600),
        max_bytes: CAP,
    });
    let base = LIVE.load(Relaxed);
    let mut worst_held = 0f64;
    let mut worst_peak = 0f64;
    for at in 0..600 {
        let next = batch(at, &mut rng, &names, &shapes);
        let with_batch = LIVE.load(Relaxed);
        PEAK.store(with_batch, Relaxed);
        history.ingest(&next, T0 + (at + 1) * SEC);
        let peak = PEAK.load(Relaxed) - with_batch;
        drop(next);
        let held = LIVE.load(Relaxed) - base;
        let estimate = history.bytes();
        // Once the cap is reached: what is held against the estimate (which
        // counts the allocator's overhead per block), and the peak an
        // ingest reaches above what was held before it.
        if history.stats().evicted_by_memory.load(Relaxed) > 0 {
            worst_held = worst_held.max(held as f64 / estimate as f64);
            worst_peak = worst_peak.max((held + peak) as f64 / CAP as f64);
        }
        assert!(
            estimate as u64 <= CAP,
            "{estimate} over the cap after ingest {at}"
        );
    }
    let evicted = history.stats().evicted_by_memory.load(Relaxed);
    println!(
        "history at an 8 MiB cap: {evicted} intervals evicted, {} compactions; held/estimate at \
         most {worst_held:.2}, peak/cap at most {worst_peak:.2}",
        history.stats().compactions.load(Relaxed)
    );
    assert!(evicted > 100, "{evicted}");
    // The blocks' own bytes are below the estimate, which adds the
    // allocator's overhead per block.
    assert!(worst_held <= 1.0, "held {worst_held:.2} of the estimate");
    assert!(worst_peak <= 1.5, "peak {worst_peak:.2} of the cap");
}
