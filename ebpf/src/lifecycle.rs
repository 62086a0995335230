//! Tracepoints telling user space when a process it described to BPF exits
//! or execs, so every map entry of that process is freed at once and a
//! reused PID never sees the old process's mappings.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use icecore_unwinders::events::{ProcessEvent, ProcessEventKind};

use crate::maps::{PROCESS_EVENTS, PROCESS_SLOTS};

#[inline(always)]
fn report(kind: ProcessEventKind) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    // Thread exits are not process exits; an exec is reported by its thread.
    if kind == ProcessEventKind::Exit && pid != tid {
        return;
    }
    // SAFETY: presence test only.
    if unsafe { PROCESS_SLOTS.get(&pid) }.is_none() {
        return;
    }
    // A full ring loses the event; user space's periodic sweep catches it.
    let _ = PROCESS_EVENTS.output::<ProcessEvent>(
        ProcessEvent {
            pid,
            kind: kind as u32,
        },
        0,
    );
}

#[tracepoint]
pub fn on_process_exit(_ctx: TracePointContext) -> u32 {
    report(ProcessEventKind::Exit);
    0
}

#[tracepoint]
pub fn on_process_exec(_ctx: TracePointContext) -> u32 {
    report(ProcessEventKind::Exec);
    0
}
