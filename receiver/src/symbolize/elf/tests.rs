//! Tests of [`ElfSymbols`] on binaries compiled for the test, libc and corrupted files.

use super::*;
use crate::symbolize::testutil::{C_SOURCE, compile_c, compile_cxx, oracle_file_offset};
use std::process::Command;

fn check_alpha_beta(path: &Path) {
    let symbols = ElfSymbols::load(path).unwrap();
    assert!(symbols.len() > 3);
    for name in ["alpha", "beta", "gamma_local"] {
        let offset = oracle_file_offset(path, name);
        let found = symbols.lookup_file_offset(offset).unwrap();
        assert_eq!(found.name, name);
        assert_eq!(found.offset, 0);
        let inside = symbols.lookup_file_offset(offset + 3).unwrap();
        assert_eq!((&*inside.name, inside.offset), (name, 3));
        assert_eq!(symbols.vaddr_to_file_offset(found.address), Some(offset));
    }
    let id = symbols
        .build_id()
        .expect("gcc/clang emit a build ID on Debian");
    assert!(
        id.len() >= 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
}

#[test]
fn pie_executable() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_c(dir.path(), "pie", C_SOURCE, &["-O0", "-fPIE", "-pie"]);
    check_alpha_beta(&exe);
}

#[test]
fn non_pie_executable() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_c(
        dir.path(),
        "nopie",
        C_SOURCE,
        &["-O0", "-fno-pie", "-no-pie"],
    );
    let symbols = ElfSymbols::load(&exe).unwrap();
    // Non-PIE code is linked at a fixed address far from its file offset.
    let offset = oracle_file_offset(&exe, "alpha");
    let vaddr = symbols.symbol_address("alpha").unwrap();
    assert!(vaddr >= 0x400000 && vaddr != offset);
    check_alpha_beta(&exe);
}

#[test]
fn shared_library_and_stripped_dynsym() {
    let dir = tempfile::tempdir().unwrap();
    let lib = compile_c(
        dir.path(),
        "libab.so",
        C_SOURCE,
        &["-O0", "-fPIC", "-shared"],
    );
    check_alpha_beta(&lib);
    let offset = oracle_file_offset(&lib, "alpha");
    let status = Command::new("strip").arg(&lib).status().unwrap();
    assert!(status.success());
    // Only .dynsym is left: the exported functions still resolve, static ones don't.
    let symbols = ElfSymbols::load(&lib).unwrap();
    assert_eq!(symbols.lookup_file_offset(offset).unwrap().name, "alpha");
    assert!(symbols.symbol_address("gamma_local").is_none());
    assert!(symbols.build_id().is_some());
}

#[test]
fn cxx_template_symbol() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_cxx(dir.path(), "cxx");
    let symbols = ElfSymbols::load(&exe).unwrap();
    let mangled = symbols
        .symbols()
        .map(|s| s.name)
        .find(|n| n.starts_with("_ZN2ns6worker"))
        .unwrap()
        .into_owned();
    let offset = oracle_file_offset(&exe, &mangled);
    let found = symbols.lookup_file_offset(offset + 1).unwrap();
    assert_eq!(found.name, mangled);
    assert_eq!(
        crate::symbolize::demangle::demangle(&found.name),
        "int ns::worker<int>(int)"
    );
}

#[test]
fn libc_dynsym_prefers_public_alias() {
    let libc = [
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/x86_64-linux-gnu/libc.so.6",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists());
    let Some(libc) = libc else { return };
    let symbols = ElfSymbols::load(libc).unwrap();
    let address = symbols.symbol_address("malloc").unwrap();
    // `__libc_malloc` shares the address; the public name wins.
    assert_eq!(symbols.lookup_vaddr(address).unwrap().name, "malloc");
}

#[test]
fn unsized_symbols_extend_to_next() {
    let raw = vec![
        RawSymbol {
            start: 0x100,
            end: None,
            limit: 0x1000,
            local: false,
            name: b"a",
        },
        RawSymbol {
            start: 0x180,
            end: Some(0x190),
            limit: 0x1000,
            local: false,
            name: b"b",
        },
        RawSymbol {
            start: 0x200,
            end: None,
            limit: 0x240,
            local: true,
            name: b"c",
        },
    ];
    let (entries, names) = merge(raw).unwrap();
    let symbols = ElfSymbols {
        entries,
        names,
        build_id: None,
        segments: Vec::new(),
        hints: DebugHints::default(),
    };
    assert_eq!(symbols.lookup_vaddr(0x17f).unwrap().name, "a");
    assert_eq!(symbols.lookup_vaddr(0x18f).unwrap().name, "b");
    assert!(symbols.lookup_vaddr(0x190).is_none());
    assert_eq!(symbols.lookup_vaddr(0x23f).unwrap().name, "c");
    assert!(symbols.lookup_vaddr(0x240).is_none());
    assert!(symbols.lookup_vaddr(0xff).is_none());
    assert!(symbols.lookup_file_offset(0x100).is_none(), "no segments");
}

#[test]
fn many_names_are_kept_compressed() {
    // Over COMPRESS_NAMES_FROM bytes of names, with aliases at one address.
    let names: Vec<String> = (0..5000)
        .map(|i| format!("_ZN4core3ptr{i:05}drop_in_place_for_some_long_generic_type_name_{i}E"))
        .collect();
    let mut raw: Vec<RawSymbol<'_>> = names
        .iter()
        .enumerate()
        .map(|(i, name)| RawSymbol {
            start: 0x1000 + 0x40 * i as u64,
            end: Some(0x1000 + 0x40 * i as u64 + 0x20),
            limit: u64::MAX,
            local: false,
            name: name.as_bytes(),
        })
        .collect();
    raw.push(RawSymbol {
        start: 0x1000,
        end: Some(0x1010),
        limit: u64::MAX,
        local: false,
        name: b"__alias_of_the_first",
    });
    let total: usize = names.iter().map(String::len).sum();
    assert!(total > COMPRESS_NAMES_FROM);
    let (entries, names_kept) = merge(raw).unwrap();
    let symbols = ElfSymbols {
        entries,
        names: names_kept,
        build_id: None,
        segments: Vec::new(),
        hints: DebugHints::default(),
    };
    assert_eq!(symbols.len(), names.len());
    assert!(
        symbols.heap_size() < total,
        "{} >= {total}",
        symbols.heap_size()
    );
    for i in [0, 1, 63, 64, 65, 4095, 4999] {
        let vaddr = 0x1000 + 0x40 * i as u64 + 5;
        let found = symbols.lookup_vaddr(vaddr).unwrap();
        assert_eq!((&*found.name, found.offset), (names[i].as_str(), 5));
    }
    assert!(symbols.lookup_vaddr(0x1000 + 0x40 * 7 + 0x20).is_none());
    assert_eq!(
        symbols.symbol_address(&names[4321]),
        Some(0x1000 + 0x40 * 4321)
    );
    assert!(
        symbols
            .symbols()
            .map(|s| s.name)
            .eq(names.iter().map(|n| n.as_str()))
    );
}

#[test]
fn malformed_files_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile_c(dir.path(), "victim", C_SOURCE, &["-O0"]);
    let good = std::fs::read(&exe).unwrap();

    assert!(matches!(
        ElfSymbols::parse(b""),
        Err(ElfError::NotElf { .. })
    ));
    assert!(matches!(
        ElfSymbols::parse(b"garbage bytes here"),
        Err(ElfError::NotElf { .. })
    ));
    let mut bad_class = b"\x7fELF".to_vec();
    bad_class.extend_from_slice(&[9; 60]);
    assert!(ElfSymbols::parse(&bad_class).is_err());

    for len in [4, 16, 63, 64, 200, 1000, good.len() / 2, good.len() - 1] {
        let truncated = &good[..len];
        let _ = ElfSymbols::parse(truncated);
        let path = dir.path().join("truncated");
        std::fs::write(&path, truncated).unwrap();
        let _ = ElfSymbols::load(&path);
    }
    // Cutting off the section headers at the end must be reported.
    assert!(matches!(
        ElfSymbols::parse(&good[..good.len() - 1]),
        Err(ElfError::Malformed { .. })
    ));

    // Deterministic bit flips all over the headers and tables.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for _ in 0..2000 {
        let mut mutated = good.clone();
        for _ in 0..8 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let at = if state.is_multiple_of(2) {
                (state >> 8) as usize % 128
            } else {
                (state >> 8) as usize % mutated.len()
            };
            mutated[at] ^= 1 << ((state >> 40) % 8);
        }
        if let Ok(symbols) = ElfSymbols::parse(&mutated) {
            for offset in (0..mutated.len() as u64).step_by(97) {
                let _ = symbols.lookup_file_offset(offset);
            }
        }
    }
}

#[test]
fn load_errors_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    let missing = ElfSymbols::load(dir.path().join("missing")).unwrap_err();
    assert!(matches!(missing, ElfError::Io { .. }), "{missing}");
    assert!(matches!(
        ElfSymbols::load(dir.path()).unwrap_err(),
        ElfError::NotElf { .. }
    ));
    let text = dir.path().join("text");
    std::fs::write(&text, "#!/bin/sh\necho hi\n").unwrap();
    let err = ElfSymbols::load(&text).unwrap_err();
    assert!(
        matches!(err, ElfError::NotElf { .. }) && err.to_string().contains("text"),
        "{err}"
    );
    let exe = compile_c(dir.path(), "big", C_SOURCE, &["-O0"]);
    let err = ElfSymbols::load_with_limit(&exe, 100).unwrap_err();
    assert!(
        matches!(err, ElfError::TooLarge { limit: 100, .. }),
        "{err}"
    );
}

#[test]
fn corrupt_symtab_falls_back_to_dynsym() {
    use object::{Object, ObjectSection};
    let dir = tempfile::tempdir().unwrap();
    let lib = compile_c(
        dir.path(),
        "libc2.so",
        C_SOURCE,
        &["-O0", "-fPIC", "-shared"],
    );
    let offset = oracle_file_offset(&lib, "alpha");
    let mut data = std::fs::read(&lib).unwrap();
    let symtab_index = {
        let file = object::File::parse(&*data).unwrap();
        file.section_by_name(".symtab").unwrap().index().0
    };
    // Elf64_Ehdr.e_shoff is at 0x28; Elf64_Shdr.sh_offset at 0x18 of a 64-byte entry.
    let shoff = u64::from_le_bytes(data[0x28..0x30].try_into().unwrap()) as usize;
    let field = shoff + symtab_index * 64 + 0x18;
    data[field..field + 8].copy_from_slice(&0xffff_ffff_0000u64.to_le_bytes());
    std::fs::write(&lib, &data).unwrap();

    let symbols = ElfSymbols::load(&lib).unwrap();
    assert_eq!(symbols.lookup_file_offset(offset).unwrap().name, "alpha");
    assert!(symbols.symbol_address("gamma_local").is_none());
}
