//! The eBPF CPU profiler as a source of [`ProfileBatch`]es: drains the ring
//! buffer on a timer (and on BPF's forced wakeups), learns processes lazily,
//! and cuts a batch every reporting interval.

use std::{
    future::Future,
    num::NonZeroUsize,
    os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd},
    sync::{Arc, Mutex},
    time::Duration,
};

use icecore_otlp::model::ProfileBatch;
use icecore_unwinders::{Counter, sample::flags};
use tokio::{io::unix::AsyncFd, sync::mpsc, time::MissedTickBehavior};
use tracing::{debug, info, warn};

use crate::{
    aggregate::{Aggregator, BatchWindow, IntervalStats},
    clock::MonotonicToUnix,
    exec_watch::ExecWatcher,
    host,
    metadata::{docker::DockerNames, kubernetes, pods::SharedPods},
    native_unwind::NativeUnwindInfo,
    off_cpu_join::{OffCpuJoin, PendingWait, WaitEnd},
    processes::ProcessTable,
    record::RawSample,
    runtimes::Runtimes,
    sampler::{CpuSampler, SamplerError},
    startup,
    symbolize::Symbolizer,
    unwind_maps::UnwindMaps,
};

mod lifecycle;
mod options;
mod runtime_setup;

pub use options::{OffCpuStats, ProfilerOptions, ProfilerStats, RuntimeState};

use lifecycle::apply_lifecycle;
use runtime_setup::start_runtimes;

/// How often the ring buffer is drained when BPF does not force a wakeup.
/// Each wakeup of an idle agent costs tens of microseconds on a VM (timer
/// programming, two context switches): at 19 Hz the timers, not the samples,
/// were most of the agent's CPU. BPF wakes the reader early when a quarter of
/// the ring fills, so a high rate does not wait for the timer.
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// `/metrics` sees fresh BPF counters and cost every this many polls (a
/// counter read is one syscall per counter, so not on every drain), on the
/// same timer so that it costs no wakeup of its own.
const POLLS_PER_STATS_REFRESH: u32 = 2;

/// The eBPF CPU profiler.
pub struct CpuProfiler {
    sampler: CpuSampler,
    /// None when the unwind maps could not be set up: frame pointers only.
    native: Option<NativeUnwindInfo>,
    runtimes: Runtimes,
    processes: ProcessTable,
    symbolizer: Symbolizer,
    aggregator: Aggregator,
    clock: MonotonicToUnix,
    host_name: Arc<str>,
    period_nanos: i64,
    window_start: u64,
    stats: Arc<Mutex<ProfilerStats>>,
    reporter_interval: Duration,
    /// Samples lost in BPF (ring full, failed tail calls) at the last refresh.
    lost_in_bpf: u64,
    /// `lost_in_bpf` when the last batch was cut.
    lost_at_last_batch: u64,
    /// Reads new images right after their exec; `None` when it could not start.
    exec_watcher: Option<ExecWatcher>,
    /// Off-CPU waits whose start was read, until their end comes.
    off_cpu: OffCpuJoin,
}

/// A duplicate of the ring buffer's fd, owned by the reactor registration.
struct RingFd(OwnedFd);

impl AsRawFd for RingFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

fn register_ring(fd: RawFd) -> std::io::Result<AsyncFd<RingFd>> {
    // SAFETY: `fd` is the sampler's ring buffer fd, open for the sampler's
    // lifetime; we only borrow it long enough to duplicate it.
    let owned = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
    // SAFETY: the duplicate is owned by the registration and closed only when
    // the AsyncFd is dropped.
    Ok(unsafe { AsyncFd::register(RingFd(owned)) }?)
}

impl CpuProfiler {
    /// Loads the BPF programs and starts sampling.
    pub fn start(options: &ProfilerOptions) -> Result<Self, SamplerError> {
        match host::ensure_tracefs() {
            Ok(true) => info!("mounted tracefs at {}", host::TRACEFS),
            Ok(false) => {}
            Err(e) => debug!("tracefs not mounted at {}: {e}", host::TRACEFS),
        }
        let mut sampler_options = options.sampler.clone();
        sampler_options.exclusions = options.labeler.as_ref().is_some_and(|l| l.may_exclude());
        let mut sampler = CpuSampler::load(&sampler_options)?;
        let mut processes = ProcessTable::new(options.max_processes);
        processes.set_command_lines(options.command_lines);
        if let Some(labeler) = &options.labeler {
            processes.set_labeler(labeler.clone());
        }
        if let Some(kubernetes) = &options.kubernetes {
            let pods = SharedPods::default();
            kubernetes::spawn(kubernetes.clone(), pods.clone());
            processes.set_pods(pods);
        }
        if let Some(socket) = &options.docker_socket {
            processes.set_docker(DockerNames::spawn(socket.clone()));
        }
        let native = sampler.take_unwind_maps().and_then(|set| {
            let maps = UnwindMaps::new(set)
                .map_err(|e| warn!("DWARF unwinding off, frame pointers only: {e}"))
                .ok()?;
            NativeUnwindInfo::new(
                maps,
                // Built tables kept in user space: more than the distinct
                // files of a crowded host (integration/crowded.rs maps 2,000).
                NonZeroUsize::new(4096).unwrap_or(NonZeroUsize::MIN),
                options.unwind_table_memory,
            )
            .map_err(|e| warn!("DWARF unwinding off, cannot start its thread: {e}"))
            .ok()
        });
        let (plugins, runtime_states) =
            start_runtimes(&mut sampler, &options.sampler.runtimes, native.is_some());
        let mut runtimes = Runtimes::new(plugins);
        let mut native = native;
        if let Some(native) = native.as_mut() {
            startup::describe_running(
                native,
                &mut runtimes,
                &mut processes,
                &options.sampler.pids,
                options.startup_tables_wait,
            );
        }
        // Excluded before the first sample: they never reach the ring.
        for pid in processes.take_excluded() {
            sampler.exclude(pid);
        }
        // Execs and exits meanwhile wait in the lifecycle ring (its
        // tracepoints are attached at load) for the first drain.
        let exec_watcher = sampler.take_events().and_then(|ring| {
            ExecWatcher::spawn(ring)
                .map_err(|e| {
                    warn!("cannot follow execs; short-lived processes may show unsymbolized: {e}")
                })
                .ok()
        });
        sampler.start_sampling()?;
        let hz = i64::from(options.sampler.frequency_hz.max(1));
        Ok(CpuProfiler {
            sampler,
            native,
            runtimes,
            processes,
            symbolizer: Symbolizer::new(options.symbolizer),
            aggregator: Aggregator::new(
                options.max_samples_per_interval,
                options.sampler.off_cpu.map(|o| o.probability),
                options.wall_clock,
            ),
            clock: MonotonicToUnix::measure(),
            host_name: Arc::from(host::host_name()),
            period_nanos: 1_000_000_000 / hz,
            window_start: MonotonicToUnix::unix_now(),
            stats: Arc::new(Mutex::new(ProfilerStats {
                runtime_states,
                ..ProfilerStats::default()
            })),
            reporter_interval: options.reporter_interval,
            lost_in_bpf: 0,
            lost_at_last_batch: 0,
            exec_watcher,
            off_cpu: OffCpuJoin::default(),
        })
    }

    /// Shared view of the running totals.
    pub fn stats(&self) -> Arc<Mutex<ProfilerStats>> {
        self.stats.clone()
    }

    /// Reads every waiting lifecycle event and sample into the current interval.
    pub fn drain(&mut self) -> usize {
        let Self {
            sampler,
            native,
            runtimes,
            processes,
            symbolizer,
            aggregator,
            clock,
            stats,
            exec_watcher,
            off_cpu,
            ..
        } = self;
        // Lifecycle first: the exec thread reads an image right after its
        // exec, and a sample taken before an exec is in its CPU's ring by
        // then, so every sample is matched to the image it was taken in by
        // its time (`image_at`).
        let mut exits = Vec::new();
        let mut described = Vec::new();
        let mut lifecycle = |processes: &mut ProcessTable,
                             native: &mut Option<NativeUnwindInfo>,
                             runtimes: &mut Runtimes,
                             symbolizer: &mut Symbolizer,
                             described: &mut Vec<u32>| {
            if let Some(watcher) = exec_watcher.as_ref() {
                watcher.drain(|event| {
                    apply_lifecycle(
                        event, processes, native, runtimes, symbolizer, described, &mut exits,
                    );
                });
            }
        };
        lifecycle(processes, native, runtimes, symbolizer, &mut described);
        let mut malformed = 0u64;
        let mut excluded = 0u64;
        // When this drain's samples were last taken, near enough for the
        // unwind-table budget's recency (drains are at most 500 ms apart).
        let drained_at = std::time::Instant::now();
        let n = sampler.drain(|bytes| match RawSample::decode(bytes) {
            Ok(sample) if sample.header.flags & flags::OFF_CPU_END != 0 => {
                let end = WaitEnd {
                    tid: sample.header.tid,
                    start_ktime_ns: sample.header.ktime_ns,
                    off_cpu_ns: sample.header.off_cpu_ns,
                };
                if let Some(joined) = off_cpu.end(end) {
                    joined.add_to(aggregator, clock);
                }
            }
            Ok(sample) => {
                let pid = sample.header.pid;
                let comm = String::from_utf8_lossy(sample.comm());
                if processes.image_at(pid, sample.header.ktime_ns).is_none() {
                    // A process this drain has not seen: its exec may have
                    // been reported while the rings were being read.
                    lifecycle(processes, native, runtimes, symbolizer, &mut described);
                }
                let (process, learned) = processes.get_or_learn(pid, &comm);
                if process.excluded {
                    // Taken before BPF was told to skip the process.
                    excluded += 1;
                    return;
                }
                let has_code = !process.mappings.is_empty();
                // An image learned at its exec is described at its first sample.
                let undescribed = !std::mem::replace(&mut process.described, true);
                if learned {
                    symbolizer.preload(pid, &process.mappings, &[]);
                }
                let refreshed = processes.refresh_if_unmapped(pid, sample.native_frames());
                if refreshed && let Some(process) = processes.get(pid) {
                    symbolizer.preload(pid, &process.mappings, &[]);
                }
                if (undescribed || refreshed)
                    && has_code
                    && let Some(native) = native.as_mut()
                    && let Some(process) = processes.get(pid)
                {
                    if learned {
                        // A reused pid: whatever was known of the old process goes.
                        runtimes.detach(pid);
                    }
                    let code = runtimes.attach(pid, &process.mappings);
                    native.describe_process(pid, &process.mappings, &code);
                    described.push(pid);
                }
                if let Some(native) = native.as_mut() {
                    native.note_sample(pid, sample.native_frames(), drained_at);
                }
                if sample.has_runtime_words() && runtimes.has_process(pid) {
                    let words: Vec<u64> = sample.user_words().collect();
                    runtimes.observe(pid, &words);
                }
                let image = processes.image_at(pid, sample.header.ktime_ns);
                if sample.header.flags & flags::OFF_CPU != 0 {
                    let wait = PendingWait {
                        pid,
                        start_ktime_ns: sample.header.ktime_ns,
                        image,
                        record: bytes.into(),
                    };
                    off_cpu.start(sample.header.tid, wait);
                } else {
                    aggregator.add(&sample, clock.to_unix(sample.header.ktime_ns), image);
                }
            }
            Err(e) => {
                malformed += 1;
                debug!("dropping ring-buffer record: {e}");
            }
        });
        for joined in off_cpu.after_drain() {
            joined.add_to(aggregator, clock);
        }
        if let Some(native) = native.as_mut() {
            // Runtimes that could not describe a process at its first
            // sample (a JVM still starting) try again.
            for pid in runtimes.due_for_attach() {
                if let Some(process) = processes.get(pid) {
                    let code = runtimes.attach(pid, &process.mappings);
                    native.describe_process(pid, &process.mappings, &code);
                    described.push(pid);
                }
            }
            for (pid, ktime) in exits {
                // The exit of the image BPF knows (not of a process the pid
                // had before): the process table keeps it until the next
                // batch is symbolized; BPF needs nothing more of it.
                if processes.known_before(pid, ktime) || processes.get(pid).is_none() {
                    native.forget_process(pid);
                }
            }
            described.extend(native.poll_builds(|pid| processes.get(pid).map(|p| &p.mappings)));
            // A process described after it exited had no exit event (BPF
            // reports exits of described processes only): forget it now
            // rather than at the next batch's sweep.
            for pid in described {
                if !processes.is_running(pid) {
                    native.forget_process(pid);
                }
            }
        }
        processes.refresh_metadata();
        for pid in processes.take_excluded() {
            if let Some(native) = native.as_mut() {
                native.forget_process(pid);
            }
            runtimes.detach(pid);
            sampler.exclude(pid);
        }
        for pid in processes.take_included() {
            sampler.include(pid);
            processes.forget(pid);
        }
        if (malformed > 0 || excluded > 0)
            && let Ok(mut s) = stats.lock()
        {
            s.malformed_records += malformed;
            s.samples_excluded += excluded;
        }
        n
    }

    /// Drains, then cuts the batches of the interval that ends now: CPU,
    /// then off-CPU when it is on.
    pub fn take_batches(&mut self) -> Vec<ProfileBatch> {
        // Exits seen before the drain: every sample of those processes is
        // in the ring now, so the drain reads them all and they are
        // symbolized with what is known of the process before it is dropped.
        // (Swept after the drain, a process that exited in between would
        // lose its last samples' executable and symbols.)
        let exited = self.processes.exited();
        self.drain();
        // Counters as of the drain: samples BPF emitted after it belong to
        // the next batch, so emitted and reported totals compare exactly
        // (symbolizing the batch below can take a while).
        self.refresh_stats(true);
        let now = MonotonicToUnix::unix_now();
        let window = BatchWindow {
            start_unix_nanos: self.window_start,
            duration_nanos: now.saturating_sub(self.window_start).max(1),
            period_nanos: self.period_nanos,
            host_name: self.host_name.clone(),
            host: icecore_otlp::model::HostInfo::this_host(),
        };
        self.window_start = now;
        let (batches, interval) = self.aggregator.take_batches(
            window,
            &mut self.processes,
            &mut self.symbolizer,
            &mut self.runtimes,
        );
        // Images replaced by an exec, and the interpreter state of exited
        // processes, are kept until their last samples are symbolized,
        // which the batch above did.
        self.processes.end_batch();
        for &pid in &exited {
            self.off_cpu.forget_process(pid);
            self.processes.forget(pid);
            self.runtimes.detach(pid);
            if let Some(native) = self.native.as_mut() {
                native.forget_process(pid);
            }
        }
        let exited = exited.len();
        self.clock = MonotonicToUnix::measure();
        self.record_interval(interval, exited);
        batches
    }

    fn record_interval(&mut self, interval: IntervalStats, exited: usize) {
        let newly_lost = self.lost_in_bpf.saturating_sub(self.lost_at_last_batch);
        self.lost_at_last_batch = self.lost_in_bpf;
        if newly_lost > 0 || interval.dropped > 0 {
            warn!(
                lost_in_bpf = newly_lost,
                dropped_at_limit = interval.dropped,
                "samples lost this interval; see the BPF counters"
            );
        }
        let Ok(mut stats) = self.stats.lock() else {
            return;
        };
        stats.samples_reported += interval.samples as u64;
        if let Some(off_cpu) = stats.off_cpu.as_mut() {
            off_cpu.reported += interval.off_cpu_waits as u64;
        }
        stats.samples_dropped += interval.dropped;
        stats.samples_relabel_dropped += interval.relabel_dropped;
        stats.batches += 1;
        let cost = stats.bpf_cost;
        drop(stats);
        debug!(
            samples = interval.samples,
            stacks = interval.stacks,
            processes = self.processes.len(),
            exited,
            bpf_ns_per_sample = cost.run_time_ns.checked_div(cost.run_count).unwrap_or(0),
            "interval"
        );
    }

    /// Brings the shared totals up to date: the BPF counters and cost, the
    /// unwinders' state and, `with_map_memory`, the BPF maps' memory (which
    /// reads every descriptor's fdinfo, so only once per batch).
    fn refresh_stats(&mut self, with_map_memory: bool) {
        let counters = self.sampler.counters().unwrap_or_default();
        let cost = self.sampler.cost().unwrap_or_default();
        self.lost_in_bpf = counters.get(Counter::RingBufferFull)
            + counters.get(Counter::TailCallFailed)
            + counters.get(Counter::ScratchUnavailable)
            + counters.get(Counter::SampleRingMissing);
        let held_map_bytes = if with_map_memory {
            crate::map_memory::held_map_bytes()
                .map_err(|e| debug!("cannot read /proc/self/fdinfo: {e}"))
                .ok()
        } else {
            None
        };
        let runtimes = self.runtimes.stats();
        let native = self
            .native
            .as_ref()
            .map(NativeUnwindInfo::stats)
            .unwrap_or_default();
        let Ok(mut stats) = self.stats.lock() else {
            return;
        };
        stats.counters = counters;
        stats.bpf_cost = cost;
        stats.processes_tracked = self.processes.len();
        stats.runtimes = runtimes;
        if let Some(watcher) = &self.exec_watcher {
            let exec = watcher.stats();
            stats.execs = exec.execs.load(std::sync::atomic::Ordering::Relaxed);
            stats.execs_gone = exec.gone_at_exec.load(std::sync::atomic::Ordering::Relaxed);
            stats.exec_events_dropped = exec.dropped.load(std::sync::atomic::Ordering::Relaxed);
        }
        stats.native = native;
        if self.sampler.off_cpu_enabled() {
            let off_cpu = stats.off_cpu.get_or_insert_default();
            off_cpu.join = self.off_cpu.stats();
            off_cpu.pending = self.off_cpu.pending();
            off_cpu.bpf_cost = self.sampler.off_cpu_cost().unwrap_or_default();
        }
        if let Some(held) = held_map_bytes {
            stats.bpf_map_bytes = held + stats.native.inner_map_bytes;
        }
    }

    /// Runs until `shutdown` completes: batches go to `batches` every
    /// reporting interval, whenever `cut_now` is notified (a pull whose
    /// window is over), and a last one with whatever remains at shutdown.
    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()>,
        batches: mpsc::Sender<ProfileBatch>,
        cut_now: Arc<tokio::sync::Notify>,
    ) -> ProfilerStats {
        let ring = match register_ring(self.sampler.as_raw_fd()) {
            Ok(fd) => Some(fd),
            Err(e) => {
                warn!("ring buffer not pollable, draining on a timer only: {e}");
                None
            }
        };
        let mut poll = tokio::time::interval(POLL_INTERVAL);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let start = tokio::time::Instant::now() + self.reporter_interval;
        let mut report = tokio::time::interval_at(start, self.reporter_interval);
        report.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut polls = 0u32;
        let built = self.native.as_ref().map(NativeUnwindInfo::build_notifier);
        let execs = self.exec_watcher.as_ref().map(ExecWatcher::ready_notifier);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = poll.tick() => {
                    self.drain();
                    polls = polls.wrapping_add(1);
                    if polls.is_multiple_of(POLLS_PER_STATS_REFRESH) {
                        self.refresh_stats(false);
                    }
                }
                () = wait_notified(built.as_deref()) => {
                    // A table is ready: install it now, not at the next poll.
                    self.drain();
                }
                () = wait_notified(execs.as_deref()) => {
                    // A new process was read: describe it now.
                    self.drain();
                }
                ready = wait_readable(ring.as_ref()) => {
                    // Cleared before draining: a wakeup that comes during
                    // the drain (an exec, a new process's first sample) must
                    // wake the next wait, not wait for the poll timer.
                    if let Some(mut guard) = ready {
                        guard.clear_ready();
                    }
                    self.drain();
                }
                _ = report.tick() => {
                    if !send_all(&batches, self.take_batches()).await {
                        warn!("no sink is listening any more; stopping");
                        break;
                    }
                }
                () = cut_now.notified() => {
                    if !send_all(&batches, self.take_batches()).await {
                        warn!("no sink is listening any more; stopping");
                        break;
                    }
                }
            }
        }
        // Samples emitted after the final drain would be counted as emitted
        // but never reported: stop sampling first.
        if let Err(e) = self.sampler.stop_sampling() {
            warn!("could not stop sampling before the final batch: {e}");
        }
        if !send_all(&batches, self.take_batches()).await {
            warn!("the final batch had no sink to go to");
        }
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Sends each batch; false once the sinks are gone.
async fn send_all(
    sender: &tokio::sync::mpsc::Sender<ProfileBatch>,
    batches: Vec<ProfileBatch>,
) -> bool {
    for batch in batches {
        if sender.send(batch).await.is_err() {
            return false;
        }
    }
    true
}

async fn wait_notified(notify: Option<&tokio::sync::Notify>) {
    match notify {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

async fn wait_readable(
    ring: Option<&AsyncFd<RingFd>>,
) -> Option<tokio::io::unix::AsyncFdReadyGuard<'_, RingFd>> {
    match ring {
        Some(fd) => fd.readable().await.ok(),
        None => std::future::pending().await,
    }
}
