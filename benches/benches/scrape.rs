//! Scrape benchmarks: what one scraped profile costs the agent, on a
//! synthetic Go heap profile shaped like a large service's (5000 stacks of
//! depth 10-40 over 2000 functions, four sample types): decoding the
//! gzipped answer, turning the cumulative counts into a delta, and
//! building and serializing the OTLP request.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use icecore_benches::Rng;
use icecore_otlp::otlp_encode::{ResourceAttributes, encode_pprof_request};
use icecore_otlp::pprof::Profile;
use icecore_otlp::pprof::proto::{Function, Line, Location, Sample, ValueType};
use icecore_otlp::prost::Message;
use icecore_otlp::scrape::{CumulativeDelta, DeltaOutcome, ScrapedProfile, decode};

const STACKS: usize = 5000;
const FUNCTIONS: u64 = 2000;

/// The heap profile at scrape `n`: every stack's counts grow with `n`.
fn heap(n: i64) -> Profile {
    let mut rng = Rng(0x1ce_c0de);
    let mut strings: Vec<String> = [
        "",
        "alloc_objects",
        "count",
        "alloc_space",
        "bytes",
        "inuse_objects",
        "inuse_space",
        "space",
        "main.go",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let function = (1..=FUNCTIONS)
        .map(|id| {
            strings.push(format!("github.com/acme/shop/pkg{}.Func{id}", id % 40));
            Function {
                id,
                name: strings.len() as i64 - 1,
                system_name: strings.len() as i64 - 1,
                filename: 8,
                start_line: 1,
            }
        })
        .collect();
    let location = (1..=FUNCTIONS)
        .map(|id| Location {
            id,
            mapping_id: 0,
            address: 0x40_0000 + id * 0x40,
            line: vec![Line {
                function_id: id,
                line: (id % 300) as i64 + 1,
                column: 0,
            }],
            is_folded: false,
        })
        .collect();
    let sample = (0..STACKS)
        .map(|i| {
            let depth = 10 + (rng.next_u64() % 31) as usize;
            let location_id = (0..depth).map(|_| 1 + rng.next_u64() % FUNCTIONS).collect();
            let base = 1 + (i as i64 % 17);
            Sample {
                location_id,
                value: vec![base * n, base * n * 4096, base, base * 4096],
                label: Vec::new(),
            }
        })
        .collect();
    let vt = |t: i64, u: i64| ValueType { r#type: t, unit: u };
    Profile {
        sample_type: vec![vt(1, 2), vt(3, 4), vt(5, 2), vt(6, 4)],
        sample,
        location,
        function,
        string_table: strings,
        time_nanos: 1_795_324_440_000_000_000 + n * 10_000_000_000,
        period_type: Some(vt(7, 4)),
        period: 512 * 1024,
        ..Profile::default()
    }
}

fn bench(c: &mut Criterion) {
    let first = heap(1);
    let second = heap(2);
    let gzipped = ScrapedProfile::new("memory".to_owned(), Vec::new(), second.clone()).gzipped;
    let mut group = c.benchmark_group("scrape");
    group.throughput(Throughput::Elements(STACKS as u64));
    group.bench_function("decode_gzipped_heap", |b| {
        b.iter(|| black_box(decode(black_box(&gzipped)).map(|p| p.sample.len())));
    });
    group.bench_function("cumulative_delta", |b| {
        b.iter_batched(
            || {
                let mut delta = CumulativeDelta::default();
                let _ = delta.apply(first.clone());
                (delta, second.clone())
            },
            |(mut delta, profile)| match delta.apply(profile) {
                DeltaOutcome::Ready(p) => black_box(p.sample.len()),
                _ => 0,
            },
            BatchSize::LargeInput,
        );
    });
    let labels = vec![
        ("job".to_owned(), "shop".to_owned()),
        ("instance".to_owned(), "10.0.0.7:6060".to_owned()),
    ];
    group.bench_function("otlp_request_from_pprof", |b| {
        b.iter(|| {
            let request = encode_pprof_request(
                black_box(&second),
                "memory",
                &labels,
                "0.1.0",
                &ResourceAttributes::default(),
            );
            black_box(request.encode_to_vec().len())
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
