//! Per-process address → unwind-table lookup, shared by BPF and user space.
//!
//! User space writes one [`ProcessMappingTable`] per process: its executable
//! file mappings sorted by address, each naming the unwind table of the
//! mapped file. BPF finds a PC's entry with a fixed-probe binary search
//! inside the one map value (no helper call per step, unlike an LPM trie).
//!
//! Tables sit at slots of an array of maps, found through a pid → slot hash;
//! each CPU remembers recent pids' slots in a [`ProcessSlotCache`], so most
//! samples find their table with array lookups the kernel inlines instead of
//! a hash lookup (a helper call, and cold cache lines, per sample).

/// Executable mappings tracked per process; more are left out (their frames
/// fall back to frame pointers, and user space counts them).
pub const MAX_PROCESS_MAPPINGS: usize = 256;

/// Search probes covering [`MAX_PROCESS_MAPPINGS`] entries.
const MAPPING_SEARCH_STEPS: u32 = MAX_PROCESS_MAPPINGS.trailing_zeros();
const _: () = assert!(MAX_PROCESS_MAPPINGS.is_power_of_two());

/// One executable mapping of a process.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MappingEntry {
    /// First address of the mapping.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Process address minus ELF virtual address (the load bias).
    pub bias: u64,
    /// The mapped file's content ID (for diagnostics; BPF uses `table_slot`).
    pub file_id: u64,
    /// Rows in the file's table; 0 when it has none (yet): use frame pointers.
    pub table_rows: u32,
    /// Index of the file's table in `UNWIND_TABLES`.
    pub table_slot: u32,
    /// The `ProgramIndex` of the runtime unwinder for code in this range; 0
    /// (the native unwinder's own slot) for native code.
    pub program: u8,
    /// How the native unwinder hands this range's frames to `program`
    /// (a [`Dispatch`](crate::runtime::Dispatch) value).
    pub dispatch: u8,
    /// Zero.
    pub reserved: [u8; 6],
}

/// The executable mappings of one process, sorted by `start`, non-overlapping.
///
/// User space rewrites a table in place, through a memory mapping of its
/// page, as a sequence lock: `seq` is odd while it writes and moves on when
/// it is done, so BPF ignores a table whose `seq` is odd or changed during a
/// walk.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProcessMappingTable {
    /// Sequence lock: odd while user space writes the table.
    pub seq: u32,
    /// Which threads [`deferred_program`](Self::deferred_program) runs for
    /// (a [`EarlyEndThreads`] value).
    pub deferred_threads: u32,
    /// Entries in use.
    pub count: u32,
    /// Zero. BPF starts its table searches from it (see `find_row`).
    pub reserved: u32,
    /// The process the table describes: a cached slot is only used when its
    /// table still names the sampled pid.
    pub pid: u32,
    /// The `ProgramIndex` of the deferred runtime program that runs when the
    /// native walk ends early, before reaching the runtime's frames (see
    /// [`crate::runtime`]); 0 for none.
    pub deferred_program: u32,
    /// The mappings; only the first `count` are meaningful.
    pub entries: [MappingEntry; MAX_PROCESS_MAPPINGS],
}

const _: () = assert!(core::mem::size_of::<MappingEntry>() == 48);
const _: () =
    assert!(core::mem::size_of::<ProcessMappingTable>() == 24 + 48 * MAX_PROCESS_MAPPINGS);

impl Default for ProcessMappingTable {
    fn default() -> Self {
        ProcessMappingTable {
            seq: 0,
            deferred_threads: EarlyEndThreads::Every as u32,
            count: 0,
            reserved: 0,
            pid: 0,
            deferred_program: 0,
            entries: [MappingEntry::default(); MAX_PROCESS_MAPPINGS],
        }
    }
}

/// The threads of a process whose samples run its
/// [`deferred_program`](ProcessMappingTable::deferred_program) when their
/// native walk ends early.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EarlyEndThreads {
    /// Every thread: the runtime finds the sampled thread's own state (from
    /// its thread pointer), and a thread running none of it has none.
    #[default]
    Every = 0,
    /// Only the main thread (thread id = process id): the runtime's state
    /// is the process's (an NTS PHP's executor globals, a Perl built without
    /// threads), so on any other thread it would be the running
    /// interpreter's stack, not the sampled thread's.
    Main = 1,
}

impl ProcessMappingTable {
    /// The deferred program to run for a sample of thread `tid` whose
    /// native walk ended early; 0 for none.
    #[inline(always)]
    pub fn early_end_program(&self, tid: u32) -> u32 {
        if self.deferred_threads == EarlyEndThreads::Main as u32 && tid != self.pid {
            0
        } else {
            self.deferred_program
        }
    }

    /// The entry containing `pc`, if any.
    #[inline(always)]
    pub fn find(&self, pc: u64) -> Option<&MappingEntry> {
        self.find_from(pc, 0)
    }

    /// [`find`](Self::find) for BPF: `zero` must be 0, loaded from a map so
    /// that the verifier sees the probes as values in one range rather than
    /// as distinct constants (as in [`super::find_row`]). Always
    /// `log2(MAX_PROCESS_MAPPINGS)` probes: a search that stops early gives
    /// the verifier one path per stopping point, and every later frame of
    /// the program is verified once per path.
    #[inline(always)]
    pub fn find_from(&self, pc: u64, zero: u32) -> Option<&MappingEntry> {
        let count = self.count;
        if count == 0 || count as usize > MAX_PROCESS_MAPPINGS {
            return None;
        }
        // Last entry with start <= pc, among the first `count`. The masks
        // never change an index; they show the verifier its bound.
        let mask = MAX_PROCESS_MAPPINGS as u32 - 1;
        let mut base = zero & mask;
        let mut step = MAX_PROCESS_MAPPINGS as u32 / 2;
        for _ in 0..MAPPING_SEARCH_STEPS {
            let probe = (base + step) & mask;
            if probe < count && self.entries[(probe & mask) as usize].start <= pc {
                base = probe;
            }
            step >>= 1;
        }
        let entry = &self.entries[(base & mask) as usize];
        (entry.start <= pc && pc < entry.end).then_some(entry)
    }
}

/// Processes with a mapping table at once (slots of `PROCESS_MAPPINGS`).
pub const PROCESS_SLOTS_MAX: usize = 16384;

/// Tables per page: slot `s` is table `s % PROCESS_TABLES_PER_PAGE` of
/// page `s / PROCESS_TABLES_PER_PAGE` (an inner array of `PROCESS_MAPPINGS`).
/// Inserting a page into the outer array waits for an RCU grace period
/// (tens of milliseconds), so pages hold many tables, written in place.
pub const PROCESS_TABLES_PER_PAGE: usize = 32;
const _: () = assert!(PROCESS_TABLES_PER_PAGE.is_power_of_two());

/// Pages of `PROCESS_MAPPINGS`.
pub const PROCESS_PAGES: usize = PROCESS_SLOTS_MAX / PROCESS_TABLES_PER_PAGE;

impl ProcessMappingTable {
    /// Whether the table is being written (`seq` odd).
    #[inline(always)]
    pub fn being_written(seq: u32) -> bool {
        seq & 1 != 0
    }
}

/// Recent pid → slot answers per CPU (direct-mapped).
pub const PROCESS_SLOT_CACHE_ENTRIES: usize = 64;
const _: () = assert!(PROCESS_SLOT_CACHE_ENTRIES.is_power_of_two());

/// One remembered slot. An empty entry has pid 0, which is never sampled
/// (the idle task is filtered out first).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessSlotEntry {
    /// The process.
    pub pid: u32,
    /// Its table's slot in `PROCESS_MAPPINGS`.
    pub slot: u32,
}

/// Per-CPU cache of pid → mapping-table slot. Entries are never invalidated:
/// a slot freed and reused for another process holds a table naming that
/// other pid, which the lookup checks, and falls back to the hash.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProcessSlotCache {
    /// The entries, indexed by `pid % PROCESS_SLOT_CACHE_ENTRIES`.
    pub entries: [ProcessSlotEntry; PROCESS_SLOT_CACHE_ENTRIES],
}

const _: () = assert!(core::mem::size_of::<ProcessSlotCache>() == 8 * PROCESS_SLOT_CACHE_ENTRIES);

impl Default for ProcessSlotCache {
    fn default() -> Self {
        Self {
            entries: [ProcessSlotEntry::default(); PROCESS_SLOT_CACHE_ENTRIES],
        }
    }
}

impl ProcessSlotCache {
    /// The entry `pid` maps to.
    #[inline(always)]
    pub fn entry_mut(&mut self, pid: u32) -> &mut ProcessSlotEntry {
        &mut self.entries[pid as usize & (PROCESS_SLOT_CACHE_ENTRIES - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(ranges: &[(u64, u64)]) -> ProcessMappingTable {
        let mut t = ProcessMappingTable::default();
        for (i, &(start, end)) in ranges.iter().enumerate() {
            t.entries[i] = MappingEntry {
                start,
                end,
                file_id: i as u64 + 1,
                ..Default::default()
            };
        }
        t.count = ranges.len() as u32;
        t
    }

    #[test]
    fn finds_containing_entries_only() {
        let t = table(&[(0x1000, 0x2000), (0x3000, 0x4000), (0x4000, 0x5000)]);
        assert_eq!(t.find(0x1000).map(|e| e.file_id), Some(1));
        assert_eq!(t.find(0x1fff).map(|e| e.file_id), Some(1));
        assert_eq!(t.find(0x2000), None, "gap");
        assert_eq!(t.find(0x4000).map(|e| e.file_id), Some(3));
        assert_eq!(t.find(0x5000), None);
        assert_eq!(t.find(0xfff), None);
    }

    #[test]
    fn full_table_and_bad_counts() {
        let ranges: [(u64, u64); MAX_PROCESS_MAPPINGS] =
            core::array::from_fn(|i| (i as u64 * 0x10000, i as u64 * 0x10000 + 0x8000));
        let t = table(&ranges);
        for (i, (start, end)) in ranges.iter().enumerate() {
            assert_eq!(t.find(*start).map(|e| e.file_id), Some(i as u64 + 1));
            assert_eq!(t.find(end - 1).map(|e| e.file_id), Some(i as u64 + 1));
            assert_eq!(t.find(*end), None);
        }
        let mut bad = t;
        bad.count = MAX_PROCESS_MAPPINGS as u32 + 1;
        assert_eq!(bad.find(0), None);
    }

    #[test]
    fn a_process_wide_runtime_runs_after_an_early_end_on_the_main_thread_only() {
        let mut t = table(&[]);
        t.pid = 100;
        t.deferred_program = 7;
        assert_eq!(t.early_end_program(100), 7);
        assert_eq!(
            t.early_end_program(101),
            7,
            "per-thread state: every thread"
        );
        t.deferred_threads = EarlyEndThreads::Main as u32;
        assert_eq!(t.early_end_program(100), 7);
        assert_eq!(
            t.early_end_program(101),
            0,
            "another thread would get the main's stack"
        );
    }
}
