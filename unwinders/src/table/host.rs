//! A host unwinder over [`UnwindTable`]s: the loop the BPF program runs,
//! with the same [`find_row`](crate::native::find_row) (through
//! [`UnwindTable::lookup`]) and [`dwarf_step`] per frame.

use std::sync::Arc;
use std::vec::Vec;

use object::{Object, ObjectSegment};

use super::UnwindTable;
use super::cfi::NO_INFO;
use crate::native::dwarf::{CfaRule, dwarf_step};
use crate::{MemoryReader, Registers, StepOutcome};

/// One executable mapping of a process and the table of its file.
#[derive(Debug, Clone)]
pub struct Mapping {
    /// First address of the mapping.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
    /// Load bias: process address minus ELF virtual address (see [`elf_load_bias`]).
    pub bias: u64,
    /// The mapped file's table.
    pub table: Arc<UnwindTable>,
}

/// The executable mappings of one process, sorted and non-overlapping.
#[derive(Debug, Clone, Default)]
pub struct AddressSpace {
    mappings: Vec<Mapping>,
}

impl AddressSpace {
    /// An address space with no mappings (every frame falls back to frame pointers).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a mapping; refused (`false`) when empty or overlapping another.
    pub fn insert(&mut self, mapping: Mapping) -> bool {
        if mapping.start >= mapping.end {
            return false;
        }
        let at = self.mappings.partition_point(|m| m.start < mapping.start);
        let overlaps_previous = at > 0 && self.mappings[at - 1].end > mapping.start;
        let overlaps_next = self.mappings.get(at).is_some_and(|m| m.start < mapping.end);
        if overlaps_previous || overlaps_next {
            return false;
        }
        self.mappings.insert(at, mapping);
        true
    }

    /// The mapping containing `address`.
    pub fn find(&self, address: u64) -> Option<&Mapping> {
        let at = self.mappings.partition_point(|m| m.start <= address);
        let mapping = self.mappings.get(at.checked_sub(1)?)?;
        (address < mapping.end).then_some(mapping)
    }

    /// The mappings, sorted by address.
    pub fn mappings(&self) -> &[Mapping] {
        &self.mappings
    }

    /// The row for `address` (the address itself for the first frame, the
    /// return address - 1 for callers); `NoInfo` where no table covers it.
    pub fn row_for(&self, address: u64) -> crate::native::UnwindRow {
        self.find(address)
            .and_then(|m| m.table.lookup(address.wrapping_sub(m.bias)))
            .unwrap_or(NO_INFO)
    }
}

/// The load bias of a mapping of an ELF file: the mapping at `map_start`
/// maps the file from `map_offset` (both as `/proc/PID/maps` shows them);
/// `None` when no loadable segment contains that offset.
pub fn elf_load_bias(elf: &[u8], map_start: u64, map_offset: u64) -> Option<u64> {
    const PF_X: u32 = 1;
    let file = object::File::parse(elf).ok()?;
    let mut found: Option<(bool, u64)> = None;
    for segment in file.segments() {
        let (offset, size) = segment.file_range();
        // Segments start mid-page; their mappings start at the page below.
        let page_offset = offset & !0xfff;
        if map_offset < page_offset || map_offset >= offset.saturating_add(size.max(1)) {
            continue;
        }
        let vaddr = segment
            .address()
            .wrapping_sub(offset)
            .wrapping_add(map_offset);
        let executable =
            matches!(segment.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & PF_X != 0);
        // Two segments can share a page: prefer the executable one.
        if found.is_none_or(|(was_executable, _)| executable && !was_executable) {
            found = Some((executable, map_start.wrapping_sub(vaddr)));
        }
    }
    found.map(|(_, bias)| bias)
}

/// One unwound frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// The instruction pointer: the sampled one first, return addresses after.
    pub ip: u64,
    /// The rule the step out of this frame used (`NoInfo` and `Unsupported`
    /// fell back to frame pointers).
    pub rule: CfaRule,
}

/// Why an unwind stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The outermost frame was reached.
    EndOfStack,
    /// Memory a step needed could not be read.
    ReadFailed,
    /// A step found a corrupt frame.
    InvalidFrame,
    /// `max_frames` frames were unwound.
    FrameLimit,
}

/// The result of [`unwind_detailed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unwound {
    /// The frames, leaf first.
    pub frames: Vec<Frame>,
    /// Why the walk stopped.
    pub stop: StopReason,
}

/// Unwinds from `regs` through `memory`, returning the instruction pointers
/// (leaf first, then return addresses), at most `max_frames` of them.
pub fn unwind<M: MemoryReader>(
    regs: Registers,
    memory: &mut M,
    space: &AddressSpace,
    max_frames: usize,
) -> Vec<u64> {
    unwind_detailed(regs, memory, space, max_frames)
        .frames
        .iter()
        .map(|f| f.ip)
        .collect()
}

/// [`unwind`], also telling how each frame was stepped and why it stopped.
///
/// Per frame: find the mapping of the lookup address (`ip`, or `ip - 1` for
/// callers so a call at a function's end finds the function's row), take
/// the table row for `address - bias` (`NoInfo` when there is none), then
/// [`dwarf_step`]. Every step moves the stack pointer up (or fails), so the
/// walk ends even on corrupt stacks.
pub fn unwind_detailed<M: MemoryReader>(
    regs: Registers,
    memory: &mut M,
    space: &AddressSpace,
    max_frames: usize,
) -> Unwound {
    let mut regs = regs;
    let mut frames = Vec::new();
    let stop = loop {
        if frames.len() >= max_frames {
            break StopReason::FrameLimit;
        }
        let address = if frames.is_empty() {
            regs.ip
        } else {
            regs.ip.wrapping_sub(1)
        };
        let row = space.row_for(address);
        frames.push(Frame {
            ip: regs.ip,
            rule: row.cfa_rule(),
        });
        match dwarf_step(&mut regs, row, memory) {
            StepOutcome::Caller => {}
            StepOutcome::EndOfStack => break StopReason::EndOfStack,
            StepOutcome::ReadFailed => break StopReason::ReadFailed,
            StepOutcome::InvalidFrame => break StopReason::InvalidFrame,
        }
    };
    Unwound { frames, stop }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::dwarf::{RbpRule, UnwindRow};
    use std::vec;

    struct Stack {
        base: u64,
        words: Vec<u64>,
    }

    impl MemoryReader for Stack {
        fn read_u64(&mut self, address: u64) -> Option<u64> {
            let index = address.checked_sub(self.base)? / 8;
            self.words.get(usize::try_from(index).ok()?).copied()
        }
    }

    #[test]
    fn walks_rsp_frames_through_two_mappings() {
        // Module A (bias 0x1000_0000): f at 0x100..0x200 with CFA = rsp + 16.
        // Module B (bias 0x2000_0000): g at 0x100..0x200 with CFA = rsp + 8,
        // then the outermost frame.
        let a = UnwindTable::from_rows(vec![
            UnwindRow::new(0x100, CfaRule::Rsp, 16, RbpRule::Unchanged, 0),
            UnwindRow::new(0x200, CfaRule::NoInfo, 0, RbpRule::Unchanged, 0),
        ])
        .unwrap();
        let b = UnwindTable::from_rows(vec![
            UnwindRow::new(0x100, CfaRule::Rsp, 8, RbpRule::Unchanged, 0),
            UnwindRow::new(0x180, CfaRule::EndOfStack, 0, RbpRule::Unchanged, 0),
        ])
        .unwrap();
        let mut space = AddressSpace::new();
        assert!(space.insert(Mapping {
            start: 0x2000_0000,
            end: 0x2000_1000,
            bias: 0x2000_0000,
            table: Arc::new(b),
        }));
        assert!(space.insert(Mapping {
            start: 0x1000_0000,
            end: 0x1000_1000,
            bias: 0x1000_0000,
            table: Arc::new(a.clone()),
        }));
        assert!(!space.insert(Mapping {
            start: 0x1000_0800,
            end: 0x1000_2000,
            bias: 0,
            table: Arc::new(a),
        }));
        // f's frame: [sp]=local, [sp+8]=return into g (0x2000_0150);
        // g's frame: [sp+16]=return into g's outermost row (0x2000_0181).
        let base = 0x7000;
        let mut stack = Stack {
            base,
            words: vec![0, 0x2000_0150, 0x2000_0181, 0],
        };
        let regs = Registers {
            ip: 0x1000_0150,
            sp: base,
            bp: 0,
        };
        let unwound = unwind_detailed(regs, &mut stack, &space, 16);
        assert_eq!(
            unwound.frames.iter().map(|f| f.ip).collect::<Vec<_>>(),
            [0x1000_0150, 0x2000_0150, 0x2000_0181]
        );
        assert_eq!(
            unwound.frames.iter().map(|f| f.rule).collect::<Vec<_>>(),
            [CfaRule::Rsp, CfaRule::Rsp, CfaRule::EndOfStack]
        );
        assert_eq!(unwound.stop, StopReason::EndOfStack);
        assert_eq!(
            unwind(regs, &mut stack, &space, 2),
            [0x1000_0150, 0x2000_0150]
        );
    }
}
