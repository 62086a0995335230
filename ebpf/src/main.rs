//! icecore's BPF programs.
//!
//! `on_cpu_sample` runs on every CPU-clock perf event. It fills the sample's
//! fixed part and kernel stack in per-CPU scratch space, then tail-calls the
//! native unwinder, which walks the user stack a bounded number of frames per
//! program and tail-calls itself to continue, handing frames to runtime
//! unwinders (`unwind_python`, `unwind_ruby`, `unwind_hotspot`, `unwind_v8`,
//! `unwind_php`, `unwind_perl`) where the program counter enters code they own (see
//! `icecore_unwinders::runtime`); the last program copies the finished
//! record into the ring buffer. Every way a sample can end or degrade bumps a
//! named counter (see `icecore_unwinders::Counter`).
//!
//! Off-CPU samples (`off_cpu`) start in the `sched_switch` tracepoint and
//! run the same unwinders, built a second time as raw tracepoint programs
//! (`off_cpu_unwind_*`), since the kernel tail-calls only between programs
//! of one type (see `chain`).
#![no_std]
#![no_main]

mod chain;
mod emit;
mod lifecycle;
mod maps;
mod native;
mod off_cpu;
mod runtimes;
mod start;
mod task;

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{perf_event, raw_tracepoint},
    programs::{PerfEventContext, RawTracePointContext},
};
use icecore_unwinders::{Counter, Registers};

use crate::maps::{count, is_profiled};

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
    // SAFETY: a perf-event context always points at bpf_perf_event_data;
    // the verifier allows reading its `regs`.
    let regs = unsafe { (*ctx.ctx).regs };
    let user = Registers {
        ip: regs.rip,
        sp: regs.rsp,
        bp: regs.rbp,
    };
    let in_user_code = regs.cs & chain::USER_MODE_RPL == chain::USER_MODE_RPL;
    start::sample(&ctx, pid_tgid, user, in_user_code, 0);
    0
}

/// Builds the unwinders of both chains: `$name` as a perf-event program
/// (CPU samples) and `$off_cpu_name` as a raw tracepoint program, the type
/// of the off-CPU entry, as tail calls require.
macro_rules! unwinder {
    ($name:ident, $off_cpu_name:ident, $body:path) => {
        #[perf_event]
        pub fn $name(ctx: PerfEventContext) -> u32 {
            $body(&ctx)
        }

        #[raw_tracepoint(tracepoint = "sched_switch")]
        pub fn $off_cpu_name(ctx: RawTracePointContext) -> u32 {
            $body(&ctx)
        }
    };
}

unwinder!(unwind_native, off_cpu_unwind_native, native::unwind_fresh);
unwinder!(
    unwind_native_resumed,
    off_cpu_unwind_native_resumed,
    native::unwind_resumed
);
unwinder!(
    unwind_python,
    off_cpu_unwind_python,
    runtimes::python::unwind
);
unwinder!(unwind_ruby, off_cpu_unwind_ruby, runtimes::ruby::unwind);
unwinder!(
    unwind_hotspot,
    off_cpu_unwind_hotspot,
    runtimes::hotspot::unwind
);
unwinder!(unwind_v8, off_cpu_unwind_v8, runtimes::v8::unwind);
unwinder!(unwind_php, off_cpu_unwind_php, runtimes::php::unwind);
unwinder!(unwind_perl, off_cpu_unwind_perl, runtimes::perl::unwind);
unwinder!(emit_sample, off_cpu_emit_sample, emit::emit_program);

/// A context switch: the end of `next`'s wait, the start of `prev`'s.
/// A raw tracepoint rather than `tp_btf`: the unwinders it tail-calls must
/// be of its type, and `tp_btf` programs may only tail-call programs of the
/// same attach target on recent kernels, where raw tracepoints load alike
/// on every kernel icecore supports.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn off_cpu_switch(ctx: RawTracePointContext) -> u32 {
    off_cpu::on_switch(&ctx);
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
