//! The BPF program array: which unwinder runs next.
//!
//! The perf-event entry program (`on_cpu_sample`) is attached to the CPUs, not
//! stored in the array. It fills the sample's fixed part and tail-calls
//! [`ProgramIndex::NativeUnwinder`]; unwinders tail-call themselves to
//! continue, and each other at runtime boundaries (see [`crate::runtime`]).
//! The native unwinder and the emitter must load; each runtime's program is
//! optional (its slot stays empty when the kernel rejects it).

/// Slots of the `PROGRAMS` program array.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProgramIndex {
    /// Walks native user frames.
    NativeUnwinder = 0,
    /// Copies the finished sample into the ring buffer.
    Emit = 1,
    /// Walks CPython frames (see [`crate::python`]).
    Python = 2,
    /// Walks native user frames from registers a runtime handed back (see
    /// [`crate::runtime::resume`]): the native unwinder built with the
    /// resume logic, so that [`ProgramIndex::NativeUnwinder`]'s frames,
    /// almost all of them, carry none of it.
    NativeResumed = 3,
    /// Walks CRuby control frames (see [`crate::ruby`]).
    Ruby = 4,
    /// Walks HotSpot's Java frames (see [`crate::hotspot`]).
    HotSpot = 5,
    /// Walks V8's JavaScript frames (see [`crate::v8`]).
    V8 = 6,
    /// Walks PHP's frames (see [`crate::php`]).
    Php = 7,
    /// Walks Perl's contexts (see [`crate::perl`]).
    Perl = 8,
}

impl ProgramIndex {
    /// The slots every sample needs, with the names of their BPF programs.
    /// Runtime programs are listed in [`crate::runtime::BPF_RUNTIMES`].
    pub const REQUIRED: [(ProgramIndex, &'static str); 3] = [
        (ProgramIndex::NativeUnwinder, "unwind_native"),
        (ProgramIndex::Emit, "emit_sample"),
        (ProgramIndex::NativeResumed, "unwind_native_resumed"),
    ];
}

/// Number of slots in the program array.
pub const PROGRAM_COUNT: u32 = 9;

/// Tail calls one sample may use. The kernel allows 33 per chain (32 before
/// 5.17); keeping a margin leaves room for the final jump to `Emit`.
pub const MAX_TAIL_CALLS: u32 = 29;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_is_filled_by_one_program() {
        let mut slots: [bool; PROGRAM_COUNT as usize] = [false; PROGRAM_COUNT as usize];
        let runtimes = crate::runtime::BPF_RUNTIMES.map(|r| r.program);
        for index in ProgramIndex::REQUIRED
            .map(|(i, _)| i)
            .iter()
            .chain(&runtimes)
        {
            assert!(!slots[*index as usize], "{index:?} twice");
            slots[*index as usize] = true;
        }
        assert!(slots.iter().all(|&s| s), "an empty slot");
    }
}
