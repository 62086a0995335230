//! icecore's BPF programs.
//!
//! `on_cpu_sample` runs on every CPU-clock perf event. It fills the sample's
//! fixed part and kernel stack in per-CPU scratch space, then tail-calls the
//! native unwinder, which walks the user stack a bounded number of frames per
//! program and tail-calls itself to continue, handing frames to runtime
//! unwinders (`unwind_python`, `unwind_ruby`, `unwind_hotspot`, `unwind_v8`,
//! `unwind_php`) where the program counter enters code they own (see
//! `icecore_unwinders::runtime`); the last program copies the finished
//! record into the ring buffer. Every way a sample can end or degrade bumps a
//! named counter (see `icecore_unwinders::Counter`).
#![no_std]
#![no_main]

mod emit;
mod lifecycle;
mod maps;
mod native;
mod runtimes;
mod task;

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        generated::{bpf_get_current_comm, bpf_get_stack},
    },
    macros::perf_event,
    programs::PerfEventContext,
};
use icecore_unwinders::{
    Counter, ProgramIndex, Registers,
    sample::{MAX_KERNEL_FRAMES, flags},
};

use crate::maps::{PROGRAMS, SCRATCH, count, is_profiled};

/// Linux's `__USER_CS` on x86-64: the privilege level of the interrupted code.
const USER_MODE_RPL: u64 = 3;

#[perf_event]
pub fn on_cpu_sample(ctx: PerfEventContext) -> u32 {
    count(Counter::Samples);
    // One helper call for both ids (`ctx.tgid()` and `ctx.pid()` make two).
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    if pid == 0 {
        count(Counter::Idle);
        return 0;
    }
    if !is_profiled(pid) {
        count(Counter::FilteredOut);
        return 0;
    }
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        count(Counter::ScratchUnavailable);
        return 0;
    };
    // SAFETY: per-CPU map value; this program is the only user on this CPU
    // until the tail-call chain ends (perf-event programs do not nest).
    let scratch = unsafe { &mut *scratch };
    let record = &mut scratch.record;
    let header = &mut record.header;
    // SAFETY: plain helper calls without pointer arguments.
    header.ktime_ns = unsafe { bpf_ktime_get_ns() };
    header.cpu = unsafe { bpf_get_smp_processor_id() };
    header.pid = pid;
    header.tid = pid_tgid as u32;
    header.flags = 0;
    header.user_words = 0;
    // Straight into the record: `ctx.command()` would zero a stack copy first.
    // SAFETY: `comm` is a 16-byte buffer, the size passed.
    if unsafe { bpf_get_current_comm(header.comm.as_mut_ptr().cast(), 16) } < 0 {
        header.comm = [0; 16];
    }

    let regs = interrupted_registers(&ctx);
    let user_mode = regs.cs & USER_MODE_RPL == USER_MODE_RPL;
    if user_mode {
        record.header.kernel_frames = 0;
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
    }
    let user = if user_mode {
        Some(Registers {
            ip: regs.rip,
            sp: regs.rsp,
            bp: regs.rbp,
        })
    } else {
        record.header.flags |= flags::KERNEL_MODE;
        let from_task = task::user_registers();
        if from_task.is_some() {
            count(Counter::UserRegistersFromTask);
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
        emit::emit(scratch);
        return 0;
    };
    scratch.state.registers = registers;
    // SAFETY: the program array holds programs of this same type.
    unsafe { PROGRAMS.tail_call(&ctx, ProgramIndex::NativeUnwinder as u32) };
    count(Counter::TailCallFailed);
    0
}

/// The registers of the code the perf event interrupted.
fn interrupted_registers(ctx: &PerfEventContext) -> aya_ebpf::bindings::pt_regs {
    // SAFETY: a perf-event context always points at bpf_perf_event_data; the
    // verifier allows reading its `regs`.
    unsafe { (*ctx.ctx).regs }
}

#[perf_event]
pub fn unwind_native(ctx: PerfEventContext) -> u32 {
    native::unwind::<false>(&ctx)
}

#[perf_event]
pub fn unwind_native_resumed(ctx: PerfEventContext) -> u32 {
    native::unwind::<true>(&ctx)
}

#[perf_event]
pub fn unwind_python(ctx: PerfEventContext) -> u32 {
    runtimes::python::unwind(&ctx)
}

#[perf_event]
pub fn unwind_ruby(ctx: PerfEventContext) -> u32 {
    runtimes::ruby::unwind(&ctx)
}

#[perf_event]
pub fn unwind_hotspot(ctx: PerfEventContext) -> u32 {
    runtimes::hotspot::unwind(&ctx)
}

#[perf_event]
pub fn unwind_v8(ctx: PerfEventContext) -> u32 {
    runtimes::v8::unwind(&ctx)
}

#[perf_event]
pub fn unwind_php(ctx: PerfEventContext) -> u32 {
    runtimes::php::unwind(&ctx)
}

#[perf_event]
pub fn emit_sample(_ctx: PerfEventContext) -> u32 {
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        count(Counter::ScratchUnavailable);
        return 0;
    };
    // SAFETY: per-CPU value owned by this CPU's tail-call chain.
    emit::emit(unsafe { &mut *scratch });
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The code has no panicking paths left after optimisation (the verifier
    // would reject an unbounded loop here); this only satisfies no_std.
    // SAFETY: unreachable by construction, see above.
    unsafe { core::hint::unreachable_unchecked() }
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
