//! Loads icecore's BPF programs and samples every online CPU.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, ProgramArray, RingBuf},
    programs::{
        TracePoint,
        perf_event::{
            PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent,
        },
    },
};
use icecore_unwinders::{BPF_RUNTIMES, BpfRuntime, COUNTER_COUNT, Counter, ProgramIndex};
use tracing::{debug, info, warn};

mod errors;
mod off_cpu;
mod programs;
mod task_offsets;

pub use errors::SamplerError;
pub use off_cpu::OffCpuOptions;

use errors::{one_line_reason, permission_or, permission_or_program};
use programs::{load_program, perf_program, rejected_program_for_test};
use task_offsets::TaskOffsets;

use crate::{
    host,
    sample_rings::{SampleRings, ring_bytes_per_cpu},
    unwind_maps::UnwindMapSet,
};

/// The compiled BPF object (see build.rs).
static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/icecore"));

const ENTRY_PROGRAM: &str = "on_cpu_sample";
/// Lifecycle tracepoints: (program, category, tracepoint).
const LIFECYCLE_PROGRAMS: [(&str, &str, &str); 2] = [
    ("on_process_exit", "sched", "sched_process_exit"),
    ("on_process_exec", "sched", "sched_process_exec"),
];

/// What to sample.
#[derive(Debug, Clone)]
pub struct SamplerOptions {
    /// Samples per second per CPU.
    pub frequency_hz: u32,
    /// Only these processes; every process when empty.
    pub pids: Vec<u32>,
    /// Names of the runtimes whose BPF programs to load (see
    /// `icecore_unwinders::BPF_RUNTIMES`); others stay unloaded.
    pub runtimes: Vec<&'static str>,
    /// Whether processes may be excluded from sampling
    /// ([`CpuSampler::exclude`]); without, the entry program never looks.
    pub exclusions: bool,
    /// Off-CPU sampling, when on.
    pub off_cpu: Option<OffCpuOptions>,
}

impl SamplerOptions {
    /// Sampling at `frequency_hz` (every process when `pids` is empty) with
    /// every runtime.
    pub fn new(frequency_hz: u32, pids: Vec<u32>) -> Self {
        SamplerOptions {
            frequency_hz,
            pids,
            runtimes: crate::runtimes::registry::RUNTIMES
                .iter()
                .map(|r| r.name)
                .collect(),
            exclusions: false,
            off_cpu: None,
        }
    }
}

/// The environment variable naming a runtime whose BPF program is made to
/// fail verification: a test switch for the path a kernel that rejects a
/// runtime's program takes.
pub const REJECT_RUNTIME_ENV: &str = "ICECORE_TEST_REJECT_RUNTIME";

/// How loading one runtime's BPF program went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeLoad {
    /// Loaded; its slot in the program array is filled.
    Loaded,
    /// Turned off by configuration.
    Disabled,
    /// The kernel rejected it (the message says why); the runtime is off.
    Failed(String),
}

/// Counter values summed over CPUs, in `Counter` index order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterValues(pub [u64; COUNTER_COUNT as usize]);

impl Default for CounterValues {
    fn default() -> Self {
        CounterValues([0; COUNTER_COUNT as usize])
    }
}

impl CounterValues {
    /// The value of one counter.
    pub fn get(&self, counter: Counter) -> u64 {
        self.0[counter as usize]
    }
}

/// Kernel-measured cost of a BPF program (needs `kernel.bpf_stats_enabled`,
/// which the sampler turns on while it runs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgramCost {
    /// Total nanoseconds spent, including tail-called programs.
    pub run_time_ns: u64,
    /// Number of runs.
    pub run_count: u64,
}

impl ProgramCost {
    /// The kernel's statistics of `program`; `None` when it has none.
    fn of(program: &aya::programs::Program) -> Option<Self> {
        let info = program.info().ok()?;
        Some(ProgramCost {
            run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
            run_count: info.run_count(),
        })
    }
}

/// The loaded, attached BPF programs and their maps.
pub struct CpuSampler {
    ebpf: Ebpf,
    rings: SampleRings,
    events: Option<RingBuf<MapData>>,
    unwind_maps: Option<UnwindMapSet>,
    counters: PerCpuArray<MapData, u64>,
    // The kernel empties a program array when its last user-space reference
    // closes, which would silently turn every tail call into a failure.
    _programs: ProgramArray<MapData>,
    _stats: Option<OwnedFd>,
    /// The online CPUs, each sampled by one perf event.
    cpus: Vec<u32>,
    frequency_hz: u32,
    /// The pid filter, for the log.
    pids: Vec<u32>,
    /// The entry program's perf events, one per CPU; empty before
    /// [`CpuSampler::start_sampling`] and once stopped.
    sampling_links: Vec<PerfEventLinkId>,
    runtime_loads: Vec<(&'static BpfRuntime, RuntimeLoad)>,
    /// `EXCLUDED_PIDS`, when exclusions are on.
    excluded: Option<HashMap<MapData, u32, u8>>,
    /// The off-CPU programs, when off-CPU sampling is on.
    off_cpu: Option<off_cpu::OffCpuPrograms>,
}

impl CpuSampler {
    /// Loads the programs and starts sampling every online CPU.
    pub fn start(options: &SamplerOptions) -> Result<Self, SamplerError> {
        let mut sampler = Self::load(options)?;
        sampler.start_sampling()?;
        Ok(sampler)
    }

    /// Loads the programs and follows process lifecycles, without sampling
    /// yet: the caller describes the running processes first (so that their
    /// first samples are unwound whole), then calls [`Self::start_sampling`].
    pub fn load(options: &SamplerOptions) -> Result<Self, SamplerError> {
        host::check_privileges()?;
        let release = host::kernel_release();
        if host::kernel_version(&release).is_some_and(|v| v < (5, 8)) {
            return Err(SamplerError::KernelTooOld(release));
        }
        if BPF_OBJECT.is_empty() {
            return Err(SamplerError::NoBpfObject);
        }
        let cpus =
            aya::util::online_cpus().map_err(|(what, e)| SamplerError::OnlineCpus(what, e))?;
        // A wakeup once a CPU's ring is a quarter full: user space drains on
        // a timer too, so wakeups only guard against bursts.
        let wakeup_bytes = u64::from(ring_bytes_per_cpu(options.frequency_hz) / 4);
        let task = TaskOffsets::read(options.off_cpu.is_some())?;
        let rejected_program = rejected_program_for_test();
        let filter = u8::from(!options.pids.is_empty());
        let filter_capacity = u32::try_from(options.pids.len().max(1)).unwrap_or(u32::MAX);
        let exclude = u8::from(options.exclusions);
        let exclusion_capacity = if options.exclusions {
            icecore_unwinders::sample::EXCLUDED_PIDS_MAX
        } else {
            1
        };

        let (off_cpu_threshold, off_cpu_min_ns, off_cpu_threads) = match &options.off_cpu {
            Some(off_cpu) => (
                off_cpu.threshold(),
                off_cpu.min_ns(),
                off_cpu::OFF_CPU_THREADS_MAX,
            ),
            None => (0, 0, 1),
        };

        let mut ebpf = EbpfLoader::new()
            .override_global("FILTER_BY_PID", &filter, true)
            .override_global("TASK_STACK_OFFSET", &task.stack, true)
            .override_global("TASK_FSBASE_OFFSET", &task.fsbase, true)
            .override_global("WAKEUP_BYTES", &wakeup_bytes, true)
            .override_global("REJECTED_PROGRAM", &rejected_program, true)
            .override_global("EXCLUDE_PIDS", &exclude, true)
            .map_max_entries("PID_FILTER", filter_capacity)
            .map_max_entries("EXCLUDED_PIDS", exclusion_capacity)
            .override_global("OFF_CPU_THRESHOLD", &off_cpu_threshold, true)
            .override_global("OFF_CPU_MIN_NS", &off_cpu_min_ns, true)
            .override_global("TASK_PID_OFFSET", &task.pid, true)
            .override_global("TASK_FLAGS_OFFSET", &task.flags, true)
            .override_global("TASK_STATE_OFFSET", &task.state, true)
            .map_max_entries("OFF_CPU_STARTS", off_cpu_threads)
            .load(BPF_OBJECT)
            .map_err(|e| permission_or(e, SamplerError::Load))?;

        let stats = match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
            Ok(fd) => Some(fd),
            Err(e) => {
                debug!("BPF run-time stats unavailable: {e}");
                None
            }
        };

        if !options.pids.is_empty() {
            let map = ebpf
                .map_mut("PID_FILTER")
                .ok_or(SamplerError::MissingMap("PID_FILTER"))?;
            let mut pid_filter: HashMap<_, u32, u8> =
                HashMap::try_from(map).map_err(|source| SamplerError::Map {
                    name: "PID_FILTER",
                    source,
                })?;
            for &pid in &options.pids {
                pid_filter
                    .insert(pid, 1, 0)
                    .map_err(|source| SamplerError::Map {
                        name: "PID_FILTER",
                        source,
                    })?;
            }
        }

        for (_, name) in ProgramIndex::REQUIRED {
            load_program(&mut ebpf, name)?;
        }
        load_program(&mut ebpf, ENTRY_PROGRAM)?;
        let runtime_loads: Vec<(&'static BpfRuntime, RuntimeLoad)> = BPF_RUNTIMES
            .iter()
            .map(|runtime| {
                if !options.runtimes.contains(&runtime.name) {
                    return (runtime, RuntimeLoad::Disabled);
                }
                match load_program(&mut ebpf, runtime.program_name) {
                    Ok(()) => (runtime, RuntimeLoad::Loaded),
                    Err(e) => {
                        // One line, not the verifier's whole log: the
                        // runtime is off, everything else runs.
                        let reason = one_line_reason(&format!("{e:#}"));
                        warn!(
                            runtime = runtime.name,
                            "the kernel rejected the runtime's BPF program; {} frames will not be unwound: {reason}",
                            runtime.name
                        );
                        debug!(runtime = runtime.name, "{e:?}");
                        (runtime, RuntimeLoad::Failed(reason))
                    }
                }
            })
            .collect();

        let programs_map = ebpf
            .take_map("PROGRAMS")
            .ok_or(SamplerError::MissingMap("PROGRAMS"))?;
        let mut programs =
            ProgramArray::try_from(programs_map).map_err(|source| SamplerError::Map {
                name: "PROGRAMS",
                source,
            })?;
        let loaded_runtimes = runtime_loads
            .iter()
            .filter(|(_, load)| *load == RuntimeLoad::Loaded)
            .map(|(runtime, _)| (runtime.program, runtime.program_name));
        for (index, name) in ProgramIndex::REQUIRED.into_iter().chain(loaded_runtimes) {
            let program = perf_program(&mut ebpf, name)?;
            let fd = program
                .fd()
                .and_then(|fd| fd.try_clone().map_err(Into::into))
                .map_err(|source| SamplerError::Program { name, source })?;
            programs
                .set(index as u32, &fd, 0)
                .map_err(|source| SamplerError::Map {
                    name: "PROGRAMS",
                    source,
                })?;
        }

        let off_cpu = match options.off_cpu {
            Some(_) => Some(off_cpu::OffCpuPrograms::load(&mut ebpf, &runtime_loads)?),
            None => None,
        };

        let rings = ebpf
            .take_map("SAMPLE_RINGS")
            .ok_or(SamplerError::MissingMap("SAMPLE_RINGS"))?;
        let rings = SampleRings::create(rings, &cpus, options.frequency_hz)?;
        let counters = ebpf
            .take_map("COUNTERS")
            .ok_or(SamplerError::MissingMap("COUNTERS"))?;
        let counters = PerCpuArray::try_from(counters).map_err(|source| SamplerError::Map {
            name: "COUNTERS",
            source,
        })?;

        let events = ebpf
            .take_map("PROCESS_EVENTS")
            .ok_or(SamplerError::MissingMap("PROCESS_EVENTS"))?;
        let events = RingBuf::try_from(events).map_err(|source| SamplerError::Map {
            name: "PROCESS_EVENTS",
            source,
        })?;
        let tables = ebpf
            .take_map("UNWIND_TABLES")
            .ok_or(SamplerError::MissingMap("UNWIND_TABLES"))?;
        let processes = ebpf
            .take_map("PROCESS_MAPPINGS")
            .ok_or(SamplerError::MissingMap("PROCESS_MAPPINGS"))?;
        let slots = ebpf
            .take_map("PROCESS_SLOTS")
            .ok_or(SamplerError::MissingMap("PROCESS_SLOTS"))?;
        let unknown_process_policy = ebpf
            .take_map("UNKNOWN_PROCESS_POLICY")
            .ok_or(SamplerError::MissingMap("UNKNOWN_PROCESS_POLICY"))?;
        let unwind_maps = Some(UnwindMapSet {
            tables,
            processes,
            slots,
            unknown_process_policy,
        });

        for (name, category, tracepoint) in LIFECYCLE_PROGRAMS {
            let program: &mut TracePoint = ebpf
                .program_mut(name)
                .ok_or(SamplerError::MissingProgram(name))?
                .try_into()
                .map_err(|source| SamplerError::Program { name, source })?;
            program
                .load()
                .map_err(|source| permission_or_program(name, source))?;
            program
                .attach(category, tracepoint)
                .map_err(|source| SamplerError::Program { name, source })?;
        }

        let excluded = if options.exclusions {
            let map = ebpf
                .take_map("EXCLUDED_PIDS")
                .ok_or(SamplerError::MissingMap("EXCLUDED_PIDS"))?;
            Some(HashMap::try_from(map).map_err(|source| SamplerError::Map {
                name: "EXCLUDED_PIDS",
                source,
            })?)
        } else {
            None
        };
        Ok(CpuSampler {
            excluded,
            ebpf,
            rings,
            events: Some(events),
            unwind_maps,
            counters,
            _programs: programs,
            _stats: stats,
            cpus,
            frequency_hz: options.frequency_hz,
            pids: options.pids.clone(),
            sampling_links: Vec::new(),
            runtime_loads,
            off_cpu,
        })
    }

    /// Stops sampling `pid` in the entry program until it execs or exits.
    /// False when exclusions are off or the map is full (its samples are
    /// then dropped in user space).
    pub fn exclude(&mut self, pid: u32) -> bool {
        let Some(map) = self.excluded.as_mut() else {
            return false;
        };
        match map.insert(pid, 1, 0) {
            Ok(()) => true,
            Err(e) => {
                debug!(pid, "cannot exclude a process in BPF: {e}");
                false
            }
        }
    }

    /// Samples `pid` again after [`Self::exclude`].
    pub fn include(&mut self, pid: u32) {
        if let Some(map) = self.excluded.as_mut() {
            let _ = map.remove(&pid);
        }
    }

    /// Starts sampling every online CPU (once; later calls do nothing).
    pub fn start_sampling(&mut self) -> Result<(), SamplerError> {
        if !self.sampling_links.is_empty() {
            return Ok(());
        }
        let entry = perf_program(&mut self.ebpf, ENTRY_PROGRAM)?;
        for &cpu in &self.cpus {
            let link = entry
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(u64::from(self.frequency_hz)),
                    false,
                )
                .map_err(|source| permission_or_program(ENTRY_PROGRAM, source))?;
            self.sampling_links.push(link);
        }
        if let Some(off_cpu) = self.off_cpu.as_mut() {
            off_cpu.attach(&mut self.ebpf)?;
        }
        info!(
            cpus = self.cpus.len(),
            frequency_hz = self.frequency_hz,
            ring_buffer_kib_per_cpu = self.rings.ring_bytes() / 1024,
            pids = ?self.pids,
            "sampling started"
        );
        Ok(())
    }

    /// How loading each runtime's BPF program went.
    pub fn runtime_loads(&self) -> &[(&'static BpfRuntime, RuntimeLoad)] {
        &self.runtime_loads
    }

    /// Whether `runtime`'s program loaded.
    pub fn runtime_loaded(&self, runtime: &BpfRuntime) -> bool {
        self.runtime_loads
            .iter()
            .any(|(r, load)| r.name == runtime.name && *load == RuntimeLoad::Loaded)
    }

    /// Stops sampling: detaches the perf events of every CPU, so that one
    /// more [`Self::drain`] reads every sample BPF will ever emit and the
    /// counters read after it match what was received. The programs stay
    /// loaded, so their run-time statistics can still be read.
    pub fn stop_sampling(&mut self) -> Result<(), SamplerError> {
        // Closing a perf event waits for its handler on that CPU to return
        // (the kernel removes the event from the CPU by IPI), so no sample
        // is still being built once this returns.
        if let Some(off_cpu) = self.off_cpu.as_mut() {
            off_cpu.detach(&mut self.ebpf)?;
        }
        let entry = perf_program(&mut self.ebpf, ENTRY_PROGRAM)?;
        for link in self.sampling_links.drain(..) {
            entry.detach(link).map_err(|source| SamplerError::Program {
                name: ENTRY_PROGRAM,
                source,
            })?;
        }
        Ok(())
    }

    /// Hands every record waiting in the CPUs' rings to `f`; never blocks.
    pub fn drain(&mut self, f: impl FnMut(&[u8])) -> usize {
        self.rings.drain(f)
    }

    /// The process events' ring buffer, once (the caller reads it after).
    pub fn take_events(&mut self) -> Option<RingBuf<MapData>> {
        self.events.take()
    }

    /// The unwind-table and process-mapping maps, once (the caller owns them after).
    pub fn take_unwind_maps(&mut self) -> Option<UnwindMapSet> {
        self.unwind_maps.take()
    }

    /// A runtime's pid-keyed map named `name`, once, for its plugin.
    pub fn runtime_process_map<V: aya::Pod>(
        &mut self,
        runtime: &BpfRuntime,
        name: &'static str,
    ) -> Result<HashMap<MapData, u32, V>, SamplerError> {
        if !self.runtime_loaded(runtime) {
            return Err(SamplerError::MissingProgram(runtime.program_name));
        }
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(SamplerError::MissingMap(name))?;
        HashMap::try_from(map).map_err(|source| SamplerError::Map { name, source })
    }

    /// Counter values summed over CPUs.
    pub fn counters(&self) -> Result<CounterValues, SamplerError> {
        let mut values = CounterValues::default();
        for counter in Counter::ALL {
            let per_cpu =
                self.counters
                    .get(&(counter as u32), 0)
                    .map_err(|source| SamplerError::Map {
                        name: "COUNTERS",
                        source,
                    })?;
            values.0[counter as usize] = per_cpu.iter().sum();
        }
        Ok(values)
    }

    /// Kernel-measured cost of the entry program, which includes every
    /// tail-called program of the chain.
    pub fn cost(&self) -> Option<ProgramCost> {
        ProgramCost::of(self.ebpf.program(ENTRY_PROGRAM)?)
    }

    /// Whether off-CPU sampling is on.
    pub fn off_cpu_enabled(&self) -> bool {
        self.off_cpu.is_some()
    }

    /// Kernel-measured cost of the off-CPU program per context switch, with
    /// the unwinders it tail-calls; `None` when off-CPU sampling is off.
    pub fn off_cpu_cost(&self) -> Option<ProgramCost> {
        self.off_cpu.as_ref()?.cost(&self.ebpf)
    }

    /// Number of CPUs sampled.
    pub fn cpu_count(&self) -> usize {
        self.cpus.len()
    }
}

impl AsRawFd for CpuSampler {
    /// Readable when BPF forced a wakeup on any CPU's ring.
    fn as_raw_fd(&self) -> RawFd {
        self.rings.as_raw_fd()
    }
}
