//! User-space cost of naming JIT code from the symbol files runtimes write
//! for `perf`: parsing a perf map (`PerfMap::feed`, per line, on 100,000
//! lines shaped like Node.js's `--perf-basic-prof` output, fed in 64 KiB
//! reads), looking addresses up in the symbols parsed, cleaning symbol
//! names into function, file and line (`names::clean`, per name, for V8,
//! .NET and JVM names), and parsing a jitdump with line tables (per code
//! load).
//!
//! `cargo bench -p icecore-benches --bench perf_map`

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use icecore_receiver::runtimes::perf_map::{jitdump::JitDump, names::clean, parse::PerfMap};

const LINES: usize = 100_000;
const LOOKUPS: usize = 4096;
const NAMES: usize = 1000;
const LOADS: usize = 10_000;

/// Builtins, bytecode handlers and JavaScript functions of every tier, in
/// the proportions of a Node.js server's perf map.
fn v8_name(i: usize) -> String {
    let line = 10 + i * 7 % 900;
    let column = 3 + i % 40;
    match i % 10 {
        0 => format!("Builtin:ArrayPrototype{}Builtin", i % 700),
        1 => format!("BytecodeHandler:LdaNamedProperty{}", i % 200),
        2..=4 => format!(
            "JS:~handle_{i} /srv/app/node_modules/express/lib/router/route{}.js:{line}:{column}",
            i % 40
        ),
        5 => format!("JS:^ /srv/app/src/routes/orders.js:{line}:{column}"),
        6..=8 => format!(
            "JS:*process_{} file:///srv/app/src/service{}.mjs:{line}:{column}",
            i % 5000,
            i % 30
        ),
        _ => format!("JS:~value node:internal/streams/writable:{line}:{column}"),
    }
}

fn dotnet_name(i: usize) -> String {
    match i % 4 {
        0 => format!(
            "instance int32 [shop] Shop.Orders.OrderService::Handle{i}(int32)[OptimizedTier1]"
        ),
        1 => format!(
            "class [System.Runtime]System.Collections.Generic.IEnumerable`1<!!1> [System.Linq] \
             System.Linq.Enumerable::Select{i}(class [System.Runtime]System.Collections.Generic.IEnumerable`1<!!0>,\
             class [System.Runtime]System.Func`2<!!0,!!1>)[QuickJitted]"
        ),
        2 => format!(
            "void [System.Private.CoreLib] System.Buffer::Memmove{i}(uint8*,uint8*,uint64)[Optimized]"
        ),
        _ => format!("stub<{i}> AllocateTemporaryEntryPoints<PRECODE_FIXUP>"),
    }
}

fn jvm_name(i: usize) -> String {
    format!(
        "Lcom/example/shop/orders/OrderService{};::handle{i}",
        i % 50
    )
}

/// A perf map's text and an address inside each of its symbols.
fn perf_map() -> (Vec<u8>, Vec<u64>) {
    let mut text = String::new();
    let mut inside = Vec::with_capacity(LINES);
    let mut address = 0x7f3a_1c00_0000u64;
    for i in 0..LINES {
        let size = 0x20 + (i as u64 * 37) % 0x600;
        text.push_str(&format!("{address:x} {size:x} {}\n", v8_name(i)));
        inside.push(address + size / 2);
        address += size + (i as u64 % 3) * 0x10;
    }
    (text.into_bytes(), inside)
}

/// A jitdump of `LOADS` functions, each with 8 line entries (V8's layout).
fn jitdump() -> Vec<u8> {
    let mut b = Vec::new();
    for v in [0x4A69_5444u32, 1, 40, 62, 0, 4242] {
        b.extend_from_slice(&v.to_ne_bytes());
    }
    b.extend_from_slice(&[0; 16]);
    let file = b"/srv/app/src/service.js\0";
    for i in 0..LOADS as u64 {
        let code = 0x7f00_0000_0000 + i * 0x400;
        let mut debug = Vec::new();
        debug.extend_from_slice(&code.to_ne_bytes());
        debug.extend_from_slice(&8u64.to_ne_bytes());
        for e in 0..8u64 {
            debug.extend_from_slice(&(code + 0x40 + e * 0x30).to_ne_bytes());
            debug.extend_from_slice(&(10 + e as u32).to_ne_bytes());
            debug.extend_from_slice(&5u32.to_ne_bytes());
            debug.extend_from_slice(file);
        }
        debug.resize(debug.len().next_multiple_of(8), 0);
        record(&mut b, 2, &debug);
        let mut load = Vec::new();
        load.extend_from_slice(&[0; 8]);
        for v in [code, code, 0x200, i] {
            load.extend_from_slice(&v.to_ne_bytes());
        }
        load.extend_from_slice(
            format!("JS:*process_{i} /srv/app/src/service.js:10:3\0").as_bytes(),
        );
        load.resize(load.len() + 0x200, 0xcc);
        record(&mut b, 0, &load);
    }
    b
}

fn record(out: &mut Vec<u8>, id: u32, body: &[u8]) {
    out.extend_from_slice(&id.to_ne_bytes());
    out.extend_from_slice(&(16 + body.len() as u32).to_ne_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(body);
}

fn bench(c: &mut Criterion) {
    let (text, inside) = perf_map();
    let mut group = c.benchmark_group("perf_map");
    group.throughput(Throughput::Elements(LINES as u64));
    group.bench_function("feed_v8_lines", |b| {
        b.iter_batched(
            || PerfMap::new(1 << 20),
            |mut map| {
                for read in text.chunks(64 << 10) {
                    black_box(map.feed(black_box(read)));
                }
                map
            },
            BatchSize::LargeInput,
        );
    });
    let mut map = PerfMap::new(1 << 20);
    map.feed(&text);
    let addresses: Vec<u64> = (0..LOOKUPS)
        .map(|i| inside[(i * 7919) % inside.len()])
        .collect();
    group.throughput(Throughput::Elements(LOOKUPS as u64));
    group.bench_function("lookup", |b| {
        b.iter(|| {
            addresses
                .iter()
                .filter(|&&a| map.lookup(black_box(a)).is_some())
                .count()
        });
    });
    group.throughput(Throughput::Elements(NAMES as u64));
    for (format, name) in [
        ("v8", v8_name as fn(usize) -> String),
        ("dotnet", dotnet_name),
        ("jvm", jvm_name),
    ] {
        let names: Vec<String> = (0..NAMES).map(name).collect();
        group.bench_function(format!("clean_{format}"), |b| {
            b.iter(|| names.iter().map(|n| clean(black_box(n)).line).sum::<u32>());
        });
    }
    let dump = jitdump();
    group.throughput(Throughput::Elements(LOADS as u64));
    group.bench_function("feed_jitdump_loads", |b| {
        b.iter_batched(
            || JitDump::new(1 << 20),
            |mut parsed| {
                for read in dump.chunks(1 << 20) {
                    black_box(parsed.feed(black_box(read)).is_ok());
                }
                parsed
            },
            BatchSize::LargeInput,
        );
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
