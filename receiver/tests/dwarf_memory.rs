//! The symbolizer's DWARF budget (`--debug-info-memory`) is kept by an
//! estimate made from section sizes before anything is read. This holds the
//! estimate to what the allocator counts: a file's DWARF, loaded and then
//! looked up across its whole text so that every unit is parsed, takes no
//! more heap at its peak than its estimated cost.
//!
//! Its own test binary, for the counting allocator it installs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers outside #[test] fns

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use icecore_receiver::symbolize::debug_file;
use icecore_receiver::symbolize::dwarf::DwarfInfo;
use icecore_receiver::symbolize::elf::ElfSymbols;
use object::{Object, ObjectSection};

// The counting allocator of the profile model's memory tests.
#[path = "../../otlp/tests/common/mod.rs"]
mod common;

use common::{LIVE, PEAK};

#[global_allocator]
static ALLOCATOR: common::Counting = common::Counting;

/// A missing prerequisite fails under `ICECORE_REQUIRE_ALL=1` (CI), and is
/// said aloud otherwise.
fn missing(what: &str) {
    assert!(
        std::env::var_os("ICECORE_REQUIRE_ALL").is_none_or(|v| v != "1"),
        "missing prerequisite: {what}"
    );
    println!("skipped: {what}");
}

/// Address and size of `.text`, from the section headers (a separate debug
/// file keeps them, without the bytes).
fn text_range(path: &Path) -> (u64, u64) {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let text = file.section_by_name(".text").unwrap();
    (text.address(), text.size())
}

/// The peak heap of loading `path`'s DWARF and parsing all of it, and the
/// estimated cost.
fn measure(path: &Path, separate: bool) -> (u64, u64) {
    let (start, size) = text_range(path);
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let dwarf = DwarfInfo::load(path, None, separate, u64::MAX, u64::MAX).unwrap();
    // addr2line parses a unit's line program and functions whole, at the
    // first look-up in it: one look-up every 16 bytes reaches every unit.
    let mut address = start;
    while address < start + size {
        let _ = dwarf.frames(address);
        address += 16;
    }
    let peak = (PEAK.load(Ordering::Relaxed) - base) as u64;
    (dwarf.cost(), peak)
}

/// A C program built with `gcc -O2 -g`.
fn c_program(dir: &Path) -> Option<PathBuf> {
    let source = dir.join("program.c");
    std::fs::write(
        &source,
        "#include <stdio.h>\n#include <stdlib.h>\n\
         static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }\n\
         int main(int argc, char **argv) {\n\
           int v[64]; for (int i = 0; i < 64; i++) v[i] = (i * 7919) % 64 + argc;\n\
           qsort(v, 64, sizeof v[0], cmp); printf(\"%s %d\\n\", argv[0], v[3]); return 0; }\n",
    )
    .unwrap();
    let binary = dir.join("program");
    let built = std::process::Command::new("gcc")
        .args(["-O2", "-g", "-o"])
        .arg(&binary)
        .arg(&source)
        .status();
    matches!(built, Ok(status) if status.success()).then_some(binary)
}

/// libc6-dbg's debug file of a system library, by the library's build ID.
fn debug_file_of(library: &str) -> Option<PathBuf> {
    let symbols = ElfSymbols::load(library).ok()?;
    let path = debug_file::build_id_path(symbols.build_id()?)?;
    path.exists().then_some(path)
}

#[test]
fn dwarf_cost_bounds_the_heap_of_fully_parsed_dwarf() {
    let dir = tempfile::tempdir().unwrap();
    let mut files: Vec<(String, PathBuf, bool)> = Vec::new();
    // Rust: this test binary (release or not, it has DWARF: the workspace
    // builds with debug information).
    let exe = std::env::current_exe().unwrap();
    files.push(("this Rust test binary".into(), exe, false));
    match c_program(dir.path()) {
        Some(path) => files.push(("a C program (gcc -O2 -g)".into(), path, false)),
        None => missing("gcc, to build a C program with DWARF"),
    }
    for library in [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/ld-linux-x86-64.so.2",
    ] {
        match debug_file_of(library) {
            Some(path) => files.push((format!("libc6-dbg's {library}"), path, true)),
            None => missing(&format!("the debug file of {library} (install libc6-dbg)")),
        }
    }
    let mut over = Vec::new();
    for (name, path, separate) in &files {
        let (cost, peak) = measure(path, *separate);
        println!(
            "{name}: estimated {cost} bytes, heap at peak {peak} ({:+.1} %)",
            (cost as f64 / peak as f64 - 1.0) * 100.0
        );
        if peak > cost {
            over.push(format!("{name}: {peak} bytes of heap, {cost} estimated"));
        }
    }
    assert!(
        over.is_empty(),
        "the estimate is under the heap DWARF takes: {over:?}"
    );
}
