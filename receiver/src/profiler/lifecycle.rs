//! What the exec thread reports (execs, mappings read after an exec,
//! processes BPF met before user space described them, exits), applied to
//! the profiler's state: BPF first, symbols after.

use crate::{
    exec_watch::Lifecycle, native_unwind::NativeUnwindInfo, processes::ProcessTable,
    runtimes::Runtimes, symbolize::Symbolizer,
};

/// Applies one result of the exec thread to the profiler's state.
pub(super) fn apply_lifecycle(
    event: Lifecycle,
    processes: &mut ProcessTable,
    native: &mut Option<NativeUnwindInfo>,
    runtimes: &mut Runtimes,
    symbolizer: &mut Symbolizer,
    described: &mut Vec<u32>,
    exits: &mut Vec<(u32, u64)>,
) {
    // BPF first, symbols after: until BPF knows a new image its samples are
    // dropped, while parsing its files' symbols can wait for the batch.
    match event {
        Lifecycle::Exec {
            pid,
            ktime_ns,
            snapshot,
            files,
        } => {
            if processes.exec(pid, ktime_ns, *snapshot) {
                // What BPF and the plugins knew was the old image's.
                if let Some(native) = native.as_mut() {
                    native.forget_process(pid);
                }
                runtimes.detach(pid);
            }
            // Described at its exec with what is mapped so far (the
            // libraries follow as the loader maps them, re-read below).
            describe_image(pid, processes, native, runtimes, described);
            // Parsed now, from the files held open since the exec: the
            // process may be gone by the time its batch is cut.
            if let Some(process) = processes.get(pid) {
                symbolizer.preload(pid, &process.mappings, &files);
            }
        }
        Lifecycle::Mappings {
            pid,
            ktime_ns,
            mappings,
            files,
        } => {
            if processes.exec_mappings(pid, ktime_ns, mappings) {
                describe_image(pid, processes, native, runtimes, described);
                if let Some(process) = processes.get(pid) {
                    symbolizer.preload(pid, &process.mappings, &files);
                }
            }
        }
        Lifecycle::Unknown { pid } => {
            let (process, learned) = processes.get_or_learn(pid, "");
            // Described already and BPF holds its table: the report was sent
            // before the description took effect. Described but absent from
            // BPF (its description was refused and counted, or dropped as
            // that of a process that looked gone): described again, at most
            // as often as BPF reports it.
            let in_bpf = native.as_ref().is_none_or(|n| n.describes(pid));
            if process.described && in_bpf {
                return;
            }
            if learned {
                // A reused pid: whatever was known of the old process goes.
                runtimes.detach(pid);
            }
            describe_image(pid, processes, native, runtimes, described);
            if learned && let Some(process) = processes.get(pid) {
                symbolizer.preload(pid, &process.mappings, &[]);
            }
        }
        Lifecycle::Exit { pid, ktime_ns } => exits.push((pid, ktime_ns)),
    }
}

/// Describes the current image of `pid` to BPF, unless relabeling excluded
/// it or it maps no code yet.
fn describe_image(
    pid: u32,
    processes: &mut ProcessTable,
    native: &mut Option<NativeUnwindInfo>,
    runtimes: &mut Runtimes,
    described: &mut Vec<u32>,
) {
    let (Some(native), Some(process)) = (native.as_mut(), processes.get(pid)) else {
        return;
    };
    if process.excluded || process.mappings.executable().next().is_none() {
        return;
    }
    let code = runtimes.attach(pid, &process.mappings);
    native.describe_process(pid, &process.mappings, &code);
    processes.mark_described(pid);
    described.push(pid);
}
