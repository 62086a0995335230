//! Symbolization costs: parsing an ELF file's symbols (cold), symbol look-ups in
//! parsed files, and frames served from the symbolizer's frame cache (warm).

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use icecore_receiver::process_maps::ProcessMappings;
use icecore_receiver::symbolize::elf::ElfSymbols;
use icecore_receiver::symbolize::{Symbolizer, SymbolizerLimits};

/// libc when it is where Debian puts it, else the bench executable itself.
fn sample_library() -> PathBuf {
    [
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib64/libc.so.6",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
    .or_else(|| std::env::current_exe().ok())
    .unwrap_or_else(|| PathBuf::from("/proc/self/exe"))
}

/// Spreads `count` file offsets over the executable segments of `symbols`.
fn code_offsets(symbols: &ElfSymbols, count: u64) -> Vec<u64> {
    let addresses: Vec<u64> = symbols.symbols().map(|s| s.address).collect();
    if addresses.is_empty() {
        return Vec::new();
    }
    (0..count)
        .filter_map(|i| {
            let index = (i.wrapping_mul(2654435761) % addresses.len() as u64) as usize;
            symbols.vaddr_to_file_offset(addresses[index] + i % 16)
        })
        .collect()
}

fn cold(c: &mut Criterion) {
    let mut group = c.benchmark_group("symbolize_cold");
    group.sample_size(20);
    for (name, path) in [
        ("library", sample_library()),
        ("own_executable", current_exe()),
    ] {
        group.bench_function(format!("load_elf_symbols/{name}"), |b| {
            b.iter(|| ElfSymbols::load(black_box(&path)).map(|s| s.len()))
        });
    }
    group.finish();
}

fn current_exe() -> PathBuf {
    std::env::current_exe().unwrap_or_else(|_| Path::new("/proc/self/exe").to_path_buf())
}

fn warm(c: &mut Criterion) {
    let mut group = c.benchmark_group("symbolize_warm");
    let Ok(symbols) = ElfSymbols::load(sample_library()) else {
        return;
    };
    let offsets = code_offsets(&symbols, 4096);
    group.throughput(Throughput::Elements(offsets.len() as u64));
    group.bench_function("elf_lookup_file_offset", |b| {
        b.iter(|| {
            offsets
                .iter()
                .filter(|&&o| symbols.lookup_file_offset(black_box(o)).is_some())
                .count()
        })
    });

    // Frames of this process's own code, through the full symbolizer.
    let pid = std::process::id();
    let Ok(maps) = ProcessMappings::read(pid) else {
        return;
    };
    let here = warm as *const () as u64;
    let Some(mapping) = maps.find(here).cloned() else {
        return;
    };
    let addresses: Vec<u64> = (0..1024u64)
        .map(|i| mapping.start + (i * 4093) % (mapping.end - mapping.start))
        .collect();
    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
    for &a in &addresses {
        symbolizer.native_frame(pid, &mapping, a, true);
    }
    group.throughput(Throughput::Elements(addresses.len() as u64));
    group.bench_function("frame_cache_hit", |b| {
        b.iter(|| {
            for &a in &addresses {
                black_box(symbolizer.native_frame(pid, &mapping, black_box(a), true));
            }
        })
    });
    group.bench_function("frame_cache_miss_file_cached", |b| {
        b.iter_batched(
            || {
                let mut fresh = Symbolizer::new(SymbolizerLimits::default());
                // Load the file so only the frame work is measured.
                fresh.native_frame(pid, &mapping, here, false);
                fresh
            },
            |mut fresh| {
                for &a in &addresses {
                    black_box(fresh.native_frame(pid, &mapping, a, true));
                }
                fresh
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, cold, warm);
criterion_main!(benches);
