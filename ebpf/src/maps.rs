//! Maps shared by the programs, and the counter helper.

use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuArray, ProgramArray, RingBuf},
};
use icecore_unwinders::{COUNTER_COUNT, Counter, UnwindScratch, programs::PROGRAM_COUNT};

/// Tail-call targets, indexed by `ProgramIndex`.
#[map]
pub static PROGRAMS: ProgramArray = ProgramArray::with_max_entries(PROGRAM_COUNT, 0);

/// The sample being built on each CPU.
#[map]
pub static SCRATCH: PerCpuArray<UnwindScratch> = PerCpuArray::with_max_entries(1, 0);

/// One counter per `Counter`.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);

/// Finished samples. User space sizes it at load time.
#[map]
pub static SAMPLES: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// PIDs to sample when `FILTER_BY_PID` is set. User space sizes it at load time.
#[map]
pub static PID_FILTER: HashMap<u32, u8> = HashMap::with_max_entries(1024, 0);

/// Adds one to a counter of this CPU.
#[inline(always)]
pub fn count(counter: Counter) {
    if let Some(value) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU value, no concurrent writer on this CPU.
        unsafe { *value += 1 };
    }
}
