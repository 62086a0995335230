//! Maps shared by the programs, and the counter helper.

use crate::chain::Chain;
use aya_ebpf::{
    bindings::{BPF_F_INNER_MAP, BPF_F_MMAPABLE},
    btf_maps::{Array, ArrayOfMaps, RingBuf as BtfRingBuf},
    macros::{btf_map, map},
    maps::{Array as LegacyArray, HashMap, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
};
use icecore_unwinders::{
    COUNTER_COUNT, Counter, MAX_TAIL_CALLS, ProgramIndex, UnwindScratch, UnwindState,
    hotspot::{HOTSPOT_PROCESSES_MAX, HotSpotProcess},
    native::{
        ProcessMappingTable, UnwindChunk,
        mappings::{PROCESS_PAGES, PROCESS_SLOTS_MAX, PROCESS_TABLES_PER_PAGE},
    },
    perl::{PERL_PROCESSES_MAX, PerlProcess},
    php::{PHP_PROCESSES_MAX, PhpProcess},
    programs::PROGRAM_COUNT,
    python::{PYTHON_PROCESSES_MAX, PythonProcess},
    ruby::{RUBY_PROCESSES_MAX, RubyProcess},
    sample::{EXCLUDED_PIDS_MAX, MAX_CPUS},
    v8::{V8_PROCESSES_MAX, V8Process},
};

/// Flags of every unwind table: user space fills them through mmap, and each
/// has its own size (the kernel requires the flags to match the template's).
pub const UNWIND_TABLE_FLAGS: usize = (BPF_F_MMAPABLE | BPF_F_INNER_MAP) as usize;

/// One unwind table per executable file, at the slot user space chose for it
/// (an array lookup, which the kernel inlines, unlike a hash lookup). Each is
/// sized by user space: a fence chunk, then the rows.
#[btf_map]
pub static UNWIND_TABLES: ArrayOfMaps<Array<UnwindChunk, 1, UNWIND_TABLE_FLAGS>, 4096> =
    ArrayOfMaps::new();

/// Flags of every page of process tables: user space writes the tables in
/// place through mmap.
pub const PROCESS_PAGE_FLAGS: usize = BPF_F_MMAPABLE as usize;

/// The executable mappings of each known process, at the slot user space
/// chose for it (found through `PROCESS_SLOTS`), in pages of
/// `PROCESS_TABLES_PER_PAGE` tables: the outer array holds pointers, so
/// memory grows a page at a time with the processes described, and a lookup
/// by slot is two array lookups the kernel inlines.
#[btf_map]
pub static PROCESS_MAPPINGS: ArrayOfMaps<
    Array<ProcessMappingTable, PROCESS_TABLES_PER_PAGE, PROCESS_PAGE_FLAGS>,
    PROCESS_PAGES,
> = ArrayOfMaps::new();

/// pid → slot of its table in `PROCESS_MAPPINGS`. Preallocated, as perf-event
/// programs require before Linux 6.1.
#[map]
pub static PROCESS_SLOTS: HashMap<u32, u32> =
    HashMap::with_max_entries(PROCESS_SLOTS_MAX as u32, 0);

/// pid → what the CPython unwinder needs of that process, written by the
/// CPython plugin for the processes it detected.
#[map]
pub static PYTHON_PROCESSES: HashMap<u32, PythonProcess> =
    HashMap::with_max_entries(PYTHON_PROCESSES_MAX, 0);

/// pid → what the CRuby unwinder needs of that process, written by the
/// CRuby plugin for the processes it detected.
#[map]
pub static RUBY_PROCESSES: HashMap<u32, RubyProcess> =
    HashMap::with_max_entries(RUBY_PROCESSES_MAX, 0);

/// pid → what the HotSpot unwinder needs of that JVM, written by the
/// HotSpot plugin.
#[map]
pub static HOTSPOT_PROCESSES: HashMap<u32, HotSpotProcess> =
    HashMap::with_max_entries(HOTSPOT_PROCESSES_MAX, 0);

/// pid → what the V8 unwinder needs of that process, written by the V8
/// plugin.
#[map]
pub static V8_PROCESSES: HashMap<u32, V8Process> = HashMap::with_max_entries(V8_PROCESSES_MAX, 0);

/// pid → what the PHP unwinder needs of that process, written by the PHP
/// plugin.
#[map]
pub static PHP_PROCESSES: HashMap<u32, PhpProcess> =
    HashMap::with_max_entries(PHP_PROCESSES_MAX, 0);

/// pid → what the Perl unwinder needs of that process, written by the Perl
/// plugin.
#[map]
pub static PERL_PROCESSES: HashMap<u32, PerlProcess> =
    HashMap::with_max_entries(PERL_PROCESSES_MAX, 0);

/// One `unknown_process` policy value, set by user space once it describes
/// processes to BPF.
#[map]
pub static UNKNOWN_PROCESS_POLICY: LegacyArray<u32> = LegacyArray::with_max_entries(1, 0);

/// Tail-call targets, indexed by `ProgramIndex`.
#[map]
pub static PROGRAMS: ProgramArray = ProgramArray::with_max_entries(PROGRAM_COUNT, 0);

/// The sample being built on each CPU.
#[map]
pub static SCRATCH: PerCpuArray<UnwindScratch> = PerCpuArray::with_max_entries(1, 0);

/// Tail-call targets of off-CPU samples: the unwinders built as probes,
/// indexed by `ProgramIndex` as `PROGRAMS` is.
#[map]
pub static OFF_CPU_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(PROGRAM_COUNT, 0);

/// The off-CPU sample being built on each CPU: its own space, as a CPU
/// sample's chain may be under way on the CPU when the switch-in probe runs.
#[map]
pub static OFF_CPU_SCRATCH: PerCpuArray<UnwindScratch> = PerCpuArray::with_max_entries(1, 0);

/// Thread id → `bpf_ktime_get_ns()` when a sampled thread went off CPU.
/// An LRU map: a thread that exits while off CPU leaves an entry, which
/// ages out rather than filling the map. User space sizes it (one entry
/// when off-CPU profiling is off).
#[map]
pub static OFF_CPU_STARTS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(65_536, 0);

/// One counter per `Counter`.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);

/// Finished samples: one ring buffer per CPU, at the CPU's number, created
/// and sized by user space. One shared ring would move its lock, positions
/// and record headers between CPUs on every sample (about 200 ns measured on
/// two CPUs), and contend on large hosts. (Inner ring buffers may differ in
/// size from this template: the kernel compares their type and flags only.)
#[btf_map]
pub static SAMPLE_RINGS: ArrayOfMaps<BtfRingBuf<u8, 4096>, MAX_CPUS> = ArrayOfMaps::new();

/// Exits and execs of processes that have a mapping table.
#[map]
pub static PROCESS_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// PIDs to sample when `FILTER_BY_PID` is set. User space sizes it at load time.
#[map]
pub static PID_FILTER: HashMap<u32, u8> = HashMap::with_max_entries(1024, 0);

/// Non-zero when only the PIDs in `PID_FILTER` are sampled. Set at load time.
#[unsafe(no_mangle)]
static FILTER_BY_PID: u8 = 0;

/// Processes user space decided not to profile (a relabeling rule dropped
/// them): their samples end in the entry program. An exec removes the entry
/// (the new image is judged anew), as does the process's exit.
#[map]
pub static EXCLUDED_PIDS: HashMap<u32, u8> = HashMap::with_max_entries(EXCLUDED_PIDS_MAX, 0);

/// Non-zero when `EXCLUDED_PIDS` may hold processes. Set at load time, so
/// that hosts without exclusions pay no lookup per sample.
#[unsafe(no_mangle)]
static EXCLUDE_PIDS: u8 = 0;

/// Whether `pid` is within the `--pid` filter: every process without one.
#[inline(always)]
pub fn in_pid_filter(pid: u32) -> bool {
    // SAFETY: a plain load of a load-time constant.
    let filter = unsafe { core::ptr::read_volatile(&FILTER_BY_PID) };
    // SAFETY: the value is only tested for presence.
    filter == 0 || unsafe { PID_FILTER.get(pid) }.is_some()
}

/// Whether user space excluded `pid` from profiling.
#[inline(always)]
pub fn is_excluded(pid: u32) -> bool {
    // SAFETY: a plain load of a load-time constant.
    let exclude = unsafe { core::ptr::read_volatile(&EXCLUDE_PIDS) };
    // SAFETY: the value is only tested for presence.
    exclude != 0 && unsafe { EXCLUDED_PIDS.get(pid) }.is_some()
}

/// Forgets an exclusion: the pid's image changed or it exited.
#[inline(always)]
pub fn forget_exclusion(pid: u32) {
    // SAFETY: a plain load of a load-time constant.
    if unsafe { core::ptr::read_volatile(&EXCLUDE_PIDS) } != 0 {
        let _ = EXCLUDED_PIDS.remove(pid);
    }
}

/// Whether `pid` is sampled: within the `--pid` filter and not excluded.
#[inline(always)]
pub fn is_profiled(pid: u32) -> bool {
    in_pid_filter(pid) && !is_excluded(pid)
}

/// Continues the sample in `program` if its tail-call budget allows. Returns
/// only when it did not: out of budget (false), or the call failed (true,
/// counted), in which case the caller must stop without emitting.
#[inline(always)]
pub fn continue_in<C: Chain>(ctx: &C, state: &mut UnwindState, program: ProgramIndex) -> bool {
    if u32::from(state.tail_calls) >= MAX_TAIL_CALLS {
        return false;
    }
    state.tail_calls += 1;
    // SAFETY: every slot holds a perf-event program; with `program` a
    // constant after inlining, the JIT patches a direct jump.
    unsafe { C::programs().tail_call(ctx, program as u32) };
    count(Counter::TailCallFailed);
    true
}

/// Adds one to a counter of this CPU.
#[inline(always)]
pub fn count(counter: Counter) {
    count_n(counter, 1);
}

/// Adds `n` to a counter of this CPU.
#[inline(always)]
pub fn count_n(counter: Counter, n: u64) {
    if let Some(value) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU value, no concurrent writer on this CPU.
        unsafe { *value += n };
    }
}
