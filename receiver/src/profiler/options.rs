//! The profiler's settings, its running totals, and each runtime's state.

use std::{num::NonZeroUsize, sync::Arc, time::Duration};

use crate::{
    metadata::{kubernetes::KubernetesOptions, labels::ProcessLabeler},
    native_unwind::NativeUnwindStats,
    runtimes::RuntimeStats,
    sampler::{CounterValues, ProgramCost, SamplerOptions},
    symbolize::SymbolizerLimits,
};

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
    /// Bytes of unwind tables BPF holds at most (the least recently sampled
    /// files' tables leave first).
    pub unwind_table_memory: usize,
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
    /// Whether a wall-clock profile (CPU samples and off-CPU waits
    /// together, per thread) is cut too; needs off-CPU sampling.
    pub wall_clock: bool,
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
            unwind_table_memory: crate::native_unwind::DEFAULT_MAX_TABLE_BYTES,
            startup_tables_wait: Duration::from_secs(10),
            labeler: None,
            kubernetes: None,
            command_lines: false,
            docker_socket: None,
            wall_clock: false,
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
    /// Off-CPU sampling's totals, when it is on.
    pub off_cpu: Option<OffCpuStats>,
}

/// Off-CPU sampling's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffCpuStats {
    /// What became of the start and end records read.
    pub join: crate::off_cpu_join::OffCpuJoinStats,
    /// Waits whose thread has not run again yet.
    pub pending: usize,
    /// Waits put into batches.
    pub reported: u64,
    /// Kernel-measured cost of the `sched_switch` program, per switch.
    pub bpf_cost: ProgramCost,
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
