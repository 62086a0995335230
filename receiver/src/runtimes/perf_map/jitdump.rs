//! The jitdump format (`jit-PID.dump`, Linux's
//! `tools/perf/Documentation/jitdump-specification.txt`), which runtimes
//! such as V8 (`--perf-prof`), .NET (`PerfMapEnabled=1`) and LLVM-based
//! JITs write for `perf inject`: a file header, then records. Symbols come
//! from `JIT_CODE_LOAD` (moved by `JIT_CODE_MOVE`), and lines from
//! `JIT_CODE_DEBUG_INFO`, written just before the load of the same code.
//!
//! Line entries' files are stored as paths (`file://` URLs decoded), and
//! their addresses without the 0x40 that V8 and LLVM add for `perf
//! inject`. Node.js 20 writes garbage file names for CommonJS scripts
//! (valid ones for ES modules): a table is cut at its first implausible one.
//!
//! The runtime mmaps the file (which is how a profiler finds it) and
//! appends to it while we read, so it is parsed incrementally like a perf
//! map: a partial last record waits for more bytes. Only the part of a
//! record that is used is buffered (a load's code bytes are skipped, by
//! seeking when reading a file), and every size is bounded: records, names,
//! symbols, line entries.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{
    names::source_path,
    parse::{
        FeedStats, FileTail, LineEntry, LineTable, MAX_LINE_BYTES, PerfMap, PerfMapSymbol, TailSink,
    },
};

/// `JiTD` as a machine of this byte order writes it.
const MAGIC: u32 = 0x4A69_5444;
/// The file header of version 1: magic, version, total_size, elf_mach,
/// pad1, pid (u32 each), timestamp, flags (u64 each).
const FILE_HEADER_BYTES: usize = 40;
/// Largest file header accepted (a later version may append fields).
const MAX_FILE_HEADER_BYTES: usize = 4096;
/// id (u32), total_size (u32), timestamp (u64).
const RECORD_HEADER_BYTES: usize = 16;
/// A code load's header and fixed fields: pid, tid (u32), vma, code_addr,
/// code_size, code_index (u64); the name follows.
const CODE_LOAD_FIXED: usize = RECORD_HEADER_BYTES + 40;
/// A record larger than this makes the file corrupt: it is not read further.
pub const MAX_RECORD_BYTES: usize = 16 << 20;
/// A code size larger than this is corrupt (the record is skipped).
const MAX_CODE_BYTES: u64 = 256 << 20;
/// Line entries held by default, over all symbols of a file.
pub const DEFAULT_MAX_LINE_ENTRIES: usize = 1 << 20;
/// Debug info records waiting for the load of their code at most; past
/// this they are orphans (the loads never came) and are forgotten.
const MAX_PENDING: usize = 1024;
/// What V8 and LLVM's `PerfJITEventListener` add to every debug entry's
/// address: the size of the ELF header `perf inject` puts before the code.
const ELF_HEADER_BIAS: u64 = 0x40;

const CODE_LOAD: u32 = 0;
const CODE_MOVE: u32 = 1;
const CODE_DEBUG_INFO: u32 = 2;
const CODE_CLOSE: u32 = 3;

/// The file header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JitDumpHeader {
    /// Format version (1 as of the specification's revision 2).
    pub version: u32,
    /// ELF machine of the code.
    pub elf_mach: u32,
    /// The runtime's process ID (in its own PID namespace).
    pub pid: u32,
    /// When the file was created, in the runtime's clock.
    pub timestamp: u64,
    /// Flags (bit 0: timestamps from an architecture clock).
    pub flags: u64,
}

/// Why a jitdump file is not read (further).
#[derive(Debug, thiserror::Error)]
pub enum JitDumpError {
    /// Opening or reading the file failed.
    #[error("reading the jitdump file: {0}")]
    Io(#[from] std::io::Error),
    /// The file does not start with the jitdump magic.
    #[error("not a jitdump file (magic {0:#010x})")]
    NotJitDump(u32),
    /// The file was written by a machine of the other byte order.
    #[error("jitdump file of the other byte order (magic {0:#010x}), not supported")]
    ForeignByteOrder(u32),
    /// The file header's size is impossible.
    #[error("jitdump file header of {0} bytes")]
    BadHeader(u32),
    /// A record's size is smaller than a record header or larger than
    /// [`MAX_RECORD_BYTES`].
    #[error("corrupt jitdump record of {size} bytes at offset {offset}")]
    BadRecord {
        /// The record's total_size.
        size: u32,
        /// Where the record starts in the file.
        offset: u64,
    },
}

/// A symbol and, when debug info gave its lines, the file and line of the
/// address looked up.
pub type SymbolAt<'a> = (&'a PerfMapSymbol, Option<(Arc<str>, u32)>);

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The symbols of one jitdump, fed its bytes as they come.
#[derive(Debug)]
pub struct JitDump {
    map: PerfMap,
    header: Option<JitDumpHeader>,
    /// The part of the file header or record being gathered.
    unit: Vec<u8>,
    /// Bytes of the current record still to skip.
    skip: u64,
    /// Bytes fed (or skipped) so far: the file offset of the next byte.
    fed: u64,
    /// Line tables of code whose load has not come yet, by code address.
    pending: HashMap<u64, LineTable>,
    pending_entries: usize,
    max_line_entries: usize,
    closed: bool,
    /// Set by an error: nothing more is parsed.
    failed: bool,
}

impl JitDump {
    /// An empty dump keeping at most `max_entries` symbols.
    pub fn new(max_entries: usize) -> Self {
        JitDump {
            map: PerfMap::new(max_entries),
            header: None,
            unit: Vec::new(),
            skip: 0,
            fed: 0,
            pending: HashMap::new(),
            pending_entries: 0,
            max_line_entries: DEFAULT_MAX_LINE_ENTRIES,
            closed: false,
            failed: false,
        }
    }

    /// The same, keeping at most `entries` line entries over all symbols
    /// (debug info past that is dropped; its symbols are still named).
    pub fn with_max_line_entries(mut self, entries: usize) -> Self {
        self.max_line_entries = entries;
        self
    }

    /// Parses `bytes`, the continuation of the bytes fed before. After an
    /// error the dump is corrupt and later bytes are ignored.
    pub fn feed(&mut self, mut input: &[u8]) -> Result<FeedStats, JitDumpError> {
        let mut stats = FeedStats::default();
        if self.failed {
            return Ok(stats);
        }
        loop {
            if self.skip > 0 {
                if input.is_empty() {
                    break;
                }
                let n = self.skip.min(input.len() as u64);
                input = input.get(n as usize..).unwrap_or_default();
                self.skip -= n;
                self.fed += n;
                continue;
            }
            let target = self.target().inspect_err(|_| self.failed = true)?;
            if self.unit.len() >= target || self.name_complete() {
                self.finish_unit(&mut stats)
                    .inspect_err(|_| self.failed = true)?;
                continue;
            }
            if input.is_empty() {
                break;
            }
            let mut n = (target - self.unit.len()).min(input.len());
            if self.header.is_some()
                && self.unit.len() >= CODE_LOAD_FIXED
                && u32_at(&self.unit, 0) == Some(CODE_LOAD)
            {
                // A code load's name: gather it through its NUL only.
                if let Some(nul) = input[..n].iter().position(|&b| b == 0) {
                    n = nul + 1;
                }
            }
            self.unit.extend_from_slice(&input[..n]);
            input = &input[n..];
            self.fed += n as u64;
        }
        Ok(stats)
    }

    /// The bytes the unit being gathered needs, as far as its first bytes tell.
    fn target(&self) -> Result<usize, JitDumpError> {
        if self.header.is_none() {
            if let Some(magic) = u32_at(&self.unit, 0) {
                if magic == MAGIC.swap_bytes() {
                    return Err(JitDumpError::ForeignByteOrder(magic));
                }
                if magic != MAGIC {
                    return Err(JitDumpError::NotJitDump(magic));
                }
            }
            return match u32_at(&self.unit, 8) {
                None => Ok(12),
                Some(size)
                    if (FILE_HEADER_BYTES..=MAX_FILE_HEADER_BYTES).contains(&(size as usize)) =>
                {
                    Ok(size as usize)
                }
                Some(size) => Err(JitDumpError::BadHeader(size)),
            };
        }
        let (Some(id), Some(size)) = (u32_at(&self.unit, 0), u32_at(&self.unit, 4)) else {
            return Ok(RECORD_HEADER_BYTES);
        };
        let total = size as usize;
        if !(RECORD_HEADER_BYTES..=MAX_RECORD_BYTES).contains(&total) {
            return Err(JitDumpError::BadRecord {
                size,
                offset: self.fed - self.unit.len() as u64,
            });
        }
        Ok(match id {
            CODE_LOAD if self.unit.len() < CODE_LOAD_FIXED => total.min(CODE_LOAD_FIXED),
            CODE_LOAD => total.min(CODE_LOAD_FIXED + MAX_LINE_BYTES),
            CODE_MOVE | CODE_DEBUG_INFO => total,
            // Unwinding info, the close marker and later record types:
            // their header is enough.
            _ => RECORD_HEADER_BYTES,
        })
    }

    /// Whether the unit is a code load whose name's NUL has come.
    fn name_complete(&self) -> bool {
        self.header.is_some()
            && self.unit.len() > CODE_LOAD_FIXED
            && u32_at(&self.unit, 0) == Some(CODE_LOAD)
            && self.unit.last() == Some(&0)
    }

    fn finish_unit(&mut self, stats: &mut FeedStats) -> Result<(), JitDumpError> {
        let mut unit = std::mem::take(&mut self.unit);
        if self.header.is_none() {
            let field = |at| u32_at(&unit, at).unwrap_or_default();
            self.header = Some(JitDumpHeader {
                version: field(4),
                elf_mach: field(12),
                pid: field(20),
                timestamp: u64_at(&unit, 24).unwrap_or_default(),
                flags: u64_at(&unit, 32).unwrap_or_default(),
            });
        } else {
            let id = u32_at(&unit, 0).unwrap_or_default();
            let size = u32_at(&unit, 4).unwrap_or_default() as usize;
            self.skip = size.saturating_sub(unit.len()) as u64;
            match id {
                CODE_LOAD => self.code_load(&unit, size, stats),
                CODE_MOVE => self.code_move(&unit, stats),
                CODE_DEBUG_INFO => self.debug_info(&unit, stats),
                CODE_CLOSE => self.closed = true,
                _ => {}
            }
        }
        unit.clear();
        if unit.capacity() <= 2 * MAX_LINE_BYTES {
            self.unit = unit;
        }
        Ok(())
    }

    fn code_load(&mut self, unit: &[u8], size: usize, stats: &mut FeedStats) {
        let (Some(code_addr), Some(code_size)) = (
            u64_at(unit, RECORD_HEADER_BYTES + 16),
            u64_at(unit, RECORD_HEADER_BYTES + 24),
        ) else {
            stats.malformed += 1;
            return;
        };
        let name = unit.get(CODE_LOAD_FIXED..).unwrap_or_default();
        let Some(name) = name.strip_suffix(&[0]) else {
            if unit.len() < size {
                stats.too_long += 1;
            } else {
                stats.malformed += 1;
            }
            return;
        };
        let name = String::from_utf8_lossy(name);
        if name.trim().is_empty() || code_size > MAX_CODE_BYTES {
            stats.malformed += 1;
            return;
        }
        let lines = self.pending.remove(&code_addr);
        self.pending_entries -= lines.as_ref().map_or(0, |l| l.len());
        if self.map.insert(code_addr, code_size, name.trim(), lines) {
            stats.added += 1;
        } else {
            stats.dropped_over_limit += 1;
        }
    }

    fn code_move(&mut self, unit: &[u8], stats: &mut FeedStats) {
        let body = unit.get(RECORD_HEADER_BYTES..).unwrap_or_default();
        let (Some(old), Some(new), Some(size)) =
            (u64_at(body, 16), u64_at(body, 24), u64_at(body, 32))
        else {
            stats.malformed += 1;
            return;
        };
        if size > MAX_CODE_BYTES {
            stats.malformed += 1;
            return;
        }
        // Code never loaded (or dropped) has nothing to move.
        self.map.relocate(old, new, size);
    }

    fn debug_info(&mut self, unit: &[u8], stats: &mut FeedStats) {
        let body = unit.get(RECORD_HEADER_BYTES..).unwrap_or_default();
        let (Some(code_addr), Some(count)) = (u64_at(body, 0), u64_at(body, 8)) else {
            stats.malformed += 1;
            return;
        };
        let mut entries: Vec<(u64, u32, Arc<str>)> = Vec::new();
        let mut at = 16;
        let mut previous: Option<(&[u8], Arc<str>)> = None;
        // Each entry takes at least 17 bytes: the record bounds the count.
        for _ in 0..count {
            let (Some(address), Some(line)) = (u64_at(body, at), u32_at(body, at + 8)) else {
                stats.malformed += 1;
                break;
            };
            let rest = body.get(at + 16..).unwrap_or_default();
            let Some(nul) = rest.iter().position(|&b| b == 0) else {
                stats.malformed += 1;
                break;
            };
            let name = &rest[..nul];
            at += 16 + nul + 1;
            let file = match &previous {
                // V8's marker for "the previous entry's file".
                Some((_, file)) if name == [0xff] => file.clone(),
                Some((bytes, file)) if *bytes == name => file.clone(),
                _ => {
                    // Node.js 20's V8 writes the file names of some scripts
                    // from freed memory: garbage, with NULs inside that
                    // misalign what follows. A name that is not plausible
                    // text ends the table (the entries before it stay).
                    let Some(text) = std::str::from_utf8(name)
                        .ok()
                        .filter(|t| !t.is_empty() && !t.chars().any(char::is_control))
                    else {
                        stats.malformed += 1;
                        break;
                    };
                    self.map.intern(&source_path(text))
                }
            };
            previous = Some((name, file.clone()));
            entries.push((address, line, file));
        }
        if entries.is_empty() {
            return;
        }
        let held = self.map.line_entries() + self.pending_entries;
        if held + entries.len() > self.max_line_entries {
            stats.dropped_over_limit += 1;
            return;
        }
        let bias = if entries
            .iter()
            .all(|e| e.0 >= code_addr.saturating_add(ELF_HEADER_BIAS))
        {
            ELF_HEADER_BIAS
        } else {
            0
        };
        let mut table: Vec<LineEntry> = entries
            .into_iter()
            .map(|(address, line, file)| LineEntry {
                address: address - bias,
                line,
                file,
            })
            .collect();
        table.sort_by_key(|e| e.address);
        if self.pending.len() >= MAX_PENDING {
            self.pending.clear();
            self.pending_entries = 0;
        }
        self.pending_entries += table.len();
        if let Some(replaced) = self.pending.insert(code_addr, table.into()) {
            self.pending_entries -= replaced.len();
        }
    }

    /// The symbol whose code holds `address`, with the file and line of
    /// the last line entry at or before it when debug info gave its lines.
    pub fn lookup(&self, address: u64) -> Option<SymbolAt<'_>> {
        let symbol = self.map.lookup(address)?;
        let line = symbol
            .line_at(address)
            .map(|(file, line)| (file.clone(), line));
        Some((symbol, line))
    }

    /// The symbols loaded so far (with their line tables).
    pub fn map(&self) -> &PerfMap {
        &self.map
    }

    /// The file header, once read.
    pub fn header(&self) -> Option<&JitDumpHeader> {
        self.header.as_ref()
    }

    /// Whether the runtime wrote its close record.
    pub fn closed(&self) -> bool {
        self.closed
    }

    /// Whether an error stopped the parsing.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Forgets everything: the next bytes fed are a file's first.
    pub fn reset(&mut self) {
        self.map.clear();
        self.header = None;
        self.unit = Vec::new();
        self.skip = 0;
        self.fed = 0;
        self.pending = HashMap::new();
        self.pending_entries = 0;
        self.closed = false;
        self.failed = false;
    }
}

impl TailSink for JitDump {
    type Error = JitDumpError;

    fn restart(&mut self) {
        self.reset();
    }

    fn consume(&mut self, bytes: &[u8]) -> Result<FeedStats, JitDumpError> {
        self.feed(bytes)
    }

    fn skippable(&self) -> u64 {
        // A corrupt file is not read further, only moved past.
        if self.failed { u64::MAX } else { self.skip }
    }

    fn skipped(&mut self, bytes: u64) {
        if !self.failed {
            self.skip -= bytes.min(self.skip);
            self.fed += bytes;
        }
    }
}

/// A jitdump file read incrementally.
#[derive(Debug)]
pub struct JitDumpFile {
    tail: FileTail,
    dump: JitDump,
}

impl JitDumpFile {
    /// The file at `path`, keeping at most `max_entries` symbols.
    pub fn new(path: PathBuf, max_entries: usize) -> Self {
        JitDumpFile {
            tail: FileTail::new(path),
            dump: JitDump::new(max_entries),
        }
    }

    /// The same, reading at most `bytes` per refresh (at least 1; code
    /// bytes skipped are not read and do not count).
    pub fn with_max_read_per_refresh(mut self, bytes: u64) -> Self {
        self.tail.max_read_per_refresh = bytes.max(1);
        self
    }

    /// The same, keeping at most `entries` line entries.
    pub fn with_max_line_entries(mut self, entries: usize) -> Self {
        self.dump = self.dump.with_max_line_entries(entries);
        self
    }

    /// Reads the records appended since the last refresh (at most the
    /// per-refresh budget). A file replaced or truncated since is read
    /// again from its start. A corrupt file's error is returned once;
    /// later refreshes skip what is appended to it, until it is replaced.
    pub fn refresh(&mut self) -> Result<FeedStats, JitDumpError> {
        self.tail.refresh(&mut self.dump)
    }

    /// The symbol whose code holds `address`, and its file and line.
    pub fn lookup(&self, address: u64) -> Option<SymbolAt<'_>> {
        self.dump.lookup(address)
    }

    /// What was parsed so far.
    pub fn dump(&self) -> &JitDump {
        &self.dump
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.tail.path()
    }

    /// Bytes of the file read or skipped so far.
    pub fn offset(&self) -> u64 {
        self.tail.offset()
    }
}

#[cfg(test)]
#[path = "jitdump_tests.rs"]
mod tests;
