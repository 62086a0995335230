//! What CRuby's machine code says where its symbols do not: Debian strips
//! `vm_exec` and `vm_exec_core` (static or hidden functions) and, from 3.3
//! on, `ruby_global_symbols` (hidden data). All three are found from facts
//! that hold for any GCC or Clang build, checked in the tests against 3.1
//! (which still exports `rb_vm_exec`), 3.3 and 3.4.
//!
//! - `vm_exec_core` is the function whose labels fill the direct-threaded
//!   instruction table: the longest run of consecutive pointers in the
//!   file's data that all point into one function (about 200 of them).
//! - `vm_exec` (the frame one VM invocation runs under, and where the
//!   invocation's Ruby frames go among native ones) is the function that
//!   calls `vm_exec_core`.
//! - `ruby_global_symbols` (the ID → String table) is the data the exported
//!   `rb_id2str` reads: a RIP-relative compare with its `last_id` and a load
//!   of its `ids` Array 16 bytes further.

use std::{collections::BTreeMap, ops::Range};

use object::{Object, ObjectSection, ObjectSymbol, RelocationFlags, RelocationTarget, SectionKind};

/// Fewer pointers into one function than this are not an instruction table
/// (CRuby 3.1 has 202 instructions; C code's tables of function pointers
/// point into many functions).
const MIN_INSTRUCTION_TABLE: usize = 100;
/// `R_X86_64_RELATIVE`.
const R_X86_64_RELATIVE: u32 = 8;
/// Bytes of a function searched for the instructions wanted.
const SCAN_BYTES: u64 = 256;
/// `ruby_global_symbols.ids` is 16 bytes after its `last_id`.
const IDS_FIELD: u64 = 16;

/// The functions of a file, sorted, for finding the one an address is in.
pub struct Functions(Vec<Range<u64>>);

impl Functions {
    /// The ranges (any order), without empty ones.
    pub fn new(mut ranges: Vec<Range<u64>>) -> Self {
        ranges.retain(|r| r.start < r.end);
        ranges.sort_by_key(|r| r.start);
        Functions(ranges)
    }

    /// The function `address` is in.
    pub fn containing(&self, address: u64) -> Option<&Range<u64>> {
        let at = self.0.partition_point(|r| r.start <= address);
        self.0[..at].last().filter(|r| address < r.end)
    }
}

/// The pointer-sized values a file's data holds at load time, by address:
/// relative relocations' addends (PIE and shared objects), or the words of
/// its read-only data sections (position-dependent executables).
fn data_pointers<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
) -> BTreeMap<u64, u64> {
    let mut values = BTreeMap::new();
    if let Some(relocations) = elf.dynamic_relocations() {
        for (at, relocation) in relocations {
            let relative = matches!(
                relocation.flags(),
                RelocationFlags::Elf { r_type } if r_type == R_X86_64_RELATIVE
            );
            if relative && matches!(relocation.target(), RelocationTarget::Absolute) {
                values.insert(at, relocation.addend() as u64);
            }
        }
    }
    if values.is_empty() {
        for section in elf.sections() {
            if !matches!(
                section.kind(),
                SectionKind::ReadOnlyData | SectionKind::Data
            ) {
                continue;
            }
            let Ok(data) = section.data() else { continue };
            for (i, word) in data.chunks_exact(8).enumerate() {
                let value = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
                values.insert(section.address() + 8 * i as u64, value);
            }
        }
    }
    values
}

/// `vm_exec_core`: the function the longest run of consecutive data
/// pointers points into, if that run is an instruction table's length.
pub fn instruction_loop<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
    functions: &Functions,
) -> Option<Range<u64>> {
    let mut best: Option<(usize, &Range<u64>)> = None;
    let mut run: Option<(usize, &Range<u64>)> = None;
    let mut previous_slot = None;
    for (slot, value) in data_pointers(elf) {
        let function = functions.containing(value);
        run = match (run, function) {
            (Some((n, f)), Some(g)) if previous_slot == Some(slot.wrapping_sub(8)) && f == g => {
                Some((n + 1, f))
            }
            (_, Some(g)) => Some((1, g)),
            (_, None) => None,
        };
        previous_slot = Some(slot);
        if let Some((n, f)) = run
            && best.is_none_or(|(m, _)| n > m)
        {
            best = Some((n, f));
        }
    }
    best.filter(|(n, _)| *n >= MIN_INSTRUCTION_TABLE)
        .map(|(_, f)| f.clone())
}

/// Every function with a direct call (`call rel32`) to `target`: byte
/// patterns in code, so a match is counted only when it lands exactly on
/// `target`'s first byte.
pub fn callers_of<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
    functions: &Functions,
    target: u64,
) -> Vec<Range<u64>> {
    let mut callers: Vec<Range<u64>> = Vec::new();
    for section in elf.sections() {
        if section.kind() != SectionKind::Text {
            continue;
        }
        let Ok(code) = section.data() else { continue };
        for (i, window) in code.windows(5).enumerate() {
            if window[0] != 0xe8 {
                continue;
            }
            let displacement = i32::from_le_bytes([window[1], window[2], window[3], window[4]]);
            let next = section.address() + i as u64 + 5;
            if next.checked_add_signed(i64::from(displacement)) != Some(target) {
                continue;
            }
            if let Some(caller) = functions.containing(next - 5)
                && !callers.contains(caller)
            {
                callers.push(caller.clone());
            }
        }
    }
    callers
}

/// `ruby_global_symbols`' address, from the code of `rb_id2str` and of the
/// function it jumps to.
pub fn global_symbols<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
    functions: &Functions,
) -> Option<u64> {
    let id2str = elf
        .dynamic_symbols()
        .find(|s| s.name() == Ok("rb_id2str") && !s.is_undefined())?
        .address();
    let code = code_at(elf, id2str, SCAN_BYTES)?;
    if let Some(found) = compare_and_load(id2str, &code) {
        return Some(found);
    }
    // `rb_id2str` is a tail call to the lookup: `jmp rel32` to a function start.
    (0..code.len().saturating_sub(5)).find_map(|i| {
        if code[i] != 0xe9 {
            return None;
        }
        let displacement = i32::from_le_bytes(code[i + 1..i + 5].try_into().ok()?);
        let target = (id2str + i as u64 + 5).checked_add_signed(i64::from(displacement))?;
        if functions.containing(target)?.start != target {
            return None;
        }
        compare_and_load(target, &code_at(elf, target, SCAN_BYTES)?)
    })
}

/// `len` bytes of code at `address`, cut at the end of its section.
fn code_at<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
    address: u64,
    len: u64,
) -> Option<Vec<u8>> {
    elf.sections().find_map(|s| {
        let end = s.address() + s.size();
        if s.kind() != SectionKind::Text || address < s.address() || address >= end {
            return None;
        }
        let len = len.min(end - address);
        s.data_range(address, len)
            .ok()
            .flatten()
            .map(<[u8]>::to_vec)
    })
}

/// The address `A` of a RIP-relative `cmp r32, A` in `code` (at `at`) that
/// a RIP-relative 64-bit load of `A + 16` follows.
fn compare_and_load(at: u64, code: &[u8]) -> Option<u64> {
    let rip_target = |end_of_disp: usize| -> Option<u64> {
        let disp = code.get(end_of_disp - 4..end_of_disp)?;
        let disp = i32::from_le_bytes(disp.try_into().ok()?);
        (at + end_of_disp as u64).checked_add_signed(i64::from(disp))
    };
    let is_rip = |modrm: u8| modrm & 0xc7 == 0x05;
    for i in 0..code.len() {
        // Optional REX (not W), then `cmp r/m32, r32` (39) or `cmp r32, r/m32` (3b).
        let op = if (0x40..=0x47).contains(&code[i]) {
            i + 1
        } else {
            i
        };
        let (Some(&opcode), Some(&modrm)) = (code.get(op), code.get(op + 1)) else {
            break;
        };
        if !matches!(opcode, 0x39 | 0x3b) || !is_rip(modrm) {
            continue;
        }
        let Some(last_id) = rip_target(op + 6) else {
            continue;
        };
        // A REX.W `mov r64, [rip + disp]` of `last_id + 16` after it.
        let loads_ids = (op + 6..code.len().saturating_sub(7)).any(|j| {
            code[j] & 0xf8 == 0x48
                && code[j + 1] == 0x8b
                && is_rip(code[j + 2])
                && rip_target(j + 7) == Some(last_id + IDS_FIELD)
        });
        if loads_ids {
            return Some(last_id);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_are_found_by_address() {
        let f = Functions::new(vec![0x30..0x40, 0x10..0x20, 0x50..0x50]);
        assert_eq!(f.containing(0x10), Some(&(0x10..0x20)));
        assert_eq!(f.containing(0x1f), Some(&(0x10..0x20)));
        assert_eq!(f.containing(0x20), None);
        assert_eq!(f.containing(0x3f), Some(&(0x30..0x40)));
        assert_eq!(f.containing(0x50), None);
        assert_eq!(f.containing(0x5), None);
    }

    #[test]
    fn the_symbol_table_is_found_from_a_compare_and_a_load() {
        // 3.4.11's lookup: `cmp %edi,0x27f6aa(%rip)`, then
        // `mov 0x27f6b1(%rip),%rdi`, with other code around them.
        let at = 0x25cad0;
        let code = [
            0x39, 0x3d, 0xaa, 0xf6, 0x27, 0x00, // cmp
            0x72, 0xd6, // jb
            0x48, 0x8b, 0x3d, 0xb1, 0xf6, 0x27, 0x00, // mov
            0x89, 0xd6,
        ];
        assert_eq!(compare_and_load(at, &code), Some(0x4dc180));
        // A load of another address is no match.
        let mut other = code;
        other[11] = 0xb9;
        assert_eq!(compare_and_load(at, &other), None);
        assert_eq!(compare_and_load(at, &[0x39]), None);
    }
}
