//! Symbolization costs: parsing an ELF file's symbols (cold), symbol look-ups in
//! parsed files, and frames served from the symbolizer's frame cache (warm); and
//! for DWARF, loading a file's debug sections plus first look-ups (cold) and
//! look-ups in units already parsed (warm).

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use icecore_receiver::process_maps::ProcessMappings;
use icecore_receiver::symbolize::debug_file;
use icecore_receiver::symbolize::dwarf::DwarfInfo;
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
    // Every look-up misses the one-frame cache, with the file parsed and its
    // DWARF loaded and fully parsed by a first pass.
    let limits = SymbolizerLimits {
        max_frames: 1,
        ..SymbolizerLimits::default()
    };
    let mut missing = Symbolizer::new(limits);
    for &a in &addresses {
        missing.native_frame(pid, &mapping, a, true);
    }
    group.bench_function("frame_cache_miss_file_cached", |b| {
        b.iter(|| {
            for &a in &addresses {
                black_box(missing.native_frame(pid, &mapping, black_box(a), true));
            }
        })
    });
    // The same without debug information: symbol tables only.
    let limits = SymbolizerLimits {
        max_frames: 1,
        max_debug_bytes: 0,
        ..SymbolizerLimits::default()
    };
    let mut symtab_only = Symbolizer::new(limits);
    for &a in &addresses {
        symtab_only.native_frame(pid, &mapping, a, true);
    }
    group.bench_function("frame_cache_miss_symtab_only", |b| {
        b.iter(|| {
            for &a in &addresses {
                black_box(symtab_only.native_frame(pid, &mapping, black_box(a), true));
            }
        })
    });
    group.finish();
}

/// Files with DWARF: libc's debug file from libc6-dbg when installed, and this
/// bench executable (release profile with `debug = 1`), each with the symbols
/// that give code addresses.
fn dwarf_files() -> Vec<(&'static str, PathBuf, ElfSymbols)> {
    let mut files = Vec::new();
    if let Ok(symbols) = ElfSymbols::load(sample_library())
        && let Some(debug) = symbols
            .build_id()
            .and_then(|id| debug_file::build_id_path(id))
            .filter(|p| p.exists())
    {
        files.push(("libc_debug_file", debug, symbols));
    }
    let exe = current_exe();
    if let Ok(symbols) = ElfSymbols::load(&exe)
        && symbols.debug_hints().has_dwarf
    {
        files.push(("own_executable", exe, symbols));
    }
    files
}

fn dwarf(c: &mut Criterion) {
    let mut group = c.benchmark_group("symbolize_dwarf");
    for (name, path, symbols) in dwarf_files() {
        let addresses: Vec<u64> = code_offsets(&symbols, 4096)
            .into_iter()
            .filter_map(|o| symbols.file_offset_to_vaddr(o))
            .collect();
        // Cold: read and decompress the sections, build the context, then
        // resolve 64 addresses, each parsing its unit's lines and functions.
        group.sample_size(10);
        group.throughput(Throughput::Elements(64));
        group.bench_function(format!("cold_load_and_64_lookups/{name}"), |b| {
            b.iter(|| {
                let dwarf = DwarfInfo::load(&path, None, false, u64::MAX, 4 << 30).ok()?;
                let found = addresses
                    .iter()
                    .take(64)
                    .filter(|&&a| dwarf.frames(black_box(a)).is_ok_and(|f| !f.is_empty()))
                    .count();
                Some(found)
            })
        });
        let Ok(dwarf) = DwarfInfo::load(&path, None, false, u64::MAX, 4 << 30) else {
            continue;
        };
        for &a in &addresses {
            let _ = dwarf.frames(a);
        }
        // Warm: every unit already parsed.
        group.sample_size(30);
        group.throughput(Throughput::Elements(addresses.len() as u64));
        group.bench_function(format!("warm_lookups/{name}"), |b| {
            b.iter(|| {
                addresses
                    .iter()
                    .filter(|&&a| dwarf.frames(black_box(a)).is_ok_and(|f| !f.is_empty()))
                    .count()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, cold, warm, dwarf);
criterion_main!(benches);
