//! The start every sample shares, CPU or off-CPU: the record's fixed part,
//! the kernel stack, the user registers, then the first tail call of its
//! chain.

use aya_ebpf::helpers::{
    bpf_get_smp_processor_id, bpf_ktime_get_ns,
    generated::{bpf_get_current_comm, bpf_get_stack},
};
use icecore_unwinders::{
    Counter, ProgramIndex, Registers,
    sample::{MAX_KERNEL_FRAMES, flags},
};

use crate::{chain::Chain, maps::count};

/// Starts a sample of the current thread (`pid_tgid` from
/// `bpf_get_current_pid_tgid`) in `C`'s chain. `user` holds the registers
/// of the user code the event interrupted, when `in_user_code`; otherwise
/// the thread is in the kernel, whose stack is taken from the context, and
/// its user registers come from the task. A non-zero `off_cpu_start` makes
/// it the start of an off-CPU wait that began then (the sample's time,
/// which its end record names).
///
/// (Plain values rather than enums or options: LLVM may load an enum's
/// payload on every path, and the 5.10 verifier refuses the read of a stack
/// slot that one path left unwritten.)
#[inline(always)]
pub fn sample<C: Chain>(
    ctx: &C,
    pid_tgid: u64,
    user: Registers,
    in_user_code: bool,
    off_cpu_start: u64,
) {
    let Some(scratch) = C::scratch_space().get_ptr_mut(0) else {
        count(Counter::ScratchUnavailable);
        return;
    };
    // SAFETY: per-CPU map value; this program is the only user on this CPU
    // until the tail-call chain ends (programs of one chain do not nest).
    let scratch = unsafe { &mut *scratch };
    let record = &mut scratch.record;
    let header = &mut record.header;
    // SAFETY: plain helper calls without pointer arguments.
    header.ktime_ns = if off_cpu_start != 0 {
        off_cpu_start
    } else {
        unsafe { bpf_ktime_get_ns() }
    };
    header.cpu = unsafe { bpf_get_smp_processor_id() };
    header.pid = (pid_tgid >> 32) as u32;
    header.tid = pid_tgid as u32;
    header.flags = if off_cpu_start != 0 {
        flags::OFF_CPU
    } else {
        0
    };
    header.off_cpu_ns = 0;
    header.user_words = 0;
    // Straight into the record: `ctx.command()` would zero a stack copy first.
    // SAFETY: `comm` is a 16-byte buffer, the size passed.
    if unsafe { bpf_get_current_comm(header.comm.as_mut_ptr().cast(), 16) } < 0 {
        header.comm = [0; 16];
    }

    let user = if in_user_code {
        record.header.kernel_frames = 0;
        Some(user)
    } else {
        // SAFETY: the buffer is the first MAX_KERNEL_FRAMES words of `frames`.
        let written = unsafe {
            bpf_get_stack(
                ctx.as_ptr(),
                record.frames.as_mut_ptr().cast(),
                (MAX_KERNEL_FRAMES * 8) as u32,
                0,
            )
        };
        if written < 0 {
            count(Counter::KernelStackFailed);
            record.header.kernel_frames = 0;
        } else {
            record.header.kernel_frames = (written as u32) / 8;
        }
        record.header.flags |= flags::KERNEL_MODE;
        let from_task = crate::task::user_registers();
        if from_task.is_some() {
            count(Counter::UserRegistersFromTask);
        } else if off_cpu_start != 0 {
            // A kernel thread: its waits are the kernel's own idling
            // (worker pools, housekeeping), not time a program waited.
            count(Counter::OffCpuKernelThread);
            return;
        }
        from_task
    };
    scratch.state.tail_calls = 0;
    scratch.state.dwarf_frames = 0;
    scratch.state.frame_pointer_frames = 0;
    scratch.state.resume = icecore_unwinders::runtime::resume::FRESH;
    scratch.state.deferred_program = 0;
    scratch.state.native_done = 0;
    scratch.state.runtimes.reset();
    scratch.stack.clear();
    let Some(registers) = user else {
        count(Counter::NoUserRegisters);
        scratch.record.header.flags |= flags::NO_USER_REGISTERS;
        // Emitted in place, so that the one tail call below has a constant
        // index: the JIT patches a direct jump for it, where a variable index
        // costs an indirect jump (a retpoline on most hosts).
        crate::emit::emit(scratch);
        return;
    };
    scratch.state.registers = registers;
    // SAFETY: the program array holds programs of this chain's type.
    unsafe { C::programs().tail_call(ctx, ProgramIndex::NativeUnwinder as u32) };
    count(Counter::TailCallFailed);
}
