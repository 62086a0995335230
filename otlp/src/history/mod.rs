//! A bounded in-memory history of aggregated profiles, for the agent's
//! flame graph page: the last minutes of a host without any backend.
//!
//! Every batch becomes one [`Slot`]: its samples summed per (stack,
//! process, thread), timestamps dropped. Stacks are interned once for the
//! whole history, each with its root-first path of frame names, so that a
//! query only adds numbers ([`query`]). The history is bounded by age and
//! by an estimate of the heap it holds; the oldest slots go first, and the
//! tables are compacted when they do.

mod names;
pub mod query;
mod tree;

#[cfg(test)]
mod tests;

use std::{
    collections::{HashMap, HashSet, VecDeque},
    mem::size_of,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use crate::model::{HostInfo, ProcessInfo, ProfileBatch, ProfileKind, Stack};
use names::{NameId, NameTable};

pub use query::{
    DEFAULT_WINDOW_NANOS, Facet, FlameNode, FlameQuery, FlameView, QueryError, RangeNanos,
    SearchResult, TimelinePoint, TopRow,
};

/// Allocation overhead charged per heap allocation.
const OVERHEAD: usize = 16;

/// How much history is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    /// Slots older than this (by their end) are dropped.
    pub retention: Duration,
    /// Most heap bytes the history may hold, about; the oldest slots are
    /// dropped to stay under it.
    pub max_bytes: u64,
}

/// Counters of the history, for `/metrics`.
#[derive(Debug, Default)]
pub struct HistoryStats {
    /// Heap bytes the history holds now (estimate).
    pub bytes: AtomicU64,
    /// Slots (batches) held now.
    pub slots: AtomicU64,
    /// Distinct stacks held now.
    pub stacks: AtomicU64,
    /// Slots dropped because they were older than the retention.
    pub evicted_by_age: AtomicU64,
    /// Slots dropped to stay under the memory limit.
    pub evicted_by_memory: AtomicU64,
    /// Batches never kept: alone larger than the memory limit.
    pub rejected_batches: AtomicU64,
}

/// One sample sum: a stack of one process's thread within a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Row {
    stack: u32,
    process: u32,
    thread: u32,
    /// Samples.
    count: u64,
    /// Their weight in nanoseconds (weighted kinds; 0 for CPU samples).
    nanos: u64,
}

/// One batch, aggregated.
#[derive(Debug, Clone)]
struct Slot {
    kind: ProfileKind,
    start: u64,
    end: u64,
    period_nanos: i64,
    rows: Vec<Row>,
}

/// An interned stack: the model's frames (for pprof downloads) and the
/// root-first path of frame names the flame graph is built from.
#[derive(Debug)]
struct StackEntry {
    stack: Stack,
    path: Box<[NameId]>,
}

/// A thread as the rows name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ThreadKey {
    tid: u32,
    name: Arc<str>,
}

/// The tables rows point into: rebuilt together when slots are dropped.
#[derive(Debug, Default)]
struct Tables {
    names: NameTable,
    stacks: Vec<StackEntry>,
    stack_ids: HashMap<Stack, u32>,
    processes: Vec<Arc<ProcessInfo>>,
    process_ids: HashMap<Arc<ProcessInfo>, u32>,
    threads: Vec<ThreadKey>,
    thread_ids: HashMap<ThreadKey, u32>,
    /// Heap objects already charged (shared strings, frames, stacks). Every
    /// pointer in it belongs to an object the tables keep alive, so none is
    /// reused while it is here.
    charged: HashSet<usize>,
    bytes: usize,
}

impl Tables {
    fn charge_str(&mut self, s: &Arc<str>) {
        if !s.is_empty() && self.charged.insert(s.as_ptr() as usize) {
            self.bytes += s.len() + 2 * size_of::<usize>() + OVERHEAD;
        }
    }

    fn stack_id(&mut self, stack: &Stack) -> u32 {
        if let Some(&id) = self.stack_ids.get(stack) {
            return id;
        }
        let id = self.stacks.len() as u32;
        let path = self.names.path_of(stack);
        self.bytes += size_of::<StackEntry>() + path.len() * size_of::<NameId>() + OVERHEAD;
        // The map's key and entry.
        self.bytes += size_of::<(Stack, u32)>() + OVERHEAD;
        if self.charged.insert(stack.as_ptr() as usize) {
            self.bytes += stack.len() * size_of::<usize>() + 2 * size_of::<usize>() + OVERHEAD;
            for frame in stack.iter() {
                if !self.charged.insert(Arc::as_ptr(frame) as usize) {
                    continue;
                }
                self.bytes += size_of::<crate::model::Frame>() + 2 * size_of::<usize>() + OVERHEAD;
                self.bytes += frame.lines.capacity() * size_of::<crate::model::Line>();
                for line in &frame.lines {
                    self.charge_str(&line.function_name);
                    self.charge_str(&line.system_name);
                    if let Some(file) = &line.filename {
                        self.charge_str(file);
                    }
                }
                if let Some(mapping) = &frame.mapping
                    && self.charged.insert(Arc::as_ptr(mapping) as usize)
                {
                    self.bytes += size_of::<crate::model::Mapping>() + OVERHEAD;
                    self.charge_str(&mapping.filename);
                }
            }
        }
        self.stacks.push(StackEntry {
            stack: stack.clone(),
            path,
        });
        self.stack_ids.insert(stack.clone(), id);
        id
    }

    fn process_id(&mut self, process: &ProcessInfo) -> u32 {
        if let Some(&id) = self.process_ids.get(process) {
            return id;
        }
        let id = self.processes.len() as u32;
        let info = Arc::new(process.clone());
        for s in info.strings() {
            self.charge_str(s);
        }
        self.bytes += 2 * (size_of::<ProcessInfo>() + OVERHEAD) + info.labels.len() * 32;
        self.processes.push(info.clone());
        self.process_ids.insert(info, id);
        id
    }

    fn thread_id(&mut self, tid: u32, name: &Arc<str>) -> u32 {
        let key = ThreadKey {
            tid,
            name: name.clone(),
        };
        if let Some(&id) = self.thread_ids.get(&key) {
            return id;
        }
        let id = self.threads.len() as u32;
        self.charge_str(name);
        self.bytes += 2 * size_of::<ThreadKey>() + OVERHEAD;
        self.threads.push(key.clone());
        self.thread_ids.insert(key, id);
        id
    }
}

/// The history: slots oldest first, and the tables they point into.
#[derive(Debug)]
pub struct History {
    limits: HistoryLimits,
    slots: VecDeque<Slot>,
    tables: Tables,
    rows_bytes: usize,
    stats: Arc<HistoryStats>,
    /// The host of the last batch (for pprof downloads).
    host_name: Arc<str>,
    host: HostInfo,
}

impl History {
    /// An empty history kept within `limits`.
    pub fn new(limits: HistoryLimits) -> Self {
        Self {
            limits,
            slots: VecDeque::new(),
            tables: Tables::default(),
            rows_bytes: 0,
            stats: Arc::new(HistoryStats::default()),
            host_name: Arc::from(""),
            host: HostInfo::default(),
        }
    }

    /// The counters `/metrics` reads.
    pub fn stats(&self) -> Arc<HistoryStats> {
        self.stats.clone()
    }

    /// The limits it keeps to.
    pub fn limits(&self) -> HistoryLimits {
        self.limits
    }

    /// Heap bytes held, about.
    pub fn bytes(&self) -> usize {
        self.tables.bytes + self.tables.names.built_bytes + self.rows_bytes
    }

    /// Adds a batch, then drops what is older than the retention (measured
    /// back from `now_unix_nanos`) or over the memory limit.
    pub fn ingest(&mut self, batch: &ProfileBatch, now_unix_nanos: u64) {
        if self.host_name != batch.host_name {
            self.host_name = batch.host_name.clone();
            self.host = batch.host.clone();
        }
        let mut sums: HashMap<(u32, u32, u32), (u64, u64)> = HashMap::new();
        for process in &batch.processes {
            if process.samples.is_empty() {
                continue;
            }
            let pid = self.tables.process_id(&process.process);
            for group in &process.samples {
                let stack = self.tables.stack_id(&group.stack);
                let thread = self.tables.thread_id(group.thread_id, &group.thread_name);
                let sum = sums.entry((stack, pid, thread)).or_default();
                sum.0 += group.count;
                sum.1 += group.weights_nanos.iter().sum::<u64>();
            }
        }
        let mut rows: Vec<Row> = sums
            .into_iter()
            .map(|((stack, process, thread), (count, nanos))| Row {
                stack,
                process,
                thread,
                count,
                nanos,
            })
            .collect();
        rows.sort_unstable_by_key(|r| (r.stack, r.process, r.thread));
        rows.shrink_to_fit();
        self.rows_bytes += rows.capacity() * size_of::<Row>() + size_of::<Slot>() + OVERHEAD;
        let slot = Slot {
            kind: batch.kind,
            start: batch.start_unix_nanos,
            end: batch.start_unix_nanos.saturating_add(batch.duration_nanos),
            period_nanos: batch.period_nanos,
            rows,
        };
        // Slots stay ordered by their start, whatever order batches of
        // different kinds come in.
        let at = self.slots.partition_point(|s| s.start <= slot.start);
        self.slots.insert(at, slot);
        self.evict(now_unix_nanos);
    }

    /// Drops slots by age and by memory, then compacts the tables if any
    /// went.
    fn evict(&mut self, now_unix_nanos: u64) {
        let retention = u64::try_from(self.limits.retention.as_nanos()).unwrap_or(u64::MAX);
        let oldest_kept = now_unix_nanos.saturating_sub(retention);
        let mut dropped = false;
        while self.slots.front().is_some_and(|s| s.end < oldest_kept) {
            self.pop_oldest();
            self.stats.evicted_by_age.fetch_add(1, Relaxed);
            dropped = true;
        }
        if dropped {
            self.compact();
        }
        // The tables' share of the memory is only known after compaction,
        // so each dropped slot is followed by one. In the steady state one
        // slot goes per batch that comes.
        let limit = usize::try_from(self.limits.max_bytes).unwrap_or(usize::MAX);
        while self.bytes() > limit && !self.slots.is_empty() {
            let last = self.slots.len() == 1;
            self.pop_oldest();
            if last {
                // Alone over the limit: the batch just added.
                self.stats.rejected_batches.fetch_add(1, Relaxed);
            } else {
                self.stats.evicted_by_memory.fetch_add(1, Relaxed);
            }
            self.compact();
        }
        self.publish_stats();
    }

    /// Removes the oldest slot; returns the bytes of its rows.
    fn pop_oldest(&mut self) -> usize {
        let Some(slot) = self.slots.pop_front() else {
            return 0;
        };
        let bytes = slot.rows.capacity() * size_of::<Row>() + size_of::<Slot>() + OVERHEAD;
        self.rows_bytes = self.rows_bytes.saturating_sub(bytes);
        bytes
    }

    /// Rebuilds the tables from the slots left, renumbering their rows.
    fn compact(&mut self) {
        let old = std::mem::take(&mut self.tables);
        let mut stack_map: Vec<Option<u32>> = vec![None; old.stacks.len()];
        let mut process_map: Vec<Option<u32>> = vec![None; old.processes.len()];
        let mut thread_map: Vec<Option<u32>> = vec![None; old.threads.len()];
        for slot in &mut self.slots {
            for row in &mut slot.rows {
                row.stack = *stack_map[row.stack as usize].get_or_insert_with(|| {
                    self.tables.stack_id(&old.stacks[row.stack as usize].stack)
                });
                row.process = *process_map[row.process as usize].get_or_insert_with(|| {
                    self.tables.process_id(&old.processes[row.process as usize])
                });
                row.thread = *thread_map[row.thread as usize].get_or_insert_with(|| {
                    let key = &old.threads[row.thread as usize];
                    self.tables.thread_id(key.tid, &key.name)
                });
            }
        }
    }

    /// Copies the sizes into the shared counters.
    fn publish_stats(&self) {
        self.stats.bytes.store(self.bytes() as u64, Relaxed);
        self.stats.slots.store(self.slots.len() as u64, Relaxed);
        self.stats
            .stacks
            .store(self.tables.stacks.len() as u64, Relaxed);
    }

    /// Drops everything older than the retention, when no batch came to do
    /// it (an idle machine still ages its history).
    pub fn expire(&mut self, now_unix_nanos: u64) {
        self.evict(now_unix_nanos);
    }
}
