//! A bounded in-memory history of aggregated profiles, for the agent's
//! flame graph page: the last minutes of a host without any backend.
//!
//! Every batch becomes one [`Slot`]: its samples summed per (stack,
//! process, thread), timestamps dropped. Stacks are interned once for the
//! whole history, each with its root-first path of frame names, so that a
//! query only adds numbers ([`query`]). The history is bounded by age and
//! by an estimate of the heap it holds; the oldest slots go first, and the
//! tables are compacted once enough of them went (see `History::evict`).

mod names;
mod query;
mod tree;
mod view;
mod window;

#[cfg(test)]
mod tests;

use std::{
    collections::{HashMap, HashSet, VecDeque},
    hash::BuildHasher,
    mem::size_of,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use foldhash::fast::FixedState;

use crate::model::{
    Frame, FrameKind, HostInfo, Line, Mapping, ProcessInfo, ProfileBatch, ProfileKind, Stack,
};
use names::{NameId, NameTable};

pub use query::DEFAULT_WINDOW_NANOS;
pub use view::{
    Facet, FlameNode, FlameQuery, FlameView, QueryError, RangeNanos, SearchResult, TimelinePoint,
    TopRow,
};

/// Allocation overhead charged per heap allocation.
const OVERHEAD: usize = 16;

/// Heap bytes of a `Vec` (or boxed slice, or `VecDeque`) of `capacity` `T`s.
fn vec_bytes<T>(capacity: usize) -> usize {
    match capacity {
        0 => 0,
        n => n * size_of::<T>() + OVERHEAD,
    }
}

/// Heap bytes of a `HashMap<K, V>` (or `HashSet<K>`, with `V = ()`) whose
/// `capacity()` is `capacity`: hashbrown keeps a power of two of buckets,
/// at most 7/8 of them full, each an entry and a control byte.
fn map_bytes<K, V>(capacity: usize) -> usize {
    match capacity {
        0 => 0,
        n => {
            let buckets = (n * 8 / 7).max(n + 1).next_power_of_two();
            buckets * (size_of::<(K, V)>() + 1) + 16 + OVERHEAD
        }
    }
}

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
    /// Times the tables were rebuilt from the slots left.
    pub compactions: AtomicU64,
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

/// An interned stack: the model's frames (for pprof downloads), the
/// root-first path of frame names the flame graph is built from, and the
/// frame types it holds (one bit per [`FrameKind`]).
#[derive(Debug)]
struct StackEntry {
    stack: Stack,
    path: Box<[NameId]>,
    kinds: u16,
}

/// Where a frame's code is, the same in every process that maps its file:
/// its address relative to the file, or the address itself without a file.
/// A symbolized frame is where its lines say: the addresses of one line
/// are one place for the flame graph (and a stack per instruction would
/// multiply the stacks kept by the instructions of every loop).
fn code_address(frame: &Frame) -> u64 {
    if !frame.lines.is_empty() {
        return 0;
    }
    match &frame.mapping {
        Some(m) => frame
            .address
            .wrapping_sub(m.memory_start)
            .wrapping_add(m.file_offset),
        None => frame.address,
    }
}

/// Whether two frames are the same code under the same names (the same
/// lines), in whichever processes they were taken.
fn same_code(a: &Frame, b: &Frame) -> bool {
    a.kind == b.kind
        && code_address(a) == code_address(b)
        && a.lines == b.lines
        && match (&a.mapping, &b.mapping) {
            (Some(x), Some(y)) => x.filename == y.filename && x.build_id == y.build_id,
            (None, None) => true,
            _ => false,
        }
}

/// The hash [`same_code`] frames share.
fn code_hash(frame: &Frame) -> u64 {
    let mapping = frame
        .mapping
        .as_ref()
        .map(|m| (m.filename.as_ref(), m.build_id.as_deref()));
    FixedState::default().hash_one((frame.kind, code_address(frame), &frame.lines, mapping))
}

/// What is known of one frame allocation: its value's hash, its names
/// (outermost first) and type. The entry holds the frame, so its address,
/// the key, stays its own while the entry lives.
#[derive(Debug)]
struct FrameEntry {
    _frame: Arc<Frame>,
    hash: u64,
    names: Box<[NameId]>,
    kind_bit: u16,
}

/// No next stack in a hash chain.
const NONE: u32 = u32::MAX;

/// The bit of a frame type in [`StackEntry::kinds`].
fn kind_bit(kind: FrameKind) -> u16 {
    let index = FrameKind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
    1 << index
}

/// A thread as the rows name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ThreadKey {
    tid: u32,
    name: Arc<str>,
}

/// The tables rows point into: rebuilt together when slots are dropped.
///
/// Stacks are found by the frames' allocations first: the profiler hands
/// the same `Arc<Frame>` for a frame it symbolized before, so a stack seen
/// again costs a lookup per frame, not a hash of every name in it. Frames
/// of the same code in distinct allocations still give one stack: equal
/// names and lines in the same file ([`same_code`]), wherever each process
/// loaded it. Otherwise every short-lived process would add its own
/// copy of every stack (its load addresses differ), and a host starting
/// thousands of processes a minute would fill the history with copies.
/// A pprof download shows such a stack with the addresses of the process
/// it was first seen in.
#[derive(Debug, Default)]
struct Tables {
    names: NameTable,
    frames: HashMap<usize, FrameEntry, FixedState>,
    stacks: Vec<StackEntry>,
    /// A stack's value hash to the newest stack with it; `same_hash` links
    /// to the others.
    stack_heads: HashMap<u64, u32, FixedState>,
    same_hash: Vec<u32>,
    processes: Vec<Arc<ProcessInfo>>,
    process_ids: HashMap<Arc<ProcessInfo>, u32>,
    threads: Vec<ThreadKey>,
    thread_ids: HashMap<ThreadKey, u32>,
    /// Heap objects already charged (shared strings and mappings). Every
    /// pointer in it belongs to an object the tables keep alive, so none is
    /// reused while it is here.
    charged: HashSet<usize, FixedState>,
    bytes: usize,
}

impl Tables {
    /// Heap bytes of the tables: what the entries point to, and the
    /// containers at their current capacities.
    fn total_bytes(&self) -> usize {
        self.bytes
            + self.names.heap_bytes()
            + map_bytes::<usize, FrameEntry>(self.frames.capacity())
            + vec_bytes::<StackEntry>(self.stacks.capacity())
            + map_bytes::<u64, u32>(self.stack_heads.capacity())
            + vec_bytes::<u32>(self.same_hash.capacity())
            + vec_bytes::<Arc<ProcessInfo>>(self.processes.capacity())
            + map_bytes::<Arc<ProcessInfo>, u32>(self.process_ids.capacity())
            + vec_bytes::<ThreadKey>(self.threads.capacity())
            + map_bytes::<ThreadKey, u32>(self.thread_ids.capacity())
            + map_bytes::<usize, ()>(self.charged.capacity())
    }

    fn charge_str(&mut self, s: &Arc<str>) {
        if !s.is_empty() && self.charged.insert(s.as_ptr() as usize) {
            self.bytes += s.len() + 2 * size_of::<usize>() + OVERHEAD;
        }
    }

    /// The frame's entry, made on first sight.
    fn frame(&mut self, frame: &Arc<Frame>) -> &FrameEntry {
        let key = Arc::as_ptr(frame) as usize;
        if !self.frames.contains_key(&key) {
            // The frame's own allocation (an `Arc`) and its lines'; the
            // entry itself is in the map, counted by `containers`.
            self.bytes += 2 * size_of::<usize>() + size_of::<Frame>() + OVERHEAD;
            self.bytes += vec_bytes::<Line>(frame.lines.capacity());
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
                self.bytes += size_of::<Mapping>() + OVERHEAD;
                self.charge_str(&mapping.filename);
            }
            let names = self.names.names_of(frame);
            self.bytes += vec_bytes::<NameId>(names.len());
            let entry = FrameEntry {
                _frame: frame.clone(),
                hash: code_hash(frame),
                names,
                kind_bit: kind_bit(frame.kind),
            };
            self.frames.insert(key, entry);
        }
        &self.frames[&key]
    }

    fn stack_id(&mut self, stack: &Stack) -> u32 {
        let mut hash: u64 = stack.len() as u64;
        for frame in stack.iter() {
            // A frame not seen before is hashed, not entered: it is kept
            // only if its stack is new (another process's copy of a known
            // stack is not).
            let h = match self.frames.get(&(Arc::as_ptr(frame) as usize)) {
                Some(entry) => entry.hash,
                None => code_hash(frame),
            };
            hash = (hash.rotate_left(5) ^ h).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
        let mut at = self.stack_heads.get(&hash).copied().unwrap_or(NONE);
        while at != NONE {
            let known = &self.stacks[at as usize].stack;
            if known.len() == stack.len()
                && known
                    .iter()
                    .zip(stack.iter())
                    .all(|(a, b)| Arc::ptr_eq(a, b) || same_code(a, b))
            {
                return at;
            }
            at = self.same_hash[at as usize];
        }
        let id = self.stacks.len() as u32;
        let mut path = Vec::with_capacity(stack.len());
        let mut kinds = 0;
        for frame in stack.iter().rev() {
            let entry = self.frame(frame);
            kinds |= entry.kind_bit;
            path.extend_from_slice(&entry.names);
        }
        // The path, and the stack's frames (an `Arc` of a slice).
        self.bytes += vec_bytes::<NameId>(path.len());
        self.bytes += (stack.len() + 2) * size_of::<usize>() + OVERHEAD;
        self.stacks.push(StackEntry {
            stack: stack.clone(),
            path: path.into_boxed_slice(),
            kinds,
        });
        self.same_hash
            .push(self.stack_heads.insert(hash, id).unwrap_or(NONE));
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
        self.bytes += 2 * size_of::<usize>() + size_of::<ProcessInfo>() + OVERHEAD;
        self.bytes += info.labels.len() * 32;
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
    /// Rows in the slots.
    live_rows: usize,
    /// Rows dropped since the tables were last compacted: what they alone
    /// pointed to is still in the tables.
    dropped_rows: usize,
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
            live_rows: 0,
            dropped_rows: 0,
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
        self.tables.total_bytes() + self.rows_bytes + vec_bytes::<Slot>(self.slots.capacity())
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
        self.live_rows += rows.len();
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

    /// Drops slots by age and by memory.
    ///
    /// Compacting re-interns every stack left, which costs about as much
    /// as ingesting the whole history again, so it is not done per dropped
    /// slot: by age, once the rows dropped since the last compaction
    /// outnumber the rows left (an amortized constant per row); by memory,
    /// once per cut down to a low-water mark an eighth under the limit, so
    /// that the next batches fit without one.
    fn evict(&mut self, now_unix_nanos: u64) {
        let retention = u64::try_from(self.limits.retention.as_nanos()).unwrap_or(u64::MAX);
        let oldest_kept = now_unix_nanos.saturating_sub(retention);
        while self.slots.front().is_some_and(|s| s.end < oldest_kept) {
            self.pop_oldest();
            self.stats.evicted_by_age.fetch_add(1, Relaxed);
        }
        if self.dropped_rows > self.live_rows {
            self.compact();
        }
        let limit = usize::try_from(self.limits.max_bytes).unwrap_or(usize::MAX);
        if self.bytes() > limit && self.dropped_rows > 0 {
            // What dropped slots left behind may be all that is over.
            self.compact();
        }
        let low_water = limit - limit / 8;
        while self.bytes() > limit && !self.slots.is_empty() {
            // The tables' share of what is left is only known after a
            // compaction: until then, the rows left hold their share of them.
            let tables = self.tables.total_bytes();
            let rows_before = self.live_rows.max(1);
            loop {
                let last = self.slots.len() == 1;
                self.pop_oldest();
                if last {
                    // Alone over the limit: the batch just added.
                    self.stats.rejected_batches.fetch_add(1, Relaxed);
                } else {
                    self.stats.evicted_by_memory.fetch_add(1, Relaxed);
                }
                let left = self.rows_bytes + tables * self.live_rows / rows_before;
                if left <= low_water || self.slots.is_empty() {
                    break;
                }
            }
            self.compact();
        }
        self.publish_stats();
    }

    /// Removes the oldest slot.
    fn pop_oldest(&mut self) {
        let Some(slot) = self.slots.pop_front() else {
            return;
        };
        let bytes = slot.rows.capacity() * size_of::<Row>() + size_of::<Slot>() + OVERHEAD;
        self.rows_bytes = self.rows_bytes.saturating_sub(bytes);
        self.live_rows -= slot.rows.len();
        self.dropped_rows += slot.rows.len();
    }

    /// Rebuilds the tables from the slots left, renumbering their rows.
    fn compact(&mut self) {
        self.dropped_rows = 0;
        self.stats.compactions.fetch_add(1, Relaxed);
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
