//! Procedure linkage tables: the `.plt` CFA expression, and rows for PLT
//! sections no FDE describes (lld emits none; nor does GNU ld with
//! `--no-ld-generated-unwind-info`).
//!
//! A lazy `.plt` is 16-byte entries. Entry 0 (PLT0) is entered with the
//! entry's index already pushed (CFA = rsp + 16) and pushes once more
//! (rsp + 24 after that push). Every other entry is entered by a call
//! (CFA = rsp + 8) and pushes its index once (rsp + 16 after the push). GNU
//! ld describes the entries with one expression, CFA = rsp + 8 +
//! 8 × ((rip & 15) >= K), where K is where the push ends: 11 for the classic
//! entry (`jmp *GOT; push $i; jmp PLT0`), 9 with IBT (`endbr64; push $i;
//! bnd jmp PLT0`), 5 with MPX (`push $i; bnd jmp PLT0`) and 10 for
//! MPX+IBT. [`dwarf_step`](crate::native::dwarf_step)'s `Plt` rule
//! hardcodes K = 11, so other thresholds become two `Rsp` rows per entry.
//!
//! `.plt.got` and `.plt.sec` entries only jump (`[endbr64;] [bnd] jmp *GOT`):
//! CFA = rsp + 8 throughout.

use core::ops::Range;

use gimli::constants::{
    DW_OP_and, DW_OP_breg7, DW_OP_breg16, DW_OP_ge, DW_OP_lit0, DW_OP_lit3, DW_OP_lit15,
    DW_OP_lit31, DW_OP_plus, DW_OP_shl,
};
use object::{Object, ObjectSection};

use super::TableError;
use super::cfi::{Collector, NO_INFO, Source};
use crate::native::dwarf::{CfaRule, RbpRule, UnwindRow};

/// The threshold [`CfaRule::Plt`] rows apply.
pub(super) const PLT_RULE_THRESHOLD: u8 = 11;

/// PLT entries one expression row may expand to; beyond this (a corrupt
/// FDE) the row is `Unsupported` rather than millions of rows.
const MAX_EXPANDED_ENTRIES: u64 = 1 << 16;

const ENTRY_SIZE: u64 = 16;
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

const fn rsp(offset: u16) -> UnwindRow {
    UnwindRow::new(0, CfaRule::Rsp, offset, RbpRule::Unchanged, 0)
}

/// K of a `.plt` CFA expression `DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15;
/// DW_OP_and; DW_OP_lit<K>; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`, or
/// `None` for any other expression.
pub(super) fn expression_threshold(expression: &[u8]) -> Option<u8> {
    const BREG7: u8 = DW_OP_breg7.0;
    const BREG16: u8 = DW_OP_breg16.0;
    const LIT15: u8 = DW_OP_lit15.0;
    const AND: u8 = DW_OP_and.0;
    const GE: u8 = DW_OP_ge.0;
    const LIT3: u8 = DW_OP_lit3.0;
    const SHL: u8 = DW_OP_shl.0;
    const PLUS: u8 = DW_OP_plus.0;
    match *expression {
        // The SLEB128 operands 8 and 0 are one byte each.
        [BREG7, 8, BREG16, 0, LIT15, AND, lit, GE, LIT3, SHL, PLUS]
            if (DW_OP_lit0.0..=DW_OP_lit31.0).contains(&lit) =>
        {
            Some(lit - DW_OP_lit0.0)
        }
        _ => None,
    }
}

/// Rows for `range` under the `.plt` expression with `threshold`; `template`
/// (an `Rsp` + 8 row) carries the rbp rule.
pub(super) fn expand(
    collector: &mut Collector,
    first: usize,
    range: Range<u64>,
    threshold: u8,
    template: UnwindRow,
) -> Result<(), TableError> {
    let pushed = UnwindRow {
        cfa_offset: 16,
        ..template
    };
    if threshold == PLT_RULE_THRESHOLD {
        let plt = UnwindRow::new(0, CfaRule::Plt, 0, template.rbp_rule(), template.rbp_offset);
        return collector.push(first, range.start, plt);
    }
    if threshold == 0 {
        return collector.push(first, range.start, pushed);
    }
    if (range.end - range.start) / ENTRY_SIZE > MAX_EXPANDED_ENTRIES {
        let unsupported = UnwindRow::new(0, CfaRule::Unsupported, 0, RbpRule::Unchanged, 0);
        return collector.push(first, range.start, unsupported);
    }
    let mut entry = range.start & !(ENTRY_SIZE - 1);
    while entry < range.end {
        let switch = entry + u64::from(threshold);
        let from = entry.max(range.start);
        collector.push(first, from, if from < switch { template } else { pushed })?;
        if from < switch && switch < range.end && switch < entry + ENTRY_SIZE {
            collector.push(first, switch, pushed)?;
        }
        entry += ENTRY_SIZE;
    }
    Ok(())
}

/// Where the push of a PLT entry (or of PLT0) ends, from its first bytes:
/// `[endbr64] [[bnd] jmp *GOT(%rip)] push $imm32 | push GOT(%rip)`.
fn push_end(entry: &[u8]) -> Option<u8> {
    let mut at = 0;
    if entry.starts_with(&ENDBR64) {
        at = 4;
    }
    let rest = entry.get(at..)?;
    if rest.starts_with(&[0xff, 0x25]) {
        at += 6;
    } else if rest.starts_with(&[0xf2, 0xff, 0x25]) {
        at += 7;
    }
    match entry.get(at..)? {
        [0x68, ..] => Some(at as u8 + 5),
        [0xff, 0x35, ..] => Some(at as u8 + 6),
        _ => None,
    }
}

/// Adds a segment for each PLT section; overlaps with FDEs are resolved later
/// (FDEs win).
pub(super) fn synthesize<'data, R: object::ReadRef<'data>>(
    file: &object::File<'data, R>,
    collector: &mut Collector,
) -> Result<(), TableError> {
    for name in [".plt", ".plt.got", ".plt.sec"] {
        let Some(section) = file.section_by_name(name) else {
            continue;
        };
        let (start, size) = (section.address(), section.size());
        let Some(end) = start.checked_add(size) else {
            continue;
        };
        let first = collector.begin();
        if name == ".plt" {
            lazy_plt(collector, first, start, section.data().unwrap_or(&[]))?;
        } else {
            collector.push(first, start, rsp(8))?;
        }
        collector.finish(first, start, end, Source::Plt);
    }
    Ok(())
}

/// Rows of a lazy `.plt` decoded from its bytes; nothing when its layout is
/// not the 16-byte one.
fn lazy_plt(
    collector: &mut Collector,
    first: usize,
    start: u64,
    data: &[u8],
) -> Result<(), TableError> {
    if data.is_empty() || !(data.len() as u64).is_multiple_of(ENTRY_SIZE) {
        return Ok(());
    }
    let aligned = start.is_multiple_of(ENTRY_SIZE);
    for (index, entry) in data.chunks_exact(ENTRY_SIZE as usize).enumerate() {
        let at = start + index as u64 * ENTRY_SIZE;
        let push = push_end(entry);
        let (before, after) = if index == 0 {
            (rsp(16), rsp(24))
        } else {
            (rsp(8), rsp(16))
        };
        match push {
            None => collector.push(first, at, NO_INFO)?,
            Some(PLT_RULE_THRESHOLD) if index > 0 && aligned => {
                let plt = UnwindRow::new(0, CfaRule::Plt, 0, RbpRule::Unchanged, 0);
                collector.push(first, at, plt)?;
            }
            Some(end) => {
                collector.push(first, at, before)?;
                collector.push(first, at + u64::from(end), after)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_the_plt_expressions() {
        let classic = [0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
        assert_eq!(expression_threshold(&classic), Some(11));
        let mut ibt = classic;
        ibt[6] = 0x39;
        assert_eq!(expression_threshold(&ibt), Some(9));
        let mut other = classic;
        other[1] = 16;
        assert_eq!(expression_threshold(&other), None);
        assert_eq!(expression_threshold(&classic[..10]), None);
    }

    #[test]
    fn decodes_entry_pushes() {
        let classic = [0xff, 0x25, 1, 2, 3, 4, 0x68, 0, 0, 0, 0, 0xe9, 0, 0, 0, 0];
        assert_eq!(push_end(&classic), Some(11));
        let plt0 = [
            0xff, 0x35, 1, 2, 3, 4, 0xff, 0x25, 1, 2, 3, 4, 0x0f, 0x1f, 0x40, 0,
        ];
        assert_eq!(push_end(&plt0), Some(6));
        let ibt = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x68, 0, 0, 0, 0, 0xf2, 0xe9, 0, 0, 0, 0, 0x90,
        ];
        assert_eq!(push_end(&ibt), Some(9));
        let bnd = [
            0x68, 0, 0, 0, 0, 0xf2, 0xe9, 0, 0, 0, 0, 0x0f, 0x1f, 0x44, 0, 0,
        ];
        assert_eq!(push_end(&bnd), Some(5));
        assert_eq!(push_end(&[0x90; 16]), None);
    }
}
