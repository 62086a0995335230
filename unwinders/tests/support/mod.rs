//! Helpers of the host tests: compiling fixtures, and independent oracles
//! (binutils' `readelf` and `objdump`, `/proc/self/maps`, symbol tables).
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use icecore_unwinders::native::{CfaRule, RbpRule, UnwindRow};
use icecore_unwinders::table::{AddressSpace, Mapping, UnwindTable, elf_load_bias};
use object::{Object, ObjectSection, ObjectSymbol};

pub const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

/// Compiles `source` with `compiler` (`cc` or `c++`) and `flags` into `dir`.
pub fn compile(dir: &Path, compiler: &str, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let extension = if compiler == "c++" { "cc" } else { "c" };
    let source_path = dir.join(format!("{name}.{extension}"));
    std::fs::write(&source_path, source).unwrap();
    let output = dir.join(name);
    let status = Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&output)
        .arg(&source_path)
        .status()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(status.success(), "{compiler} {flags:?} {name} failed");
    output
}

/// What a readelf row says the table must hold at its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    Row(UnwindRow),
    /// The CFA is a DWARF expression (checked by the PLT test).
    Expression,
}

/// One FDE as `readelf --debug-dump=frames-interp` prints it.
#[derive(Debug, Clone)]
pub struct ReadelfFde {
    pub debug_frame: bool,
    pub start: u64,
    pub end: u64,
    /// (address, expectation), in address order; each holds up to the next.
    pub rows: Vec<(u64, Expected)>,
}

fn unsupported() -> Expected {
    Expected::Row(UnwindRow::new(
        0,
        CfaRule::Unsupported,
        0,
        RbpRule::Unchanged,
        0,
    ))
}

/// The row the table rules say a readelf row becomes, from its column values.
fn expected(columns: &HashMap<String, String>) -> Expected {
    // Expressions (PLT, saved-CFA dereferences, signal frames) are checked by
    // their own tests.
    if columns["CFA"] == "exp" {
        return Expected::Expression;
    }
    match columns.get("ra").map(String::as_str) {
        Some("u") => {
            return Expected::Row(UnwindRow::new(
                0,
                CfaRule::EndOfStack,
                0,
                RbpRule::Unchanged,
                0,
            ));
        }
        Some("c-8") => {}
        _ => return unsupported(),
    }
    let (rbp, rbp_offset) = match columns.get("rbp").map(String::as_str) {
        None | Some("u" | "s" | "rbp") => (RbpRule::Unchanged, 0),
        Some(value) => match value.strip_prefix("c").and_then(|n| n.parse::<i64>().ok()) {
            Some(n) if n % 8 == 0 && i8::try_from(n / 8).is_ok() => {
                (RbpRule::CfaOffset, (n / 8) as i8)
            }
            _ => return unsupported(),
        },
    };
    let cfa = &columns["CFA"];
    let (register, offset) = cfa.split_at(3);
    let rule = match register {
        "rsp" => CfaRule::Rsp,
        "rbp" => CfaRule::Rbp,
        _ => return unsupported(),
    };
    match offset.strip_prefix('+').and_then(|n| n.parse::<u16>().ok()) {
        Some(offset) => Expected::Row(UnwindRow::new(0, rule, offset, rbp, rbp_offset)),
        None => unsupported(),
    }
}

/// Every FDE of `path`'s `.eh_frame` and `.debug_frame`, interpreted by readelf.
pub fn readelf_fdes(path: &Path) -> Vec<ReadelfFde> {
    let output = Command::new("readelf")
        .arg("--debug-dump=frames-interp")
        .arg(path)
        .output()
        .unwrap();
    // readelf exits 1 on some files without saying why; the output is complete.
    let text = String::from_utf8(output.stdout).unwrap();
    let mut fdes: Vec<ReadelfFde> = Vec::new();
    // CIE offset -> its initial rows (the rules of FDEs printing no table).
    let mut cie_rows: HashMap<(bool, String), HashMap<String, String>> = HashMap::new();
    let mut debug_frame = false;
    let mut header: Vec<String> = Vec::new();
    // The entry being read: Some(cie key) for a CIE, None for an FDE.
    let mut current_cie: Option<(bool, String)> = None;
    for line in text.lines() {
        if line.starts_with("Contents of the .debug_frame") {
            debug_frame = true;
            continue;
        }
        if line.starts_with("Contents of the .eh_frame") {
            debug_frame = false;
            continue;
        }
        // Register rules print as "r9 (r9)": keep the name with its number.
        let mut words: Vec<&str> = Vec::new();
        for word in line.split_whitespace() {
            if word.starts_with('(') && !words.is_empty() {
                continue;
            }
            words.push(word);
        }
        if words.len() >= 4 && words[3] == "CIE" {
            current_cie = Some((debug_frame, words[0].to_string()));
            header.clear();
            continue;
        }
        if words.len() >= 6 && words[3] == "FDE" {
            let cie = words[4].trim_start_matches("cie=").to_string();
            let range = words[5].trim_start_matches("pc=");
            let (start, end) = range.split_once("..").unwrap();
            let start = u64::from_str_radix(start, 16).unwrap();
            let end = u64::from_str_radix(end, 16).unwrap();
            current_cie = None;
            header.clear();
            // Until a table is printed, the FDE has its CIE's rules.
            let rows = match cie_rows.get(&(debug_frame, cie)) {
                Some(columns) => vec![(start, expected(columns))],
                None => Vec::new(),
            };
            fdes.push(ReadelfFde {
                debug_frame,
                start,
                end,
                rows,
            });
            continue;
        }
        if words.first() == Some(&"LOC") {
            header = words.iter().map(|w| w.to_string()).collect();
            if current_cie.is_none() {
                // The FDE prints its own table.
                fdes.last_mut().unwrap().rows.clear();
            }
            continue;
        }
        if header.is_empty() || words.len() != header.len() {
            continue;
        }
        let Ok(address) = u64::from_str_radix(words[0], 16) else {
            continue;
        };
        let columns: HashMap<String, String> = header[1..]
            .iter()
            .cloned()
            .zip(words[1..].iter().map(|w| w.to_string()))
            .collect();
        match &current_cie {
            Some(key) => {
                cie_rows.insert(key.clone(), columns);
            }
            None => {
                let rows = &mut fdes.last_mut().unwrap().rows;
                // A later row at the same address replaces the earlier one.
                if rows.last().is_some_and(|(a, _)| *a == address) {
                    rows.pop();
                }
                rows.push((address, expected(&columns)));
            }
        }
    }
    fdes
}

/// Checks `table` against readelf's interpretation of the FDEs `include`
/// accepts; returns (rows checked, expression rows seen).
pub fn check_against_readelf(
    path: &Path,
    table: &UnwindTable,
    include: impl Fn(&ReadelfFde) -> bool,
) -> (usize, usize) {
    let fdes = readelf_fdes(path);
    assert!(
        !fdes.is_empty(),
        "readelf found no FDEs in {}",
        path.display()
    );
    let same = |a: UnwindRow, b: UnwindRow| {
        a.rules == b.rules && a.cfa_offset == b.cfa_offset && a.rbp_offset == b.rbp_offset
    };
    let (mut checked, mut expressions) = (0, 0);
    for fde in fdes.iter().filter(|f| f.start < f.end && include(f)) {
        for (i, &(address, expect)) in fde.rows.iter().enumerate() {
            let next = fde.rows.get(i + 1).map_or(fde.end, |r| r.0).min(fde.end);
            if address >= next {
                continue;
            }
            let Expected::Row(want) = expect else {
                expressions += 1;
                continue;
            };
            for pc in [address, next - 1, address + (next - address) / 2] {
                let got = table
                    .lookup(pc)
                    .unwrap_or_else(|| panic!("no row for {pc:#x}"));
                assert!(
                    same(got, want),
                    "{}: pc {pc:#x} in FDE {:#x}..{:#x}: table has {got:?} ({:?}), readelf says {want:?} ({:?})",
                    path.display(),
                    fde.start,
                    fde.end,
                    got.cfa_rule(),
                    want.cfa_rule()
                );
            }
            checked += 1;
        }
    }
    // Where no FDE (nor a PLT section) covers a PC after an FDE's end, frame
    // pointers take over.
    let mut covered: Vec<(u64, u64)> = fdes.iter().map(|f| (f.start, f.end)).collect();
    covered.extend(plt_sections(path).iter().map(|s| (s.1, s.2)));
    for fde in fdes.iter().filter(|f| f.start < f.end && include(f)) {
        if covered
            .iter()
            .any(|&(start, end)| start <= fde.end && fde.end < end)
        {
            continue;
        }
        let row = table.lookup(fde.end);
        assert!(
            row.is_none_or(|r| r.cfa_rule() == CfaRule::NoInfo),
            "{}: gap at {:#x} has {row:?}",
            path.display(),
            fde.end
        );
    }
    (checked, expressions)
}

/// Checks the table's own invariants: sorted, strictly increasing, no two
/// consecutive rows with the same rules.
pub fn check_invariants(table: &UnwindTable) {
    for pair in table.rows().windows(2) {
        assert!(pair[0].pc < pair[1].pc, "unsorted: {pair:?}");
        let same = pair[0].rules == pair[1].rules
            && pair[0].cfa_offset == pair[1].cfa_offset
            && pair[0].rbp_offset == pair[1].rbp_offset;
        assert!(!same, "redundant rows: {pair:?}");
    }
}

/// The instructions of `sections` as objdump decodes them: (address, mnemonic).
pub fn objdump_instructions(path: &Path, section: &str) -> Vec<(u64, String)> {
    let output = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "-j", section])
        .arg(path)
        .output()
        .unwrap();
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    text.lines()
        .filter_map(|line| {
            let (address, rest) = line.trim_start().split_once(":\t")?;
            let address = u64::from_str_radix(address, 16).ok()?;
            let mnemonic = rest.split_whitespace().next()?.to_string();
            Some((address, mnemonic))
        })
        .collect()
}

/// The executable file mappings of a `/proc/PID/maps` text: (start, end, offset, path).
pub fn executable_mappings(maps: &str) -> Vec<(u64, u64, u64, String)> {
    maps.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (start, end) = fields.first()?.split_once('-')?;
            let path = fields.get(5)?;
            if !fields[1].contains('x') || !path.starts_with('/') {
                return None;
            }
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
                u64::from_str_radix(fields[2], 16).ok()?,
                path.to_string(),
            ))
        })
        .collect()
}

/// The mapping (start, end) of `/proc/self/maps` containing `address`.
pub fn mapping_containing(maps: &str, address: u64) -> Option<(u64, u64)> {
    maps.lines().find_map(|line| {
        let (start, end) = line.split_whitespace().next()?.split_once('-')?;
        let (start, end) = (
            u64::from_str_radix(start, 16).ok()?,
            u64::from_str_radix(end, 16).ok()?,
        );
        (start <= address && address < end).then_some((start, end))
    })
}

/// An address space with a table for every executable file mapping in
/// `mappings`, and each file's (path, bias) to symbolize with.
pub fn address_space(
    mappings: &[(u64, u64, u64, String)],
) -> (AddressSpace, Vec<(u64, u64, u64, String)>) {
    let mut tables: HashMap<String, (Vec<u8>, Arc<UnwindTable>)> = HashMap::new();
    let mut space = AddressSpace::new();
    let mut biased = Vec::new();
    for (start, end, offset, path) in mappings {
        let (data, table) = tables.entry(path.clone()).or_insert_with(|| {
            let data = std::fs::read(path).unwrap();
            let table = UnwindTable::from_elf(&data).unwrap();
            (data, Arc::new(table))
        });
        let bias = elf_load_bias(data, *start, *offset).unwrap();
        assert!(space.insert(Mapping {
            start: *start,
            end: *end,
            bias,
            table: table.clone(),
        }));
        biased.push((*start, *end, bias, path.clone()));
    }
    (space, biased)
}

/// Function symbols of an ELF file: (address, size, name), sorted.
pub fn symbols(path: &Path) -> Vec<(u64, u64, String)> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let mut symbols: Vec<(u64, u64, String)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
        .collect();
    symbols.sort();
    symbols
}

/// The name of the function containing ELF address `address`.
pub fn symbolize(symbols: &[(u64, u64, String)], address: u64) -> Option<&str> {
    let at = symbols.partition_point(|s| s.0 <= address).checked_sub(1)?;
    let (start, size, name) = &symbols[at];
    (address < start + size).then_some(name.as_str())
}

/// Addresses of a file's PLT-like sections: (name, start, end).
pub fn plt_sections(path: &Path) -> Vec<(String, u64, u64)> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.sections()
        .filter_map(|s| {
            let name = s.name().ok()?;
            [".plt", ".plt.got", ".plt.sec"]
                .contains(&name)
                .then(|| (name.to_string(), s.address(), s.address() + s.size()))
        })
        .collect()
}
