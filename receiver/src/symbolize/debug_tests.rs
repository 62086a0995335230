//! Tests of DWARF, separate debug files and the vDSO through [`Symbolizer`], on
//! programs compiled for the test at -O2 -g and on libc with Debian's libc6-dbg.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::testutil::{compile_c, whole_file_mapping};
use super::*;
use crate::process_maps::ProcessMappings;

/// `leaf` prints its return address, which lies in `outer` inside the inlined
/// `square_plus`. Markers name the lines a symbolizer must report.
const INLINE_SOURCE: &str = r#"
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) int leaf(int x) {
    printf("%lx\n", (unsigned long)__builtin_return_address(0));
    return x + (int)(random() & 1);
}
static inline __attribute__((always_inline)) int square_plus(int x) {
    int y = x * x;
    return leaf(y) + 3; /* LEAF_CALL */
}
__attribute__((noinline)) int outer(int x) {
    int total = 0;
    total += square_plus(x); /* INLINE_CALL */
    return total;
}
int main(int argc, char **argv) { (void)argv; return outer(argc) == 12345; }
"#;

fn line_of(marker: &str) -> u32 {
    let index = INLINE_SOURCE
        .lines()
        .position(|l| l.contains(marker))
        .unwrap();
    u32::try_from(index + 1).unwrap()
}

/// Compiles the inline program (non-PIE, so printed addresses are link-time
/// addresses) and returns it with the return address `leaf` printed.
fn inline_program(dir: &Path, name: &str) -> (PathBuf, u64) {
    let exe = compile_c(
        dir,
        name,
        INLINE_SOURCE,
        &["-O2", "-g", "-fno-pie", "-no-pie"],
    );
    let output = Command::new(&exe).output().unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    let address = u64::from_str_radix(text.trim(), 16).unwrap();
    (exe, address)
}

/// Symbolizes the link-time address `vaddr` of `exe` as a return address.
fn symbolize_vaddr(symbolizer: &mut Symbolizer, exe: &Path, vaddr: u64) -> Arc<Frame> {
    let offset = ElfSymbols::load(exe)
        .unwrap()
        .vaddr_to_file_offset(vaddr)
        .unwrap();
    let mapping = whole_file_mapping(exe, 0x5555_0000_0000);
    symbolizer.native_frame(std::process::id(), &mapping, mapping.start + offset, true)
}

fn assert_inline_chain(frame: &Frame, source_name: &str) {
    let names: Vec<&str> = frame.lines.iter().map(|l| &*l.function_name).collect();
    assert_eq!(names, ["square_plus", "outer"], "{frame:#?}");
    let (inner, outer) = (&frame.lines[0], &frame.lines[1]);
    assert_eq!(inner.line, line_of("LEAF_CALL"), "{inner:?}");
    assert_eq!(outer.line, line_of("INLINE_CALL"), "{outer:?}");
    for line in &frame.lines {
        let file = line.filename.as_deref().unwrap();
        assert!(file.ends_with(source_name), "{file}");
    }
}

#[test]
fn inlined_function_and_its_caller_with_lines() {
    let dir = tempfile::tempdir().unwrap();
    let (exe, address) = inline_program(dir.path(), "inl");
    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
    let frame = symbolize_vaddr(&mut symbolizer, &exe, address);
    assert_inline_chain(&frame, "inl.c");
    // The mapping keeps the binary's build ID.
    let build_id = ElfSymbols::load(&exe).unwrap().build_id().cloned();
    assert_eq!(frame.mapping.as_ref().unwrap().build_id, build_id);
    // A non-inlined function gets one line with its file.
    let leaf = ElfSymbols::load(&exe)
        .unwrap()
        .symbol_address("leaf")
        .unwrap();
    let frame = symbolize_vaddr(&mut symbolizer, &exe, leaf + 1);
    assert_eq!(frame.lines.len(), 1);
    assert_eq!(&*frame.lines[0].function_name, "leaf");
    assert!(frame.lines[0].line > 0);
    let stats = symbolizer.stats();
    assert_eq!((stats.dwarf_loaded, stats.separate_debug_files), (1, 0));
    assert_eq!((stats.debug_files, stats.debug_load_failures), (1, 0));
    assert!(stats.debug_bytes > 0);
}

#[test]
fn stripped_binary_uses_debuglink_file() {
    let dir = tempfile::tempdir().unwrap();
    let (exe, address) = inline_program(dir.path(), "linked");
    let debug = dir.path().join("linked.debug");
    let run = |args: &[&str]| {
        let status = Command::new(args[0]).args(&args[1..]).status().unwrap();
        assert!(status.success(), "{args:?}");
    };
    let (exe_str, debug_str) = (exe.to_str().unwrap(), debug.to_str().unwrap());
    run(&["objcopy", "--only-keep-debug", exe_str, debug_str]);
    run(&["strip", "--strip-all", exe_str]);
    run(&[
        "objcopy",
        &format!("--add-gnu-debuglink={debug_str}"),
        exe_str,
    ]);
    let symbols = ElfSymbols::load(&exe).unwrap();
    assert!(!symbols.debug_hints().has_dwarf && !symbols.debug_hints().has_symtab);
    assert_eq!(
        symbols.debug_hints().debuglink.as_ref().unwrap().name,
        "linked.debug"
    );

    // Beside the binary, then in its .debug directory.
    for place in ["", ".debug"] {
        let target = dir.path().join(place).join("linked.debug");
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        if target != debug {
            std::fs::rename(&debug, &target).unwrap();
        }
        let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
        let frame = symbolize_vaddr(&mut symbolizer, &exe, address);
        assert_inline_chain(&frame, "linked.c");
        let stats = symbolizer.stats();
        assert_eq!((stats.separate_debug_files, stats.dwarf_loaded), (1, 1));
        // The binary's build ID, not the debug file's (they are equal anyway).
        assert_eq!(
            frame.mapping.as_ref().unwrap().build_id,
            symbols.build_id().cloned()
        );
    }

    // A debug file whose CRC does not match is refused; nothing else is known.
    let target = dir.path().join(".debug/linked.debug");
    let mut data = std::fs::read(&target).unwrap();
    let last = data.len() - 1;
    data[last] ^= 0x55;
    std::fs::write(&target, &data).unwrap();
    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
    let frame = symbolize_vaddr(&mut symbolizer, &exe, address);
    assert!(frame.lines.is_empty(), "{frame:?}");
    let stats = symbolizer.stats();
    assert_eq!((stats.debug_files_rejected, stats.dwarf_loaded), (1, 0));
}

#[test]
fn libc_resolves_through_libc6_dbg() {
    let pid = std::process::id();
    // SAFETY: dlsym with a NUL-terminated name and the default handle.
    let malloc = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) } as u64;
    let maps = ProcessMappings::read(pid).unwrap();
    let mapping = maps.find(malloc).unwrap();
    let symbols = ElfSymbols::load(&*mapping.path).unwrap();
    let id = symbols.build_id().unwrap();
    let debug = debug_file::build_id_path(id).unwrap();
    if !debug.exists() {
        crate::test_support::missing_prerequisite(&format!(
            "{} missing (install libc6-dbg)",
            debug.display()
        ));
        return;
    }
    // libc's DWARF (38.5 MB parsed, estimated at 46 MB) is over the default budget.
    let limits = SymbolizerLimits {
        max_debug_bytes: 64 << 20,
        ..SymbolizerLimits::default()
    };
    let mut symbolizer = Symbolizer::new(limits);
    let frame = symbolizer.native_frame(pid, mapping, malloc + 4, false);
    let outer = frame.lines.last().unwrap();
    assert!(outer.function_name.contains("malloc"), "{frame:#?}");
    let file = outer.filename.as_deref().unwrap();
    assert!(file.ends_with("malloc.c"), "{file}");
    assert!(outer.line > 0);
    assert_eq!(
        frame.mapping.as_ref().unwrap().build_id.as_deref(),
        Some(&**id)
    );
    let stats = symbolizer.stats();
    assert_eq!((stats.separate_debug_files, stats.debug_files), (1, 1));
    println!("libc DWARF: estimated {} bytes", stats.debug_bytes);

    // Assembly (memcpy's variants) has lines but no DWARF function: its name
    // comes from the debug file's symbol table.
    let memcpy = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"memcpy".as_ptr()) } as u64;
    if let Some(m) = maps.find(memcpy) {
        let frame = symbolizer.native_frame(pid, m, memcpy, false);
        assert!(!frame.lines.is_empty(), "{frame:?}");
        assert_ne!(&*frame.lines[0].function_name, "??", "{frame:?}");
    }
}

/// A local function of Debian's stripped libc, named only by libc6-dbg's
/// symbol table, keeps its name when that file's DWARF is over the budget
/// (the default 16 MiB) and when DWARF is off.
#[test]
fn libc_local_functions_are_named_without_its_dwarf() {
    let pid = std::process::id();
    // SAFETY: dlsym with a NUL-terminated name and the default handle.
    let malloc = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) } as u64;
    let maps = ProcessMappings::read(pid).unwrap();
    let libc_file = maps.find(malloc).unwrap().path.clone();
    let symbols = ElfSymbols::load(&*libc_file).unwrap();
    let debug = debug_file::build_id_path(symbols.build_id().unwrap()).unwrap();
    if !debug.exists() {
        crate::test_support::missing_prerequisite(&format!(
            "{} missing (install libc6-dbg)",
            debug.display()
        ));
        return;
    }
    const LOCAL: &str = "__libc_start_call_main";
    assert!(
        symbols.symbol_address(LOCAL).is_none(),
        "stripped libc has no {LOCAL}"
    );
    let vaddr = ElfSymbols::load(&debug)
        .unwrap()
        .symbol_address(LOCAL)
        .unwrap();
    let offset = symbols.vaddr_to_file_offset(vaddr).unwrap();
    let mapping = maps
        .mappings()
        .iter()
        .find(|m| {
            m.path == libc_file
                && m.file_offset <= offset
                && offset < m.file_offset + (m.end - m.start)
        })
        .unwrap();
    let address = mapping.start + (offset - mapping.file_offset) + 8;
    for max_debug_bytes in [SymbolizerLimits::default().max_debug_bytes, 0] {
        let mut symbolizer = Symbolizer::new(SymbolizerLimits {
            max_debug_bytes,
            ..SymbolizerLimits::default()
        });
        let frame = symbolizer.native_frame(pid, mapping, address, true);
        assert_eq!(
            frame
                .lines
                .iter()
                .map(|l| &*l.function_name)
                .collect::<Vec<_>>(),
            [LOCAL],
            "DWARF budget {max_debug_bytes}: {frame:?}"
        );
        let stats = symbolizer.stats();
        assert_eq!((stats.debug_files, stats.debug_symbol_tables), (0, 1));
    }
}

#[test]
fn vdso_clock_gettime() {
    let pid = std::process::id();
    let maps = ProcessMappings::read(pid).unwrap();
    let Some(mapping) = maps.mappings().iter().find(|m| m.is_vdso()) else {
        crate::test_support::missing_prerequisite("no [vdso] mapping in this process");
        return;
    };
    let own = vdso::own().expect("the vDSO of a 64-bit process parses");
    assert!(own.fits(mapping.end - mapping.start));
    let symbols = &own.symbols;
    let vaddr = symbols
        .symbol_address("__vdso_clock_gettime")
        .or_else(|| symbols.symbol_address("clock_gettime"))
        .unwrap();
    let offset = symbols.vaddr_to_file_offset(vaddr).unwrap();
    let address = mapping.start + offset;
    // Calling through the address proves it is clock_gettime in this process.
    type ClockGettime = unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> libc::c_int;
    // SAFETY: the vDSO's clock_gettime has this C signature.
    let call: ClockGettime = unsafe { std::mem::transmute(address as *const ()) };
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock and a valid out pointer.
    assert_eq!(unsafe { call(libc::CLOCK_MONOTONIC, &mut ts) }, 0);
    assert!(ts.tv_sec > 0 || ts.tv_nsec > 0);

    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
    let frame = symbolizer.native_frame(pid, mapping, address + 1, false);
    let name = &*frame.lines[0].function_name;
    assert!(name.ends_with("clock_gettime"), "{frame:?}");
    assert_eq!(&*frame.mapping.as_ref().unwrap().filename, "[vdso]");
    let again = symbolizer.native_frame(pid, mapping, address + 1, false);
    assert!(Arc::ptr_eq(&frame, &again));
    assert_eq!(symbolizer.stats().file_cache_misses, 0);

    // A vDSO of another size (a 32-bit process's) is not ours: no names.
    let other = MappedFile {
        end: mapping.start + 3 * 4096 + (mapping.end - mapping.start),
        ..mapping.clone()
    };
    assert!(
        symbolizer
            .native_frame(pid, &other, address, false)
            .lines
            .is_empty()
    );
}

#[test]
fn vdso_image_size_is_bounded() {
    assert_eq!(vdso::image_size(b"\x7fELF"), None);
    let mut header = vec![0u8; 64];
    header[..6].copy_from_slice(b"\x7fELF\x02\x01");
    header[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
    header[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    header[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
    assert_eq!(vdso::image_size(&header), None, "overflow is refused");
    header[0x28..0x30].copy_from_slice(&0x1000u64.to_le_bytes());
    assert_eq!(vdso::image_size(&header), Some(0x1080));
}

#[test]
fn debug_budget_evicts_and_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let (a, address_a) = inline_program(dir.path(), "a");
    let (b, address_b) = inline_program(dir.path(), "b");
    // Room for one file, and `a` in use: `b` waits with its symbol table's
    // names instead of evicting `a` (which would thrash: each would reload
    // the other at its next frame).
    let limits = SymbolizerLimits {
        max_debug_files: 1,
        max_frames: 1,
        ..SymbolizerLimits::default()
    };
    let mut symbolizer = Symbolizer::new(limits);
    for _ in 0..2 {
        let frame = symbolize_vaddr(&mut symbolizer, &a, address_a);
        assert_inline_chain(&frame, "a.c");
        let frame = symbolize_vaddr(&mut symbolizer, &b, address_b);
        let names: Vec<&str> = frame.lines.iter().map(|l| &*l.function_name).collect();
        assert_eq!(names, ["outer"], "{frame:#?}");
    }
    let stats = symbolizer.stats();
    assert_eq!((stats.dwarf_loaded, stats.debug_evictions), (1, 0));
    assert_eq!(stats.debug_files, 1);

    // Nothing counts as in use: the least recently used file makes room.
    let limits = SymbolizerLimits {
        max_debug_files: 1,
        max_frames: 1,
        debug_in_use: Duration::ZERO,
        ..SymbolizerLimits::default()
    };
    let mut symbolizer = Symbolizer::new(limits);
    for _ in 0..2 {
        let frame = symbolize_vaddr(&mut symbolizer, &a, address_a);
        assert_inline_chain(&frame, "a.c");
        let frame = symbolize_vaddr(&mut symbolizer, &b, address_b);
        assert_inline_chain(&frame, "b.c");
    }
    let stats = symbolizer.stats();
    assert_eq!((stats.dwarf_loaded, stats.debug_evictions), (4, 3));
    assert_eq!(stats.debug_files, 1);

    // Over the byte budget: the symbol table names the function, without lines.
    let limits = SymbolizerLimits {
        max_debug_bytes: 1000,
        ..SymbolizerLimits::default()
    };
    let mut symbolizer = Symbolizer::new(limits);
    let frame = symbolize_vaddr(&mut symbolizer, &a, address_a);
    assert_eq!(frame.lines.len(), 1);
    assert_eq!(&*frame.lines[0].function_name, "outer");
    assert_eq!(frame.lines[0].filename, None);
    let stats = symbolizer.stats();
    assert_eq!((stats.debug_load_failures, stats.debug_files), (1, 0));
}

/// Flips bits inside the `.debug_*` sections only, so the ELF stays valid.
fn flip_debug_bits(data: &mut [u8], ranges: &[(usize, usize)], state: &mut u64, flips: usize) {
    for _ in 0..flips {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        let (start, len) = ranges[(*state >> 3) as usize % ranges.len()];
        let at = start + (*state >> 16) as usize % len;
        data[at] ^= 1 << ((*state >> 40) % 8);
    }
}

#[test]
fn corrupt_dwarf_is_counted_and_falls_back() {
    use object::{Object, ObjectSection};
    let dir = tempfile::tempdir().unwrap();
    // Uncompressed sections, so flips reach the DWARF itself.
    let (exe, address) = inline_program(dir.path(), "fuzz");
    let good = std::fs::read(&exe).unwrap();
    let ranges: Vec<(usize, usize)> = {
        let file = object::File::parse(&*good).unwrap();
        file.sections()
            .filter(|s| s.name().is_ok_and(|n| n.starts_with(".debug_")))
            .filter_map(|s| s.file_range())
            .filter(|&(_, len)| len > 0)
            .map(|(start, len)| (start as usize, len as usize))
            .collect()
    };
    assert!(ranges.len() >= 4);
    let symbols = ElfSymbols::load(&exe).unwrap();
    let text = symbols.symbol_address("outer").unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut failures = 0;
    for round in 0..150 {
        let mut data = good.clone();
        flip_debug_bits(&mut data, &ranges, &mut state, 1 + round % 16);
        let path = dir.path().join(format!("mutant{}", round % 4));
        std::fs::write(&path, &data).unwrap();
        // Directly: load errors or look-up errors, never a panic.
        if let Ok(dwarf) = dwarf::DwarfInfo::load(&path, None, false, u64::MAX, 1 << 30) {
            for probe in (text.saturating_sub(0x400)..text + 0x400).step_by(7) {
                let _ = dwarf.frames(probe);
            }
        }
        // Through the symbolizer: some frame always comes back.
        let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
        let frame = symbolize_vaddr(&mut symbolizer, &path, address);
        let stats = symbolizer.stats();
        failures += stats.debug_load_failures + stats.debug_lookup_failures;
        if stats.debug_load_failures > 0 {
            assert_eq!(&*frame.lines[0].function_name, "outer", "symtab fallback");
        }
    }
    assert!(failures > 0, "some mutants must be detected as malformed");
}

#[test]
fn compressed_debug_sections() {
    let dir = tempfile::tempdir().unwrap();
    let (exe, address) = inline_program(dir.path(), "zsec");
    for (format, name) in [("zlib", "zsec-zlib"), ("zstd", "zsec-zstd")] {
        let out = dir.path().join(name);
        let status = Command::new("objcopy")
            .arg(format!("--compress-debug-sections={format}"))
            .arg(&exe)
            .arg(&out)
            .output()
            .unwrap();
        if !status.status.success() {
            println!("skipped {format}: objcopy cannot compress with it");
            continue;
        }
        let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
        let frame = symbolize_vaddr(&mut symbolizer, &out, address);
        assert_inline_chain(&frame, "zsec.c");
    }
}

/// The fuzz target `elf_symbols` found this file: DWARF, and a load segment
/// at 0xffff_ffff_ffff_ffef, so file offset 0x10 maps to the address
/// `u64::MAX`, which addr2line cannot look up without overflowing. A
/// look-up there now finds nothing, and offsets past it have no address.
#[test]
fn a_segment_at_the_end_of_the_address_space_is_no_panic() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/regressions/elf_symbols/dwarf-load-segment-at-u64-max");
    let symbols = ElfSymbols::load(&path).unwrap();
    let segment = symbols.segments()[0];
    let last = symbols.file_offset_to_vaddr(segment.file_offset + 0x10);
    assert_eq!(last, Some(u64::MAX));
    // One byte further would wrap: no address.
    if segment.file_size > 0x11 {
        assert_eq!(
            symbols.file_offset_to_vaddr(segment.file_offset + 0x11),
            None
        );
    }
    let dwarf = dwarf::DwarfInfo::load(&path, None, false, 1 << 30, 1 << 26).unwrap();
    assert!(dwarf.frames(u64::MAX).unwrap().is_empty());
    let mut symbolizer = Symbolizer::new(SymbolizerLimits::default());
    let _ = symbolize_vaddr(&mut symbolizer, &path, u64::MAX);
}
