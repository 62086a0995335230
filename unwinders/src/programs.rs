//! The BPF program array: which unwinder runs next.
//!
//! The perf-event entry program (`on_cpu_sample`) is attached to the CPUs, not
//! stored in the array. It fills the sample's fixed part and tail-calls
//! [`ProgramIndex::NativeUnwinder`]; unwinders tail-call themselves to continue
//! and [`ProgramIndex::Emit`] when the stack is complete. Interpreter unwinders
//! get their own slots here.

/// Slots of the `PROGRAMS` program array.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramIndex {
    /// Walks native user frames.
    NativeUnwinder = 0,
    /// Copies the finished sample into the ring buffer.
    Emit = 1,
    /// Walks CPython frames (see [`crate::python`]).
    Python = 2,
}

impl ProgramIndex {
    /// Every slot with the name of the BPF program that fills it.
    pub const ALL: [(ProgramIndex, &'static str); PROGRAM_COUNT as usize] = [
        (ProgramIndex::NativeUnwinder, "unwind_native"),
        (ProgramIndex::Emit, "emit_sample"),
        (ProgramIndex::Python, "unwind_python"),
    ];
}

/// Number of slots in the program array.
pub const PROGRAM_COUNT: u32 = 3;

/// Tail calls one sample may use. The kernel allows 33 per chain (32 before
/// 5.17); keeping a margin leaves room for the final jump to `Emit`.
pub const MAX_TAIL_CALLS: u32 = 29;
