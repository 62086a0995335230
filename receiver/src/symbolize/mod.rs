//! Symbolization of native (user-space ELF) and kernel frames into the profile model.
//!
//! [`Symbolizer`] turns an address inside a [`MappedFile`] into an
//! `Arc<Frame>`: it parses each ELF file once ([`elf::ElfSymbols`], kept in a
//! bounded LRU that remembers failures too), caches symbolized frames by
//! (device, inode, file offset) so the same code in any process costs one hash
//! look-up, and shares `Arc<Mapping>`s and function names between frames. Kernel
//! frames use `/proc/kallsyms` ([`kallsyms::KernelSymbols`]), loaded on the first
//! kernel frame.
//!
//! When a file has debug information, frames get source files, lines and their
//! inlined functions like `perf report` shows them: DWARF from the file itself or
//! from a separate debug file ([`debug_file`]: build ID, `.gnu_debuglink`), or
//! the pclntab of Go binaries ([`gopclntab`]). It is loaded on the first frame
//! miss in the file, kept with the file, and bounded in number of files and
//! estimated bytes (least recently used dropped first); anything malformed is
//! counted and the symbol tables serve instead. `[vdso]` frames are symbolized
//! with icecore's own vDSO ([`vdso`]).

pub mod debug;
pub mod debug_file;
pub mod demangle;
pub mod dwarf;
pub mod elf;
mod file_cache;
pub mod gopclntab;
pub mod kallsyms;
pub mod sections;
#[cfg(test)]
mod testutil;
pub mod vdso;

use std::borrow::Cow;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use icecore_otlp::model::{Frame, FrameKind, Line, Mapping};
use lru::LruCache;

use crate::process_maps::MappedFile;
use debug::DebugInfo;
use elf::{ElfSymbols, SymbolRef};
use kallsyms::KernelSymbols;

/// Name of the pseudo mapping kernel frames belong to.
pub const KERNEL_MAPPING_NAME: &str = "[kernel.kallsyms]";

/// Bounds of the symbolizer's caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymbolizerLimits {
    /// Parsed ELF files kept, failed loads included.
    pub max_files: usize,
    /// Symbolized frames kept.
    pub max_frames: usize,
    /// Distinct mappings kept for sharing `Arc<Mapping>`s.
    pub max_mappings: usize,
    /// Demangled function names kept for sharing between frames of one function.
    pub max_functions: usize,
    /// Largest ELF file that is parsed, in bytes.
    pub max_file_size: u64,
    /// How long a file that could not be reached (process gone, no privilege) is
    /// not tried again. Files that are not valid ELF are never retried while cached.
    pub retry_unreachable_after: Duration,
    /// Files whose debug information (DWARF or Go pclntab) is kept loaded at once.
    pub max_debug_files: usize,
    /// Estimated bytes of debug information kept loaded, all files together
    /// (section data plus what parsing it fully would build); a file needing
    /// more is symbolized from its symbol tables only.
    pub max_debug_bytes: u64,
    /// Debug information used within this long is never evicted for another
    /// file's: the newcomer waits (symbolized from its symbol tables) and is
    /// tried again after as long. Evicting what current batches use would
    /// reload it, and decompress it, at the next of its frames: two files
    /// that do not fit together would thrash.
    pub debug_in_use: Duration,
    /// Source file names kept for sharing between frames.
    pub max_source_files: usize,
}

impl Default for SymbolizerLimits {
    fn default() -> Self {
        SymbolizerLimits {
            max_files: 256,
            max_frames: 65536,
            max_mappings: 8192,
            max_functions: 65536,
            max_file_size: elf::DEFAULT_MAX_FILE_SIZE,
            retry_unreachable_after: Duration::from_secs(30),
            max_debug_files: 32,
            max_debug_bytes: 16 << 20,
            debug_in_use: Duration::from_secs(60),
            max_source_files: 16384,
        }
    }
}

/// Counters of the symbolizer's work since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SymbolizerStats {
    /// Frames served from the frame cache.
    pub frame_cache_hits: u64,
    /// Frames that had to be symbolized.
    pub frame_cache_misses: u64,
    /// Symbol look-ups that found the file already parsed (or known broken).
    pub file_cache_hits: u64,
    /// Symbol look-ups that had to open the file.
    pub file_cache_misses: u64,
    /// ELF files parsed successfully.
    pub files_loaded: u64,
    /// ELF files that could not be opened or parsed.
    pub load_failures: u64,
    /// Files currently in the file cache.
    pub cached_files: usize,
    /// Frames currently in the frame cache.
    pub cached_frames: usize,
    /// Kernel symbols loaded (0 before the first kernel frame or when unavailable).
    pub kernel_symbols: usize,
    /// DWARF loads that succeeded (a file evicted and loaded again counts twice).
    pub dwarf_loaded: u64,
    /// Of those, loads from a separate debug file (build ID or `.gnu_debuglink`).
    pub separate_debug_files: u64,
    /// Go pclntab loads that succeeded.
    pub go_tables_loaded: u64,
    /// Candidate debug files refused: CRC or build ID mismatch, or unreadable.
    pub debug_files_rejected: u64,
    /// Debug information present but unusable: malformed DWARF or pclntab, or
    /// over the byte budget. The symbol tables serve instead.
    pub debug_load_failures: u64,
    /// Separate debug files whose symbol table names functions in place of
    /// their unused DWARF.
    pub debug_symbol_tables: u64,
    /// Look-ups in loaded DWARF that failed on malformed data.
    pub debug_lookup_failures: u64,
    /// Debug information dropped to stay within the file or byte bounds.
    pub debug_evictions: u64,
    /// Files with debug information loaded now.
    pub debug_files: usize,
    /// Estimated bytes of the debug information loaded now.
    pub debug_bytes: u64,
}

/// What is known of one ELF file.
enum CachedFile {
    Loaded(Box<LoadedFile>),
    /// Not ELF, malformed or too large: stays so while cached.
    Broken,
    /// Could not be opened through any path; retried after the instant.
    Unreachable(Instant),
}

/// A parsed file and its debug information.
struct LoadedFile {
    symbols: Arc<ElfSymbols>,
    /// The symbol table of the file's separate debug file, when its DWARF
    /// is not in use (over budget, DWARF off): it names the local functions
    /// a stripped file's `.dynsym` lacks (`__libc_start_call_main`).
    debug_symbols: Option<Arc<ElfSymbols>>,
    debug: DebugState,
}

/// Whether a file's debug information is loaded.
enum DebugState {
    /// Not tried yet, or dropped to stay within bounds.
    NotLoaded,
    Loaded(Box<DebugInfo>),
    /// None, or unusable: the symbol tables serve.
    Absent,
    /// The file was out of reach; tried again after the instant.
    Retry(Instant),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FileKey {
    dev: (u32, u32),
    inode: u64,
    path: Arc<str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum FrameKey {
    Native {
        dev: (u32, u32),
        inode: u64,
        file_offset: u64,
    },
    Kernel(u64),
    /// An offset in this host's 64-bit vDSO.
    Vdso(u64),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct MappingKey {
    start: u64,
    end: u64,
    file_offset: u64,
    dev: (u32, u32),
    inode: u64,
    path: Arc<str>,
}

/// A function of a file (or of the kernel, with `inode` 0) by start address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FunctionKey {
    dev: (u32, u32),
    inode: u64,
    address: u64,
}

/// Kernel symbols, loaded on the first kernel frame.
enum KernelState {
    NotLoaded,
    Loaded(KernelSymbols, Arc<Mapping>),
    Unavailable(Arc<Mapping>),
}

/// Turns addresses into shared, symbolized frames. Not thread-safe by itself: one
/// per symbolizing task.
pub struct Symbolizer {
    limits: SymbolizerLimits,
    files: LruCache<FileKey, CachedFile>,
    frames: LruCache<FrameKey, Arc<Frame>>,
    mappings: LruCache<MappingKey, Arc<Mapping>>,
    functions: LruCache<FunctionKey, Line>,
    /// Lines of functions named by debug information, by mangled name.
    names: LruCache<Box<str>, Line>,
    /// Source file names, shared between frames.
    source_files: LruCache<Box<str>, Arc<str>>,
    /// Files with debug information loaded, least recently used first.
    debug_files: LruCache<FileKey, DebugEntry>,
    debug_bytes: u64,
    kernel: KernelState,
    stats: SymbolizerStats,
}

/// A file's loaded debug information, as the budget sees it.
#[derive(Debug, Clone, Copy)]
struct DebugEntry {
    /// Estimated bytes held.
    cost: u64,
    /// When a look-up last used it.
    last_used: std::time::Instant,
}

fn bound(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN)
}

impl Symbolizer {
    /// A symbolizer with empty caches bounded by `limits` (zero bounds count as 1).
    pub fn new(limits: SymbolizerLimits) -> Self {
        Symbolizer {
            limits,
            files: LruCache::new(bound(limits.max_files)),
            frames: LruCache::new(bound(limits.max_frames)),
            mappings: LruCache::new(bound(limits.max_mappings)),
            functions: LruCache::new(bound(limits.max_functions)),
            names: LruCache::new(bound(limits.max_functions)),
            source_files: LruCache::new(bound(limits.max_source_files)),
            debug_files: LruCache::unbounded(),
            debug_bytes: 0,
            kernel: KernelState::NotLoaded,
            stats: SymbolizerStats::default(),
        }
    }

    /// The limits the symbolizer was created with.
    pub fn limits(&self) -> SymbolizerLimits {
        self.limits
    }

    /// The frame for `address` in `mapping` of process `pid`.
    ///
    /// With `is_return_address` the address is first moved back by one byte so the
    /// call instruction, not the one after it, is symbolized; the frame reports
    /// that adjusted address. Unknown code gives a frame with its mapping and no
    /// lines. The file is read as `/proc/<pid>/map_files/...` or
    /// `/proc/<pid>/root/<path>` so files in containers and deleted files resolve.
    pub fn native_frame(
        &mut self,
        pid: u32,
        mapping: &MappedFile,
        address: u64,
        is_return_address: bool,
    ) -> Arc<Frame> {
        let address = if is_return_address {
            address.saturating_sub(1)
        } else {
            address
        };
        let Some(file_offset) = mapping.file_offset_of(address) else {
            return Self::unknown_frame(FrameKind::Native, address);
        };
        let key = if mapping.is_vdso() {
            // Only a vDSO like ours (not a 32-bit process's) is symbolized.
            match vdso::own() {
                Some(own) if own.fits(mapping.end - mapping.start) => FrameKey::Vdso(file_offset),
                _ => {
                    let mapping = self.mapping_arc(mapping, None);
                    return Arc::new(Frame {
                        kind: FrameKind::Native,
                        address,
                        mapping: Some(mapping),
                        lines: Vec::new(),
                    });
                }
            }
        } else {
            FrameKey::Native {
                dev: mapping.dev,
                inode: mapping.inode,
                file_offset,
            }
        };
        if let Some(cached) = self.frames.get(&key) {
            self.stats.frame_cache_hits += 1;
            if cached.address == address && same_mapping(cached.mapping.as_deref(), mapping) {
                return Arc::clone(cached);
            }
            // Same code, other process or load address: reuse the symbolization.
            let build_id = cached.mapping.as_ref().and_then(|m| m.build_id.clone());
            let lines = cached.lines.clone();
            let mapping = self.mapping_arc(mapping, build_id);
            let frame = Arc::new(Frame {
                kind: FrameKind::Native,
                address,
                mapping: Some(mapping),
                lines,
            });
            self.frames.put(key, Arc::clone(&frame));
            return frame;
        }
        self.stats.frame_cache_misses += 1;
        let (lines, build_id, transient) = if let FrameKey::Vdso(offset) = key {
            (self.vdso_lines(offset), None, false)
        } else {
            self.file_lines(pid, mapping, file_offset)
        };
        let mapping = self.mapping_arc(mapping, build_id);
        let frame = Arc::new(Frame {
            kind: FrameKind::Native,
            address,
            mapping: Some(mapping),
            lines,
        });
        // A frame left unsymbolized because the file was out of reach is not kept:
        // another process may show the file later.
        if !transient {
            self.frames.put(key, Arc::clone(&frame));
        }
        frame
    }

    /// The frame for a kernel `address` (already adjusted if it is a return
    /// address). Kernel symbols are loaded on first use; if they are unavailable a
    /// warning is logged once and kernel frames carry no lines.
    pub fn kernel_frame(&mut self, address: u64) -> Arc<Frame> {
        if matches!(self.kernel, KernelState::NotLoaded) {
            self.kernel = load_kernel();
        }
        let key = FrameKey::Kernel(address);
        if let Some(cached) = self.frames.get(&key) {
            self.stats.frame_cache_hits += 1;
            return Arc::clone(cached);
        }
        self.stats.frame_cache_misses += 1;
        let (found, mapping) = match &self.kernel {
            KernelState::Loaded(symbols, mapping) => (
                symbols
                    .lookup_with_offset(address)
                    .map(|(name, offset)| (Arc::<str>::from(name), address - offset)),
                Arc::clone(mapping),
            ),
            KernelState::Unavailable(mapping) => (None, Arc::clone(mapping)),
            KernelState::NotLoaded => (None, kernel_mapping(0)),
        };
        let lines = match found {
            Some((name, start)) => {
                let key = FunctionKey {
                    dev: (0, 0),
                    inode: 0,
                    address: start,
                };
                vec![self.cached_line(key, &name)]
            }
            None => Vec::new(),
        };
        let frame = Arc::new(Frame {
            kind: FrameKind::Kernel,
            address,
            mapping: Some(mapping),
            lines,
        });
        self.frames.put(key, Arc::clone(&frame));
        frame
    }

    /// A frame for an address outside any known mapping.
    pub fn unknown_frame(kind: FrameKind, address: u64) -> Arc<Frame> {
        Arc::new(Frame {
            kind,
            address,
            mapping: None,
            lines: Vec::new(),
        })
    }

    /// Uses `symbols` for kernel frames instead of loading `/proc/kallsyms`.
    pub fn set_kernel_symbols(&mut self, symbols: KernelSymbols) {
        let mapping = kernel_mapping(symbols.first_address().unwrap_or(0));
        self.kernel = KernelState::Loaded(symbols, mapping);
        self.clear_kernel_frames();
    }

    /// Counters and cache sizes.
    pub fn stats(&self) -> SymbolizerStats {
        SymbolizerStats {
            cached_files: self.files.len(),
            cached_frames: self.frames.len(),
            kernel_symbols: match &self.kernel {
                KernelState::Loaded(symbols, _) => symbols.len(),
                _ => 0,
            },
            debug_files: self.debug_files.len(),
            debug_bytes: self.debug_bytes,
            ..self.stats
        }
    }

    fn clear_kernel_frames(&mut self) {
        let kernel_keys: Vec<FrameKey> = self
            .frames
            .iter()
            .map(|(k, _)| *k)
            .filter(|k| matches!(k, FrameKey::Kernel(_)))
            .collect();
        for key in kernel_keys {
            self.frames.pop(&key);
        }
    }

    /// The shared `Arc<Mapping>` for a mapping.
    fn mapping_arc(&mut self, mapping: &MappedFile, build_id: Option<Arc<str>>) -> Arc<Mapping> {
        let key = MappingKey {
            start: mapping.start,
            end: mapping.end,
            file_offset: mapping.file_offset,
            dev: mapping.dev,
            inode: mapping.inode,
            path: Arc::clone(&mapping.path),
        };
        if let Some(cached) = self.mappings.get(&key) {
            return Arc::clone(cached);
        }
        let arc = Arc::new(Mapping {
            memory_start: mapping.start,
            memory_limit: mapping.end,
            file_offset: mapping.file_offset,
            filename: Arc::clone(&mapping.path),
            build_id,
        });
        self.mappings.put(key, Arc::clone(&arc));
        arc
    }

    /// The shared line of a file's function.
    fn function_line(&mut self, dev: (u32, u32), inode: u64, function: SymbolRef<'_>) -> Line {
        self.cached_line(
            FunctionKey {
                dev,
                inode,
                address: function.address,
            },
            &function.name,
        )
    }

    /// [`Self::function_line`], reading the name only when the line is not cached.
    fn function_line_with<'n>(
        &mut self,
        dev: (u32, u32),
        inode: u64,
        address: u64,
        name: impl FnOnce() -> Cow<'n, str>,
    ) -> Line {
        let key = FunctionKey {
            dev,
            inode,
            address,
        };
        if let Some(line) = self.functions.get(&key) {
            return line.clone();
        }
        let line = make_line(&name());
        self.functions.put(key, line.clone());
        line
    }

    fn cached_line(&mut self, key: FunctionKey, name: &str) -> Line {
        if let Some(line) = self.functions.get(&key) {
            return line.clone();
        }
        let line = make_line(name);
        self.functions.put(key, line.clone());
        line
    }
}

/// A line with the demangled name, sharing the string when nothing changed.
fn make_line(name: &str) -> Line {
    let system_name: Arc<str> = Arc::from(name);
    let function_name = match demangle::demangle(name) {
        Cow::Borrowed(same) if same.len() == name.len() => Arc::clone(&system_name),
        other => Arc::from(other),
    };
    Line {
        function_name,
        system_name,
        filename: None,
        line: 0,
        column: 0,
    }
}

/// Whether a cached frame's mapping describes `mapping`.
fn same_mapping(cached: Option<&Mapping>, mapping: &MappedFile) -> bool {
    cached.is_some_and(|m| {
        m.memory_start == mapping.start
            && m.memory_limit == mapping.end
            && m.file_offset == mapping.file_offset
            && (Arc::ptr_eq(&m.filename, &mapping.path) || *m.filename == *mapping.path)
    })
}

fn kernel_mapping(start: u64) -> Arc<Mapping> {
    Arc::new(Mapping {
        memory_start: start,
        memory_limit: u64::MAX,
        file_offset: 0,
        filename: Arc::from(KERNEL_MAPPING_NAME),
        build_id: kallsyms::kernel_build_id().map(Arc::from),
    })
}

fn load_kernel() -> KernelState {
    match KernelSymbols::load() {
        Ok(symbols) => {
            let mapping = kernel_mapping(symbols.first_address().unwrap_or(0));
            tracing::debug!(symbols = symbols.len(), "loaded kernel symbols");
            KernelState::Loaded(symbols, mapping)
        }
        Err(error) => {
            tracing::warn!(%error, "kernel symbols unavailable; kernel frames stay unsymbolized");
            KernelState::Unavailable(kernel_mapping(0))
        }
    }
}

#[cfg(test)]
mod debug_tests;
#[cfg(test)]
mod go_tests;
#[cfg(test)]
mod tests;
