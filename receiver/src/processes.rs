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

use crate::metadata::docker::{DockerContainer, DockerNames};
use crate::metadata::labels::{self, ProcessLabeler, Workload};
use crate::metadata::pods::{PodMeta, SharedPods};
use crate::process_maps::{self, ProcessMappings};

mod image;
mod thread_labels;

pub use image::{ImageSnapshot, TrackedProcess};

/// Re-reading a process's maps for an unknown address (a library loaded with
/// `dlopen`, JIT code) happens at most this often per process.
const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// Tracked processes, bounded in number (least recently sampled evicted).
/// Images an `exec` replaced are kept aside until the batch holding their
/// samples is cut, so those samples are symbolized against the image they
/// were taken in.
pub struct ProcessTable {
    processes: LruCache<u32, TrackedProcess>,
    replaced: Vec<TrackedProcess>,
    next_image: u64,
    /// Decides each new image's labels, or that it is not profiled.
    labeler: Option<Arc<dyn ProcessLabeler>>,
    /// Images excluded since [`Self::take_excluded`] was last called.
    newly_excluded: Vec<u32>,
    /// Images that were excluded and are not any more (their pod's labels
    /// changed), since [`Self::take_included`] was last called.
    newly_included: Vec<u32>,
    /// The node's pods, when Kubernetes is watched.
    pods: Option<SharedPods>,
    /// Docker's names of containers, when its socket is there.
    docker: Option<DockerNames>,
    /// The pods' and Docker answers' generations the tracked images were
    /// labeled with.
    metadata_generation: (u64, u64),
    /// Whether images carry their command line (`process.command_line`).
    command_lines: bool,
    /// Labels of the threads and CPUs of the current batch, when relabeling
    /// reads them ([`Self::thread_labels`]).
    thread_labels: thread_labels::ThreadLabels,
}

impl ProcessTable {
    /// A table holding at most `capacity` processes.
    pub fn new(capacity: NonZeroUsize) -> Self {
        ProcessTable {
            processes: LruCache::new(capacity),
            replaced: Vec::new(),
            next_image: 1,
            labeler: None,
            newly_excluded: Vec::new(),
            newly_included: Vec::new(),
            pods: None,
            docker: None,
            metadata_generation: (0, 0),
            command_lines: false,
            thread_labels: thread_labels::ThreadLabels::default(),
        }
    }

    /// Gives each image learned from now on its command line as
    /// `process.command_line` (off by default: arguments may hold secrets).
    pub fn set_command_lines(&mut self, on: bool) {
        self.command_lines = on;
    }

    /// Names each image in a pod from `pods` from now on.
    pub fn set_pods(&mut self, pods: SharedPods) {
        self.pods = Some(pods);
    }

    /// Names each image in a Docker container through `docker` from now on.
    pub fn set_docker(&mut self, docker: DockerNames) {
        self.docker = Some(docker);
    }

    /// The pids of the images no longer excluded since the last call.
    pub fn take_included(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.newly_included)
    }

    /// Names and labels the images in pods or containers again if what is
    /// known of those changed since (metadata that arrived after the
    /// process). Returns whether it did.
    pub fn refresh_metadata(&mut self) -> bool {
        let pods = self.pods.clone();
        let pods = pods.as_ref().and_then(|p| p.read().ok());
        let generation = (
            pods.as_ref().map_or(0, |p| p.generation()),
            self.docker.as_ref().map_or(0, DockerNames::generation),
        );
        if generation == self.metadata_generation {
            return false;
        }
        self.metadata_generation = generation;
        let labeler = self.labeler.clone();
        let docker = self.docker.clone();
        for (&pid, process) in self.processes.iter_mut() {
            if process.info.container_id.is_empty() && process.info.k8s_pod_uid.is_empty() {
                continue;
            }
            let pod = pods.as_ref().and_then(|p| p.get(&process.info.k8s_pod_uid));
            let container = docker
                .as_ref()
                .and_then(|d| d.lookup(&process.info.container_id));
            let workload = Workload {
                pod: pod.as_deref(),
                docker: container.as_deref(),
            };
            labels::apply_workload(&mut process.info, workload);
            let Some(labeler) = &labeler else {
                continue;
            };
            let keep = labels::apply(
                labeler.as_ref(),
                &mut process.info,
                &process.facts,
                workload,
            );
            if keep == process.excluded {
                process.excluded = !keep;
                if keep {
                    self.newly_included.push(pid);
                } else {
                    self.newly_excluded.push(pid);
                }
            }
        }
        true
    }

    /// Labels each image learned from now on with `labeler`.
    pub fn set_labeler(&mut self, labeler: Arc<dyn ProcessLabeler>) {
        self.labeler = Some(labeler);
    }

    /// The pids of the images excluded since the last call.
    pub fn take_excluded(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.newly_excluded)
    }

    /// A new image: labeled (or excluded) once, here.
    fn track(&mut self, snapshot: ImageSnapshot, image: u64, exec_ktime: u64) -> TrackedProcess {
        let (pod, container) = self.workload_records(&snapshot.info);
        let workload = Workload {
            pod: pod.as_deref(),
            docker: container.as_deref(),
        };
        let mut process = TrackedProcess::from_snapshot(snapshot, image, exec_ktime);
        if self.command_lines {
            process.info.command_line = Arc::from(process.facts.cmdline.as_str());
        }
        if workload.pod.is_some() || workload.docker.is_some() {
            labels::apply_workload(&mut process.info, workload);
        }
        if let Some(labeler) = &self.labeler
            && !labels::apply(
                labeler.as_ref(),
                &mut process.info,
                &process.facts,
                workload,
            )
        {
            process.excluded = true;
            self.newly_excluded.push(process.info.pid);
        }
        process
    }

    /// The pod and Docker container records of a process, as known now.
    fn workload_records(
        &self,
        info: &ProcessInfo,
    ) -> (Option<Arc<PodMeta>>, Option<Arc<DockerContainer>>) {
        let pod = match (&self.pods, &*info.k8s_pod_uid) {
            (Some(pods), uid) if !uid.is_empty() => pods.read().ok().and_then(|p| p.get(uid)),
            _ => None,
        };
        let container = self
            .docker
            .as_ref()
            .and_then(|d| d.lookup(&info.container_id));
        (pod, container)
    }

    fn new_image(&mut self) -> u64 {
        let image = self.next_image;
        self.next_image += 1;
        image
    }

    /// The process, learning it from `/proc` on first sight; `true` when it
    /// was learned just now.
    pub fn get_or_learn(&mut self, pid: u32, comm: &str) -> (&mut TrackedProcess, bool) {
        // Read and labeled before the cache is borrowed: `track` needs `self`.
        let fresh = if self.processes.contains(&pid) {
            None
        } else {
            let image = self.new_image();
            Some(self.track(ImageSnapshot::read(pid, comm), image, 0))
        };
        let learned = fresh.is_some();
        // The closure runs only when the pid is absent, that is when `fresh`
        // holds the image; the fallback only satisfies the types.
        let process = self.processes.get_or_insert_mut(pid, || {
            fresh.unwrap_or_else(|| {
                TrackedProcess::from_snapshot(ImageSnapshot::read(pid, comm), 0, 0)
            })
        });
        (process, learned)
    }

    /// `pid` ran `exec` at `ktime`, and `snapshot` is what was read of the
    /// new image right after (a short-lived process may be gone by its
    /// first sample's turn): its current image is kept aside until the next
    /// batch is cut.
    /// Returns whether an image was replaced (false when the one tracked is
    /// already this exec's, learned from a sample read before the event).
    pub fn exec(&mut self, pid: u32, ktime: u64, snapshot: ImageSnapshot) -> bool {
        let learned_since = self
            .processes
            .peek(&pid)
            .is_some_and(|c| c.exec_ktime == 0 && c.learned_ktime >= ktime);
        if learned_since {
            // A sample taught it already, after this exec: it is this exec's
            // image, and samples before the exec are not its.
            if let Some(current) = self.processes.peek_mut(&pid) {
                current.exec_ktime = ktime;
                if current.mappings.is_empty() {
                    current.mappings = snapshot.mappings;
                }
            }
            return false;
        }
        let replaced = match self.processes.pop(&pid) {
            Some(old) => {
                self.replaced.push(old);
                true
            }
            None => false,
        };
        let image = self.new_image();
        let process = self.track(snapshot, image, ktime);
        self.processes.put(pid, process);
        replaced
    }

    /// Mappings read again shortly after the exec at `ktime` (the loader
    /// has mapped the libraries since): they replace what the image knew,
    /// if the image is still that exec's. Returns whether they did.
    pub fn exec_mappings(&mut self, pid: u32, ktime: u64, mappings: ProcessMappings) -> bool {
        match self.processes.peek_mut(&pid) {
            Some(p) if p.exec_ktime == ktime && !mappings.is_empty() => {
                p.mappings = mappings;
                true
            }
            _ => false,
        }
    }

    /// The image of `pid` a sample taken at `ktime` belongs to: the current
    /// one, or one an `exec` since replaced; `None` for an image icecore
    /// never learned (the process image before an `exec` it saw first).
    pub fn image_at(&self, pid: u32, ktime: u64) -> Option<u64> {
        let current = self.processes.peek(&pid)?;
        if ktime >= current.exec_ktime {
            return Some(current.image);
        }
        self.replaced
            .iter()
            .filter(|p| p.info.pid == pid && p.exec_ktime <= ktime)
            .max_by_key(|p| p.exec_ktime)
            .map(|p| p.image)
    }

    /// Image `image` of `pid`, current or replaced.
    pub fn image(&self, pid: u32, image: u64) -> Option<&TrackedProcess> {
        match self.processes.peek(&pid) {
            Some(p) if p.image == image => Some(p),
            _ => self
                .replaced
                .iter()
                .find(|p| p.image == image && p.info.pid == pid),
        }
    }

    /// Whether `pid`'s tracked image was there before `ktime` (so an exit
    /// at `ktime` is its exit, not that of a process the pid had before).
    pub fn known_before(&self, pid: u32, ktime: u64) -> bool {
        self.processes.peek(&pid).is_some_and(|p| {
            let started = if p.exec_ktime > 0 {
                p.exec_ktime
            } else {
                p.learned_ktime
            };
            started <= ktime
        })
    }

    /// Forgets replaced images: the batch holding their samples is cut.
    pub fn end_batch(&mut self) {
        self.replaced.clear();
        self.thread_labels.clear();
    }

    /// Forgets a process now.
    pub fn forget(&mut self, pid: u32) {
        self.processes.pop(&pid);
    }

    /// Whether `pid` runs (not exited, not a zombie) the process learned
    /// under it.
    pub fn is_running(&self, pid: u32) -> bool {
        let Some(process) = self.processes.peek(&pid) else {
            return false;
        };
        match process_maps::start_time_and_state(pid) {
            Ok((start, state)) => {
                state != 'Z' && state != 'X' && process.start_time.is_none_or(|t| t == start)
            }
            Err(_) => false,
        }
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

    /// Re-reads the maps of `pid` when some of `addresses` fall outside its
    /// known executable memory (rate-limited per process after the first
    /// re-read).
    /// Returns whether they changed.
    pub fn refresh_if_unmapped(
        &mut self,
        pid: u32,
        addresses: impl IntoIterator<Item = u64>,
    ) -> bool {
        let Some(process) = self.processes.peek_mut(&pid) else {
            return false;
        };
        if process
            .last_refresh
            .is_some_and(|at| at.elapsed() < REFRESH_INTERVAL)
        {
            return false;
        }
        if addresses
            .into_iter()
            .all(|a| process.mappings.covers_code(a))
        {
            return false;
        }
        process.last_refresh = Some(Instant::now());
        match ProcessMappings::read(pid) {
            // An exiting process's maps read empty once its memory is torn
            // down: what it had stays, for its samples not symbolized yet.
            Ok(m) if m.is_empty() => false,
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

    /// Notes that the current image of `pid` is described to BPF.
    pub fn mark_described(&mut self, pid: u32) {
        if let Some(process) = self.processes.peek_mut(&pid) {
            process.described = true;
        }
    }

    /// The current image of the process, if tracked.
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
mod tests;
