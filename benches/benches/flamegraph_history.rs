//! The flame graph page's history with a large profile: 100,000 distinct
//! stacks (depth 8-40, over 5,000 function names, 50 processes) in one
//! batch, and 30 such batches (the default 5-minute view at 10 s). Measures
//! ingesting a batch, and the page's queries (the tree pruned for a
//! 1,400-pixel chart, a search, a diff, the pprof download's window).
//! Prints the history's memory and how many nodes a query sends.

use std::hint::black_box;
use std::sync::{Arc, atomic::Ordering::Relaxed};
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use icecore_benches::Rng;
use icecore_otlp::history::{FlameQuery, History, HistoryLimits, RangeNanos};
use icecore_otlp::model::{
    Frame, FrameKind, HostInfo, Line, ProcessInfo, ProcessProfile, ProfileBatch, ProfileKind,
    SampleGroup, Stack,
};

const STACKS: usize = 100_000;
const NAMES: usize = 5_000;
const PROCESSES: u32 = 50;
const BATCHES: u64 = 30;
const START: u64 = 1_795_324_440_000_000_000;
const INTERVAL: u64 = 10_000_000_000;
/// The byte cap of the steady-state ingest: about 20 batches of 10k stacks.
const CAPPED_BYTES: u64 = 48 << 20;

fn frames(rng: &mut Rng) -> Vec<Arc<Frame>> {
    (0..NAMES)
        .map(|i| {
            Arc::new(Frame {
                kind: if i % 10 == 0 {
                    FrameKind::Kernel
                } else if i % 3 == 0 {
                    FrameKind::CPython
                } else {
                    FrameKind::Native
                },
                address: 0x40_0000 + (i as u64) * 64 + rng.below(64) as u64,
                mapping: None,
                lines: vec![Line {
                    function_name: format!("module{}::function_{i}", i % 97).into(),
                    system_name: format!("_ZN{i}E").into(),
                    filename: Some(format!("src/module{}.rs", i % 97).into()),
                    line: (i % 500) as u32,
                    column: 0,
                }],
            })
        })
        .collect()
}

/// Distinct stacks sharing prefixes, as real ones do: each extends a random
/// earlier one's prefix by a few frames.
fn stacks(rng: &mut Rng, pool: &[Arc<Frame>]) -> Vec<Stack> {
    let mut root_first: Vec<Vec<Arc<Frame>>> = Vec::with_capacity(STACKS);
    let mut seen = std::collections::HashSet::new();
    while root_first.len() < STACKS {
        let mut path: Vec<Arc<Frame>> = match root_first.len() {
            0 => Vec::new(),
            n => {
                let base = &root_first[rng.below(n)];
                base[..rng.below(base.len()).max(1)].to_vec()
            }
        };
        let depth = 8 + rng.below(33);
        while path.len() < depth {
            path.push(pool[rng.below(NAMES)].clone());
        }
        let key: Vec<usize> = path.iter().map(|f| Arc::as_ptr(f) as usize).collect();
        if seen.insert(key) {
            root_first.push(path);
        }
    }
    root_first
        .into_iter()
        .map(|p| p.into_iter().rev().collect())
        .collect()
}

fn batch(at: u64, stacks: &[Stack], rng: &mut Rng) -> ProfileBatch {
    let mut processes: Vec<ProcessProfile> = (0..PROCESSES)
        .map(|pid| ProcessProfile {
            process: ProcessInfo {
                pid: 1000 + pid,
                executable_name: format!("app{pid}").into(),
                service_name: format!("app{pid}").into(),
                ..ProcessInfo::default()
            },
            samples: Vec::new(),
        })
        .collect();
    let start = START + at * INTERVAL;
    for stack in stacks {
        let p = rng.below(PROCESSES as usize);
        let count = 1 + rng.below(3);
        let tid = processes[p].process.pid;
        processes[p].samples.push(SampleGroup::timed(
            stack.clone(),
            tid,
            "worker".into(),
            vec![start + 1; count],
        ));
    }
    ProfileBatch {
        kind: ProfileKind::Cpu,
        start_unix_nanos: start,
        duration_nanos: INTERVAL,
        period_nanos: 10_000_000,
        host_name: "bench".into(),
        host: HostInfo::default(),
        processes,
    }
}

fn limits() -> HistoryLimits {
    HistoryLimits {
        retention: Duration::from_secs(3600),
        max_bytes: 1 << 30,
    }
}

fn bench(c: &mut Criterion) {
    let mut rng = Rng(0x5eed_f1a3);
    let pool = frames(&mut rng);
    let stacks = stacks(&mut rng, &pool);
    let batches: Vec<ProfileBatch> = (0..BATCHES).map(|i| batch(i, &stacks, &mut rng)).collect();

    let mut full = History::new(limits());
    for (i, b) in batches.iter().enumerate() {
        full.ingest(b, START + (i as u64 + 1) * INTERVAL);
    }
    let page = FlameQuery {
        min_share: 1.0 / 2800.0,
        ..FlameQuery::default()
    };
    let view = full.query(&page).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "history: {BATCHES} batches of {STACKS} stacks: {:.1} MiB; the page's query sends {} of {} nodes, {} top rows",
        full.bytes() as f64 / (1 << 20) as f64,
        view.nodes,
        view.all_nodes,
        view.top.len()
    );

    let mut group = c.benchmark_group("flamegraph_history");
    group.sample_size(10);
    group.bench_function("ingest a batch of 100k stacks (new)", |b| {
        b.iter(|| {
            let mut h = History::new(limits());
            h.ingest(black_box(&batches[0]), START + INTERVAL);
            black_box(h.bytes())
        });
    });
    group.bench_function("ingest a batch of 100k stacks (known)", |b| {
        // A minute kept: the history holds six batches as it goes, and
        // each ingest also drops (and compacts after) the oldest.
        let mut h = History::new(HistoryLimits {
            retention: Duration::from_secs(60),
            ..limits()
        });
        h.ingest(&batches[0], START + INTERVAL);
        let mut at = 1;
        b.iter_batched(
            || {
                let mut next = batches[(at % BATCHES) as usize].clone();
                next.start_unix_nanos = START + at * INTERVAL;
                at += 1;
                next
            },
            |next| h.ingest(black_box(&next), next.start_unix_nanos + INTERVAL),
            BatchSize::LargeInput,
        );
    });
    group.bench_function("ingest a batch of 10k stacks at the memory cap", |b| {
        // The soak's steady state: each batch a random tenth of the
        // stacks (some new, some not seen for a while), the history at its
        // byte cap (about 20 such batches), so every ingest evicts.
        let subsets: Vec<Vec<Stack>> = (0..BATCHES)
            .map(|_| {
                (0..STACKS / 10)
                    .map(|_| stacks[rng.below(STACKS)].clone())
                    .collect()
            })
            .collect();
        let small: Vec<ProfileBatch> = subsets
            .iter()
            .enumerate()
            .map(|(i, s)| batch(i as u64, s, &mut rng))
            .collect();
        let mut h = History::new(HistoryLimits {
            retention: Duration::from_secs(3600),
            max_bytes: CAPPED_BYTES,
        });
        let mut at = 0u64;
        let mut next_batch = || {
            let mut next = small[(at % BATCHES) as usize].clone();
            next.start_unix_nanos = START + at * INTERVAL;
            at += 1;
            next
        };
        while h.stats().evicted_by_memory.load(Relaxed) < BATCHES {
            let next = next_batch();
            h.ingest(&next, next.start_unix_nanos + INTERVAL);
        }
        println!(
            "history at its cap of {:.0} MiB: {} batches of 10k stacks, {} stacks interned",
            CAPPED_BYTES as f64 / (1 << 20) as f64,
            h.stats().slots.load(Relaxed),
            h.stats().stacks.load(Relaxed)
        );
        b.iter_batched(
            &mut next_batch,
            |next| h.ingest(black_box(&next), next.start_unix_nanos + INTERVAL),
            BatchSize::LargeInput,
        );
    });
    group.bench_function("query 5 min (30 x 100k stacks)", |b| {
        b.iter(|| black_box(full.query(black_box(&page))));
    });
    let searched = FlameQuery {
        search: Some("function_42".into()),
        ..page.clone()
    };
    group.bench_function("query with a search", |b| {
        b.iter(|| black_box(full.query(black_box(&searched))));
    });
    let mid = START + (BATCHES / 2) * INTERVAL;
    let diff = FlameQuery {
        range: Some(RangeNanos {
            from: mid,
            to: START + BATCHES * INTERVAL,
        }),
        baseline: Some(RangeNanos {
            from: START,
            to: mid,
        }),
        ..page.clone()
    };
    group.bench_function("query a diff of two halves", |b| {
        b.iter(|| black_box(full.query(black_box(&diff))));
    });
    let one = FlameQuery {
        pid: Some(1007),
        ..page.clone()
    };
    group.bench_function("query one process", |b| {
        b.iter(|| black_box(full.query(black_box(&one))));
    });
    group.bench_function("window for a pprof download", |b| {
        b.iter(|| black_box(full.window(black_box(&page))));
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
