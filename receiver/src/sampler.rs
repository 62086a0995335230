//! Loads icecore's BPF programs and samples every online CPU.

use std::{
    io,
    os::fd::{AsRawFd, OwnedFd, RawFd},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, ProgramArray, RingBuf},
    programs::{
        PerfEvent, TracePoint,
        perf_event::{
            PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent,
        },
    },
};
use icecore_unwinders::{BPF_RUNTIMES, BpfRuntime, COUNTER_COUNT, Counter, ProgramIndex};
use tracing::{debug, info, warn};

use crate::{
    host, kernel_btf,
    sample_rings::{SampleRingError, SampleRings, ring_bytes_per_cpu},
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

/// Why sampling could not start.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    /// The process lacks the privileges to load BPF programs and open perf events.
    #[error("icecore needs root, or CAP_BPF + CAP_PERFMON + CAP_SYS_PTRACE")]
    Privileges,
    /// The kernel is older than the oldest one icecore supports.
    #[error("icecore needs Linux 5.8 or newer for the BPF ring buffer (this is {0})")]
    KernelTooOld(String),
    /// The binary was built with AYA_BUILD_SKIP and carries no BPF programs.
    #[error(
        "this icecore binary was built without its BPF programs (AYA_BUILD_SKIP); rebuild it with bpf-linker installed"
    )]
    NoBpfObject,
    /// The kernel refused the BPF object or one of its maps.
    #[error("loading the BPF programs failed: {0}")]
    Load(#[from] aya::EbpfError),
    /// A program named in the object is missing.
    #[error("BPF program {0} missing from the object")]
    MissingProgram(&'static str),
    /// A map named in the object is missing.
    #[error("BPF map {0} missing from the object")]
    MissingMap(&'static str),
    /// The kernel's verifier rejected a program, or attaching it failed.
    #[error("BPF program {name}: {source}")]
    Program {
        /// The program.
        name: &'static str,
        /// What went wrong.
        source: aya::programs::ProgramError,
    },
    /// A map operation failed.
    #[error("BPF map {name}: {source}")]
    Map {
        /// The map.
        name: &'static str,
        /// What went wrong.
        source: aya::maps::MapError,
    },
    /// The online CPUs could not be listed.
    #[error("cannot list online CPUs ({0}): {1}")]
    OnlineCpus(&'static str, io::Error),
    /// The per-CPU sample rings could not be set up.
    #[error(transparent)]
    SampleRings(#[from] SampleRingError),
}

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
        let task_stack_offset = match kernel_btf::member_offset_in_file(
            std::path::Path::new(kernel_btf::VMLINUX_BTF),
            "task_struct",
            "stack",
        ) {
            Ok(offset) => u64::from(offset),
            Err(e) => {
                warn!("no user stacks for samples taken in kernel mode: {e}");
                0
            }
        };
        let task_fsbase_offset = task_fsbase_offset()
            .map_err(|e| warn!("no interpreter stacks (the thread's FS base is unknown): {e}"))
            .unwrap_or(0);
        let rejected_program = rejected_program_for_test();
        let filter = u8::from(!options.pids.is_empty());
        let filter_capacity = u32::try_from(options.pids.len().max(1)).unwrap_or(u32::MAX);
        let exclude = u8::from(options.exclusions);
        let exclusion_capacity = if options.exclusions {
            icecore_unwinders::sample::EXCLUDED_PIDS_MAX
        } else {
            1
        };

        let mut ebpf = EbpfLoader::new()
            .override_global("FILTER_BY_PID", &filter, true)
            .override_global("TASK_STACK_OFFSET", &task_stack_offset, true)
            .override_global("TASK_FSBASE_OFFSET", &task_fsbase_offset, true)
            .override_global("WAKEUP_BYTES", &wakeup_bytes, true)
            .override_global("REJECTED_PROGRAM", &rejected_program, true)
            .override_global("EXCLUDE_PIDS", &exclude, true)
            .map_max_entries("PID_FILTER", filter_capacity)
            .map_max_entries("EXCLUDED_PIDS", exclusion_capacity)
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
        let program: &PerfEvent = self.ebpf.program(ENTRY_PROGRAM)?.try_into().ok()?;
        let info = program.info().ok()?;
        Some(ProgramCost {
            run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
            run_count: info.run_count(),
        })
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

fn perf_program<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut PerfEvent, SamplerError> {
    ebpf.program_mut(name)
        .ok_or(SamplerError::MissingProgram(name))?
        .try_into()
        .map_err(|source| SamplerError::Program { name, source })
}

fn load_program(ebpf: &mut Ebpf, name: &'static str) -> Result<(), SamplerError> {
    let program = perf_program(ebpf, name)?;
    program
        .load()
        .map_err(|source| permission_or_program(name, source))?;
    // How close the program is to the verifier's 1M-instruction limit.
    if let Some(count) = program
        .info()
        .ok()
        .and_then(|info| info.verified_instruction_count())
    {
        debug!(
            program = name,
            verified_instructions = count,
            "BPF program loaded"
        );
    }
    Ok(())
}

fn is_permission_denied(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<io::Error>()
            && io.kind() == io::ErrorKind::PermissionDenied
        {
            return true;
        }
        if e.to_string().contains("Operation not permitted") {
            return true;
        }
        current = e.source();
    }
    false
}

fn permission_or<E: std::error::Error + 'static>(
    error: E,
    wrap: impl FnOnce(E) -> SamplerError,
) -> SamplerError {
    if is_permission_denied(&error) {
        SamplerError::Privileges
    } else {
        wrap(error)
    }
}

fn permission_or_program(name: &'static str, source: aya::programs::ProgramError) -> SamplerError {
    // The verifier rejects programs with EACCES too; a log means it ran, so
    // privileges were not the problem.
    if let aya::programs::ProgramError::LoadError { verifier_log, .. } = &source
        && !verifier_log.to_string().trim().is_empty()
    {
        return SamplerError::Program { name, source };
    }
    permission_or(source, |source| SamplerError::Program { name, source })
}

/// The program slot [`REJECT_RUNTIME_ENV`] names, or `u32::MAX`.
fn rejected_program_for_test() -> u32 {
    let Ok(name) = std::env::var(REJECT_RUNTIME_ENV) else {
        return u32::MAX;
    };
    match BPF_RUNTIMES.iter().find(|r| r.name == name) {
        Some(runtime) => {
            warn!("{REJECT_RUNTIME_ENV}={name}: its BPF program is made to fail verification");
            runtime.program as u32
        }
        None => u32::MAX,
    }
}

/// One line for a (possibly multi-line) load error: its first line, and for
/// a verifier log the line that says why (the last one before the
/// verifier's statistics).
fn one_line_reason(message: &str) -> String {
    let first = message.lines().next().unwrap_or("").trim();
    let first = first.split(" Verifier output:").next().unwrap_or(first);
    let why = message.lines().rev().map(str::trim).find(|line| {
        !line.is_empty()
            && !line.starts_with("processed ")
            && !line.starts_with("verification time")
            && !line.starts_with("stack depth")
            && !line.starts_with(": ")
    });
    match why {
        Some(why) if message.contains("Verifier output:") => format!("{first}: {why}"),
        _ => first.to_owned(),
    }
}

/// Offset of `thread.fsbase` in `struct task_struct`, from the kernel's BTF.
fn task_fsbase_offset() -> Result<u64, kernel_btf::BtfError> {
    let btf = std::path::Path::new(kernel_btf::VMLINUX_BTF);
    let thread = kernel_btf::member_offset_in_file(btf, "task_struct", "thread")?;
    let fsbase = kernel_btf::member_offset_in_file(btf, "thread_struct", "fsbase")?;
    Ok(u64::from(thread) + u64::from(fsbase))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_log_is_told_in_one_line() {
        let log = "BPF program unwind_python: the BPF_PROG_LOAD syscall returned Permission \
                   denied (os error 13). Verifier output: 0: R1=ctx() R10=fp0\n\
                   1: (bf) r6 = r1\nR1 invalid mem access 'scalar'\n\
                   processed 40 insns (limit 1000000)\n: Permission denied (os error 13)";
        assert_eq!(
            one_line_reason(log),
            "BPF program unwind_python: the BPF_PROG_LOAD syscall returned Permission denied \
             (os error 13).: R1 invalid mem access 'scalar'"
        );
        assert_eq!(one_line_reason("one\ntwo"), "one");
    }
}
