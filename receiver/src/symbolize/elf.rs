//! Function symbols of one ELF file, for turning file offsets into names.
//!
//! [`ElfSymbols::load`] reads only what symbolization needs (headers, the symbol
//! and string tables, notes) through `object`'s read cache, so a binary with
//! hundreds of megabytes of debug information costs no more than its symbol
//! tables. Function symbols of `.symtab` and `.dynsym` are merged, sorted by
//! address and kept with their names in one string arena.

use std::borrow::Cow;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader, Sym};
use object::read::{ReadCache, ReadRef, SectionIndex, StringTable};
use object::{Endian, Endianness, FileKind};

/// Files larger than this are refused by [`ElfSymbols::load`].
pub const DEFAULT_MAX_FILE_SIZE: u64 = 2 << 30;
/// Function symbols read from one file at most (both tables together); the rest
/// is ignored. Bounds the memory a huge or corrupt symbol table can take.
pub const MAX_FUNCTION_SYMBOLS: usize = 8 << 20;
/// A symbol without size extends to the next symbol, but never further than this.
pub const MAX_UNSIZED_SYMBOL_EXTENT: u64 = 1 << 20;

/// Why an ELF file's symbols could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// The file could not be opened or its size read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the ELF magic (or is another object format).
    #[error("{path} is not an ELF file")]
    NotElf {
        /// The file.
        path: String,
    },
    /// The file exceeds the size limit.
    #[error("{path} is {size} bytes, over the limit of {limit}")]
    TooLarge {
        /// The file.
        path: String,
        /// Its size in bytes.
        size: u64,
        /// The limit in bytes.
        limit: u64,
    },
    /// The file is ELF but its headers or tables are inconsistent or truncated.
    #[error("{path} is malformed ELF: {reason}")]
    Malformed {
        /// The file.
        path: String,
        /// What the parser rejected.
        reason: String,
    },
}

/// A `PT_LOAD` program header: how file offsets map to virtual addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSegment {
    /// `p_offset`.
    pub file_offset: u64,
    /// `p_filesz`.
    pub file_size: u64,
    /// `p_vaddr`.
    pub vaddr: u64,
    /// `p_memsz`.
    pub mem_size: u64,
}

pub use names::{COMPRESS_NAMES_FROM, NAMES_PER_BLOCK};
use names::{Names, NamesBuilder};

/// A resolved symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolRef<'a> {
    /// The name as stored in the file (mangled).
    pub name: Cow<'a, str>,
    /// Virtual address of the symbol's first byte.
    pub address: u64,
    /// How far into the symbol the looked-up address is.
    pub offset: u64,
}

/// One function: `[start, end)` and its name in its block of [`Names`].
#[derive(Debug, Clone, Copy)]
struct Entry {
    start: u64,
    end: u64,
    name_start: u32,
    name_len: u32,
}

/// A section's place in its file and in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionRange {
    /// `sh_addr`.
    pub vaddr: u64,
    /// `sh_offset`.
    pub file_offset: u64,
    /// `sh_size`.
    pub size: u64,
}

/// The `.gnu_debuglink` section: where the separate debug file is and its CRC32.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugLink {
    /// File name of the debug file (no directory).
    pub name: String,
    /// CRC32 (the zlib one) of the whole debug file.
    pub crc: u32,
}

/// What an ELF file says about its debug information, noted while its symbols
/// are read so nothing else has to be parsed until a debug look-up needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DebugHints {
    /// The file has a non-empty `.debug_info` (or `.zdebug_info`) section.
    pub has_dwarf: bool,
    /// The file has a `.symtab` section.
    pub has_symtab: bool,
    /// Its `.gnu_debuglink`, when present and well-formed.
    pub debuglink: Option<DebugLink>,
    /// Its Go `.gopclntab` (`.data.rel.ro.gopclntab` in PIE binaries).
    pub gopclntab: Option<SectionRange>,
    /// Its `.text` section.
    pub text: Option<SectionRange>,
    /// Its `.noptrdata` section (Go's module data lives there).
    pub noptrdata: Option<SectionRange>,
}

/// The function symbols, build ID and load segments of one ELF file.
#[derive(Debug, Default)]
pub struct ElfSymbols {
    entries: Vec<Entry>,
    names: Names,
    build_id: Option<Arc<str>>,
    segments: Vec<LoadSegment>,
    hints: DebugHints,
}

impl ElfSymbols {
    /// Loads a file, refusing files over [`DEFAULT_MAX_FILE_SIZE`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ElfError> {
        Self::load_with_limit(path, DEFAULT_MAX_FILE_SIZE)
    }

    /// Loads a file, refusing files over `max_file_size` bytes.
    pub fn load_with_limit(path: impl AsRef<Path>, max_file_size: u64) -> Result<Self, ElfError> {
        let path = path.as_ref();
        let name = || path.display().to_string();
        let io = |source| ElfError::Io {
            path: name(),
            source,
        };
        // Refuse devices, FIFOs and directories before opening: opening some
        // devices has side effects or blocks.
        if !std::fs::metadata(path).map_err(io)?.is_file() {
            return Err(ElfError::NotElf { path: name() });
        }
        let file = File::open(path).map_err(io)?;
        let metadata = file.metadata().map_err(io)?;
        if !metadata.is_file() {
            return Err(ElfError::NotElf { path: name() });
        }
        if metadata.len() > max_file_size {
            return Err(ElfError::TooLarge {
                path: name(),
                size: metadata.len(),
                limit: max_file_size,
            });
        }
        let cache = ReadCache::new(file);
        parse_any(&cache).map_err(|e| e.with_path(name()))
    }

    /// Parses an ELF image held in memory.
    pub fn parse(data: &[u8]) -> Result<Self, ElfError> {
        parse_any(data).map_err(|e| e.with_path("<memory>".to_owned()))
    }

    /// The function containing the code at `file_offset`, via the `PT_LOAD` segment
    /// holding that offset.
    pub fn lookup_file_offset(&self, file_offset: u64) -> Option<SymbolRef<'_>> {
        self.lookup_vaddr(self.file_offset_to_vaddr(file_offset)?)
    }

    /// The function containing the virtual address `vaddr` (as linked, no load bias).
    pub fn lookup_vaddr(&self, vaddr: u64) -> Option<SymbolRef<'_>> {
        let (index, address) = self.function_at(vaddr)?;
        Some(SymbolRef {
            name: self.name_at(index),
            address,
            offset: vaddr - address,
        })
    }

    /// The index and start address of the function containing `vaddr`,
    /// without reading its name (see [`Self::name_at`]).
    pub fn function_at(&self, vaddr: u64) -> Option<(usize, u64)> {
        let index = self
            .entries
            .partition_point(|e| e.start <= vaddr)
            .checked_sub(1)?;
        let entry = self.entries.get(index)?;
        (vaddr < entry.end).then_some((index, entry.start))
    }

    /// The name of the function at `index` (from [`Self::function_at`]).
    pub fn name_at(&self, index: usize) -> Cow<'_, str> {
        self.entries.get(index).map_or(Cow::Borrowed(""), |e| {
            self.names.get(index, e.name_start, e.name_len)
        })
    }

    /// Converts a file offset to a virtual address: `offset - p_offset + p_vaddr` of
    /// the `PT_LOAD` segment whose file range contains it.
    pub fn file_offset_to_vaddr(&self, file_offset: u64) -> Option<u64> {
        self.segments.iter().find_map(|s| {
            let delta = file_offset.checked_sub(s.file_offset)?;
            // A segment that wraps past the end of the address space
            // (a hostile file) has no address for it.
            (delta < s.file_size).then(|| s.vaddr.checked_add(delta))?
        })
    }

    /// Converts a virtual address back to a file offset, when it is file-backed.
    pub fn vaddr_to_file_offset(&self, vaddr: u64) -> Option<u64> {
        self.segments.iter().find_map(|s| {
            let delta = vaddr.checked_sub(s.vaddr)?;
            (delta < s.file_size).then(|| s.file_offset.wrapping_add(delta))
        })
    }

    /// Address of the first function named exactly `name` (linear scan; for tests
    /// and one-off look-ups, not the hot path).
    pub fn symbol_address(&self, name: &str) -> Option<u64> {
        self.symbols().find(|s| s.name == name).map(|s| s.address)
    }

    /// All functions in address order.
    pub fn symbols(&self) -> impl Iterator<Item = SymbolRef<'_>> {
        self.entries.iter().enumerate().map(|(index, e)| SymbolRef {
            name: self.names.get(index, e.name_start, e.name_len),
            address: e.start,
            offset: 0,
        })
    }

    /// The GNU build ID in lower-case hex, when the file has one.
    pub fn build_id(&self) -> Option<&Arc<str>> {
        self.build_id.as_ref()
    }

    /// The `PT_LOAD` segments in file order.
    pub fn segments(&self) -> &[LoadSegment] {
        &self.segments
    }

    /// What the file says about its debug information.
    pub fn debug_hints(&self) -> &DebugHints {
        &self.hints
    }

    /// Number of distinct function addresses.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the file has no function symbols (stripped without `.dynsym`).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Approximate heap bytes held.
    pub fn heap_size(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.names.heap_size()
            + self.segments.capacity() * std::mem::size_of::<LoadSegment>()
            + self
                .hints
                .debuglink
                .as_ref()
                .map_or(0, |l| l.name.capacity())
    }
}

/// A parse failure before the path is known.
#[derive(Debug)]
enum ParseError {
    NotElf,
    Malformed(String),
}

impl ParseError {
    fn with_path(self, path: String) -> ElfError {
        match self {
            ParseError::NotElf => ElfError::NotElf { path },
            ParseError::Malformed(reason) => ElfError::Malformed { path, reason },
        }
    }
}

impl From<object::read::Error> for ParseError {
    fn from(e: object::read::Error) -> Self {
        ParseError::Malformed(e.to_string())
    }
}

fn parse_any<'data, R: ReadRef<'data>>(data: R) -> Result<ElfSymbols, ParseError> {
    match data.read_bytes_at(0, 4) {
        Ok(magic) if magic == elf::ELFMAG => {}
        _ => return Err(ParseError::NotElf),
    }
    match FileKind::parse(data)? {
        FileKind::Elf32 => parse_elf::<elf::FileHeader32<Endianness>, R>(data),
        FileKind::Elf64 => parse_elf::<elf::FileHeader64<Endianness>, R>(data),
        _ => Err(ParseError::NotElf),
    }
}

/// A function symbol before merging.
struct RawSymbol<'data> {
    start: u64,
    /// Explicit end, or `None` for size-0 symbols.
    end: Option<u64>,
    /// Where a size-0 symbol must stop at the latest.
    limit: u64,
    local: bool,
    name: &'data [u8],
}

fn parse_elf<'data, Elf: FileHeader<Endian = Endianness>, R: ReadRef<'data>>(
    data: R,
) -> Result<ElfSymbols, ParseError> {
    let header = Elf::parse(data)?;
    let endian = header.endian()?;
    let program_headers = header.program_headers(endian, data)?;
    let segments: Vec<LoadSegment> = program_headers
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD)
        .map(|p| LoadSegment {
            file_offset: p.p_offset(endian).into(),
            file_size: p.p_filesz(endian).into(),
            vaddr: p.p_vaddr(endian).into(),
            mem_size: p.p_memsz(endian).into(),
        })
        .collect();
    let sections = header.sections(endian, data)?;

    // A broken table is skipped so the other one still serves; only when no
    // table could be read at all is the file reported as malformed.
    let mut raw = Vec::new();
    let mut tables_read = 0;
    let mut table_error = None;
    for table_type in [elf::SHT_SYMTAB, elf::SHT_DYNSYM] {
        for section in sections.iter().filter(|s| s.sh_type(endian) == table_type) {
            match read_table(section, endian, data, &sections, &mut raw) {
                Ok(()) => tables_read += 1,
                Err(e) => table_error = Some(e),
            }
        }
    }
    if let (0, Some(error)) = (tables_read, table_error) {
        return Err(error);
    }
    // A corrupt note only costs the build ID.
    let build_id = build_id::<Elf, R>(&sections, program_headers, endian, data).unwrap_or(None);
    let hints = debug_hints(&sections, endian, data);
    let (entries, names) = merge(raw)?;
    Ok(ElfSymbols {
        entries,
        names,
        build_id,
        segments,
        hints,
    })
}

/// Notes the debug-related sections; a malformed one is left out.
fn debug_hints<'data, Elf: FileHeader, R: ReadRef<'data>>(
    sections: &object::read::elf::SectionTable<'data, Elf, R>,
    endian: Elf::Endian,
    data: R,
) -> DebugHints {
    let mut hints = DebugHints::default();
    for section in sections.iter() {
        let Ok(name) = sections.section_name(endian, section) else {
            continue;
        };
        let range = SectionRange {
            vaddr: section.sh_addr(endian).into(),
            file_offset: section.sh_offset(endian).into(),
            size: section.sh_size(endian).into(),
        };
        let present = range.size > 0 && section.sh_type(endian) != elf::SHT_NOBITS;
        match name {
            b".debug_info" | b".zdebug_info" => hints.has_dwarf |= present,
            b".symtab" => hints.has_symtab = true,
            b".gopclntab" | b".data.rel.ro.gopclntab" if present => hints.gopclntab = Some(range),
            b".text" if present => hints.text = Some(range),
            b".noptrdata" if present => hints.noptrdata = Some(range),
            b".gnu_debuglink" => {
                hints.debuglink = section
                    .data(endian, data)
                    .ok()
                    .and_then(|d| parse_debuglink(d, endian.is_big_endian()));
            }
            _ => {}
        }
    }
    hints
}

/// A `.gnu_debuglink` body: a NUL-terminated file name, padding to 4 bytes, CRC32.
pub fn parse_debuglink(data: &[u8], big_endian: bool) -> Option<DebugLink> {
    let nul = data.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(data.get(..nul)?).ok()?;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return None;
    }
    let crc_at = (nul + 1).next_multiple_of(4);
    let crc: [u8; 4] = data.get(crc_at..crc_at + 4)?.try_into().ok()?;
    let crc = if big_endian {
        u32::from_be_bytes(crc)
    } else {
        u32::from_le_bytes(crc)
    };
    Some(DebugLink {
        name: name.to_owned(),
        crc,
    })
}

/// Appends the function symbols of one symbol table section to `raw`, up to
/// [`MAX_FUNCTION_SYMBOLS`] in all.
fn read_table<'data, Elf: FileHeader, R: ReadRef<'data>>(
    section: &Elf::SectionHeader,
    endian: Elf::Endian,
    data: R,
    sections: &object::read::elf::SectionTable<'data, Elf, R>,
    raw: &mut Vec<RawSymbol<'data>>,
) -> Result<(), ParseError> {
    let symbols: &[Elf::Sym] = section.data_as_array(endian, data)?;
    let strtab = sections.section(section.link(endian))?.data(endian, data)?;
    let strings = StringTable::new(strtab, 0, strtab.len() as u64);
    for symbol in symbols {
        if raw.len() >= MAX_FUNCTION_SYMBOLS {
            break;
        }
        if let Some(raw_symbol) = function_symbol(symbol, endian, strings, sections) {
            raw.push(raw_symbol);
        }
    }
    Ok(())
}

fn function_symbol<'data, Elf: FileHeader, R: ReadRef<'data>>(
    symbol: &Elf::Sym,
    endian: Elf::Endian,
    strings: StringTable<'data, &'data [u8]>,
    sections: &object::read::elf::SectionTable<'data, Elf, R>,
) -> Option<RawSymbol<'data>> {
    if !matches!(symbol.st_type(), elf::STT_FUNC | elf::STT_GNU_IFUNC) {
        return None;
    }
    let shndx = symbol.st_shndx(endian);
    if shndx == elf::SHN_UNDEF || (shndx >= elf::SHN_LORESERVE && shndx != elf::SHN_XINDEX) {
        return None;
    }
    let start: u64 = symbol.st_value(endian).into();
    let size: u64 = symbol.st_size(endian).into();
    let name = symbol.name(endian, strings).ok()?;
    if start == 0 || name.is_empty() {
        return None;
    }
    let mut limit = start.saturating_add(MAX_UNSIZED_SYMBOL_EXTENT);
    if shndx != elf::SHN_XINDEX
        && let Ok(section) = sections.section(SectionIndex(usize::from(shndx)))
    {
        let section_end = Into::<u64>::into(section.sh_addr(endian))
            .saturating_add(section.sh_size(endian).into());
        if section_end > start {
            limit = limit.min(section_end);
        }
    }
    Some(RawSymbol {
        start,
        end: (size > 0).then(|| start.saturating_add(size)),
        limit,
        local: symbol.st_bind() == elf::STB_LOCAL,
        name,
    })
}

/// Sorts by address and keeps one name per address: the one with the fewest
/// leading underscores (`malloc` over `__libc_malloc`), global before local,
/// then the shortest, then the first alphabetically.
fn merge(mut raw: Vec<RawSymbol<'_>>) -> Result<(Vec<Entry>, Names), ParseError> {
    fn underscores(name: &[u8]) -> usize {
        name.iter().take_while(|&&b| b == b'_').count()
    }
    raw.sort_unstable_by(|a, b| {
        a.start
            .cmp(&b.start)
            .then_with(|| underscores(a.name).cmp(&underscores(b.name)))
            .then_with(|| a.local.cmp(&b.local))
            .then_with(|| a.name.len().cmp(&b.name.len()))
            .then_with(|| a.name.cmp(b.name))
    });
    // The names kept: the first of each address's group.
    let total_names: usize = raw
        .iter()
        .enumerate()
        .filter(|(i, r)| *i == 0 || raw[i - 1].start != r.start)
        .map(|(_, r)| r.name.len())
        .sum();
    let mut entries: Vec<Entry> = Vec::new();
    let mut limits: Vec<u64> = Vec::new();
    let mut names = NamesBuilder::new(total_names);
    let mut index = 0;
    while let Some(first) = raw.get(index) {
        let group_len = raw[index..]
            .iter()
            .take_while(|r| r.start == first.start)
            .count();
        let group = &raw[index..index + group_len];
        index += group_len;
        // The widest explicit size among aliases; 0 marks an unsized symbol.
        let end = group.iter().filter_map(|r| r.end).max().unwrap_or(0);
        let limit = group.iter().map(|r| r.limit).min().unwrap_or(first.limit);
        let name = String::from_utf8_lossy(first.name);
        let name_len = u32::try_from(name.len())
            .map_err(|_| ParseError::Malformed("symbol name exceeds 4 GiB".to_owned()))?;
        let name_start = names
            .push(&name)
            .ok_or_else(|| ParseError::Malformed("symbol names exceed 4 GiB".to_owned()))?;
        entries.push(Entry {
            start: first.start,
            end,
            name_start,
            name_len,
        });
        limits.push(limit);
    }
    // Unsized symbols extend to the next symbol, within their limit.
    for i in 0..entries.len() {
        if entries[i].end == 0 {
            let next = entries.get(i + 1).map_or(u64::MAX, |e| e.start);
            entries[i].end = next.min(limits[i]);
        }
    }
    entries.shrink_to_fit();
    Ok((entries, names.finish()))
}

/// The GNU build ID from a note section, or from a `PT_NOTE` segment when the
/// section headers are stripped.
fn build_id<'data, Elf: FileHeader, R: ReadRef<'data>>(
    sections: &object::read::elf::SectionTable<'data, Elf, R>,
    program_headers: &'data [Elf::ProgramHeader],
    endian: Elf::Endian,
    data: R,
) -> Result<Option<Arc<str>>, ParseError> {
    for section in sections.iter() {
        if let Some(mut notes) = section.notes(endian, data)? {
            while let Some(note) = notes.next()? {
                if let Some(id) = gnu_build_id::<Elf>(&note, endian) {
                    return Ok(Some(id));
                }
            }
        }
    }
    for segment in program_headers {
        if let Some(mut notes) = segment.notes(endian, data)? {
            while let Some(note) = notes.next()? {
                if let Some(id) = gnu_build_id::<Elf>(&note, endian) {
                    return Ok(Some(id));
                }
            }
        }
    }
    Ok(None)
}

fn gnu_build_id<Elf: FileHeader>(
    note: &object::read::elf::Note<'_, Elf>,
    endian: Elf::Endian,
) -> Option<Arc<str>> {
    (note.name() == elf::ELF_NOTE_GNU
        && note.n_type(endian) == elf::NT_GNU_BUILD_ID
        && !note.desc().is_empty())
    .then(|| Arc::from(hex(note.desc())))
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

mod names;
#[cfg(test)]
mod tests;
