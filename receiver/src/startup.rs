//! Describing the processes that already run before sampling starts, so
//! that their first samples are unwound whole rather than with frame
//! pointers only: every process (or every target) gets its mapping table and
//! its runtimes' data in BPF, and the start waits, within a bound, for the
//! unwind tables of their files (each file built once, however many
//! processes map it).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use tracing::{debug, info};

use crate::{
    native_unwind::NativeUnwindInfo, process_maps::ProcessMappings, processes::ProcessTable,
    runtimes::Runtimes,
};

/// What describing the running processes did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StartupDescription {
    /// Processes described to BPF.
    pub processes: usize,
    /// Table builds still running when the wait ended (their processes
    /// are re-described when they finish, or at their first sample).
    pub builds_pending: usize,
    /// Time spent, the wait for tables included.
    pub elapsed: Duration,
}

/// The pids to describe: `targets`, or every process in `/proc`.
fn running_pids(targets: &[u32]) -> Vec<u32> {
    if !targets.is_empty() {
        return targets.to_vec();
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect()
}

/// Describes every running process (or every one of `targets`) to BPF and
/// waits at most `wait` for their unwind tables.
#[tracing::instrument(name = "describe_processes", skip_all)]
pub fn describe_running(
    native: &mut NativeUnwindInfo,
    runtimes: &mut Runtimes,
    processes: &mut ProcessTable,
    targets: &[u32],
    wait: Duration,
) -> StartupDescription {
    let started = Instant::now();
    let own = std::process::id();
    let mut described: HashMap<u32, ProcessMappings> = HashMap::new();
    for pid in running_pids(targets) {
        if pid == own {
            continue;
        }
        // Learned whole (identity, labels) now, not at its first sample.
        let (process, _) = processes.get_or_learn(pid, "");
        // Kernel threads have no mappings; a process may exit meanwhile.
        if process.excluded {
            debug!(pid, "excluded by relabeling");
            continue;
        }
        if process.mappings.executable().next().is_none() {
            continue;
        }
        let mappings = process.mappings.clone();
        let code = runtimes.attach(pid, &mappings);
        native.describe_process(pid, &mappings, &code);
        processes.mark_described(pid);
        described.insert(pid, mappings);
    }
    while native.builds_pending() > 0 && started.elapsed() < wait {
        native.poll_builds(|pid| described.get(&pid));
        if native.builds_pending() > 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let result = StartupDescription {
        processes: described.len(),
        builds_pending: native.builds_pending(),
        elapsed: started.elapsed(),
    };
    info!(
        processes = result.processes,
        tables_built = native.stats().tables_built,
        builds_pending = result.builds_pending,
        elapsed_ms = result.elapsed.as_millis() as u64,
        "described the running processes before sampling"
    );
    result
}
