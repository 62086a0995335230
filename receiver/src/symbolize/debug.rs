//! Debug information of one mapped file: DWARF (in the file or a separate debug
//! file) or, for Go binaries without it, the Go pclntab. Loaded on demand by
//! the [`Symbolizer`](super::Symbolizer), which bounds how much is kept.

use std::path::{Path, PathBuf};

use super::debug_file::{self, Wanted};
use super::dwarf::{DwarfError, DwarfInfo};
use super::elf::ElfSymbols;
use super::gopclntab::{GoError, GoTable};
use super::sections::{SectionError, SectionFile};
use crate::process_maps::MappedFile;

/// One function of an inline chain, before interning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    /// Mangled (linkage) name when known.
    pub name: Option<String>,
    /// Source file.
    pub file: Option<String>,
    /// 1-based line; 0 when unknown.
    pub line: u32,
}

/// Loaded debug information.
#[derive(Debug)]
pub enum DebugInfo {
    /// DWARF, from the file or its separate debug file.
    Dwarf(DwarfInfo),
    /// A Go pclntab.
    Go(GoTable),
}

impl DebugInfo {
    /// Conservative estimate of the bytes held.
    pub fn cost(&self) -> u64 {
        match self {
            DebugInfo::Dwarf(dwarf) => dwarf.cost(),
            DebugInfo::Go(table) => table.heap_size() as u64,
        }
    }

    /// The inline chain at link-time address `vaddr`, innermost first, and the
    /// name of the function from the debug file's own symbols for when the
    /// chain's outermost function has none. Errors only for malformed DWARF.
    pub fn frames(&self, vaddr: u64) -> Result<(Vec<RawFrame>, Option<String>), String> {
        match self {
            DebugInfo::Dwarf(dwarf) => {
                let frames = dwarf.frames(vaddr).map_err(|e| e.to_string())?;
                let fallback = dwarf
                    .symbols()
                    .and_then(|s| s.lookup_vaddr(vaddr))
                    .map(|s| s.name.into_owned());
                let frames = frames
                    .into_iter()
                    .map(|f| RawFrame {
                        name: f.name,
                        file: f.file,
                        line: f.line,
                    })
                    .collect();
                Ok((frames, fallback))
            }
            DebugInfo::Go(table) => {
                let frames = table
                    .frames(vaddr)
                    .into_iter()
                    .map(|f| RawFrame {
                        name: (!f.name.is_empty()).then_some(f.name),
                        file: f.file,
                        line: f.line,
                    })
                    .collect();
                Ok((frames, None))
            }
        }
    }
}

/// What loading found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The debug information, when there is usable one.
    pub info: Option<DebugInfo>,
    /// Whether it came from a separate debug file.
    pub separate: bool,
    /// Debug information that exists but could not be used (malformed, over budget).
    pub failures: u64,
    /// Candidate debug files refused (CRC or build ID mismatch, unreadable).
    pub rejected: u64,
    /// The file could not be reached at all; loading may work later.
    pub unreachable: bool,
    /// The separate debug file's symbol table, when its DWARF is not used.
    pub symbols: Option<ElfSymbols>,
}

/// The paths the mapped file can be opened by, as in symbol loading.
pub fn binary_candidates(pid: u32, mapping: &MappedFile) -> Vec<PathBuf> {
    let mut candidates = vec![PathBuf::from(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    ))];
    if !mapping.deleted {
        candidates.push(PathBuf::from(format!("/proc/{pid}/root{}", mapping.path)));
        candidates.push(PathBuf::from(&*mapping.path));
    }
    candidates
}

/// Loads the debug information of the mapped file whose `symbols` are known,
/// within `budget` bytes.
pub fn load(
    pid: u32,
    mapping: &MappedFile,
    symbols: &ElfSymbols,
    max_file_size: u64,
    budget: u64,
) -> Outcome {
    let mut outcome = Outcome::default();
    let hints = symbols.debug_hints();
    let binary = binary_candidates(pid, mapping)
        .into_iter()
        .find(|p| std::fs::File::open(p).is_ok());
    if hints.has_dwarf {
        match &binary {
            Some(path) => match DwarfInfo::load(path, None, false, max_file_size, budget) {
                Ok(dwarf) => {
                    outcome.info = Some(DebugInfo::Dwarf(dwarf));
                    return outcome;
                }
                Err(error) => note_failure(&mut outcome, &mapping.path, &error.into()),
            },
            None => outcome.unreachable = true,
        }
    } else {
        let roots = debug_file::roots(pid);
        let search = debug_file::find(
            &roots,
            &Wanted {
                binary_path: &mapping.path,
                build_id: symbols.build_id().map(|id| &**id),
                debuglink: hints.debuglink.as_ref(),
                max_file_size,
            },
        );
        outcome.rejected = search.rejected.len() as u64;
        for (path, why) in &search.rejected {
            tracing::debug!(path = %path.display(), ?why, "debug file refused");
        }
        if let Some(path) = search.found {
            let sup = debug_file::find_sup(&roots, &path, max_file_size);
            match DwarfInfo::load(&path, sup.as_deref(), true, max_file_size, budget) {
                Ok(dwarf) => {
                    outcome.info = Some(DebugInfo::Dwarf(dwarf));
                    outcome.separate = true;
                    return outcome;
                }
                Err(DwarfError::Absent { .. }) => {}
                Err(error) => note_failure(&mut outcome, &path.to_string_lossy(), &error.into()),
            }
            // No DWARF from it (over the budget, or none): its symbol table
            // still names what the stripped file's does not. Read from the
            // section headers and the table alone, not the DWARF.
            match ElfSymbols::load_with_limit(&path, max_file_size) {
                Ok(symbols) if !symbols.is_empty() => outcome.symbols = Some(symbols),
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(path = %path.display(), %error, "debug file's symbols unusable");
                }
            }
        }
    }
    if hints.gopclntab.is_some() {
        let Some(path) = &binary else {
            outcome.unreachable = true;
            return outcome;
        };
        match load_go(path, symbols, max_file_size, budget) {
            Ok(table) => outcome.info = Some(DebugInfo::Go(table)),
            Err(error) => note_failure(&mut outcome, &mapping.path, &error.into()),
        }
    }
    outcome
}

fn load_go(
    path: &Path,
    symbols: &ElfSymbols,
    max_file_size: u64,
    budget: u64,
) -> Result<GoTable, GoError> {
    let mut file = SectionFile::open(path, max_file_size, budget)?;
    GoTable::load(&mut file, symbols)
}

/// A failure of either kind, for logging and counting.
enum LoadError {
    /// DWARF could not be used.
    Dwarf(DwarfError),
    /// The pclntab could not be used.
    Go(GoError),
}

impl From<DwarfError> for LoadError {
    fn from(e: DwarfError) -> Self {
        LoadError::Dwarf(e)
    }
}

impl From<GoError> for LoadError {
    fn from(e: GoError) -> Self {
        LoadError::Go(e)
    }
}

fn note_failure(outcome: &mut Outcome, path: &str, error: &LoadError) {
    let (message, io) = match error {
        LoadError::Dwarf(e) => (
            e.to_string(),
            matches!(e, DwarfError::Section(SectionError::Io { .. })),
        ),
        LoadError::Go(e) => (
            e.to_string(),
            matches!(e, GoError::Section(SectionError::Io { .. })),
        ),
    };
    if io {
        outcome.unreachable = true;
    } else {
        outcome.failures += 1;
    }
    tracing::debug!(path, error = %message, "debug information unusable");
}
