//! The perf map format (`/tmp/perf-PID.map`): one `START SIZE NAME` line
//! per JIT-compiled symbol, START and SIZE in hex, NAME the rest of the line.
//! Runtimes append to it while they run, so it is read incrementally: a
//! partial last line waits for the next read, and later symbols replace
//! earlier ones they overlap (code freed and its memory reused).

use std::{
    collections::BTreeMap,
    fs::File,
    io::{self, Read, Seek, SeekFrom},
    os::unix::fs::MetadataExt,
    path::PathBuf,
    sync::Arc,
};

/// Longest line kept; a longer one is skipped (and counted) without being buffered.
pub const MAX_LINE_BYTES: usize = 64 << 10;
/// Bytes read from a file per refresh at most: a huge map is consumed over
/// several refreshes rather than at once.
pub const MAX_READ_PER_REFRESH: u64 = 16 << 20;

/// One JIT symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfMapSymbol {
    /// First address.
    pub start: u64,
    /// Bytes of code (at least 1).
    pub size: u64,
    /// The name as the runtime wrote it.
    pub name: Arc<str>,
}

/// What one feed of bytes did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeedStats {
    /// Symbols added.
    pub added: u64,
    /// Lines that are not `START SIZE NAME`.
    pub malformed: u64,
    /// Symbols dropped because the map holds its maximum, or lines too long.
    pub dropped: u64,
}

impl std::ops::AddAssign for FeedStats {
    fn add_assign(&mut self, other: FeedStats) {
        self.added += other.added;
        self.malformed += other.malformed;
        self.dropped += other.dropped;
    }
}

/// The symbols of one process, by start address, non-overlapping.
#[derive(Debug)]
pub struct PerfMap {
    symbols: BTreeMap<u64, PerfMapSymbol>,
    max_symbols: usize,
    /// The unfinished last line of the bytes fed so far.
    partial: Vec<u8>,
    /// Skipping the rest of a line longer than [`MAX_LINE_BYTES`].
    skipping: bool,
    name_bytes: usize,
}

impl PerfMap {
    /// An empty map keeping at most `max_symbols` symbols.
    pub fn new(max_symbols: usize) -> Self {
        PerfMap {
            symbols: BTreeMap::new(),
            max_symbols,
            partial: Vec::new(),
            skipping: false,
            name_bytes: 0,
        }
    }

    /// Parses `bytes`, the continuation of what was fed before.
    pub fn feed(&mut self, mut bytes: &[u8]) -> FeedStats {
        let mut stats = FeedStats::default();
        while !bytes.is_empty() {
            let Some(end) = bytes.iter().position(|&b| b == b'\n') else {
                if !self.skipping {
                    self.partial.extend_from_slice(bytes);
                    if self.partial.len() > MAX_LINE_BYTES {
                        self.partial.clear();
                        self.skipping = true;
                        stats.dropped += 1;
                    }
                }
                break;
            };
            let (line, rest) = bytes.split_at(end);
            bytes = &rest[1..];
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            if self.partial.is_empty() {
                self.line(line, &mut stats);
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                if whole.len() > MAX_LINE_BYTES {
                    stats.dropped += 1;
                } else {
                    self.line(&whole, &mut stats);
                }
            }
        }
        stats
    }

    fn line(&mut self, line: &[u8], stats: &mut FeedStats) {
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches('\r');
        if text.trim().is_empty() {
            return;
        }
        match parse_line(text) {
            Some((start, size, name)) => {
                if self.insert(start, size, Arc::from(name)) {
                    stats.added += 1;
                } else {
                    stats.dropped += 1;
                }
            }
            None => stats.malformed += 1,
        }
    }

    /// Adds a symbol, removing those it overlaps; false when the map is full.
    pub fn insert(&mut self, start: u64, size: u64, name: Arc<str>) -> bool {
        let size = size.max(1);
        let end = start.saturating_add(size);
        // Overlapped: the one starting before `start` that reaches into it,
        // and every one starting inside [start, end).
        let mut overlapped: Vec<u64> = Vec::new();
        if let Some((&at, before)) = self.symbols.range(..start).next_back()
            && at.saturating_add(before.size) > start
        {
            overlapped.push(at);
        }
        overlapped.extend(self.symbols.range(start..end).map(|(&at, _)| at));
        for at in overlapped {
            if let Some(old) = self.symbols.remove(&at) {
                self.name_bytes -= old.name.len();
            }
        }
        if self.symbols.len() >= self.max_symbols {
            return false;
        }
        self.name_bytes += name.len();
        self.symbols
            .insert(start, PerfMapSymbol { start, size, name });
        true
    }

    /// The symbol covering `address`.
    pub fn lookup(&self, address: u64) -> Option<&PerfMapSymbol> {
        let (_, symbol) = self.symbols.range(..=address).next_back()?;
        (address - symbol.start < symbol.size).then_some(symbol)
    }

    /// Symbols held.
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// Whether no symbol is held.
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// Approximate heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        // A B-tree entry: key, value, and node overhead.
        self.symbols.len() * (8 + std::mem::size_of::<PerfMapSymbol>() + 16)
            + self.name_bytes
            + self.partial.capacity()
    }

    /// Forgets every symbol (the file was replaced).
    fn clear(&mut self) {
        self.symbols.clear();
        self.partial.clear();
        self.skipping = false;
        self.name_bytes = 0;
    }
}

/// `START SIZE NAME`, hex numbers with or without `0x`.
fn parse_line(line: &str) -> Option<(u64, u64, &str)> {
    let line = line.trim_start();
    let (start, rest) = line.split_once(' ')?;
    let rest = rest.trim_start();
    let (size, name) = rest.split_once(' ').unwrap_or((rest, ""));
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x").unwrap_or(s), 16).ok();
    Some((hex(start)?, hex(size)?, name.trim()))
}

/// A perf map file read incrementally.
#[derive(Debug)]
pub struct PerfMapFile {
    path: PathBuf,
    map: PerfMap,
    /// Bytes consumed so far, and the file's identity then.
    offset: u64,
    identity: Option<(u64, u64)>,
    /// Totals over every refresh.
    pub totals: FeedStats,
}

impl PerfMapFile {
    /// The file at `path` (which may not exist yet), keeping at most
    /// `max_symbols` symbols.
    pub fn new(path: PathBuf, max_symbols: usize) -> Self {
        PerfMapFile {
            path,
            map: PerfMap::new(max_symbols),
            offset: 0,
            identity: None,
            totals: FeedStats::default(),
        }
    }

    /// Reads what was appended since the last refresh (at most
    /// [`MAX_READ_PER_REFRESH`] bytes). A file replaced or truncated since
    /// is read again from its start.
    pub fn refresh(&mut self) -> io::Result<FeedStats> {
        let mut file = File::open(&self.path)?;
        let meta = file.metadata()?;
        let identity = (meta.dev(), meta.ino());
        if self.identity != Some(identity) || meta.len() < self.offset {
            self.map.clear();
            self.offset = 0;
            self.identity = Some(identity);
        }
        if meta.len() == self.offset {
            return Ok(FeedStats::default());
        }
        file.seek(SeekFrom::Start(self.offset))?;
        let mut stats = FeedStats::default();
        let mut chunk = vec![0u8; 1 << 20];
        let mut budget = MAX_READ_PER_REFRESH;
        while budget > 0 {
            let want = chunk
                .len()
                .min(usize::try_from(budget).unwrap_or(usize::MAX));
            let n = file.read(&mut chunk[..want])?;
            if n == 0 {
                break;
            }
            self.offset += n as u64;
            budget -= n as u64;
            stats += self.map.feed(&chunk[..n]);
        }
        self.totals += stats;
        Ok(stats)
    }

    /// The symbol covering `address`.
    pub fn lookup(&self, address: u64) -> Option<&PerfMapSymbol> {
        self.map.lookup(address)
    }

    /// The symbols read so far.
    pub fn map(&self) -> &PerfMap {
        &self.map
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn names(map: &PerfMap, addresses: &[u64]) -> Vec<Option<String>> {
        addresses
            .iter()
            .map(|&a| map.lookup(a).map(|s| s.name.to_string()))
            .collect()
    }

    #[test]
    fn parses_lines_split_anywhere() {
        let text = b"7f00 10 JS:*alpha /app/x.js:4:15\n0x7f10 0x20 LazyCompile:~beta with spaces\n";
        for split in 0..text.len() {
            let mut map = PerfMap::new(100);
            let mut stats = map.feed(&text[..split]);
            stats += map.feed(&text[split..]);
            assert_eq!(stats.added, 2, "split at {split}");
            assert_eq!(
                names(&map, &[0x7f00, 0x7f0f, 0x7f10, 0x7f2f, 0x7f30]),
                [
                    Some("JS:*alpha /app/x.js:4:15".into()),
                    Some("JS:*alpha /app/x.js:4:15".into()),
                    Some("LazyCompile:~beta with spaces".into()),
                    Some("LazyCompile:~beta with spaces".into()),
                    None
                ]
            );
        }
    }

    #[test]
    fn later_symbols_replace_the_ones_they_overlap() {
        let mut map = PerfMap::new(100);
        map.feed(b"1000 100 old_a\n1100 100 old_b\n1200 100 old_c\n");
        // Reused memory: covers the end of old_a and all of old_b.
        map.feed(b"1080 100 new\n");
        assert_eq!(
            names(&map, &[0x1000, 0x1080, 0x1150, 0x1200]),
            [
                None,
                Some("new".into()),
                Some("new".into()),
                Some("old_c".into())
            ]
        );
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn bad_lines_are_counted_and_memory_is_bounded() {
        let mut map = PerfMap::new(2);
        let stats = map.feed(b"zz 10 bad\n\n10 nothex name\n1 1 a\n2 1 b\n3 1 c\n4 0 zero-size\n");
        assert_eq!((stats.added, stats.malformed, stats.dropped), (2, 2, 2));
        let mut long = vec![b'x'; MAX_LINE_BYTES * 3];
        long.push(b'\n');
        let mut map = PerfMap::new(10);
        for piece in long.chunks(1000) {
            map.feed(piece);
            assert!(
                map.heap_bytes() <= 2 * MAX_LINE_BYTES,
                "a long line is not buffered"
            );
        }
        let stats = map.feed(b"5 1 after\n");
        assert_eq!(stats.added, 1);
        assert_eq!(names(&map, &[5]), [Some("after".into())]);
        assert_eq!(
            map.feed(b"\xff\xfe 1 x\n").malformed,
            1,
            "non-UTF-8 is a bad line"
        );
    }

    #[test]
    fn a_file_is_read_as_it_grows_and_again_when_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("perf-1.map");
        let mut file = PerfMapFile::new(path.clone(), 100);
        assert!(file.refresh().is_err(), "not there yet");
        let mut out = std::fs::File::create(&path).unwrap();
        write!(out, "100 10 first\n200 10 sec").unwrap();
        assert_eq!(file.refresh().unwrap().added, 1);
        writeln!(out, "ond").unwrap();
        assert_eq!(file.refresh().unwrap().added, 1);
        assert_eq!(file.refresh().unwrap(), FeedStats::default());
        assert_eq!(file.lookup(0x205).map(|s| &*s.name), Some("second"));
        drop(out);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "300 10 third\n").unwrap();
        file.refresh().unwrap();
        assert!(file.lookup(0x100).is_none(), "a new file starts over");
        assert_eq!(file.lookup(0x300).map(|s| &*s.name), Some("third"));
    }
}
