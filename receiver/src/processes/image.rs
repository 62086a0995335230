//! One image of a process (what one `exec` put in place) and the snapshot
//! of `/proc` it is learned from.

use std::{sync::Arc, time::Instant};

use icecore_otlp::model::{ExecutableBuildIds, ProcessInfo};
use tracing::debug;

use crate::metadata::labels::ProcessFacts;
use crate::process_maps::{self, MappedFile, ProcessMappings};

/// One image of a tracked process: what one `exec` (or the process's
/// start) put in place, until the next `exec` replaces it.
#[derive(Debug)]
pub struct TrackedProcess {
    /// Identity for the profile.
    pub info: ProcessInfo,
    /// File-backed mappings and the vDSO; empty when the process was gone before they could be read.
    pub mappings: ProcessMappings,
    /// Which image this is: unique over the table's life, so samples name
    /// the image they were taken in even after an `exec` replaced it.
    pub image: u64,
    /// Whether the profiler described this image to BPF (at its exec or its
    /// first sample).
    pub described: bool,
    /// Whether relabeling excluded the image from profiling: it is never
    /// described, BPF is told to skip it, and samples taken before are dropped.
    pub excluded: bool,
    /// Its command line and cgroup, for relabeling it again when its pod's
    /// metadata arrives.
    pub(super) facts: ProcessFacts,
    /// Start time in clock ticks since boot, to tell a reused PID from the original.
    pub(super) start_time: Option<u64>,
    /// `CLOCK_MONOTONIC` of the `exec` that started the image; 0 when it was
    /// learned from a sample (it ran before anything icecore saw).
    pub(super) exec_ktime: u64,
    /// `CLOCK_MONOTONIC` when the image was read.
    pub(super) learned_ktime: u64,
    /// When the maps were last re-read; `None` before the first re-read,
    /// which is never held back (an image learned at `exec` has not mapped
    /// its libraries yet).
    pub(super) last_refresh: Option<Instant>,
}

/// What `/proc` says of a process at one moment: enough to profile it
/// after it is gone.
#[derive(Debug, Clone)]
pub struct ImageSnapshot {
    /// Identity for the profile.
    pub info: ProcessInfo,
    /// File-backed mappings and the vDSO; empty when the process was gone.
    pub mappings: ProcessMappings,
    /// Start time in clock ticks since boot.
    pub start_time: Option<u64>,
    /// `CLOCK_MONOTONIC` when it was read.
    pub read_ktime: u64,
    /// Its command line and cgroup, for its labels.
    pub facts: ProcessFacts,
}

/// How many times a read an `exec` tore is started again.
const TORN_READ_RETRIES: usize = 3;

impl ImageSnapshot {
    /// Reads the process now; `comm` names it when its executable cannot be read.
    ///
    /// The executable is read first and again last: an `exec` in between
    /// tore the read (the maps of one image, the name of the other), which
    /// then starts over, as it does when the maps do not map the
    /// executable (two `exec`s, away and back). `read_ktime` is taken after the first look at the
    /// executable, so the snapshot of an image an `exec` at `K` started has
    /// `read_ktime >= K`, and that of the image before it `read_ktime < K`:
    /// what [`super::ProcessTable::exec`] relies on to tell them apart.
    pub fn read(pid: u32, comm: &str) -> Self {
        let mut attempt = 0;
        loop {
            let path = process_maps::executable_path(pid).ok();
            let read_ktime = crate::clock::MonotonicToUnix::monotonic_now();
            let mut snapshot = Self::read_image(pid, comm, path);
            snapshot.read_ktime = read_ktime;
            // Gone since (`None`) is no tear: what was read stays.
            let after = process_maps::executable_path(pid).ok();
            let exe = &*snapshot.info.executable_path;
            let renamed = after.as_deref().is_some_and(|after| exe != after);
            // An exec away and one back (A, B's maps, A) leaves the name
            // alone, not the maps.
            let unmapped = !exe.is_empty()
                && !snapshot.mappings.is_empty()
                && !snapshot.mappings.mappings().iter().any(|m| *m.path == *exe);
            if !renamed && !unmapped {
                return snapshot;
            }
            attempt += 1;
            if attempt > TORN_READ_RETRIES {
                // Exec after exec: named as the image of now, without maps
                // rather than another image's (they are read again at the
                // first sample, which falls outside none).
                debug!(pid, "the process kept calling exec while read");
                let path = process_maps::executable_path(pid).ok();
                let read_ktime = crate::clock::MonotonicToUnix::monotonic_now();
                let mut snapshot = Self::read_image(pid, comm, path);
                snapshot.read_ktime = read_ktime;
                snapshot.mappings = ProcessMappings::default();
                return snapshot;
            }
        }
    }

    /// The rest of the snapshot, for the executable at `path`.
    fn read_image(pid: u32, comm: &str, path: Option<String>) -> Self {
        let mappings = match ProcessMappings::read(pid) {
            Ok(m) => m,
            Err(e) => {
                debug!(pid, "cannot read mappings: {e}");
                ProcessMappings::default()
            }
        };
        let cgroup = crate::metadata::cgroup::read_identity(pid);
        let stat = process_maps::start_time_and_parent(pid).ok();
        let facts = ProcessFacts::read(pid, &cgroup);
        let name: Arc<str> = match &path {
            Some(p) => Arc::from(p.rsplit('/').next().unwrap_or(p.as_str())),
            // A kernel thread, or a process learned without a sample (at
            // start, at a report of BPF): its own `comm`.
            None if comm.is_empty() => Arc::from(
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map(|c| c.trim_end().to_owned())
                    .unwrap_or_default(),
            ),
            None => Arc::from(comm),
        };
        ImageSnapshot {
            info: ProcessInfo {
                pid,
                executable_name: name.clone(),
                executable_path: Arc::from(path.as_deref().unwrap_or("")),
                service_name: name,
                container_id: Arc::from(cgroup.container_id.as_deref().unwrap_or("")),
                k8s_pod_uid: Arc::from(cgroup.pod_uid.as_deref().unwrap_or("")),
                parent_pid: stat.map_or(0, |(_, parent)| parent),
                build_ids: if path.is_some() {
                    crate::metadata::build_id::of_process(pid)
                } else {
                    ExecutableBuildIds::default()
                },
                ..ProcessInfo::default()
            },
            mappings,
            start_time: stat.map(|(start, _)| start),
            read_ktime: 0,
            facts,
        }
    }
}

impl TrackedProcess {
    pub(super) fn from_snapshot(snapshot: ImageSnapshot, image: u64, exec_ktime: u64) -> Self {
        TrackedProcess {
            info: snapshot.info,
            mappings: snapshot.mappings,
            image,
            described: false,
            excluded: false,
            facts: snapshot.facts,
            start_time: snapshot.start_time,
            exec_ktime,
            learned_ktime: snapshot.read_ktime,
            last_refresh: None,
        }
    }

    /// The mapping containing `address`, if known.
    pub fn mapping(&self, address: u64) -> Option<&MappedFile> {
        self.mappings.find(address)
    }
}
