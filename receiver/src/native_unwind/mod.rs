//! Keeps BPF's view of native code current: builds each executable file's
//! unwind table once (on a worker thread, off the drain loop), installs it
//! while some live process maps the file, and writes every known process's
//! mapping table.
//!
//! BPF holds only tables that live processes reference, so its maps return to
//! their baseline when processes exit; built rows stay in a bounded user-space
//! cache so a file mapped again (a command run in a loop) is reinstalled
//! without rebuilding. The tables' memory is bounded ([`budget`]): on a host
//! mapping more than it holds, the least recently sampled files' tables leave
//! and come back when sampled again. A process mapping more than its BPF
//! mapping table holds keeps its most recently sampled mappings there
//! ([`cap`]).

use std::{
    collections::{HashMap, HashSet},
    num::NonZeroUsize,
    path::PathBuf,
    sync::{Arc, mpsc},
    thread,
    time::{Duration, Instant},
};

use icecore_unwinders::{
    Dispatch,
    native::{MappingEntry, ProcessMappingTable, mappings::MAX_PROCESS_MAPPINGS},
};
use lru::LruCache;
use tracing::{debug, info, warn};

mod budget;
mod cap;
mod overlay;
mod residency;

use budget::TableBudget;
use cap::LeftOut;

pub use overlay::overlay_runtime_code;

use crate::{
    process_maps::{MappedFile, ProcessMappings},
    runtimes::{ProcessRuntimes, services::mapped_file_paths},
    unwind_maps::UnwindMaps,
    unwind_table::{BuiltTable, build_table, vdso_table},
};

/// A mapped file, by identity on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileKey {
    /// Device (major, minor).
    pub dev: (u32, u32),
    /// Inode.
    pub inode: u64,
}

impl FileKey {
    /// The `[vdso]`, which has no file (its device and inode read as 0).
    const VDSO: FileKey = FileKey {
        dev: (0, 0),
        inode: 0,
    };

    /// The file `mapping` maps.
    pub fn of(mapping: &MappedFile) -> Self {
        FileKey {
            dev: mapping.dev,
            inode: mapping.inode,
        }
    }
}

enum FileState {
    Building,
    Ready(Arc<BuiltTable>),
    /// No table (no CFI, not ELF, unreadable): frames use frame pointers.
    Unusable,
}

struct BuildJob {
    key: FileKey,
    paths: Vec<PathBuf>,
}

/// Totals for logs and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NativeUnwindStats {
    /// Tables built since start.
    pub tables_built: u64,
    /// Files without a usable table.
    pub tables_unusable: u64,
    /// Tables installed in BPF now.
    pub tables_installed: usize,
    /// Bytes of rows installed in BPF now.
    pub table_bytes_installed: usize,
    /// Processes with a mapping table in BPF now.
    pub processes_described: usize,
    /// Kernel memory of the tables' and processes' inner maps now.
    pub inner_map_bytes: u64,
    /// Executable mappings left out of processes' BPF mapping tables now,
    /// because a process has more than a table holds.
    pub mappings_left_out: usize,
    /// Times a sample went through a mapping left out of its process's
    /// mapping table (once per mapping of the sample), which brings it back.
    pub mappings_sampled_left_out: u64,
    /// Failed BPF map updates.
    pub map_update_failures: u64,
    /// Tables not installed because BPF's table budget was spent and no
    /// table could leave for them (their frames use frame pointers).
    pub tables_over_budget: u64,
    /// Tables taken out of BPF to make room (least recently sampled first).
    pub tables_evicted: u64,
    /// Tables put back into BPF after a sample went through their file.
    pub tables_readmitted: u64,
    /// The budget of table bytes in BPF (`--unwind-table-memory`).
    pub table_budget_bytes: usize,
}

/// A described process's file mapping that has a built table (in BPF or
/// left out): which file a sampled address is in.
#[derive(Debug, Clone, Copy)]
struct FileRange {
    start: u64,
    end: u64,
    file_id: u64,
    key: FileKey,
    /// When a sample last went through the range.
    last_sampled: Option<Instant>,
    /// Whether the process's BPF mapping table holds the range (one with
    /// more mappings than the table holds leaves some out).
    in_table: bool,
}

/// The native unwinder's user-space half.
pub struct NativeUnwindInfo {
    maps: UnwindMaps,
    files: LruCache<FileKey, FileState>,
    /// The processes referencing each file that has a table (in BPF or
    /// left out by the budget)...
    users: HashMap<FileKey, HashSet<u32>>,
    /// ...and that table's file id.
    table_of: HashMap<FileKey, u64>,
    /// Where each described process maps files with a table, sorted.
    file_ranges: HashMap<u32, Vec<FileRange>>,
    /// Which tables BPF holds within `--unwind-table-memory`.
    budget: TableBudget,
    /// Tables the budget chose to take out: removed once no process's
    /// mapping table points at them any more.
    leaving: Vec<u64>,
    /// Files left out that a sample went through since the last poll.
    sampled_outside: HashSet<u64>,
    /// Processes with mappings left out of their mapping tables.
    left_out: LeftOut,
    /// Files let back in whose table is not installed yet.
    returning: HashSet<u64>,
    /// Installed tables no process uses, since when: removed after
    /// [`TABLE_LINGER`], or used again (a program run over and over, as a
    /// build or a cron job does, keeps its table).
    idle: HashMap<u64, Instant>,
    /// Files each described process references.
    process_files: HashMap<u32, Vec<FileKey>>,
    /// Tables whose slot is being set, by file id, and the files waiting
    /// for each (copies of one file share its table).
    installing: HashMap<u64, Vec<FileKey>>,
    /// The runtimes' code of each described process that has any.
    runtimes: HashMap<u32, ProcessRuntimes>,
    jobs: mpsc::SyncSender<BuildJob>,
    results: mpsc::Receiver<(FileKey, Option<BuiltTable>)>,
    /// Notified when a build finishes, so that its table is installed at
    /// once rather than at the next drain.
    built: Arc<tokio::sync::Notify>,
    stats: NativeUnwindStats,
    /// Builds queued whose result has not been polled yet.
    builds_pending: usize,
    /// The vDSO's table, with the vDSO's size: a `[vdso]` mapping of another
    /// size (a 32-bit process's) is a different image.
    vdso: Option<Arc<BuiltTable>>,
}

/// The entry of a mapping whose table is being built or set: BPF drops
/// (and counts) samples through it rather than cut them short.
fn table_pending(mapping: &MappedFile) -> MappingEntry {
    MappingEntry {
        start: mapping.start,
        end: mapping.end,
        dispatch: Dispatch::TablePending as u8,
        ..MappingEntry::default()
    }
}

/// The range of `ranges` (sorted by start) that holds `address`.
fn range_of(ranges: &[FileRange], address: u64) -> Option<&FileRange> {
    let index = ranges.partition_point(|r| r.start <= address);
    index
        .checked_sub(1)
        .and_then(|i| ranges.get(i))
        .filter(|r| address < r.end)
}

/// Gives `new` ranges (a new description of a process) the sampling times
/// of the same ranges in `old` (both sorted by start).
fn carry_recency(old: &[FileRange], new: &mut [FileRange]) {
    for range in new {
        range.last_sampled = range_of(old, range.start)
            .filter(|o| o.start == range.start && o.file_id == range.file_id)
            .and_then(|o| o.last_sampled);
    }
}

/// How many of `entries` (sorted by start, disjoint) hold a part of
/// `range` (runtime code splits a file's range into several).
fn parts_held(entries: &[MappingEntry], range: &FileRange) -> usize {
    let index = entries.partition_point(|e| e.end <= range.start);
    entries
        .get(index..)
        .unwrap_or_default()
        .iter()
        .take_while(|e| e.start < range.end)
        .count()
}

/// Bytes of unwind-table rows kept in BPF maps at most, by default: a busy
/// host's executables need a few tens of MiB (see the host_tables benchmark).
pub const DEFAULT_MAX_TABLE_BYTES: usize = 128 << 20;

/// Rounds of [`NativeUnwindInfo::poll_builds`]'s budget work: letting a
/// table back in may choose others to leave, whose users are described
/// again in the next round (what is left waits for the next poll).
const BUDGET_ROUNDS: usize = 4;

/// How long a table no process uses stays in BPF: inserting and removing
/// a table each wait for an RCU grace period, and a program that runs again
/// and again (a compiler in a build) would pay both per run.
pub const TABLE_LINGER: Duration = Duration::from_secs(2);

/// Build jobs waiting at most; more are retried on a later refresh.
const BUILD_QUEUE: usize = 4096;

impl NativeUnwindInfo {
    /// Starts the table-building thread. `max_cached_files` bounds the
    /// user-space cache of built tables.
    pub fn new(
        mut maps: UnwindMaps,
        max_cached_files: NonZeroUsize,
        max_table_bytes: usize,
    ) -> std::io::Result<Self> {
        let (jobs, job_rx) = mpsc::sync_channel::<BuildJob>(BUILD_QUEUE);
        let (result_tx, results) = mpsc::channel();
        // One wake-up for a build done and for a table's slot set.
        let built = maps.install_notifier();
        let notify = Arc::clone(&built);
        thread::Builder::new()
            .name("unwind-tables".into())
            .spawn(move || {
                for job in job_rx {
                    let built = job.paths.iter().find_map(|path| match build_table(path) {
                        Ok(table) => Some(table),
                        Err(e) => {
                            debug!(path = %path.display(), "no unwind table: {e}");
                            None
                        }
                    });
                    // The build's transient memory (the CFI sections, the
                    // unmerged rows) goes back to the system now.
                    crate::host::release_free_memory();
                    if result_tx.send((job.key, built)).is_err() {
                        break;
                    }
                    notify.notify_one();
                }
            })?;
        // Processes are described from here on: a sample of one BPF does
        // not know yet is dropped and reported, not cut short.
        maps.drop_unknown_processes()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(NativeUnwindInfo {
            maps,
            files: LruCache::new(max_cached_files),
            users: HashMap::new(),
            table_of: HashMap::new(),
            file_ranges: HashMap::new(),
            budget: TableBudget::new(max_table_bytes),
            leaving: Vec::new(),
            sampled_outside: HashSet::new(),
            left_out: LeftOut::default(),
            returning: HashSet::new(),
            idle: HashMap::new(),
            process_files: HashMap::new(),
            installing: HashMap::new(),
            runtimes: HashMap::new(),
            jobs,
            results,
            built,
            stats: NativeUnwindStats::default(),
            builds_pending: 0,
            vdso: vdso_table().map(Arc::new),
        })
    }

    /// Describes a process to BPF (first sample, or its mappings changed),
    /// queueing table builds for files not seen before. `runtimes` says
    /// which of its code runtime programs unwind.
    pub fn describe_process(
        &mut self,
        pid: u32,
        mappings: &ProcessMappings,
        runtimes: &ProcessRuntimes,
    ) {
        if runtimes.code.is_empty() && runtimes.deferred_program == 0 {
            self.runtimes.remove(&pid);
        } else {
            self.runtimes.insert(pid, runtimes.clone());
        }
        let mut table = ProcessMappingTable {
            deferred_program: runtimes.deferred_program,
            deferred_threads: runtimes.deferred_threads as u32,
            ..Default::default()
        };
        let mut entries = Vec::new();
        let mut referenced = Vec::new();
        let mut ranges = Vec::new();
        for mapping in mappings.mappings().iter().filter(|m| m.executable) {
            let (key, built) = if mapping.is_vdso() {
                let Some(vdso) = self.vdso_for(mapping) else {
                    continue;
                };
                (FileKey::VDSO, vdso)
            } else {
                let key = FileKey::of(mapping);
                // Referenced even while building: the build's end re-describes.
                referenced.push(key);
                let building = match self.files.get(&key) {
                    Some(FileState::Ready(built)) => Ok(built.clone()),
                    Some(FileState::Unusable) => Err(false),
                    Some(FileState::Building) => Err(true),
                    None => Err(self.queue_build(pid, key, mapping)),
                };
                match building {
                    Ok(built) => (key, built),
                    Err(true) => {
                        // Samples through this file are dropped (and
                        // counted) until its table exists, rather than cut
                        // short by frame pointers.
                        entries.push(table_pending(mapping));
                        continue;
                    }
                    Err(false) => continue,
                }
            };
            let Some(bias) = built.load_bias(mapping) else {
                continue;
            };
            if key == FileKey::VDSO {
                referenced.push(key);
            }
            ranges.push(FileRange {
                start: mapping.start,
                end: mapping.end,
                file_id: built.file_id,
                key,
                last_sampled: None,
                in_table: true,
            });
            let Some((slot, live)) = self.use_table(pid, key, &built) else {
                continue;
            };
            if !live {
                // Its slot is being set: pending as a build is, and
                // described again when the set is done.
                entries.push(table_pending(mapping));
                continue;
            }
            entries.push(MappingEntry {
                start: mapping.start,
                end: mapping.end,
                bias,
                file_id: built.file_id,
                table_rows: built.rows.len() as u32,
                table_slot: slot,
                ..MappingEntry::default()
            });
        }
        let entries = overlay_runtime_code(entries, &runtimes.code);
        if let Some(old) = self.file_ranges.get(&pid) {
            carry_recency(old, &mut ranges);
        }
        let mapped = entries.len();
        // The entries of each range before the cap: only those can it leave
        // out (a table the budget keeps out has none, and comes back by the
        // budget's rules).
        let parts: Vec<usize> = if mapped > MAX_PROCESS_MAPPINGS {
            ranges.iter().map(|r| parts_held(&entries, r)).collect()
        } else {
            Vec::new()
        };
        let (entries, left_out) = cap::keep_within(entries, MAX_PROCESS_MAPPINGS, |entry| {
            range_of(&ranges, entry.start).and_then(|r| r.last_sampled)
        });
        if self.left_out.set_count(pid, left_out) {
            info!(
                pid,
                mapped,
                held = MAX_PROCESS_MAPPINGS,
                "the process has more executable mappings than its BPF table holds: the least \
                 recently sampled are left out (a sample through one is cut short there, and \
                 brings it back)"
            );
        }
        for (range, parts) in ranges.iter_mut().zip(parts) {
            range.in_table = parts_held(&entries, range) == parts;
        }
        let count = entries.len().min(MAX_PROCESS_MAPPINGS);
        table.entries[..count].copy_from_slice(&entries[..count]);
        table.count = count as u32;
        // Mappings are sorted by start already (ProcessMappings guarantees it).
        if let Err(e) = self.maps.set_process(pid, &table) {
            self.stats.map_update_failures += 1;
            warn!(pid, "cannot describe process to BPF: {e}");
        }
        // Mappings come sorted by start, so the ranges are too.
        self.file_ranges.insert(pid, ranges);
        referenced.sort_unstable_by_key(|k| (k.dev, k.inode));
        referenced.dedup();
        if let Some(old) = self.process_files.insert(pid, referenced.clone()) {
            for key in old.into_iter().filter(|k| !referenced.contains(k)) {
                self.release_table(pid, key);
            }
        }
    }

    /// Queues a build of the file's table; false when the queue is full
    /// (retried at the process's next description).
    fn queue_build(&mut self, pid: u32, key: FileKey, mapping: &MappedFile) -> bool {
        // map_files names the exact file mapped (even if deleted or replaced
        // since); the container-root path and the plain path are fallbacks.
        let paths = mapped_file_paths(pid, mapping).to_vec();
        match self.jobs.try_send(BuildJob { key, paths }) {
            Ok(()) => {
                self.files.put(key, FileState::Building);
                self.builds_pending += 1;
                true
            }
            Err(e) => {
                debug!("table build queue full, retrying later: {e}");
                false
            }
        }
    }

    /// The vDSO's table if `mapping` holds the same image as icecore's own.
    fn vdso_for(&self, mapping: &MappedFile) -> Option<Arc<BuiltTable>> {
        let own = crate::symbolize::vdso::own()?;
        own.fits(mapping.end - mapping.start)
            .then(|| self.vdso.clone())
            .flatten()
    }

    /// Table builds queued, and tables being set, that [`Self::poll_builds`]
    /// has not taken in yet.
    pub fn builds_pending(&self) -> usize {
        self.builds_pending + self.maps.installs_pending()
    }

    /// Notified each time a table build finishes ([`Self::poll_builds`]
    /// installs it).
    pub fn build_notifier(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.built)
    }

    /// Installs finished tables and re-describes the processes waiting for
    /// them. `mappings_of` gives a process's current mappings.
    pub fn poll_builds<'a>(
        &mut self,
        mut mappings_of: impl FnMut(u32) -> Option<&'a ProcessMappings>,
    ) -> Vec<u32> {
        self.remove_idle_tables();
        let mut ready = Vec::new();
        while let Ok((key, built)) = self.results.try_recv() {
            self.builds_pending = self.builds_pending.saturating_sub(1);
            match built {
                Some(table) => {
                    self.stats.tables_built += 1;
                    self.files.put(key, FileState::Ready(Arc::new(table)));
                }
                None => {
                    self.stats.tables_unusable += 1;
                    self.files.put(key, FileState::Unusable);
                }
            }
            ready.push(key);
        }
        for done in self.maps.poll_installs() {
            let Some(keys) = self.installing.remove(&done.file_id) else {
                continue;
            };
            if !done.live {
                debug!(file_id = done.file_id, "unwind table slot set failed");
                self.stats.map_update_failures += 1;
            }
            for key in keys {
                if !done.live {
                    // Not tried again at every description: its mappings go
                    // without a table (frame pointers), as an unusable
                    // file's do.
                    if key == FileKey::VDSO {
                        self.vdso = None;
                    } else {
                        self.files.put(key, FileState::Unusable);
                    }
                }
                ready.push(key);
            }
        }
        let mut described = Vec::new();
        if !ready.is_empty() {
            let waiting: Vec<u32> = self
                .process_files
                .iter()
                .filter(|(_, files)| files.iter().any(|f| ready.contains(f)))
                .map(|(pid, _)| *pid)
                .collect();
            for pid in waiting {
                if let Some(mappings) = mappings_of(pid) {
                    let runtimes = self.runtimes.get(&pid).cloned().unwrap_or_default();
                    self.describe_process(pid, mappings, &runtimes);
                    described.push(pid);
                }
            }
        }
        self.settle_budget(&mut mappings_of, &mut described);
        described
    }

    /// Whether BPF holds a mapping table for `pid`.
    pub fn describes(&self, pid: u32) -> bool {
        self.maps.has_process(pid)
    }

    /// Frees everything BPF holds for a process that exited or exec'd.
    pub fn forget_process(&mut self, pid: u32) {
        self.maps.remove_process(pid);
        self.runtimes.remove(&pid);
        self.file_ranges.remove(&pid);
        self.left_out.forget(pid);
        if let Some(files) = self.process_files.remove(&pid) {
            for key in files {
                self.release_table(pid, key);
            }
        }
    }

    /// Whether BPF has a mapping table for `pid`.
    pub fn is_described(&self, pid: u32) -> bool {
        self.process_files.contains_key(&pid)
    }

    /// Current totals.
    pub fn stats(&self) -> NativeUnwindStats {
        NativeUnwindStats {
            tables_installed: self.maps.table_count(),
            table_bytes_installed: self.maps.installed_bytes(),
            processes_described: self.process_files.len(),
            inner_map_bytes: self.maps.inner_map_bytes(),
            table_budget_bytes: self.budget.limit(),
            mappings_left_out: self.left_out.total(),
            ..self.stats
        }
    }
}
