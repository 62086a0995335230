//! What icecore knows of each sampled process: identity and memory mappings,
//! learned from `/proc` on its first sample and dropped when it exits.

use std::{
    num::NonZeroUsize,
    sync::Arc,
    time::{Duration, Instant},
};

use icecore_otlp::model::ProcessInfo;
use lru::LruCache;
use tracing::debug;

use crate::process_maps::{self, MappedFile, ProcessMappings};

/// Re-reading a process's maps for an unknown address (a library loaded with
/// `dlopen`, JIT code) happens at most this often per process.
const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// One tracked process.
#[derive(Debug)]
pub struct TrackedProcess {
    /// Identity for the profile.
    pub info: ProcessInfo,
    /// File-backed mappings and the vDSO; empty when the process was gone before they could be read.
    pub mappings: ProcessMappings,
    /// Start time in clock ticks since boot, to tell a reused PID from the original.
    start_time: Option<u64>,
    last_refresh: Instant,
}

impl TrackedProcess {
    fn learn(pid: u32, comm: &str) -> Self {
        let mappings = match ProcessMappings::read(pid) {
            Ok(m) => m,
            Err(e) => {
                debug!(pid, "cannot read mappings: {e}");
                ProcessMappings::default()
            }
        };
        let path = process_maps::executable_path(pid).ok();
        let name: Arc<str> = match &path {
            Some(p) => Arc::from(p.rsplit('/').next().unwrap_or(p.as_str())),
            None => Arc::from(comm),
        };
        TrackedProcess {
            info: ProcessInfo {
                pid,
                executable_name: name.clone(),
                executable_path: Arc::from(path.as_deref().unwrap_or("")),
                service_name: name,
            },
            mappings,
            start_time: process_maps::start_time_ticks(pid).ok(),
            last_refresh: Instant::now(),
        }
    }

    /// The mapping containing `address`, if known.
    pub fn mapping(&self, address: u64) -> Option<&MappedFile> {
        self.mappings.find(address)
    }
}

/// Tracked processes, bounded in number (least recently sampled evicted).
pub struct ProcessTable {
    processes: LruCache<u32, TrackedProcess>,
}

impl ProcessTable {
    /// A table holding at most `capacity` processes.
    pub fn new(capacity: NonZeroUsize) -> Self {
        ProcessTable {
            processes: LruCache::new(capacity),
        }
    }

    /// The process, learning it from `/proc` on first sight; `true` when it
    /// was learned just now.
    pub fn get_or_learn(&mut self, pid: u32, comm: &str) -> (&mut TrackedProcess, bool) {
        let mut learned = false;
        let process = self.processes.get_or_insert_mut(pid, || {
            learned = true;
            TrackedProcess::learn(pid, comm)
        });
        (process, learned)
    }

    /// Forgets a process now (it exec'd: its next sample learns it anew).
    pub fn forget(&mut self, pid: u32) {
        self.processes.pop(&pid);
    }

    /// Whether `pid` still runs the process that was learned under it.
    pub fn is_alive(&self, pid: u32) -> bool {
        match (
            self.processes.peek(&pid),
            process_maps::start_time_ticks(pid),
        ) {
            (Some(p), Ok(now)) => p.start_time.is_none_or(|then| then == now),
            (_, Err(e)) => !e.is_gone(),
            (None, Ok(_)) => true,
        }
    }

    /// Re-reads the maps of `pid` when some of `addresses` fall outside every
    /// known mapping (rate-limited per process). Returns whether they changed.
    pub fn refresh_if_unmapped(
        &mut self,
        pid: u32,
        addresses: impl IntoIterator<Item = u64>,
    ) -> bool {
        let Some(process) = self.processes.peek_mut(&pid) else {
            return false;
        };
        if process.last_refresh.elapsed() < REFRESH_INTERVAL {
            return false;
        }
        if addresses
            .into_iter()
            .all(|a| process.mappings.find(a).is_some())
        {
            return false;
        }
        process.last_refresh = Instant::now();
        match ProcessMappings::read(pid) {
            Ok(m) if m != process.mappings => {
                process.mappings = m;
                true
            }
            Ok(_) => false,
            Err(e) => {
                debug!(pid, "cannot refresh mappings: {e}");
                false
            }
        }
    }

    /// The process, if tracked.
    pub fn get(&self, pid: u32) -> Option<&TrackedProcess> {
        self.processes.peek(&pid)
    }

    /// Drops processes that exited (or whose PID now belongs to another
    /// process). Returns their PIDs.
    pub fn sweep_exited(&mut self) -> Vec<u32> {
        let gone = self.exited();
        for pid in &gone {
            self.processes.pop(pid);
        }
        gone
    }

    /// Processes that exited (or whose PID now belongs to another process),
    /// still tracked. Checked before a drain, they have no samples left
    /// unread in the ring buffer once the drain is done.
    pub fn exited(&self) -> Vec<u32> {
        let gone: Vec<u32> = self
            .processes
            .iter()
            .filter(|(pid, p)| match process_maps::start_time_ticks(**pid) {
                Ok(now) => p.start_time.is_some_and(|then| then != now),
                Err(e) => e.is_gone(),
            })
            .map(|(pid, _)| *pid)
            .collect();
        gone
    }

    /// Number of tracked processes.
    pub fn len(&self) -> usize {
        self.processes.len()
    }

    /// Whether no process is tracked.
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_this_process_and_sweeps_a_dead_one() {
        let mut table = ProcessTable::new(NonZeroUsize::new(4).unwrap());
        let me = std::process::id();
        let (p, learned) = table.get_or_learn(me, "test");
        assert!(learned);
        assert_eq!(p.info.pid, me);
        assert!(!p.mappings.is_empty());
        let here = learns_this_process_and_sweeps_a_dead_one as *const () as u64;
        assert!(p.mapping(here).is_some(), "own code is mapped");

        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        table.get_or_learn(pid, "true");
        child.wait().unwrap();
        assert_eq!(table.len(), 2);
        assert_eq!(table.sweep_exited(), vec![pid]);
        assert!(table.get(pid).is_none());
        assert!(table.get(me).is_some());
    }
}
