//! The jitdump format (`jit-PID.dump`, Linux's
//! `tools/perf/Documentation/jitdump-specification.txt`): a header, then
//! records; `JIT_CODE_LOAD` names code, `JIT_CODE_MOVE` moves it, and
//! `JIT_CODE_DEBUG_INFO`, written before the load of the same code, gives
//! its lines. Runtimes mmap the file (which is how icecore finds it) and
//! append to it, so it is read incrementally: a partial last record waits.

use std::{
    collections::{BTreeMap, HashMap},
    fs::File,
    io::{self, Read, Seek, SeekFrom},
    path::PathBuf,
    sync::Arc,
};

use super::parse::{MAX_READ_PER_REFRESH, PerfMap, PerfMapSymbol};

const MAGIC: u32 = 0x4A69_5444;
const FILE_HEADER_BYTES: usize = 40;
const RECORD_HEADER_BYTES: usize = 16;
/// A record larger than this is corrupt: the file is not read further.
const MAX_RECORD_BYTES: usize = 16 << 20;

const CODE_LOAD: u32 = 0;
const CODE_MOVE: u32 = 1;
const CODE_DEBUG_INFO: u32 = 2;
const CODE_CLOSE: u32 = 3;

/// Why a jitdump file is not read (further).
#[derive(Debug, thiserror::Error)]
pub enum JitDumpError {
    /// Reading the file failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The header is not a jitdump's of this machine's byte order.
    #[error("not a little-endian jitdump file (magic {0:#x})")]
    BadMagic(u32),
    /// A record's size is impossible.
    #[error("corrupt record of {0} bytes at offset {1}")]
    BadRecord(usize, u64),
}

/// Line entries of one piece of code: (address, line, file), by address.
type Lines = Arc<[(u64, u32, Arc<str>)]>;

/// A symbol and, when debug info gave it, the file and line of an address in it.
pub type SymbolAt<'a> = (&'a PerfMapSymbol, Option<(Arc<str>, u32)>);

/// A jitdump file read incrementally.
#[derive(Debug)]
pub struct JitDumpFile {
    path: PathBuf,
    symbols: PerfMap,
    /// Line entries of each loaded symbol, by its start.
    lines: BTreeMap<u64, Lines>,
    /// Debug info waiting for the load of its code, by code address.
    pending_lines: HashMap<u64, Lines>,
    /// Bytes consumed (whole records) and unparsed bytes of a partial record.
    offset: u64,
    buffer: Vec<u8>,
    header_read: bool,
    /// Set once the file proved corrupt: it is not read again.
    broken: bool,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The NUL-terminated string at `at`, and the offset after its NUL.
fn c_str_at(b: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = b.get(at..)?;
    let len = rest.iter().position(|&c| c == 0)?;
    Some((&rest[..len], at + len + 1))
}

impl JitDumpFile {
    /// The file at `path`, keeping at most `max_symbols` symbols.
    pub fn new(path: PathBuf, max_symbols: usize) -> Self {
        JitDumpFile {
            path,
            symbols: PerfMap::new(max_symbols),
            lines: BTreeMap::new(),
            pending_lines: HashMap::new(),
            offset: 0,
            buffer: Vec::new(),
            header_read: false,
            broken: false,
        }
    }

    /// Reads the records appended since the last refresh.
    pub fn refresh(&mut self) -> Result<(), JitDumpError> {
        if self.broken {
            return Ok(());
        }
        let mut file = File::open(&self.path)?;
        file.seek(SeekFrom::Start(self.offset + self.buffer.len() as u64))?;
        let mut budget = MAX_READ_PER_REFRESH;
        let mut chunk = vec![0u8; 1 << 20];
        while budget > 0 {
            let want = chunk
                .len()
                .min(usize::try_from(budget).unwrap_or(usize::MAX));
            let n = file.read(&mut chunk[..want])?;
            if n == 0 {
                break;
            }
            budget -= n as u64;
            if let Err(e) = self.feed(&chunk[..n]) {
                self.broken = true;
                self.buffer = Vec::new();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Parses `bytes`, the continuation of what was fed before.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), JitDumpError> {
        self.buffer.extend_from_slice(bytes);
        let mut at = 0usize;
        if !self.header_read {
            let Some(magic) = u32_at(&self.buffer, 0) else {
                return Ok(());
            };
            if magic != MAGIC {
                return Err(JitDumpError::BadMagic(magic));
            }
            let Some(size) = u32_at(&self.buffer, 8) else {
                return Ok(());
            };
            let size = (size as usize).max(FILE_HEADER_BYTES);
            if size > MAX_RECORD_BYTES {
                return Err(JitDumpError::BadRecord(size, 0));
            }
            if self.buffer.len() < size {
                return Ok(());
            }
            self.header_read = true;
            at = size;
        }
        while let (Some(id), Some(size)) = (u32_at(&self.buffer, at), u32_at(&self.buffer, at + 4))
        {
            let size = size as usize;
            if !(RECORD_HEADER_BYTES..=MAX_RECORD_BYTES).contains(&size) {
                return Err(JitDumpError::BadRecord(size, self.offset + at as u64));
            }
            if self.buffer.len() < at + size {
                break;
            }
            let body = &self.buffer[at + RECORD_HEADER_BYTES..at + size];
            let record = body.to_vec();
            self.record(id, &record);
            at += size;
        }
        self.offset += at as u64;
        self.buffer.drain(..at);
        Ok(())
    }

    fn record(&mut self, id: u32, body: &[u8]) {
        match id {
            CODE_LOAD => {
                let (Some(code_addr), Some(code_size)) = (u64_at(body, 16), u64_at(body, 24))
                else {
                    return;
                };
                let Some((name, _)) = c_str_at(body, 40) else {
                    return;
                };
                let name: Arc<str> = Arc::from(String::from_utf8_lossy(name).as_ref());
                if self.symbols.insert(code_addr, code_size, name) {
                    self.lines.retain(|&start, _| {
                        start < code_addr || start >= code_addr.saturating_add(code_size)
                    });
                    if let Some(lines) = self.pending_lines.remove(&code_addr) {
                        self.lines.insert(code_addr, lines);
                    }
                }
            }
            CODE_MOVE => {
                let (Some(old), Some(new), Some(size)) =
                    (u64_at(body, 16), u64_at(body, 24), u64_at(body, 32))
                else {
                    return;
                };
                if let Some(symbol) = self.symbols.lookup(old).cloned() {
                    self.symbols.insert(new, size, symbol.name);
                }
            }
            CODE_DEBUG_INFO => self.debug_info(body),
            CODE_CLOSE => {}
            // Unwinding info and ids from later versions: nothing to name.
            _ => {}
        }
    }

    fn debug_info(&mut self, body: &[u8]) {
        let (Some(code_addr), Some(count)) = (u64_at(body, 0), u64_at(body, 8)) else {
            return;
        };
        let mut at = 16;
        let mut entries: Vec<(u64, u32, Arc<str>)> = Vec::new();
        // Each entry takes at least 17 bytes, so the body bounds the count.
        for _ in 0..count.min(body.len() as u64 / 17) {
            let (Some(addr), Some(line)) = (u64_at(body, at), u32_at(body, at + 8)) else {
                break;
            };
            let Some((name, next)) = c_str_at(body, at + 16) else {
                break;
            };
            at = next;
            // 0xff: the same file as the previous entry.
            let file = match (name, entries.last()) {
                ([0xff], Some((_, _, previous))) => previous.clone(),
                _ => Arc::from(String::from_utf8_lossy(name).as_ref()),
            };
            entries.push((addr, line, file));
        }
        entries.sort_by_key(|e| e.0);
        if self.pending_lines.len() < 65_536 {
            self.pending_lines.insert(code_addr, entries.into());
        }
    }

    /// The symbol covering `address`, with the file and line of the last
    /// line entry at or before it when the dump had debug info for it.
    pub fn lookup(&self, address: u64) -> Option<SymbolAt<'_>> {
        let symbol = self.symbols.lookup(address)?;
        let line = self.lines.get(&symbol.start).and_then(|lines| {
            let index = lines.partition_point(|e| e.0 <= address).checked_sub(1)?;
            let (_, line, file) = &lines[index];
            Some((file.clone(), *line))
        });
        Some((symbol, line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Vec<u8> {
        let mut b = Vec::new();
        for v in [MAGIC, 1, 40, 62, 0, 1234] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b
    }

    fn record(id: u32, body: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&id.to_le_bytes());
        b.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(body);
        b
    }

    fn load(addr: u64, size: u64, name: &str) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes());
        for v in [addr, addr, size, 7] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.extend_from_slice(name.as_bytes());
        body.push(0);
        body.extend_from_slice(&vec![0x90; size as usize]);
        record(CODE_LOAD, &body)
    }

    fn debug(addr: u64, entries: &[(u64, u32, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&addr.to_le_bytes());
        body.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        for (a, line, file) in entries {
            body.extend_from_slice(&a.to_le_bytes());
            body.extend_from_slice(&line.to_le_bytes());
            body.extend_from_slice(&0u32.to_le_bytes());
            body.extend_from_slice(file);
            body.push(0);
        }
        record(CODE_DEBUG_INFO, &body)
    }

    fn dump() -> Vec<u8> {
        let mut b = header();
        b.extend(debug(
            0x1000,
            &[(0x1000, 10, b"/app/x.js"), (0x1010, 12, &[0xff])],
        ));
        b.extend(load(0x1000, 0x40, "alpha"));
        b.extend(load(0x2000, 0x20, "beta"));
        b
    }

    fn at(file: &JitDumpFile, address: u64) -> Option<(String, Option<(String, u32)>)> {
        file.lookup(address)
            .map(|(s, l)| (s.name.to_string(), l.map(|(f, n)| (f.to_string(), n))))
    }

    #[test]
    fn loads_with_lines_fed_in_any_pieces() {
        let bytes = dump();
        for split in [0, 3, 39, 40, 41, 60, bytes.len() - 1] {
            let mut file = JitDumpFile::new(PathBuf::new(), 100);
            file.feed(&bytes[..split]).unwrap();
            file.feed(&bytes[split..]).unwrap();
            assert_eq!(
                at(&file, 0x1014),
                Some(("alpha".into(), Some(("/app/x.js".into(), 12)))),
                "split at {split}"
            );
            assert_eq!(at(&file, 0x1005).and_then(|a| a.1).map(|l| l.1), Some(10));
            assert_eq!(at(&file, 0x2000), Some(("beta".into(), None)));
            assert_eq!(at(&file, 0x2020), None);
        }
    }

    #[test]
    fn corrupt_files_are_refused() {
        let mut file = JitDumpFile::new(PathBuf::new(), 100);
        let mut swapped = header();
        swapped[..4].copy_from_slice(&MAGIC.to_be_bytes());
        assert!(matches!(
            file.feed(&swapped),
            Err(JitDumpError::BadMagic(_))
        ));
        let mut file = JitDumpFile::new(PathBuf::new(), 100);
        let mut bytes = header();
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            file.feed(&bytes),
            Err(JitDumpError::BadRecord(..))
        ));
        // Truncated bodies and huge entry counts are skipped, not trusted.
        let mut file = JitDumpFile::new(PathBuf::new(), 100);
        let mut bytes = header();
        bytes.extend(record(CODE_LOAD, &[1, 2, 3]));
        let mut lying = Vec::new();
        lying.extend_from_slice(&0x3000u64.to_le_bytes());
        lying.extend_from_slice(&u64::MAX.to_le_bytes());
        bytes.extend(record(CODE_DEBUG_INFO, &lying));
        file.feed(&bytes).unwrap();
        assert!(file.lookup(0x3000).is_none());
    }

    #[test]
    fn a_real_file_is_read_as_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jit-1.dump");
        let bytes = dump();
        std::fs::write(&path, &bytes[..70]).unwrap();
        let mut file = JitDumpFile::new(path.clone(), 100);
        file.refresh().unwrap();
        assert!(file.lookup(0x1000).is_none());
        std::fs::write(&path, &bytes).unwrap();
        file.refresh().unwrap();
        assert_eq!(at(&file, 0x2001).map(|a| a.0), Some("beta".into()));
    }
}
