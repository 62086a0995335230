//! Off-CPU samples, from the `sched_switch` tracepoint alone (it needs
//! neither kprobes nor BPF trampolines, which kernels may lack).
//!
//! A switch has two sides. The thread leaving the CPU (`prev`) is still
//! current: when it blocks (it left the runnable state: a preempted thread,
//! in the kernel or on its way back to user space, waits for a CPU, not
//! for an event, and is not recorded) and a random draw
//! below `OFF_CPU_THRESHOLD` picks the switch, its stack is taken through
//! the same unwinders as a CPU sample, and once it is sent its start time is
//! noted by thread
//! (the kernel stack is the one it blocks in: `futex_wait`,
//! `do_nanosleep`, ...) and sent as an off-CPU start. The thread taking the
//! CPU (`next`) ends its wait: if one was noted and lasted at least
//! `OFF_CPU_MIN_NS`, an end record (the header alone: thread, start time
//! and duration) follows, which user space joins to the start. A shorter
//! wait costs the map lookup and nothing more on this side; its start
//! record goes unanswered and is dropped in user space.

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        bpf_probe_read_kernel, generated::bpf_ringbuf_output,
    },
    programs::RawTracePointContext,
};
use icecore_unwinders::{Counter, Registers, SampleHeader, sample::flags};

use crate::{
    maps::{OFF_CPU_STARTS, SAMPLE_RINGS, count, is_profiled},
    start::sample,
};

/// A switch is sampled when a random 32-bit value is below this: the
/// sampling probability times 2^32 (2^32: every switch). Set at load time.
#[unsafe(no_mangle)]
static OFF_CPU_THRESHOLD: u64 = 0;

/// Shorter times off CPU are not reported. Set at load time.
#[unsafe(no_mangle)]
static OFF_CPU_MIN_NS: u64 = 0;

/// Offset of `pid` (the thread id) in `struct task_struct`. Set at load time.
#[unsafe(no_mangle)]
static TASK_PID_OFFSET: u64 = 0;

/// Offset of `flags` in `struct task_struct`. Set at load time.
#[unsafe(no_mangle)]
static TASK_FLAGS_OFFSET: u64 = 0;

/// Offset of `__state` (`state` before Linux 5.14) in `struct
/// task_struct`. Set at load time.
#[unsafe(no_mangle)]
static TASK_STATE_OFFSET: u64 = 0;

/// `PF_EXITING`: the task is exiting; its last switch-out ends nothing.
const PF_EXITING: u32 = 0x4;

/// `sched_switch(preempt, prev, next, ...)`.
#[inline(always)]
pub fn on_switch(ctx: &RawTracePointContext) {
    let preempt: u64 = ctx.arg(0);
    let prev: u64 = ctx.arg(1);
    let next: u64 = ctx.arg(2);
    switch_in(next);
    if preempt & 1 == 0 {
        switch_out(ctx, prev);
    }
}

/// `next` takes the CPU: the end of its wait, if one was noted.
#[inline(always)]
fn switch_in(next: u64) {
    // SAFETY: a plain load of a load-time constant.
    let offset = unsafe { core::ptr::read_volatile(&TASK_PID_OFFSET) };
    // SAFETY: the helper tolerates bad addresses.
    let Ok(tid) = (unsafe { bpf_probe_read_kernel((next + offset) as *const u32) }) else {
        return;
    };
    if tid == 0 {
        return;
    }
    // SAFETY: the value is copied out before the entry is removed.
    let Some(started) = (unsafe { OFF_CPU_STARTS.get(tid) }).copied() else {
        return;
    };
    let _ = OFF_CPU_STARTS.remove(tid);
    // SAFETY: helper calls without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let off_cpu_ns = now.saturating_sub(started);
    // SAFETY: a plain load of a load-time constant.
    let min_ns = unsafe { core::ptr::read_volatile(&OFF_CPU_MIN_NS) };
    if off_cpu_ns < min_ns || off_cpu_ns == 0 {
        count(Counter::OffCpuShort);
        return;
    }
    // SAFETY: a helper call without arguments.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let end = SampleHeader {
        ktime_ns: started,
        pid: 0,
        tid,
        cpu,
        flags: flags::OFF_CPU_END,
        kernel_frames: 0,
        user_words: 0,
        off_cpu_ns,
        comm: [0; 16],
    };
    let Some(ring) = SAMPLE_RINGS.get(cpu) else {
        count(Counter::SampleRingMissing);
        return;
    };
    let ring = core::ptr::from_ref(ring).cast_mut().cast();
    // SAFETY: `end` is a header on this stack, its size passed; `ring` is
    // the inner map the outer array's lookup returned.
    let ret = unsafe {
        bpf_ringbuf_output(
            ring,
            core::ptr::from_ref(&end).cast_mut().cast(),
            core::mem::size_of::<SampleHeader>() as u64,
            0,
        )
    };
    if ret < 0 {
        count(Counter::RingBufferFull);
    } else {
        count(Counter::OffCpuEnds);
    }
}

/// The current thread blocks: note the time and take its stack, for a
/// random share of switches.
#[inline(always)]
fn switch_out(ctx: &RawTracePointContext, prev: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    if pid == 0 || !is_profiled(pid) {
        return;
    }
    // SAFETY: a plain load of a load-time constant.
    let threshold = unsafe { core::ptr::read_volatile(&OFF_CPU_THRESHOLD) };
    // SAFETY: a helper call without arguments.
    if u64::from(unsafe { bpf_get_prandom_u32() }) >= threshold {
        return;
    }
    // SAFETY: plain loads of load-time constants; the helper tolerates bad
    // addresses.
    let state_offset = unsafe { core::ptr::read_volatile(&TASK_STATE_OFFSET) };
    let state = unsafe { bpf_probe_read_kernel((prev + state_offset) as *const u32) };
    // TASK_RUNNING is 0: switched out while runnable.
    if state.is_ok_and(|state| state == 0) {
        return;
    }
    let flags_offset = unsafe { core::ptr::read_volatile(&TASK_FLAGS_OFFSET) };
    let task_flags = unsafe { bpf_probe_read_kernel((prev + flags_offset) as *const u32) };
    if task_flags.is_ok_and(|f| f & PF_EXITING != 0) {
        return;
    }
    // SAFETY: a helper call without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // The start time is noted by the emit program, once the stack is out.
    sample(ctx, pid_tgid, Registers::default(), false, now);
}
