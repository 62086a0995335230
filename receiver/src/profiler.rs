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
use icecore_unwinders::Counter;
use tokio::{io::unix::AsyncFd, sync::mpsc, time::MissedTickBehavior};
use tracing::{debug, info, warn};

use crate::{
    aggregate::{Aggregator, BatchWindow, IntervalStats},
    clock::MonotonicToUnix,
    exec_watch::{ExecWatcher, Lifecycle},
    host,
    metadata::{
        docker::DockerNames,
        kubernetes::{self, KubernetesOptions},
        labels::ProcessLabeler,
        pods::SharedPods,
    },
    native_unwind::{DEFAULT_MAX_TABLE_BYTES, NativeUnwindInfo, NativeUnwindStats},
    processes::ProcessTable,
    record::RawSample,
    runtimes::{RuntimePlugin, RuntimeStats, Runtimes, registry},
    sampler::{CounterValues, CpuSampler, ProgramCost, RuntimeLoad, SamplerError, SamplerOptions},
    startup,
    symbolize::{Symbolizer, SymbolizerLimits},
    unwind_maps::UnwindMaps,
};

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

/// Settings of the eBPF CPU profiler.
#[derive(Debug, Clone)]
pub struct ProfilerOptions {
    /// What to sample.
    pub sampler: SamplerOptions,
    /// How often a batch is cut.
    pub reporter_interval: Duration,
    /// Processes tracked at once (least recently sampled evicted).
    pub max_processes: NonZeroUsize,
    /// Samples kept per interval; more are dropped and counted.
    pub max_samples_per_interval: usize,
    /// The symbolizer's bounds (debug information memory among them).
    pub symbolizer: SymbolizerLimits,
    /// How long the start waits for the unwind tables of the processes
    /// already running (their first samples are then unwound whole).
    pub startup_tables_wait: Duration,
    /// Decides each process's labels, or that it is not profiled; every
    /// process is profiled without labels beyond its identity when `None`.
    pub labeler: Option<Arc<dyn ProcessLabeler>>,
    /// Where to watch this node's pods for their names and labels; none
    /// when `None` (processes in pods keep their IDs).
    pub kubernetes: Option<KubernetesOptions>,
    /// Whether processes carry their command line (`process.command_line`).
    pub command_lines: bool,
    /// The Docker Engine's socket, to name Docker containers; none when `None`.
    pub docker_socket: Option<std::path::PathBuf>,
}

impl ProfilerOptions {
    /// Defaults for everything but what to sample.
    pub fn new(sampler: SamplerOptions, reporter_interval: Duration) -> Self {
        ProfilerOptions {
            sampler,
            reporter_interval,
            max_processes: NonZeroUsize::new(16_384).unwrap_or(NonZeroUsize::MIN),
            max_samples_per_interval: 2_000_000,
            symbolizer: SymbolizerLimits::default(),
            startup_tables_wait: Duration::from_secs(10),
            labeler: None,
            kubernetes: None,
            command_lines: false,
            docker_socket: None,
        }
    }
}

/// Running totals, readable while the profiler runs (for logs and metrics).
#[derive(Debug, Clone, Default)]
pub struct ProfilerStats {
    /// BPF counters summed over CPUs.
    pub counters: CounterValues,
    /// Kernel-measured BPF cost.
    pub bpf_cost: ProgramCost,
    /// Ring-buffer records that failed to decode.
    pub malformed_records: u64,
    /// Samples of processes relabeling excluded, taken before BPF skipped
    /// them (dropped in user space).
    pub samples_excluded: u64,
    /// Samples put into batches.
    pub samples_reported: u64,
    /// Samples dropped at the per-interval limit.
    pub samples_dropped: u64,
    /// Samples relabeling by thread or CPU dropped.
    pub samples_relabel_dropped: u64,
    /// Batches produced.
    pub batches: u64,
    /// Processes currently tracked.
    pub processes_tracked: usize,
    /// The native unwinder's tables and process descriptions.
    pub native: NativeUnwindStats,
    /// Kernel memory of all of icecore's BPF maps, inner maps included.
    pub bpf_map_bytes: u64,
    /// Each runtime plugin's counts, by name.
    pub runtimes: Vec<(&'static str, RuntimeStats)>,
    /// Each runtime's state: running, turned off, or failed to start.
    pub runtime_states: Vec<(&'static str, RuntimeState)>,
    /// Execs the exec thread followed.
    pub execs: u64,
    /// Of those, processes gone before their image could be read.
    pub execs_gone: u64,
    /// Lifecycle events dropped because the profiler fell behind.
    pub exec_events_dropped: u64,
}

/// Whether a runtime runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeState {
    /// Its plugin runs (and its BPF program, if it has one, is loaded).
    Running,
    /// Turned off by configuration.
    Disabled,
    /// It could not start: the kernel rejected its BPF program, or its
    /// plugin could not be built (the message says why).
    Failed(String),
}

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
                NonZeroUsize::new(1024).unwrap_or(NonZeroUsize::MIN),
                DEFAULT_MAX_TABLE_BYTES,
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
            aggregator: Aggregator::new(options.max_samples_per_interval),
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
        let n = sampler.drain(|bytes| match RawSample::decode(bytes) {
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
                if sample.has_runtime_words() && runtimes.has_process(pid) {
                    let words: Vec<u64> = sample.user_words().collect();
                    runtimes.observe(pid, &words);
                }
                let image = processes.image_at(pid, sample.header.ktime_ns);
                aggregator.add(&sample, clock.to_unix(sample.header.ktime_ns), image);
            }
            Err(e) => {
                malformed += 1;
                debug!("dropping ring-buffer record: {e}");
            }
        });
        if let Some(native) = native.as_mut() {
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

    /// Drains, then cuts the batch of the interval that ends now.
    pub fn take_batch(&mut self) -> ProfileBatch {
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
        let (batch, interval) = self.aggregator.take_batch(
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
            self.processes.forget(pid);
            self.runtimes.detach(pid);
            if let Some(native) = self.native.as_mut() {
                native.forget_process(pid);
            }
        }
        let exited = exited.len();
        self.clock = MonotonicToUnix::measure();
        self.record_interval(interval, exited);
        batch
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
                    let batch = self.take_batch();
                    if batches.send(batch).await.is_err() {
                        warn!("no sink is listening any more; stopping");
                        break;
                    }
                }
                () = cut_now.notified() => {
                    let batch = self.take_batch();
                    if batches.send(batch).await.is_err() {
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
        let batch = self.take_batch();
        if batches.send(batch).await.is_err() {
            warn!("the final batch had no sink to go to");
        }
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Applies one result of the exec thread to the profiler's state.
fn apply_lifecycle(
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
            // Described already: BPF learns it from that description (the
            // report was sent before it took effect), or the description
            // failed and was counted; either way, not again on every report.
            if process.described {
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

/// Each runtime's name and state.
type RuntimeStates = Vec<(&'static str, RuntimeState)>;

/// Builds the plugin of every enabled runtime whose BPF program (if any)
/// loaded, and says what became of each runtime.
fn start_runtimes(
    sampler: &mut CpuSampler,
    enabled: &[&'static str],
    native_tables: bool,
) -> (Vec<Box<dyn RuntimePlugin>>, RuntimeStates) {
    let mut plugins = Vec::new();
    let mut states = Vec::new();
    for runtime in registry::RUNTIMES {
        let state = if !enabled.contains(&runtime.name) {
            RuntimeState::Disabled
        } else if let Some(failure) = runtime.bpf.and_then(|bpf| {
            sampler
                .runtime_loads()
                .iter()
                .find_map(|(r, load)| match load {
                    RuntimeLoad::Failed(why) if r.name == bpf.name => Some(why.clone()),
                    _ => None,
                })
        }) {
            RuntimeState::Failed(failure)
        } else if runtime.bpf.is_some() && !native_tables {
            // Runtime code is dispatched from the native unwinder's tables.
            warn!(
                runtime = runtime.name,
                "runtime off: the native unwinder's tables are off"
            );
            RuntimeState::Failed("the native unwinder's tables are off".into())
        } else {
            match (runtime.build)(sampler) {
                Ok(plugin) => {
                    plugins.push(plugin);
                    RuntimeState::Running
                }
                Err(e) => {
                    warn!(runtime = runtime.name, "runtime off: {e}");
                    RuntimeState::Failed(e.to_string())
                }
            }
        };
        states.push((runtime.name, state));
    }
    let running: Vec<&str> = states
        .iter()
        .filter(|(_, s)| *s == RuntimeState::Running)
        .map(|(n, _)| *n)
        .collect();
    info!(runtimes = ?running, "runtime unwinders");
    (plugins, states)
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
