//! What a tail-call chain of unwinders runs in: the CPU-clock perf event
//! (CPU samples) or the `sched_switch` tracepoint (off-CPU samples). The kernel only
//! tail-calls between programs of one type, so every unwinder is built once
//! per chain (`main.rs`), each chain with its own program array and scratch
//! space; the unwinders themselves are generic over this trait.

use aya_ebpf::{
    EbpfContext,
    maps::{PerCpuArray, ProgramArray},
    programs::{PerfEventContext, RawTracePointContext},
};
use icecore_unwinders::UnwindScratch;

use crate::maps::{OFF_CPU_PROGRAMS, OFF_CPU_SCRATCH, PROGRAMS, SCRATCH};

/// Linux's `__USER_CS` on x86-64: the privilege level of the interrupted code.
pub const USER_MODE_RPL: u64 = 3;

/// A program context that runs the unwinders.
pub trait Chain: EbpfContext {
    /// The chain's program array, indexed by `ProgramIndex`.
    fn programs() -> &'static ProgramArray;

    /// The per-CPU scratch space of the sample the chain builds.
    fn scratch_space() -> &'static PerCpuArray<UnwindScratch>;

    /// The registers of the user code the event interrupted, when it
    /// interrupted user code directly (a runtime may read more of them than
    /// the walk's ip, sp and bp); `None` for an event in the kernel.
    fn user_frame_registers(&self) -> Option<aya_ebpf::bindings::pt_regs>;
}

impl Chain for PerfEventContext {
    #[inline(always)]
    fn programs() -> &'static ProgramArray {
        &PROGRAMS
    }

    #[inline(always)]
    fn scratch_space() -> &'static PerCpuArray<UnwindScratch> {
        &SCRATCH
    }

    #[inline(always)]
    fn user_frame_registers(&self) -> Option<aya_ebpf::bindings::pt_regs> {
        // SAFETY: a perf-event context always points at bpf_perf_event_data;
        // the verifier allows reading its `regs`.
        let regs = unsafe { (*self.ctx).regs };
        (regs.cs & USER_MODE_RPL == USER_MODE_RPL).then_some(regs)
    }
}

impl Chain for RawTracePointContext {
    #[inline(always)]
    fn programs() -> &'static ProgramArray {
        &OFF_CPU_PROGRAMS
    }

    #[inline(always)]
    fn scratch_space() -> &'static PerCpuArray<UnwindScratch> {
        &OFF_CPU_SCRATCH
    }

    #[inline(always)]
    fn user_frame_registers(&self) -> Option<aya_ebpf::bindings::pt_regs> {
        // The thread is in the scheduler: its user registers are the ones
        // saved at its kernel entry, read by `task`.
        None
    }
}
