//! Tracepoints telling user space when a process execs or a process it
//! described to BPF exits. An exec is reported for every profiled process,
//! so user space reads the new image's mappings while it runs (a process
//! living milliseconds is gone before its samples are read); an exit frees
//! that process's map entries at once, and a reused PID never sees the old
//! process's mappings.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::tracepoint,
    programs::TracePointContext,
};
use icecore_unwinders::events::{ProcessEvent, ProcessEventKind};

use crate::maps::{PROCESS_EVENTS, PROCESS_SLOTS, is_profiled};

#[inline(always)]
fn report(pid: u32, kind: ProcessEventKind, flags: u64) {
    // A full ring loses the event; user space's periodic sweep catches an
    // exit, and the process's first sample teaches it an exec'd image.
    let _ = PROCESS_EVENTS.output::<ProcessEvent>(
        ProcessEvent {
            pid,
            kind: kind as u32,
            // SAFETY: a helper without arguments.
            ktime_ns: unsafe { bpf_ktime_get_ns() },
        },
        flags,
    );
}

#[tracepoint]
pub fn on_process_exit(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    // Thread exits are not process exits.
    if pid != pid_tgid as u32 {
        return 0;
    }
    // SAFETY: presence test only.
    if unsafe { PROCESS_SLOTS.get(pid) }.is_none() {
        return 0;
    }
    // Default flags, as for an exec: an exit left unread without a wakeup
    // would keep every later exec from waking the reader (the kernel wakes
    // it only when it has caught up with the ring).
    report(pid, ProcessEventKind::Exit, 0);
    0
}

#[tracepoint]
pub fn on_process_exec(_ctx: TracePointContext) -> u32 {
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_profiled(pid) {
        return 0;
    }
    // Default flags: the reader is woken only when it has caught up with
    // the ring, so a burst of execs costs one wakeup.
    report(pid, ProcessEventKind::Exec, 0);
    0
}
