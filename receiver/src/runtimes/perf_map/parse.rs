//! The perf map format (`/tmp/perf-PID.map`), which JIT runtimes (Node.js
//! with `--perf-basic-prof`, .NET with `PerfMapEnabled`, the JVM through an
//! agent, Erlang, Julia, …) write so that profilers can name their
//! generated code: one `START SIZE NAME` line per symbol, START and SIZE in
//! hex (with or without `0x`), NAME the rest of the line.
//!
//! The runtime appends while we read, so a file is read incrementally
//! ([`PerfMapFile`]): a partial last line waits for the next read, a huge
//! file is consumed over several refreshes, and a later symbol replaces the
//! earlier ones it overlaps (the code was freed and its memory reused).
//! Memory is bounded: symbols per map, bytes per line, bytes per read.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap, hash_map::Entry},
    fs::File,
    hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState},
    io,
    ops::AddAssign,
    os::unix::fs::{FileExt, MetadataExt},
    path::{Path, PathBuf},
    sync::Arc,
};

/// Longest line parsed; a longer one is skipped (and counted) without
/// being buffered.
pub const MAX_LINE_BYTES: usize = 64 << 10;
/// Bytes read from a file per `read` call at most.
pub const READ_CHUNK_BYTES: usize = 1 << 20;
/// Bytes read from a file per refresh by default: a huge file is consumed
/// over several refreshes rather than at once.
pub const DEFAULT_MAX_READ_PER_REFRESH: u64 = 16 << 20;

/// One entry of a symbol's line table (from jitdump debug info).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineEntry {
    /// First address of the code the entry describes.
    pub address: u64,
    /// 1-based source line.
    pub line: u32,
    /// Source file, shared between entries and symbols.
    pub file: Arc<str>,
}

/// A symbol's line table, sorted by address.
pub type LineTable = Arc<[LineEntry]>;

/// One JIT symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfMapSymbol {
    /// First address.
    pub start: u64,
    /// Bytes of code (at least 1: a zero-size symbol is kept as size 1).
    pub size: u64,
    /// The name as the runtime wrote it, shared by the symbols of a map
    /// that have the same name.
    pub name: Arc<str>,
    /// Line table, when the runtime gave one (jitdump debug info); perf
    /// maps have none.
    pub lines: Option<LineTable>,
}

impl PerfMapSymbol {
    /// Whether `address` is in the symbol's code.
    pub fn contains(&self, address: u64) -> bool {
        address
            .checked_sub(self.start)
            .is_some_and(|o| o < self.size)
    }

    /// The file and line of `address`: those of the last line entry at or
    /// before it, if the symbol has a line table.
    pub fn line_at(&self, address: u64) -> Option<(&Arc<str>, u32)> {
        let lines = self.lines.as_deref()?;
        let index = lines
            .partition_point(|e| e.address <= address)
            .checked_sub(1)?;
        lines.get(index).map(|e| (&e.file, e.line))
    }
}

/// What feeding bytes (or a refresh) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeedStats {
    /// Symbols added.
    pub added: u64,
    /// Lines (records) that could not be parsed.
    pub malformed: u64,
    /// Symbols (or line tables) refused because the map holds its maximum.
    pub dropped_over_limit: u64,
    /// Lines (names) longer than [`MAX_LINE_BYTES`], skipped.
    pub too_long: u64,
}

impl AddAssign for FeedStats {
    fn add_assign(&mut self, other: FeedStats) {
        self.added += other.added;
        self.malformed += other.malformed;
        self.dropped_over_limit += other.dropped_over_limit;
        self.too_long += other.too_long;
    }
}

/// Passes the interner's keys, SipHash outputs already, through.
#[derive(Debug, Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Strings shared by the symbols of one map: a runtime that recompiles
/// writes the same names again, and jitdump line entries repeat files.
/// Keyed by the string's (randomly keyed) SipHash, so that a string is
/// hashed once; a string whose hash another holds is simply not shared.
#[derive(Debug, Default)]
struct Interner {
    hasher: RandomState,
    by_hash: HashMap<u64, Arc<str>, BuildHasherDefault<PassThrough>>,
    bytes: usize,
}

impl Interner {
    fn intern(&mut self, s: &str) -> Arc<str> {
        match self.by_hash.entry(self.hasher.hash_one(s)) {
            Entry::Occupied(known) if **known.get() == *s => known.get().clone(),
            Entry::Occupied(_) => Arc::from(s),
            Entry::Vacant(slot) => {
                self.bytes += s.len();
                slot.insert(Arc::from(s)).clone()
            }
        }
    }

    /// Forgets `s` when the caller's copy was the last one outside the set.
    fn release(&mut self, s: Arc<str>) {
        if Arc::strong_count(&s) != 2 {
            return;
        }
        if let Entry::Occupied(known) = self.by_hash.entry(self.hasher.hash_one(&*s))
            && Arc::ptr_eq(known.get(), &s)
        {
            known.remove();
            self.bytes -= s.len();
        }
    }

    /// Forgets every string only the set holds (the ones symbols stopped
    /// using while another copy, since dropped, was alive).
    fn sweep(&mut self) {
        self.by_hash.retain(|_, s| Arc::strong_count(s) > 1);
        self.bytes = self.by_hash.values().map(|s| s.len()).sum();
    }

    fn len(&self) -> usize {
        self.by_hash.len()
    }

    fn heap_bytes(&self) -> usize {
        // Slots (hash, pointer, length, control byte), Arc headers, characters.
        self.by_hash.capacity() * (size_of::<u64>() + size_of::<Arc<str>>() + 1)
            + self.by_hash.len() * 16
            + self.bytes
    }
}

/// The symbols of one process by start address, non-overlapping, at most
/// a given number; fed the bytes of a perf map as they come.
#[derive(Debug)]
pub struct PerfMap {
    symbols: BTreeMap<u64, PerfMapSymbol>,
    max_entries: usize,
    names: Interner,
    /// Line entries of every symbol held.
    line_entries: usize,
    /// The unfinished last line of the bytes fed so far.
    partial: Vec<u8>,
    /// Skipping the rest of a line longer than [`MAX_LINE_BYTES`].
    skipping: bool,
}

impl PerfMap {
    /// An empty map keeping at most `max_entries` symbols.
    pub fn new(max_entries: usize) -> Self {
        PerfMap {
            symbols: BTreeMap::new(),
            max_entries,
            names: Interner::default(),
            line_entries: 0,
            partial: Vec::new(),
            skipping: false,
        }
    }

    /// Parses `bytes`, the continuation of the bytes fed before: complete
    /// lines are added, an unfinished last line waits for the next feed.
    pub fn feed(&mut self, bytes: &[u8]) -> FeedStats {
        let mut stats = FeedStats::default();
        let mut lines = bytes.split(|&b| b == b'\n');
        // The last piece has no newline (it is empty when `bytes` ends one).
        let tail = lines.next_back().unwrap_or_default();
        for line in lines {
            if std::mem::take(&mut self.skipping) {
                // The end of a line already counted as too long.
            } else if self.partial.is_empty() {
                self.line(line, &mut stats);
            } else if self.partial.len() + line.len() > MAX_LINE_BYTES {
                self.partial = Vec::new();
                stats.too_long += 1;
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                self.line(&whole, &mut stats);
                whole.clear();
                if whole.capacity() <= 4096 {
                    self.partial = whole;
                }
            }
        }
        if !tail.is_empty() && !self.skipping {
            if self.partial.len() + tail.len() > MAX_LINE_BYTES {
                self.partial = Vec::new();
                self.skipping = true;
                stats.too_long += 1;
            } else {
                self.partial.extend_from_slice(tail);
            }
        }
        stats
    }

    fn line(&mut self, line: &[u8], stats: &mut FeedStats) {
        let text = match std::str::from_utf8(line) {
            Ok(text) => Cow::Borrowed(text),
            Err(_) => String::from_utf8_lossy(line),
        };
        match parse_line(&text) {
            Some((start, size, name)) => {
                if self.insert(start, size, name, None) {
                    stats.added += 1;
                } else {
                    stats.dropped_over_limit += 1;
                }
            }
            None if text.trim().is_empty() => {}
            None => stats.malformed += 1,
        }
    }

    /// Adds a symbol (a zero `size` counts as 1), first removing every
    /// symbol it overlaps; false when the map already holds its maximum.
    pub fn insert(&mut self, start: u64, size: u64, name: &str, lines: Option<LineTable>) -> bool {
        let name = self.names.intern(name);
        self.place(PerfMapSymbol {
            start,
            size: size.max(1),
            name,
            lines,
        })
    }

    /// The shared copy of `s` (for the files of line tables).
    pub fn intern(&mut self, s: &str) -> Arc<str> {
        self.names.intern(s)
    }

    /// Moves the symbol starting at `old_start` to `new_start` with `size`,
    /// its line table shifted with it; false when there is none there.
    pub fn relocate(&mut self, old_start: u64, new_start: u64, size: u64) -> bool {
        let Some(mut symbol) = self.symbols.remove(&old_start) else {
            return false;
        };
        self.line_entries -= symbol.lines.as_ref().map_or(0, |l| l.len());
        let shift = |address: u64| new_start.wrapping_add(address.wrapping_sub(old_start));
        symbol.lines = symbol.lines.map(|lines| {
            lines
                .iter()
                .map(|e| LineEntry {
                    address: shift(e.address),
                    ..e.clone()
                })
                .collect()
        });
        symbol.start = new_start;
        symbol.size = size.max(1);
        self.place(symbol)
    }

    fn place(&mut self, symbol: PerfMapSymbol) -> bool {
        let start = symbol.start;
        let end = start.saturating_add(symbol.size);
        // The symbols are disjoint: if the last one starting before `end`
        // ends by `start`, so do all before it (one query in the usual case).
        while let Some((&at, old)) = self.symbols.range(..end).next_back()
            && old.start.saturating_add(old.size) > start
        {
            self.evict(at);
        }
        if self.symbols.len() >= self.max_entries {
            self.names.release(symbol.name);
            return false;
        }
        self.line_entries += symbol.lines.as_ref().map_or(0, |l| l.len());
        if let Some(old) = self.symbols.insert(start, symbol) {
            // Only at the very top of the address space, where `end` saturates.
            self.line_entries -= old.lines.as_ref().map_or(0, |l| l.len());
            self.names.release(old.name);
        }
        if self.names.len() > 2 * self.symbols.len() + 1024 {
            self.names.sweep();
        }
        true
    }

    fn evict(&mut self, start: u64) {
        if let Some(old) = self.symbols.remove(&start) {
            self.line_entries -= old.lines.as_ref().map_or(0, |l| l.len());
            self.names.release(old.name);
        }
    }

    /// The symbol whose code holds `address`.
    pub fn lookup(&self, address: u64) -> Option<&PerfMapSymbol> {
        let (_, symbol) = self.symbols.range(..=address).next_back()?;
        symbol.contains(address).then_some(symbol)
    }

    /// Symbols held.
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// Whether no symbol is held.
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// Line entries of the symbols held.
    pub fn line_entries(&self) -> usize {
        self.line_entries
    }

    /// The symbols, by start address.
    pub fn symbols(&self) -> impl Iterator<Item = &PerfMapSymbol> {
        self.symbols.values()
    }

    /// Approximate heap bytes held: symbols, names, line tables and the
    /// unfinished line.
    pub fn heap_bytes(&self) -> usize {
        // A B-tree entry: key, value and its share of the node.
        const ENTRY: usize = size_of::<u64>() + size_of::<PerfMapSymbol>() + 16;
        self.symbols.len() * ENTRY
            + self.names.heap_bytes()
            + self.line_entries * size_of::<LineEntry>()
            + self.partial.capacity()
    }

    /// Forgets every symbol and the unfinished line (the file was replaced).
    pub fn clear(&mut self) {
        self.symbols.clear();
        self.names = Interner::default();
        self.line_entries = 0;
        self.partial = Vec::new();
        self.skipping = false;
    }
}

/// `START SIZE NAME`: hex numbers with or without `0x`, separated by
/// spaces or tabs; the name is the rest of the line, trimmed.
fn parse_line(line: &str) -> Option<(u64, u64, &str)> {
    let is_space = |c: char| c == ' ' || c == '\t';
    let (start, rest) = line.trim_start_matches(is_space).split_once(is_space)?;
    let (size, name) = rest.trim_start_matches(is_space).split_once(is_space)?;
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    Some((hex(start)?, hex(size)?, name))
}

/// A hex number of 1 to 16 digits, with or without `0x`.
fn hex(s: &str) -> Option<u64> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    digits.bytes().try_fold(0u64, |value, b| {
        let digit = (b as char).to_digit(16)?;
        Some(value << 4 | u64::from(digit))
    })
}

/// What [`FileTail`] hands the bytes it reads to.
pub(crate) trait TailSink {
    /// What consuming bytes may fail with.
    type Error: From<io::Error>;
    /// Forgets everything: the file is read again from its start.
    fn restart(&mut self);
    /// Parses the next bytes of the file.
    fn consume(&mut self, bytes: &[u8]) -> Result<FeedStats, Self::Error>;
    /// Bytes that follow and are not needed (jitdump code bytes): the tail
    /// moves past them without reading them, then tells [`Self::skipped`].
    fn skippable(&self) -> u64 {
        0
    }
    /// `bytes` of the skippable bytes were moved past.
    fn skipped(&mut self, _bytes: u64) {}
}

/// First bytes of a file remembered to tell it was rewritten.
const HEAD_BYTES: usize = 64;

/// A file read from where the last read stopped, again from its start when
/// it was replaced: another inode, shorter than what was read, or other
/// first bytes (truncated and rewritten in place, or a new file that got
/// the inode number of the one deleted).
#[derive(Debug)]
pub(crate) struct FileTail {
    path: PathBuf,
    /// Bytes consumed so far.
    offset: u64,
    /// The file's (device, inode) when last read.
    identity: Option<(u64, u64)>,
    /// Its first bytes, as far as read (up to [`HEAD_BYTES`]).
    head: Vec<u8>,
    /// Bytes read per refresh at most.
    pub(crate) max_read_per_refresh: u64,
}

impl FileTail {
    pub(crate) fn new(path: PathBuf) -> Self {
        FileTail {
            path,
            offset: 0,
            identity: None,
            head: Vec::new(),
            max_read_per_refresh: DEFAULT_MAX_READ_PER_REFRESH,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads what was appended since the last refresh, up to the budget,
    /// into `sink`; the file's length is taken once, so a runtime writing
    /// fast does not keep one refresh going.
    pub(crate) fn refresh<S: TailSink>(&mut self, sink: &mut S) -> Result<FeedStats, S::Error> {
        let file = File::open(&self.path)?;
        let meta = file.metadata()?;
        let identity = (meta.dev(), meta.ino());
        let len = meta.len();
        if self.identity != Some(identity) || len < self.offset || !self.same_head(&file)? {
            sink.restart();
            self.offset = 0;
            self.identity = Some(identity);
            self.head.clear();
        }
        let mut stats = FeedStats::default();
        let mut budget = self.max_read_per_refresh;
        let mut buffer = Vec::new();
        loop {
            let skip = sink.skippable().min(len - self.offset);
            if skip > 0 {
                self.offset += skip;
                sink.skipped(skip);
            }
            let want = (len - self.offset).min(budget).min(READ_CHUNK_BYTES as u64) as usize;
            if want == 0 {
                break;
            }
            if buffer.len() < want {
                buffer.resize(want, 0);
            }
            let read = &mut buffer[..want];
            let n = file.read_at(read, self.offset)?;
            if n == 0 {
                // Truncated while we read: the next refresh starts over.
                break;
            }
            if self.head.len() < HEAD_BYTES && self.offset == self.head.len() as u64 {
                let more = (HEAD_BYTES - self.head.len()).min(n);
                self.head.extend_from_slice(&read[..more]);
            }
            self.offset += n as u64;
            budget -= n as u64;
            stats += sink.consume(&read[..n])?;
        }
        Ok(stats)
    }

    /// Whether the file still starts with the bytes read from it.
    fn same_head(&self, file: &File) -> io::Result<bool> {
        if self.head.is_empty() {
            return Ok(true);
        }
        let mut now = [0u8; HEAD_BYTES];
        let now = &mut now[..self.head.len()];
        match file.read_exact_at(now, 0) {
            Ok(()) => Ok(*now == *self.head),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl TailSink for PerfMap {
    type Error = io::Error;

    fn restart(&mut self) {
        self.clear();
    }

    fn consume(&mut self, bytes: &[u8]) -> io::Result<FeedStats> {
        Ok(self.feed(bytes))
    }
}

/// A perf map file read incrementally.
#[derive(Debug)]
pub struct PerfMapFile {
    tail: FileTail,
    map: PerfMap,
    totals: FeedStats,
}

impl PerfMapFile {
    /// The file at `path` (which may not exist yet), keeping at most
    /// `max_entries` symbols.
    pub fn new(path: PathBuf, max_entries: usize) -> Self {
        PerfMapFile {
            tail: FileTail::new(path),
            map: PerfMap::new(max_entries),
            totals: FeedStats::default(),
        }
    }

    /// The same, reading at most `bytes` per refresh (at least 1) instead
    /// of [`DEFAULT_MAX_READ_PER_REFRESH`].
    pub fn with_max_read_per_refresh(mut self, bytes: u64) -> Self {
        self.tail.max_read_per_refresh = bytes.max(1);
        self
    }

    /// Reads what was appended since the last refresh, at most the
    /// per-refresh budget (the rest waits for the next refresh). A file
    /// replaced or truncated since is read again from its start, into an
    /// empty map.
    pub fn refresh(&mut self) -> io::Result<FeedStats> {
        let stats = self.tail.refresh(&mut self.map)?;
        self.totals += stats;
        Ok(stats)
    }

    /// The symbol whose code holds `address`.
    pub fn lookup(&self, address: u64) -> Option<&PerfMapSymbol> {
        self.map.lookup(address)
    }

    /// The symbols read so far.
    pub fn map(&self) -> &PerfMap {
        &self.map
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.tail.path()
    }

    /// Bytes of the file read so far.
    pub fn offset(&self) -> u64 {
        self.tail.offset()
    }

    /// What every refresh did, summed (since the map was created).
    pub fn totals(&self) -> FeedStats {
        self.totals
    }
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
