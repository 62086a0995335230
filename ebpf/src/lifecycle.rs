//! Tracepoints telling user space when a process execs or a process it
//! described to BPF exits, and the report of a sample of a process BPF does
//! not know. An exec is reported for every profiled process, so user space
//! reads the new image's mappings while it runs (a process living
//! milliseconds is gone before its samples are read); an exit frees that
//! process's map entries at once, and a reused PID never sees the old
//! process's mappings.

use aya_ebpf::{
    bindings::BPF_RB_FORCE_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::tracepoint,
    programs::TracePointContext,
};
use icecore_unwinders::{
    events::{ProcessEvent, ProcessEventKind},
    native::mappings::PROCESS_TABLES_PER_PAGE,
};

use crate::maps::{
    PROCESS_EVENTS, PROCESS_MAPPINGS, PROCESS_SLOTS, forget_exclusion, in_pid_filter,
};

/// A CPU reports a process it does not know at most once per this many
/// 2^20 ns (about 8 ms): the first sample of a new process is what matters,
/// and a process that cannot be described must not flood the ring.
const UNKNOWN_REPORT_EVERY: u16 = 8;

/// Tells user space that a sample of `pid`, which has no mapping table, was
/// dropped, unless this CPU reported one in the last few milliseconds
/// (`last_report` is this CPU's note of when, kept across samples).
#[inline(always)]
pub fn report_unknown(pid: u32, ktime_ns: u64, last_report: &mut u16) {
    let now = (ktime_ns >> 20) as u16;
    if now.wrapping_sub(*last_report) < UNKNOWN_REPORT_EVERY {
        return;
    }
    *last_report = now;
    // Woken at once: user space reads the process's maps while it runs.
    report(pid, ProcessEventKind::Unknown, BPF_RB_FORCE_WAKEUP as u64);
}

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
    forget_exclusion(pid);
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
    forget_old_image(pid);
    // The new image is judged anew: reported even if the old one was
    // excluded, and sampled until user space excludes it again.
    forget_exclusion(pid);
    if !in_pid_filter(pid) {
        return 0;
    }
    // Default flags: the reader is woken only when it has caught up with
    // the ring, so a burst of execs costs one wakeup.
    report(pid, ProcessEventKind::Exec, 0);
    0
}

/// The mappings BPF holds for `pid` are the image `exec` just replaced:
/// marked as no longer the pid's, so that its samples are dropped as those
/// of an unknown process (and user space told) until user space describes
/// the new image, rather than unwound with the old image's tables.
#[inline(always)]
fn forget_old_image(pid: u32) {
    // SAFETY: a plain value read.
    let Some(&slot) = (unsafe { PROCESS_SLOTS.get(pid) }) else {
        return;
    };
    let page = slot / PROCESS_TABLES_PER_PAGE as u32;
    let index = slot % PROCESS_TABLES_PER_PAGE as u32;
    if let Some(table) = PROCESS_MAPPINGS.get_value_ptr_mut(page, &index) {
        // SAFETY: a store to a plain integer of the map value; readers
        // compare it with the sampled pid and ignore the table when it
        // differs. User space rewrites the whole table when it describes
        // the new image.
        unsafe { core::ptr::write_volatile(&raw mut (*table).pid, 0) };
    }
}
