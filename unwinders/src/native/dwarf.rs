//! The DWARF CFI step: unwind tables built from `.eh_frame`/`.debug_frame`
//! in user space, compacted to 8-byte [`UnwindRow`]s that BPF searches (in
//! the chunked layout of [`super::chunks`]).
//!
//! A row says how to find the caller for every PC from its `pc` up to the next
//! row's: the canonical frame address (CFA) from rsp or rbp plus an offset,
//! the return address at CFA - 8 (always so on x86-64, or the row is marked
//! unsupported), and the caller's rbp either unchanged or saved at
//! CFA + 8 × `rbp_offset`. What cannot be expressed is marked, so BPF stops
//! or falls back to frame pointers instead of guessing.

use super::{Registers, StepOutcome, frame_pointer::bad_return_address, frame_pointer_step};
use crate::{MemoryReader, runtime::USER_ADDRESS_END};

/// How the CFA of a row is found.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CfaRule {
    /// No FDE covers these PCs: fall back to frame pointers.
    NoInfo = 0,
    /// CFA = rsp + offset.
    Rsp = 1,
    /// CFA = rbp + offset.
    Rbp = 2,
    /// The `.plt` expression: CFA = rsp + 8, plus 8 once the PLT entry pushed its index
    /// (`(rip & 15) >= 11`).
    Plt = 3,
    /// The return address is undefined: the outermost frame (e.g. `_start`).
    EndOfStack = 4,
    /// A rule this table cannot express (a DWARF expression, a huge offset): fall back to frame pointers.
    Unsupported = 5,
    /// CFA = *(rsp + offset) + addend (hand-written assembly such as
    /// OpenSSL's, which saves the caller's rsp in its frame); see
    /// [`UnwindRow::deref_parts`].
    RspDeref = 6,
    /// CFA = *(rbp + offset) + addend (GCC's stack realignment, OpenSSL).
    RbpDeref = 7,
    /// A signal frame (`__restore_rt`): the interrupted rip, rsp and rbp are
    /// in the `ucontext` at rsp, at the offsets of [`signal_frame`].
    SignalFrame = 8,
}

/// Where the kernel's x86-64 signal frame keeps the interrupted registers,
/// from rsp in `__restore_rt` (the `ucontext`'s `mcontext` starts at 40).
pub mod signal_frame {
    /// Offset of the saved rbp.
    pub const RBP: u64 = 120;
    /// Offset of the saved rsp.
    pub const RSP: u64 = 160;
    /// Offset of the saved rip.
    pub const RIP: u64 = 168;
}

/// How the caller's rbp is found.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RbpRule {
    /// rbp was not changed by this function.
    Unchanged = 0,
    /// The caller's rbp is saved at CFA + 8 × `rbp_offset`.
    CfaOffset = 1,
}

/// One row of an unwind table. Tables are sorted by `pc`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct UnwindRow {
    /// First ELF virtual address the row covers.
    pub pc: u32,
    /// [`CfaRule`] in bits 0..4, [`RbpRule`] in bits 4..8.
    pub rules: u8,
    /// Where the caller's rbp is saved, in 8-byte words from the CFA.
    pub rbp_offset: i8,
    /// Offset added to the CFA's base register.
    pub cfa_offset: u16,
}

const _: () = assert!(core::mem::size_of::<UnwindRow>() == 8);

impl UnwindRow {
    /// A row from its parts.
    pub const fn new(pc: u32, cfa: CfaRule, cfa_offset: u16, rbp: RbpRule, rbp_offset: i8) -> Self {
        UnwindRow {
            pc,
            rules: (cfa as u8) | ((rbp as u8) << 4),
            rbp_offset,
            cfa_offset,
        }
    }

    /// The CFA rule (unknown encodings read as [`CfaRule::Unsupported`]).
    pub const fn cfa_rule(self) -> CfaRule {
        match self.rules & 0x0f {
            0 => CfaRule::NoInfo,
            1 => CfaRule::Rsp,
            2 => CfaRule::Rbp,
            3 => CfaRule::Plt,
            4 => CfaRule::EndOfStack,
            6 => CfaRule::RspDeref,
            7 => CfaRule::RbpDeref,
            8 => CfaRule::SignalFrame,
            _ => CfaRule::Unsupported,
        }
    }

    /// A `RspDeref`/`RbpDeref` row: CFA = *(base + offset) + addend, both
    /// multiples of 8 (offset in -1024..1024, addend below 2048); `None`
    /// when they do not fit.
    pub fn deref(
        pc: u32,
        base: CfaRule,
        offset: i64,
        addend: u64,
        rbp: RbpRule,
        rbp_offset: i8,
    ) -> Option<Self> {
        if !matches!(base, CfaRule::RspDeref | CfaRule::RbpDeref)
            || offset % 8 != 0
            || !addend.is_multiple_of(8)
        {
            return None;
        }
        let words = i8::try_from(offset / 8).ok()?;
        let addend_words = u8::try_from(addend / 8).ok()?;
        let packed = u16::from(words as u8) | (u16::from(addend_words) << 8);
        Some(UnwindRow::new(pc, base, packed, rbp, rbp_offset))
    }

    /// The (offset, addend) of a `RspDeref`/`RbpDeref` row, in bytes: the
    /// low byte of `cfa_offset` is the offset in signed words, the high byte
    /// the addend in words.
    pub const fn deref_parts(self) -> (i64, u64) {
        let words = (self.cfa_offset & 0xff) as u8 as i8;
        ((words as i64) * 8, ((self.cfa_offset >> 8) as u64) * 8)
    }

    /// The rbp rule (unknown encodings read as unchanged).
    pub const fn rbp_rule(self) -> RbpRule {
        match self.rules >> 4 {
            1 => RbpRule::CfaOffset,
            _ => RbpRule::Unchanged,
        }
    }
}

/// Rows per table at most: 2^24, larger than any executable's.
pub const MAX_TABLE_ROWS: u32 = 1 << 24;

/// Unwinds one frame with `row`, the table row covering `regs.ip` (or, for a
/// caller frame, `regs.ip - 1`: the call, not the instruction after it). On
/// [`StepOutcome::Caller`] `regs` holds the caller's registers; otherwise it
/// is unchanged.
#[inline(always)]
pub fn dwarf_step<M: MemoryReader>(
    regs: &mut Registers,
    row: UnwindRow,
    memory: &mut M,
) -> StepOutcome {
    let offset = u64::from(row.cfa_offset);
    let cfa = match row.cfa_rule() {
        CfaRule::RspDeref | CfaRule::RbpDeref => {
            let base = if row.cfa_rule() == CfaRule::RspDeref {
                regs.sp
            } else {
                regs.bp
            };
            if base == 0 {
                return StepOutcome::InvalidFrame;
            }
            let (at, addend) = row.deref_parts();
            let Some(value) = memory.read_u64(base.wrapping_add_signed(at)) else {
                return StepOutcome::ReadFailed;
            };
            value.wrapping_add(addend)
        }
        CfaRule::SignalFrame => return signal_frame_step(regs, memory),
        CfaRule::Rsp => regs.sp.wrapping_add(offset),
        CfaRule::Rbp => {
            if regs.bp == 0 {
                return StepOutcome::InvalidFrame;
            }
            regs.bp.wrapping_add(offset)
        }
        CfaRule::Plt => regs
            .sp
            .wrapping_add(if regs.ip & 15 >= 11 { 16 } else { 8 }),
        CfaRule::EndOfStack => return StepOutcome::EndOfStack,
        CfaRule::NoInfo | CfaRule::Unsupported => return frame_pointer_step(regs, memory),
    };
    // The caller's frame lies above ours: a CFA at or below rsp is corrupt.
    if cfa <= regs.sp {
        return StepOutcome::InvalidFrame;
    }
    let Some(return_address) = memory.read_u64(cfa - 8) else {
        return StepOutcome::ReadFailed;
    };
    if let Some(end) = bad_return_address(return_address) {
        return end;
    }
    let bp = match row.rbp_rule() {
        RbpRule::Unchanged => regs.bp,
        RbpRule::CfaOffset => {
            let at = cfa.wrapping_add_signed(i64::from(row.rbp_offset) * 8);
            let Some(bp) = memory.read_u64(at) else {
                return StepOutcome::ReadFailed;
            };
            bp
        }
    };
    regs.ip = return_address;
    regs.sp = cfa;
    regs.bp = bp;
    StepOutcome::Caller
}

/// Steps out of a signal frame: the interrupted code's registers, as the
/// kernel saved them. The interrupted rsp may lie anywhere (the handler can
/// run on an alternate stack), so it is not checked against ours.
#[inline(always)]
fn signal_frame_step<M: MemoryReader>(regs: &mut Registers, memory: &mut M) -> StepOutcome {
    let (Some(ip), Some(sp), Some(bp)) = (
        memory.read_u64(regs.sp.wrapping_add(signal_frame::RIP)),
        memory.read_u64(regs.sp.wrapping_add(signal_frame::RSP)),
        memory.read_u64(regs.sp.wrapping_add(signal_frame::RBP)),
    ) else {
        return StepOutcome::ReadFailed;
    };
    if ip == 0 || ip >= USER_ADDRESS_END || sp == 0 {
        return StepOutcome::InvalidFrame;
    }
    regs.ip = ip;
    regs.sp = sp;
    regs.bp = bp;
    StepOutcome::Caller
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Words {
        base: u64,
        words: [u64; 8],
    }

    impl MemoryReader for Words {
        fn read_u64(&mut self, address: u64) -> Option<u64> {
            let i = address.checked_sub(self.base)? / 8;
            self.words.get(usize::try_from(i).ok()?).copied()
        }
    }

    /// The step's outcome and the registers it left.
    fn step(regs: Registers, row: UnwindRow, mem: &mut Words) -> (StepOutcome, Registers) {
        let mut regs = regs;
        (dwarf_step(&mut regs, row, mem), regs)
    }

    #[test]
    fn row_packs_its_rules() {
        let row = UnwindRow::new(0x1234, CfaRule::Rbp, 16, RbpRule::CfaOffset, -2);
        assert_eq!(row.cfa_rule(), CfaRule::Rbp);
        assert_eq!(row.rbp_rule(), RbpRule::CfaOffset);
        assert_eq!(
            UnwindRow { rules: 0x0f, ..row }.cfa_rule(),
            CfaRule::Unsupported
        );
    }

    #[test]
    fn steps_through_an_rsp_frame_with_saved_rbp() {
        // Frame: [sp+0]=local, [sp+8]=saved rbp, [sp+16]=return address; CFA = sp+24.
        let base = 0x7000;
        let mut mem = Words {
            base,
            words: [0, 0x7777, 0x40_1234, 0, 0, 0, 0, 0],
        };
        let row = UnwindRow::new(0, CfaRule::Rsp, 24, RbpRule::CfaOffset, -2);
        let regs = Registers {
            ip: 0x40_0000,
            sp: base,
            bp: 1,
        };
        assert_eq!(
            step(regs, row, &mut mem),
            (
                StepOutcome::Caller,
                Registers {
                    ip: 0x40_1234,
                    sp: base + 24,
                    bp: 0x7777
                }
            )
        );
    }

    #[test]
    fn deref_rows_pack_and_step() {
        let row = UnwindRow::deref(0, CfaRule::RspDeref, -8, 8, RbpRule::Unchanged, 0).unwrap();
        assert_eq!(row.cfa_rule(), CfaRule::RspDeref);
        assert_eq!(row.deref_parts(), (-8, 8));
        let far = UnwindRow::deref(0, CfaRule::RbpDeref, 152, 64, RbpRule::Unchanged, 0).unwrap();
        assert_eq!(far.deref_parts(), (152, 64));
        assert_eq!(
            UnwindRow::deref(0, CfaRule::RspDeref, 4, 8, RbpRule::Unchanged, 0),
            None,
            "not a multiple of 8"
        );
        assert_eq!(
            UnwindRow::deref(0, CfaRule::Rsp, 8, 8, RbpRule::Unchanged, 0),
            None
        );
        // OpenSSL: the caller's rsp - 8 saved at [rsp + 8]; CFA = that + 8.
        let base = 0x7000;
        let saved = base + 32; // the caller's CFA - 8
        let mut mem = Words {
            base,
            words: [0, saved, 0, 0, 0x40_5555, 0, 0, 0],
        };
        let row = UnwindRow::deref(0, CfaRule::RspDeref, 8, 8, RbpRule::Unchanged, 0).unwrap();
        let regs = Registers {
            ip: 1,
            sp: base,
            bp: 9,
        };
        assert_eq!(
            step(regs, row, &mut mem),
            (
                StepOutcome::Caller,
                Registers {
                    ip: 0x40_5555,
                    sp: saved + 8,
                    bp: 9
                }
            )
        );
    }

    #[test]
    fn signal_frames_restore_the_interrupted_registers() {
        struct Frame;
        impl MemoryReader for Frame {
            fn read_u64(&mut self, address: u64) -> Option<u64> {
                match address - 0x9000 {
                    signal_frame::RIP => Some(0x40_1111),
                    signal_frame::RSP => Some(0x5000),
                    signal_frame::RBP => Some(0x5040),
                    _ => None,
                }
            }
        }
        let row = UnwindRow::new(0, CfaRule::SignalFrame, 0, RbpRule::Unchanged, 0);
        let mut regs = Registers {
            ip: 0x7f00_0000,
            sp: 0x9000,
            bp: 1,
        };
        // The interrupted stack may be below the handler's (sigaltstack).
        assert_eq!(dwarf_step(&mut regs, row, &mut Frame), StepOutcome::Caller);
        assert_eq!(
            regs,
            Registers {
                ip: 0x40_1111,
                sp: 0x5000,
                bp: 0x5040
            }
        );
    }

    #[test]
    fn plt_rows_and_stops() {
        let base = 0x7000;
        let mut mem = Words {
            base,
            words: [0x40_1000, 0x40_2000, 0, 0, 0, 0, 0, 0],
        };
        let plt = UnwindRow::new(0, CfaRule::Plt, 0, RbpRule::Unchanged, 0);
        let early = Registers {
            ip: 0x1006,
            sp: base,
            bp: 5,
        };
        assert_eq!(
            step(early, plt, &mut mem),
            (
                StepOutcome::Caller,
                Registers {
                    ip: 0x40_1000,
                    sp: base + 8,
                    bp: 5
                }
            )
        );
        let late = Registers {
            ip: 0x100b,
            sp: base,
            bp: 5,
        };
        assert_eq!(
            step(late, plt, &mut mem),
            (
                StepOutcome::Caller,
                Registers {
                    ip: 0x40_2000,
                    sp: base + 16,
                    bp: 5
                }
            )
        );
        let end = UnwindRow::new(0, CfaRule::EndOfStack, 0, RbpRule::Unchanged, 0);
        assert_eq!(step(early, end, &mut mem), (StepOutcome::EndOfStack, early));
        let corrupt = UnwindRow::new(0, CfaRule::Rbp, 16, RbpRule::Unchanged, 0);
        let below = Registers {
            ip: 1,
            sp: base + 64,
            bp: base,
        };
        assert_eq!(
            step(below, corrupt, &mut mem),
            (StepOutcome::InvalidFrame, below)
        );
    }
}
