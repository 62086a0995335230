//! DWARF line tables and inlined functions of one file, through `addr2line`.
//!
//! [`DwarfInfo::load`] reads the DWARF sections that symbolization needs (not
//! location lists, macros or call frame information) into memory, decompressed
//! and within a byte budget, and builds an `addr2line` context over them; units,
//! line programs and function trees are then parsed lazily, one compilation unit
//! at a time, by the look-ups that need them. [`DwarfInfo::frames`] gives the
//! inline chain of an address, innermost function first.

use std::path::Path;
use std::sync::Arc;

use gimli::SectionId;
use object::{Object, ObjectSection};

use super::elf::ElfSymbols;
use super::sections::{SectionError, SectionFile};

/// The reader `addr2line` works on: shared, owned section bytes.
type Reader = gimli::EndianReader<gimli::RunTimeEndian, SectionBytes>;

/// A section's bytes, shared by the readers that point into it. Keeping the
/// `Vec` the section was read into (rather than `Arc<[u8]>`, which copies it)
/// means a section is in memory once, even while it loads.
#[derive(Debug, Clone)]
struct SectionBytes(Arc<Vec<u8>>);

impl std::ops::Deref for SectionBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

// SAFETY: the bytes live in the Vec's heap buffer, which the Arc shares
// immutably: it never moves or changes while any clone exists (as for
// `Arc<[u8]>`, which gimli implements these for).
unsafe impl gimli::StableDeref for SectionBytes {}
// SAFETY: clones share the same buffer, see above.
unsafe impl gimli::CloneStableDeref for SectionBytes {}

/// Inline frames reported for one address at most.
pub const MAX_INLINE_DEPTH: usize = 64;

/// Why a file's DWARF could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DwarfError {
    /// A section could not be read, decompressed, or exceeded the budget.
    #[error(transparent)]
    Section(#[from] SectionError),
    /// The DWARF data is malformed.
    #[error("{path}: malformed DWARF: {source}")]
    Malformed {
        /// The file holding the DWARF.
        path: String,
        /// What `gimli` rejected.
        #[source]
        source: gimli::Error,
    },
    /// The file has no `.debug_info`.
    #[error("{path} has no DWARF")]
    Absent {
        /// The file.
        path: String,
    },
}

/// One function of an inline chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DwarfFrame {
    /// The linkage (mangled) name when DWARF has one, else the plain name.
    pub name: Option<String>,
    /// Source file, directory included.
    pub file: Option<String>,
    /// 1-based line; 0 when unknown.
    pub line: u32,
}

/// The DWARF of one file, ready for look-ups.
pub struct DwarfInfo {
    context: addr2line::Context<Reader>,
    /// Function symbols of a separate debug file, for code DWARF has no
    /// function for (assembly); `None` when the DWARF is in the binary itself.
    symbols: Option<ElfSymbols>,
    /// Conservative estimate of the memory it holds once fully parsed.
    cost: u64,
    path: Arc<str>,
}

impl std::fmt::Debug for DwarfInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DwarfInfo")
            .field("path", &self.path)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

/// Sections read: everything `addr2line` looks at. Others load as empty.
const WANTED: [SectionId; 11] = [
    SectionId::DebugAbbrev,
    SectionId::DebugAddr,
    SectionId::DebugAranges,
    SectionId::DebugInfo,
    SectionId::DebugLine,
    SectionId::DebugLineStr,
    SectionId::DebugStr,
    SectionId::DebugStrOffsets,
    SectionId::DebugTypes,
    SectionId::DebugRanges,
    SectionId::DebugRngLists,
];

impl DwarfInfo {
    /// Loads the DWARF of `path`, taking at most `budget` bytes by the estimate
    /// of [`DwarfInfo::cost`]. `sup` is the dwz supplementary file, if any.
    /// With `separate`, the file's own function symbols are kept too.
    pub fn load(
        path: &Path,
        sup: Option<&Path>,
        separate: bool,
        max_file_size: u64,
        budget: u64,
    ) -> Result<Self, DwarfError> {
        let mut file = SectionFile::open(path, max_file_size, budget)?;
        let (mut dwarf, mut sizes) = load_dwarf(&mut file, budget)?;
        if sizes.info == 0 {
            return Err(DwarfError::Absent {
                path: file.path().to_owned(),
            });
        }
        if let Some(sup) = sup {
            let remaining = budget.saturating_sub(estimated_cost(sizes));
            let mut sup_file = SectionFile::open(sup, max_file_size, remaining)?;
            let (sup_dwarf, sup_sizes) = load_dwarf(&mut sup_file, remaining)?;
            sizes.sections = sizes.sections.saturating_add(sup_sizes.sections);
            dwarf.set_sup(sup_dwarf);
        }
        let cost = estimated_cost(sizes);
        let symbols = separate.then(|| ElfSymbols::load_with_limit(path, max_file_size).ok());
        let symbols = symbols.flatten();
        let cost = cost.saturating_add(symbols.as_ref().map_or(0, |s| s.heap_size() as u64));
        if cost > budget {
            return Err(SectionError::TooLarge {
                path: file.path().to_owned(),
                limit: budget,
            }
            .into());
        }
        let malformed = |source| DwarfError::Malformed {
            path: file.path().to_owned(),
            source,
        };
        let context = addr2line::Context::from_dwarf(dwarf).map_err(malformed)?;
        Ok(DwarfInfo {
            context,
            symbols,
            cost,
            path: Arc::from(file.path()),
        })
    }

    /// Conservative estimate of the bytes held: sections, parsed tables, symbols.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The file the DWARF was read from.
    pub fn path(&self) -> &Arc<str> {
        &self.path
    }

    /// Function symbols of the separate debug file, when the DWARF came from one.
    pub fn symbols(&self) -> Option<&ElfSymbols> {
        self.symbols.as_ref()
    }

    /// The inline chain at the link-time address `vaddr`, innermost first; empty
    /// when no compilation unit covers it.
    pub fn frames(&self, vaddr: u64) -> Result<Vec<DwarfFrame>, gimli::Error> {
        let mut out = Vec::new();
        // addr2line looks up `vaddr + 1`, which overflows here (a panic in
        // builds with overflow checks; found by fuzz/ `elf_symbols`). No
        // instruction starts at the last byte of the address space.
        if vaddr == u64::MAX {
            return Ok(out);
        }
        let mut frames = self.context.find_frames(vaddr).skip_all_loads()?;
        while let Some(frame) = frames.next()? {
            if out.len() >= MAX_INLINE_DEPTH {
                break;
            }
            let name = match &frame.function {
                Some(function) => Some(function.raw_name()?.into_owned()),
                None => None,
            };
            let (file, line) = match &frame.location {
                Some(location) => (location.file.map(str::to_owned), location.line.unwrap_or(0)),
                None => (None, 0),
            };
            out.push(DwarfFrame { name, file, line });
        }
        Ok(out)
    }
}

/// Section sizes that decide what DWARF costs in memory.
#[derive(Debug, Clone, Copy, Default)]
struct DwarfSizes {
    /// All sections read.
    sections: u64,
    line: u64,
    info: u64,
    abbrev: u64,
}

/// What DWARF costs in memory once loaded and every unit parsed: its
/// sections, plus line rows (up to 12 times their encoding, for Rust's
/// dense line programs), function trees (about twice the DIEs), and every
/// unit's abbreviations, which `addr2line` parses up front (about 10 times
/// their encoding: C libraries of many small units are mostly that), plus
/// 64 KiB for the context itself, which is most of a small program's.
///
/// `tests/dwarf_memory.rs` holds it to what the allocator counts. There,
/// 2026-11-28, the estimate against the heap at its peak: libc6-dbg's libc
/// 45.9 MB against 38.5, libm 11.2 against 9.4, ld.so 4.8 against 3.6, a
/// Rust test binary 198 against 131 (the agent's own binary: 309 against
/// 301). Before the abbreviations' term (sections, 8 times the lines,
/// twice the DIEs), it was 25-35 % under for libc and libm.
fn estimated_cost(sizes: DwarfSizes) -> u64 {
    const CONTEXT: u64 = 64 << 10;
    sizes
        .sections
        .saturating_add(CONTEXT)
        .saturating_add(sizes.line.saturating_mul(12))
        .saturating_add(sizes.info.saturating_mul(2))
        .saturating_add(sizes.abbrev.saturating_mul(10))
}

/// Reads the wanted sections; returns the DWARF and its sizes. DWARF whose
/// estimated cost exceeds `budget` is refused from the section headers,
/// before anything is read.
fn load_dwarf(
    file: &mut SectionFile,
    budget: u64,
) -> Result<(gimli::Dwarf<Reader>, DwarfSizes), DwarfError> {
    let (endian, ranges) = {
        let object = file.object()?;
        let endian = if object.is_little_endian() {
            gimli::RunTimeEndian::Little
        } else {
            gimli::RunTimeEndian::Big
        };
        let mut ranges = Vec::new();
        for id in WANTED {
            if let Some(section) = object.section_by_name(id.name()) {
                let range = section
                    .compressed_file_range()
                    .map_err(|e| file.malformed(e.to_string()))?;
                ranges.push((id, range));
            }
        }
        (endian, ranges)
    };
    let size_of = |wanted: SectionId| {
        ranges
            .iter()
            .filter(|(id, _)| *id == wanted)
            .map(|(_, r)| r.uncompressed_size)
            .sum::<u64>()
    };
    let total = ranges
        .iter()
        .fold(0u64, |sum, (_, r)| sum.saturating_add(r.uncompressed_size));
    let sizes = DwarfSizes {
        sections: total,
        line: size_of(SectionId::DebugLine),
        info: size_of(SectionId::DebugInfo),
        abbrev: size_of(SectionId::DebugAbbrev),
    };
    if estimated_cost(sizes) > budget {
        return Err(SectionError::TooLarge {
            path: file.path().to_owned(),
            limit: budget,
        }
        .into());
    }
    let mut loaded: Vec<(SectionId, SectionBytes)> = Vec::with_capacity(ranges.len());
    for (id, range) in ranges {
        let data = file.read(range)?;
        loaded.push((id, SectionBytes(Arc::new(data))));
    }
    let empty = SectionBytes(Arc::new(Vec::new()));
    let dwarf = gimli::Dwarf::load(|id| -> Result<Reader, gimli::Error> {
        let data = loaded
            .iter()
            .find(|(loaded_id, _)| *loaded_id == id)
            .map_or_else(|| empty.clone(), |(_, data)| data.clone());
        Ok(gimli::EndianReader::new(data, endian))
    })
    .map_err(|source| DwarfError::Malformed {
        path: file.path().to_owned(),
        source,
    })?;
    Ok((dwarf, sizes))
}
