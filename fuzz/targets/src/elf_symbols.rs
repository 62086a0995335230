//! An ELF file to names, as the symbolizer reads a mapped binary (a hostile
//! process can map any file): `ElfSymbols::load` (function symbols, build
//! ID, load segments, `.gnu_debuglink`, section hints), lookups by file
//! offset and address with demangling; then, as `symbolize::debug::load`
//! does, the file's DWARF (`DwarfInfo::load`, addr2line's line tables and
//! inlined functions) and its Go `.gopclntab` (`GoTable::load`, with the
//! inline trees found through `moduledata`), each asked for frames.

use icecore_receiver::symbolize::demangle::demangle;
use icecore_receiver::symbolize::dwarf::DwarfInfo;
use icecore_receiver::symbolize::elf::ElfSymbols;
use icecore_receiver::symbolize::gopclntab::GoTable;
use icecore_receiver::symbolize::sections::SectionFile;

/// The symbolizer's defaults, about: files up to 1 GiB, 64 MiB of debug
/// sections read per file.
const MAX_FILE: u64 = 1 << 30;
const BUDGET: u64 = 64 << 20;

/// Runs one input through the entry points above; panics are the bugs
/// looked for (errors are expected answers to bad input).
pub fn run(data: &[u8]) {
    let path = crate::scratch_file("elf-symbols", data);
    let Ok(symbols) = ElfSymbols::load(&path) else {
        return;
    };
    let _ = symbols.build_id();
    let _ = symbols.heap_size();
    let mut addresses: Vec<u64> = symbols
        .symbols()
        .take(64)
        .flat_map(|s| {
            let _ = demangle(&s.name);
            [s.address, s.address.wrapping_add(1)]
        })
        .collect();
    // As the symbolizer finds them: a sampled address's file offset in the
    // mapping, to a link-time address through the file's segments.
    for segment in symbols.segments() {
        for offset in [0, 0x10, segment.file_size.saturating_sub(1)] {
            let file_offset = segment.file_offset.wrapping_add(offset);
            addresses.extend(symbols.file_offset_to_vaddr(file_offset));
        }
    }
    let hints = symbols.debug_hints().clone();
    if let Some(text) = &hints.text {
        addresses.extend(crate::probe_addresses(text.vaddr));
    }
    addresses.truncate(256);
    for &address in &addresses {
        if let Some(found) = symbols.lookup_vaddr(address) {
            let _ = demangle(&found.name);
        }
        if let Some(offset) = symbols.vaddr_to_file_offset(address) {
            let _ = symbols.lookup_file_offset(offset);
        }
    }
    if hints.has_dwarf
        && let Ok(dwarf) = DwarfInfo::load(&path, None, false, MAX_FILE, BUDGET)
    {
        let _ = dwarf.cost();
        // Not u64::MAX: addr2line 0.27's `find` computes `probe + 1`, which
        // panics there with overflow checks (regressions/elf_symbols/, see
        // the README); left out so that the rest keeps being fuzzed.
        for &address in addresses.iter().filter(|&&a| a != u64::MAX) {
            let _ = dwarf.frames(address);
        }
    }
    if hints.gopclntab.is_some()
        && let Ok(mut file) = SectionFile::open(&path, MAX_FILE, BUDGET)
        && let Ok(table) = GoTable::load(&mut file, &symbols)
    {
        for &address in &addresses {
            let _ = table.frames(address);
        }
    }
}
