//! The sample record BPF writes to the ring buffer, and the per-CPU scratch
//! space the programs of one tail-call chain share.

use crate::{
    memory::StackWindow,
    native::{ProcessSlotCache, Registers, RowCache},
    runtime::RuntimeStates,
};

/// Kernel frames kept per sample; `kernel.perf_event_max_stack` defaults to 127.
pub const MAX_KERNEL_FRAMES: usize = 127;
/// User frames kept per sample.
pub const MAX_USER_FRAMES: usize = 512;
/// Capacity of [`SampleRecord::frames`]: kernel frames first, then user frames.
pub const MAX_FRAMES: usize = MAX_KERNEL_FRAMES + 1 + MAX_USER_FRAMES;

/// Processes excluded from profiling at once (`EXCLUDED_PIDS`); more are
/// sampled and their samples dropped in user space.
pub const EXCLUDED_PIDS_MAX: u32 = 16384;

/// CPUs with a sample ring buffer: the size of the per-CPU ring array,
/// indexed by CPU number (higher-numbered CPUs are not sampled).
pub const MAX_CPUS: usize = 4096;

/// Bits of [`SampleHeader::flags`].
pub mod flags {
    /// The sample interrupted kernel code.
    pub const KERNEL_MODE: u32 = 1 << 0;
    /// The user stack was cut at the frame or tail-call limit.
    pub const USER_TRUNCATED: u32 = 1 << 1;
    /// The user walk stopped on an unreadable or invalid frame, not at the stack's end.
    pub const USER_INCOMPLETE: u32 = 1 << 2;
    /// No user registers were available (kernel thread, or `pt_regs` not found).
    pub const NO_USER_REGISTERS: u32 = 1 << 3;
    /// A runtime's frames were cut at the record or tail-call limit.
    pub const INTERPRETER_TRUNCATED: u32 = 1 << 4;
    /// A runtime's walk stopped on unreadable memory.
    pub const INTERPRETER_INCOMPLETE: u32 = 1 << 5;
    /// The start of an off-CPU wait: the stack the thread blocked with, at
    /// `ktime_ns`, the time it blocked. Its weight comes with the end record.
    pub const OFF_CPU: u32 = 1 << 6;
    /// The end of an off-CPU wait: a header alone, for the thread `tid`
    /// whose wait began at `ktime_ns` and lasted `off_cpu_ns`.
    pub const OFF_CPU_END: u32 = 1 << 7;
}

/// Fixed part of a sample.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleHeader {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when the sample was taken.
    pub ktime_ns: u64,
    /// Process ID (tgid).
    pub pid: u32,
    /// Thread ID.
    pub tid: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// [`flags`] bits.
    pub flags: u32,
    /// Kernel frames at the start of `frames`.
    pub kernel_frames: u32,
    /// User words after the kernel frames: native frames' addresses and
    /// runtimes' tagged words, in walk order (see [`crate::runtime`]).
    pub user_words: u32,
    /// For the end of an off-CPU wait ([`flags::OFF_CPU_END`]): how long
    /// the thread was off CPU, in nanoseconds; zero otherwise.
    pub off_cpu_ns: u64,
    /// Thread name (`comm`), NUL-padded.
    pub comm: [u8; 16],
}

/// One sample as written to the ring buffer. Only the header and the
/// `kernel_frames + user_words` used words are sent.
///
/// `frames` holds kernel frames, then user words, each leaf first: native
/// frames' addresses and runtimes' tagged words. The first native frame of
/// the kernel and user parts is the interrupted instruction; the others are
/// return addresses.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SampleRecord {
    /// The fixed part.
    pub header: SampleHeader,
    /// Kernel frames, then user words.
    pub frames: [u64; MAX_FRAMES],
}

impl SampleRecord {
    /// Bytes of a record carrying `frame_count` frames.
    pub const fn wire_size(frame_count: usize) -> usize {
        core::mem::size_of::<SampleHeader>() + frame_count * 8
    }
}

/// Where an unwinder is in the user stack between tail calls.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UnwindState {
    /// Registers of the frame to unwind next.
    pub registers: Registers,
    /// Tail calls used so far by this sample.
    pub tail_calls: u16,
    /// Frames stepped with an unwind table so far (counted once, at emit).
    pub dwarf_frames: u16,
    /// Frames stepped with frame pointers so far (counted once, at emit).
    pub frame_pointer_frames: u16,
    /// Samples this CPU emitted since it last asked the ring buffer how much
    /// data waits. Kept across samples.
    pub samples_since_query: u16,
    /// `bpf_ktime_get_ns() >> 20` (about milliseconds, wrapping) when this
    /// CPU last told user space of a process it does not know. Kept across
    /// samples.
    pub unknown_reported: u16,
    /// What the native unwinder does with `registers` when a runtime hands
    /// back (a [`crate::runtime::resume`] value).
    pub resume: u8,
    /// The deferred runtime program the native walk passed, to run when it
    /// ends; 0 for none (see [`crate::runtime`]).
    pub deferred_program: u8,
    /// 1 once the native walk has ended (a deferred program then walks what
    /// remains of its stack and emits).
    pub native_done: u8,
    /// Zero.
    pub reserved: u8,
    /// The low bits of the process mapping table's `seq` when the walk
    /// began: a table user space rewrote meanwhile voids the sample.
    pub table_seq: u16,
    /// Each runtime's state area.
    pub runtimes: RuntimeStates,
}

/// The per-CPU scratch space of one sample's tail-call chain. Larger than the
/// 512-byte BPF stack, so it lives in a one-entry per-CPU array.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UnwindScratch {
    /// The sample being built.
    pub record: SampleRecord,
    /// Unwinder cursor.
    pub state: UnwindState,
    /// The part of the user stack read so far.
    pub stack: StackWindow,
    /// Recent unwind-table lookups of this CPU, kept across samples.
    pub rows: RowCache,
    /// Recent pid → mapping-table slot lookups of this CPU, kept across samples.
    pub processes: ProcessSlotCache,
}

const _: () = assert!(core::mem::size_of::<SampleHeader>() == 56);
const _: () = assert!(core::mem::size_of::<SampleRecord>() == 56 + MAX_FRAMES * 8);
const _: () = assert!(core::mem::size_of::<UnwindState>() == 152);
const _: () = assert!(
    core::mem::size_of::<UnwindScratch>()
        == core::mem::size_of::<SampleRecord>()
            + core::mem::size_of::<UnwindState>()
            + core::mem::size_of::<StackWindow>()
            + core::mem::size_of::<RowCache>()
            + core::mem::size_of::<ProcessSlotCache>()
);
