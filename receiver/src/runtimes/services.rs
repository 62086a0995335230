//! What the framework gives every runtime plugin, so that none copies it:
//! opening a process's mapped file, a per-file probe cache (parse a file
//! once, then describe each process that maps it), a file's load segments
//! (to place its symbols in a process), and a handle on the runtime's
//! per-process BPF map.

use std::{num::NonZeroUsize, path::PathBuf, sync::Arc};

use lru::LruCache;
use tracing::{debug, warn};

use super::RuntimeStats;
use crate::{
    native_unwind::FileKey,
    process_maps::{MappedFile, ProcessMappings},
};

/// The functions a file's `.eh_frame` describes (one address range per
/// FDE), in the section's order; empty when it has none or it is malformed
/// before the first FDE. Stripped files keep their unwind information, so
/// this finds functions that no symbol names.
pub fn eh_frame_functions<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
) -> Vec<std::ops::Range<u64>> {
    use gimli::UnwindSection;
    use object::{Object, ObjectSection};
    let Some(section) = elf.section_by_name(".eh_frame") else {
        return Vec::new();
    };
    let Ok(data) = section.data() else {
        return Vec::new();
    };
    let eh_frame = gimli::EhFrame::new(data, gimli::LittleEndian);
    let bases = gimli::BaseAddresses::default().set_eh_frame(section.address());
    let mut entries = eh_frame.entries(&bases);
    let mut functions = Vec::new();
    while let Ok(Some(entry)) = entries.next() {
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(|_, bases, offset| eh_frame.cie_from_offset(bases, offset))
        else {
            break;
        };
        functions.push(fde.initial_address()..fde.end_address());
    }
    functions
}

/// `len` bytes of an ELF file at virtual address `at`, from its sections
/// (code or data the file holds, not `.bss`).
pub fn bytes_at<'a, R: object::ReadRef<'a>>(
    elf: &object::File<'a, R>,
    at: u64,
    len: u64,
) -> Option<Vec<u8>> {
    use object::{Object, ObjectSection};
    elf.sections()
        .find_map(|s| s.data_range(at, len).ok().flatten())
        .map(<[u8]>::to_vec)
}

/// One FDE's address range and its rows: each row's range and its CFA
/// offset from `rsp` (`None` for a CFA not `rsp`-based).
type FdeRows = (
    std::ops::Range<u64>,
    Vec<(std::ops::Range<u64>, Option<i64>)>,
);

/// The FDEs of a file's `.eh_frame` that `wanted` picks by address range,
/// with their rows. Malformed entries end the scan.
fn unwind_rows<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
    wanted: impl Fn(std::ops::Range<u64>) -> bool,
) -> Vec<FdeRows> {
    use gimli::UnwindSection;
    use object::{Object, ObjectSection};
    let Some(section) = elf.section_by_name(".eh_frame") else {
        return Vec::new();
    };
    let Ok(data) = section.data() else {
        return Vec::new();
    };
    let eh_frame = gimli::EhFrame::new(data, gimli::LittleEndian);
    let bases = gimli::BaseAddresses::default().set_eh_frame(section.address());
    let mut entries = eh_frame.entries(&bases);
    let mut context = Box::new(gimli::UnwindContext::new());
    let mut found = Vec::new();
    while let Ok(Some(entry)) = entries.next() {
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(|_, bases, offset| eh_frame.cie_from_offset(bases, offset))
        else {
            break;
        };
        let range = fde.initial_address()..fde.end_address();
        if !wanted(range.clone()) {
            continue;
        }
        let Ok(mut table) = fde.rows(&eh_frame, &bases, &mut context) else {
            continue;
        };
        let mut rows = Vec::new();
        while let Ok(Some(row)) = table.next_row() {
            let cfa = match row.cfa() {
                gimli::CfaRule::RegisterAndOffset { register, offset }
                    if *register == gimli::X86_64::RSP =>
                {
                    Some(*offset)
                }
                _ => None,
            };
            rows.push((row.start_address()..row.end_address(), cfa));
        }
        found.push((range, rows));
    }
    found
}

/// The widest row of the unwind information (`.eh_frame`) of the function
/// at `address`: the address range of the function's body, where its frame
/// is whole (after the prologue, before the epilogues). `None` when no FDE
/// covers `address` or it cannot be parsed. An interpreter whose generated
/// code runs on the interpreter loop's own frame (PHP's JIT) is unwound as
/// a PC in this range.
pub fn widest_unwind_row<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
    address: u64,
) -> Option<std::ops::Range<u64>> {
    let fdes = unwind_rows(elf, |range| range.contains(&address));
    let (_, rows) = fdes.into_iter().next()?;
    rows.into_iter()
        .map(|(range, _)| range)
        .max_by_key(|range| range.end - range.start)
}

/// The cold parts GCC split out of `function` (`execute_ex.cold`): code
/// the function jumps into (a `jmp` or `jcc` with a 32-bit displacement,
/// found in its bytes `code`) that lies in an FDE starting mid-frame (its
/// first row's CFA is not `rsp + 8`, as at a function's entry). A frame
/// there is the function's own frame, on its error paths.
pub fn cold_parts<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
    function: std::ops::Range<u64>,
    code: &[u8],
) -> Vec<std::ops::Range<u64>> {
    let mut targets = Vec::new();
    for (i, window) in code.windows(6).enumerate() {
        let (length, displacement) = match window {
            [0x0f, 0x80..=0x8f, d @ ..] => (6, d),
            [0xe9, d @ .., _] => (5, d),
            _ => continue,
        };
        let Ok(displacement) = <[u8; 4]>::try_from(&displacement[..4]) else {
            continue;
        };
        let next = function.start + i as u64 + length;
        if let Some(target) = next.checked_add_signed(i64::from(i32::from_le_bytes(displacement)))
            && !function.contains(&target)
        {
            targets.push(target);
        }
    }
    if targets.is_empty() {
        return Vec::new();
    }
    targets.sort_unstable();
    // Two jumps at least: a stray 0xe9 byte inside another instruction
    // rarely points into code at all, twice into the same FDE never.
    let hits = |range: &std::ops::Range<u64>| {
        let first = targets.partition_point(|&t| t < range.start);
        targets[first..]
            .iter()
            .take_while(|&&t| t < range.end)
            .count()
    };
    let hit = |range: &std::ops::Range<u64>| hits(range) >= 2;
    unwind_rows(elf, |range| hit(&range))
        .into_iter()
        .filter(|(_, rows)| rows.first().is_some_and(|(_, cfa)| *cfa != Some(8)))
        .map(|(range, _)| range)
        .collect()
}

/// Where a process's mapped file can be opened, best first: the exact file
/// mapped (`map_files`, which works for deleted and replaced files), the
/// path in the process's mount namespace (`/proc/PID/root`, for
/// containers), and the path as the process sees it.
pub fn mapped_file_paths(pid: u32, mapping: &MappedFile) -> [PathBuf; 3] {
    [
        PathBuf::from(format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            mapping.start, mapping.end
        )),
        PathBuf::from(format!("/proc/{pid}/root{}", mapping.path)),
        PathBuf::from(&*mapping.path),
    ]
}

/// A runtime's file could not be read as ELF.
#[derive(Debug, thiserror::Error)]
pub enum ElfFileError {
    /// The file could not be opened.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not ELF, or its headers cannot be parsed.
    #[error("{path}: {message}")]
    NotElf {
        /// The file.
        path: String,
        /// The parser's complaint.
        message: String,
    },
}

/// `path` opened for parsing as ELF, read on demand.
pub fn open_elf(
    path: &std::path::Path,
) -> Result<object::read::ReadCache<std::fs::File>, ElfFileError> {
    std::fs::File::open(path)
        .map(object::read::ReadCache::new)
        .map_err(|source| ElfFileError::Io {
            path: path.display().to_string(),
            source,
        })
}

/// `cache` (opened from `path`) parsed as an object file.
pub fn parse_elf<'a>(
    path: &std::path::Path,
    cache: &'a object::read::ReadCache<std::fs::File>,
) -> Result<object::File<'a, &'a object::read::ReadCache<std::fs::File>>, ElfFileError> {
    object::File::parse(cache).map_err(|e| ElfFileError::NotElf {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// An ELF file's `PT_LOAD` segments: (file offset, file size, virtual
/// address), to turn one mapping of the file into its load bias.
#[derive(Debug, Clone, Default)]
pub struct LoadSegments(Vec<(u64, u64, u64)>);

impl LoadSegments {
    /// The segments of `elf`.
    pub fn of<'data, R: object::ReadRef<'data>>(elf: &object::File<'data, R>) -> Self {
        use object::{Object, ObjectSegment};
        LoadSegments(
            elf.segments()
                .map(|s| {
                    let (offset, size) = s.file_range();
                    (offset, size, s.address())
                })
                .collect(),
        )
    }

    /// Process address minus ELF virtual address, from a mapping of the
    /// file starting at `mapping_start` with `file_offset`.
    pub fn load_bias(&self, mapping_start: u64, file_offset: u64) -> Option<u64> {
        // A mapping starts on a page, which may be before its segment's
        // unaligned file offset; vaddr - offset is constant across the page.
        let &(offset, _, vaddr) = self.0.iter().find(|&&(offset, size, _)| {
            // Saturating: a hostile file's segment may end past u64::MAX.
            offset & !0xfff <= file_offset && file_offset < offset.saturating_add(size)
        })?;
        let vaddr_of_start = vaddr.wrapping_add(file_offset).wrapping_sub(offset);
        Some(mapping_start.wrapping_sub(vaddr_of_start))
    }
}

/// What a runtime's probe found in a file: where the file is placed in a
/// process that maps it.
pub trait RuntimeFile {
    /// Process address minus ELF virtual address, from one mapping of the
    /// file (its start and file offset).
    fn load_bias(&self, mapping_start: u64, file_offset: u64) -> Option<u64>;
}

/// Why a runtime's probe of a file failed.
pub trait ProbeFailure: std::fmt::Display {
    /// Whether the file is the runtime's but cannot be profiled (an
    /// unsupported version, missing symbols): the user is told, once per
    /// file. Files that are not the runtime's are no refusal.
    fn is_refusal(&self) -> bool;
}

/// `path` as the process `pid` sees it, from icecore's mount namespace.
pub fn path_in_process(pid: u32, path: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root{path}"))
}

/// A runtime's probe of each mapped file, cached per file (device and
/// inode): processes of one interpreter binary come and go, the file's
/// symbols and version stay. A file found not to be the runtime's is
/// remembered too, so it is not parsed again.
pub struct FileProbes<T> {
    probes: LruCache<FileKey, Option<Arc<T>>>,
}

impl<T> FileProbes<T> {
    /// A cache of at most `capacity` files.
    pub fn new(capacity: usize) -> Self {
        FileProbes {
            probes: LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN)),
        }
    }

    /// The probe of `mapping`'s file, running `probe` on the first of its
    /// paths that works when the file was not probed before. `probe`'s
    /// errors are logged at debug level: most files are not the runtime's.
    pub fn get_or_probe<E: std::fmt::Display>(
        &mut self,
        pid: u32,
        mapping: &MappedFile,
        mut probe: impl FnMut(&std::path::Path) -> Result<T, E>,
    ) -> Option<Arc<T>> {
        let key = FileKey::of(mapping);
        if let Some(known) = self.probes.get(&key) {
            return known.clone();
        }
        let probed = mapped_file_paths(pid, mapping).iter().find_map(|path| {
            probe(path)
                .map_err(|e| debug!(pid, path = %mapping.path, "probe: {e}"))
                .ok()
        });
        let probed = probed.map(Arc::new);
        self.probes.put(key, probed.clone());
        probed
    }

    /// The runtime's file among `pid`'s executable mappings: the first
    /// whose path is `named` like one and whose `probe` succeeds, with its
    /// load bias. A file that is the runtime's but cannot be profiled (a
    /// [`ProbeFailure::is_refusal`]) is logged as "`runtime` not profiled"
    /// and counted in `stats.attach_failures`, once per file.
    pub fn find_in<E: ProbeFailure>(
        &mut self,
        pid: u32,
        mappings: &ProcessMappings,
        (runtime, stats): (&str, &mut RuntimeStats),
        named: impl Fn(&str) -> bool,
        probe: impl Fn(&std::path::Path) -> Result<T, E>,
    ) -> Option<(Arc<T>, u64)>
    where
        T: RuntimeFile,
    {
        for mapping in mappings.executable() {
            if !named(&mapping.path) {
                continue;
            }
            // The probe runs on each path of the file until one works: the
            // refusal is said once.
            let mut refused = false;
            let found = self.get_or_probe(pid, mapping, |path| {
                probe(path).inspect_err(|e| {
                    if e.is_refusal() && !refused {
                        refused = true;
                        stats.attach_failures += 1;
                        warn!(pid, file = %mapping.path, "{runtime} not profiled: {e}");
                    }
                })
            });
            if let Some(file) = found
                && let Some(bias) = file.load_bias(mapping.start, mapping.file_offset)
            {
                return Some((file, bias));
            }
        }
        None
    }

    /// Files remembered.
    pub fn len(&self) -> usize {
        self.probes.len()
    }

    /// Whether no file is remembered.
    pub fn is_empty(&self) -> bool {
        self.probes.is_empty()
    }
}

/// Drops the entries of `cache` whose key `doomed` picks (a process's, when
/// it exits): an LRU cache is keyed by (pid, …) and has no index by pid.
pub fn remove_where<K: std::hash::Hash + Eq + Clone, V>(
    cache: &mut LruCache<K, V>,
    mut doomed: impl FnMut(&K) -> bool,
) {
    let keys: Vec<K> = cache
        .iter()
        .map(|(k, _)| k)
        .filter(|k| doomed(k))
        .cloned()
        .collect();
    for key in keys {
        cache.pop(&key);
    }
}

/// A runtime's pid-keyed BPF map (or a stand-in in tests): the one way a
/// plugin describes its processes to its BPF program.
pub trait ProcessMap<V>: Send {
    /// Writes the entry of `pid`.
    fn insert(&mut self, pid: u32, value: &V) -> Result<(), String>;
    /// Deletes the entry of `pid`, if any.
    fn remove(&mut self, pid: u32);
}

impl<V: aya::Pod + Send> ProcessMap<V> for aya::maps::HashMap<aya::maps::MapData, u32, V> {
    fn insert(&mut self, pid: u32, value: &V) -> Result<(), String> {
        aya::maps::HashMap::insert(self, pid, value, 0).map_err(|e| e.to_string())
    }

    fn remove(&mut self, pid: u32) {
        let _ = aya::maps::HashMap::remove(self, &pid);
    }
}

/// A [`ProcessMap`] that keeps entries in memory: for tests and host walks.
/// Clones share the entries, so a test can read what a plugin wrote.
#[derive(Debug)]
pub struct MemoryProcessMap<V> {
    entries: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u32, V>>>,
}

impl<V> Clone for MemoryProcessMap<V> {
    fn clone(&self) -> Self {
        MemoryProcessMap {
            entries: self.entries.clone(),
        }
    }
}

impl<V> Default for MemoryProcessMap<V> {
    fn default() -> Self {
        MemoryProcessMap {
            entries: Default::default(),
        }
    }
}

impl<V: Clone> MemoryProcessMap<V> {
    /// The entry of `pid`.
    pub fn get(&self, pid: u32) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.get(&pid).cloned()
    }
}

impl<V: Clone + Send> ProcessMap<V> for MemoryProcessMap<V> {
    fn insert(&mut self, pid: u32, value: &V) -> Result<(), String> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.insert(pid, value.clone());
        Ok(())
    }

    fn remove(&mut self, pid: u32) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_ending_past_the_address_space_still_holds_its_offsets() {
        // Its end overflows u64: wrapped, it would hold no offset at all.
        let segments = LoadSegments(vec![(u64::MAX - 0xfff, 0x2000, 0x1000)]);
        let file_offset = u64::MAX - 0x800;
        assert_eq!(
            segments.load_bias(0x7f00_0000_0000, file_offset),
            Some(0x7f00_0000_0000 - 0x17ff)
        );
        assert_eq!(segments.load_bias(0x7f00_0000_0000, 0x1000), None);
    }

    #[test]
    fn a_file_is_probed_once_whatever_the_answer() {
        let maps = crate::process_maps::ProcessMappings::read(std::process::id()).unwrap();
        let exe = maps.executable().next().unwrap().clone();
        let mut probes = FileProbes::<u64>::new(4);
        let mut runs = 0;
        for _ in 0..3 {
            let got = probes.get_or_probe(std::process::id(), &exe, |path| {
                runs += 1;
                std::fs::metadata(path).map(|m| m.len())
            });
            assert!(got.is_some_and(|len| *len > 0));
        }
        assert_eq!(runs, 1);
        let mut refused = FileProbes::<u64>::new(4);
        for _ in 0..2 {
            let got = refused.get_or_probe(std::process::id(), &exe, |_| {
                runs += 1;
                Err::<u64, _>("not this runtime")
            });
            assert!(got.is_none());
        }
        assert_eq!(runs, 4, "three paths tried once, then remembered");
    }
}
