//! Native (machine-code) unwinding steps.

pub mod chunks;
pub mod dwarf;
pub mod frame_pointer;
pub mod mappings;
pub mod row_cache;

pub use chunks::{ChunkLayout, UnwindChunk, find_row};
pub use dwarf::{CfaRule, RbpRule, UnwindRow, dwarf_step};
pub use frame_pointer::frame_pointer_step;
pub use mappings::{
    EarlyEndThreads, MappingEntry, ProcessMappingTable, ProcessSlotCache, ProcessSlotEntry,
};
pub use row_cache::{ROW_CACHE_ENTRIES, RowCache, RowCacheEntry};

/// The registers an x86-64 unwind step needs.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Registers {
    /// Instruction pointer.
    pub ip: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer (rbp).
    pub bp: u64,
}

/// The result of unwinding one frame. The step updates the registers in
/// place, and only on [`StepOutcome::Caller`]: a payload-free result keeps
/// the BPF code free of values left undefined on some paths, which older
/// verifiers (5.10) reject when they are spilled and reloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepOutcome {
    /// The registers now hold the caller's; its `ip` is a return address.
    Caller,
    /// The outermost frame was reached.
    EndOfStack,
    /// Memory the step needed could not be read.
    ReadFailed,
    /// The registers or the frame contents break the stack discipline.
    InvalidFrame,
}
