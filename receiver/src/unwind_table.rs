//! Building one file's unwind table for BPF: the rows (from
//! `icecore_unwinders::table`), the file's content ID, and its loadable
//! segments, which give each mapping's load bias.

use std::path::Path;

use icecore_unwinders::table::{CollectedCfi, FileId, PackedRows, TableError};
use object::{Object, ObjectSegment};

use crate::process_maps::MappedFile;

/// Files larger than this are not read for unwind tables (frame pointers only).
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// Why a file has no unwind table.
#[derive(Debug, thiserror::Error)]
pub enum TableBuildError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error("{path} is {size} bytes, more than the {MAX_FILE_BYTES} read for unwind tables")]
    TooLarge {
        /// The file.
        path: String,
        /// Its size.
        size: u64,
    },
    /// The file is not a readable ELF file.
    #[error("{path}: {message}")]
    NotElf {
        /// The file.
        path: String,
        /// The parser's complaint.
        message: String,
    },
    /// The CFI could not be turned into a table.
    #[error("{path}: {source}")]
    Table {
        /// The file.
        path: String,
        /// The table builder's error.
        source: TableError,
    },
    /// The file has no CFI rows at all.
    #[error("{0} has no call frame information")]
    Empty(String),
}

/// A loadable segment: where file offsets land in the ELF address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LoadSegment {
    offset: u64,
    vaddr: u64,
    size: u64,
    executable: bool,
}

/// A file's table, ready to install.
#[derive(Debug, Clone)]
pub struct BuiltTable {
    /// Content-derived ID: the key in `UNWIND_TABLES`.
    pub file_id: u64,
    /// The rows, sorted by PC, packed (about 2 bytes a row): tables stay
    /// cached in user space after their processes exit.
    pub rows: PackedRows,
    segments: Vec<LoadSegment>,
}

impl BuiltTable {
    /// Process address minus ELF virtual address for a mapping of this file,
    /// or None when the mapping's offset is in no loadable segment.
    pub fn load_bias(&self, mapping: &MappedFile) -> Option<u64> {
        const PAGE_MASK: u64 = !0xfff;
        // Linkers such as lld put the end of one segment and the start of the
        // next in the same file page, so an offset alone can match two
        // segments: an executable mapping holds the executable segment that
        // overlaps the file range it maps.
        // Saturating: segments end within the address space (checked when
        // read), and a mapping's offset plus its length should too.
        let mapped = mapping.file_offset
            ..mapping
                .file_offset
                .saturating_add(mapping.end.saturating_sub(mapping.start));
        let end = |s: &LoadSegment| s.offset.saturating_add(s.size);
        let overlaps = |s: &&LoadSegment| s.offset < mapped.end && mapped.start < end(s);
        let segment = self
            .segments
            .iter()
            .filter(|s| s.executable == mapping.executable)
            .find(overlaps)
            .or_else(|| {
                self.segments.iter().find(|s| {
                    s.offset & PAGE_MASK <= mapping.file_offset && mapping.file_offset < end(s)
                })
            })?;
        // vaddr - offset is the same for every byte of the segment.
        let vaddr_of_start = mapping
            .file_offset
            .wrapping_add(segment.vaddr.wrapping_sub(segment.offset));
        Some(mapping.start.wrapping_sub(vaddr_of_start))
    }
}

/// Builds the table of the file at `path`, reading only its headers and the
/// sections the table comes from: a binary's debug information, often most
/// of its size, is never read.
#[tracing::instrument(name = "build_unwind_table", skip_all, fields(path = %path.display()))]
pub fn build_table(path: &Path) -> Result<BuiltTable, TableBuildError> {
    let name = || path.display().to_string();
    let read_error = |source| TableBuildError::Read {
        path: name(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let size = file.metadata().map_err(read_error)?.len();
    if size > MAX_FILE_BYTES {
        return Err(TableBuildError::TooLarge { path: name(), size });
    }
    let file_id = FileId::from_file(&file).map_err(read_error)?;
    // The read cache (the CFI sections' bytes) goes before the table is
    // assembled: only the evaluated rows are needed for that.
    let (segments, collected) = {
        let cache = object::ReadCache::new(&file);
        collect_elf(&cache, &name)?
    };
    finish_table(segments, collected, file_id, name)
}

/// The table of this kernel's vDSO, which every 64-bit process maps: built
/// once from icecore's own copy. `None` without a readable vDSO.
pub fn vdso_table() -> Option<BuiltTable> {
    let vdso = crate::symbolize::vdso::own()?;
    let file_id = FileId::from_bytes(&vdso.image);
    let name = || "[vdso]".to_string();
    let table = collect_elf(vdso.image.as_slice(), &name)
        .and_then(|(segments, collected)| finish_table(segments, collected, file_id, name));
    match table {
        Ok(table) => Some(table),
        Err(e) => {
            tracing::warn!("vDSO frames will use frame pointers: {e}");
            None
        }
    }
}

fn collect_elf<'data, R: object::ReadRef<'data>>(
    data: R,
    name: &impl Fn() -> String,
) -> Result<(Vec<LoadSegment>, CollectedCfi), TableBuildError> {
    let file = object::File::parse(data).map_err(|e| TableBuildError::NotElf {
        path: name(),
        message: e.to_string(),
    })?;
    let segments = file
        .segments()
        .filter_map(|s| {
            let (offset, size) = s.file_range();
            let executable = match s.flags() {
                object::SegmentFlags::Elf { p_flags } => p_flags & object::elf::PF_X != 0,
                _ => false,
            };
            // A segment past the end of the address space is not one a
            // process can map (a hostile file's).
            (size > 0 && offset.checked_add(size).is_some()).then_some(LoadSegment {
                offset,
                vaddr: s.address(),
                size,
                executable,
            })
        })
        .collect();
    let collected =
        CollectedCfi::from_elf_reader(data).map_err(|source| TableBuildError::Table {
            path: name(),
            source,
        })?;
    Ok((segments, collected))
}

fn finish_table(
    segments: Vec<LoadSegment>,
    collected: CollectedCfi,
    file_id: FileId,
    name: impl Fn() -> String,
) -> Result<BuiltTable, TableBuildError> {
    let (rows, _stats) =
        PackedRows::assemble(collected).map_err(|source| TableBuildError::Table {
            path: name(),
            source,
        })?;
    if rows.is_empty() {
        return Err(TableBuildError::Empty(name()));
    }
    Ok(BuiltTable {
        file_id: file_id.0,
        rows,
        segments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_this_test_binary_and_finds_its_bias() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let built = build_table(&exe).unwrap();
        assert!(built.rows.len() > 1000, "{} rows", built.rows.len());
        let maps = crate::process_maps::ProcessMappings::read(std::process::id()).unwrap();
        let here = builds_this_test_binary_and_finds_its_bias as *const () as u64;
        let mapping = maps.find(here).unwrap();
        let bias = built.load_bias(mapping).unwrap();
        // The function's ELF address must be covered by the table.
        let vaddr = here - bias;
        let first = u64::from(built.rows.iter().next().unwrap().pc);
        assert!(
            vaddr >= first,
            "vaddr {vaddr:#x} below the table's first pc {first:#x}"
        );
    }

    /// The streamed, packed build gives exactly the rows of the whole-table
    /// build, on this test binary (Rust, large) and on libc (assembly,
    /// hand-written CFI).
    #[test]
    fn packed_rows_are_the_whole_tables_rows() {
        // SAFETY: dlsym with a NUL-terminated name and the default handle.
        let malloc = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) } as u64;
        let maps = crate::process_maps::ProcessMappings::read(std::process::id()).unwrap();
        let libc_path = maps.find(malloc).unwrap().path.to_string();
        for path in [
            std::fs::read_link("/proc/self/exe").unwrap(),
            libc_path.into(),
        ] {
            let data = std::fs::read(&path).unwrap();
            let whole = icecore_unwinders::table::UnwindTable::from_elf(&data).unwrap();
            let built = build_table(&path).unwrap();
            assert_eq!(built.rows.len(), whole.rows().len(), "{}", path.display());
            assert!(
                built.rows.iter().eq(whole.rows().iter().copied()),
                "{}: packed rows differ",
                path.display()
            );
            assert!(built.rows.heap_size() * 2 < whole.rows().len() * 8);
        }
    }

    #[test]
    fn lld_layout_picks_the_executable_segment() {
        // lld: read-only segment [0, 0x16dd4) and executable segment at file
        // offset 0x16de0 (vaddr 0x17de0) share the file page 0x16000.
        let table = BuiltTable {
            file_id: 1,
            rows: PackedRows::default(),
            segments: vec![
                LoadSegment {
                    offset: 0,
                    vaddr: 0,
                    size: 0x16dd4,
                    executable: false,
                },
                LoadSegment {
                    offset: 0x16de0,
                    vaddr: 0x17de0,
                    size: 0x5_0000,
                    executable: true,
                },
            ],
        };
        let mapping = MappedFile {
            start: 0x5555_8026_c000,
            end: 0x5555_802c_0000,
            file_offset: 0x16000,
            dev: (0, 0),
            inode: 1,
            path: "/x".into(),
            executable: true,
            deleted: false,
        };
        // vaddr of the mapping start: 0x16000 + (0x17de0 - 0x16de0) = 0x17000.
        assert_eq!(table.load_bias(&mapping), Some(0x5555_8026_c000 - 0x17000));
    }

    #[test]
    fn segments_past_the_end_of_the_address_space_are_left_out() {
        // libFuzzer's input: a segment whose offset plus size overflows,
        // which made load_bias overflow (a panic with overflow checks).
        let crash = Path::new(env!("CARGO_MANIFEST_DIR")).join(
            "../fuzz/regressions/elf_unwind_table/crash-50663548f6923643ebd5e29cf17718f35f5c0d94",
        );
        let data = std::fs::read(&crash).unwrap();
        let file = object::File::parse(data.as_slice()).unwrap();
        assert!(
            file.segments().any(|s| {
                let (offset, size) = s.file_range();
                offset.checked_add(size).is_none()
            }),
            "the input should hold such a segment"
        );
        if let Ok(built) = build_table(&crash) {
            assert!(
                built
                    .segments
                    .iter()
                    .all(|s| s.offset.checked_add(s.size).is_some())
            );
            let mapping = MappedFile {
                start: 0x1000,
                end: 0x2000,
                file_offset: u64::MAX - 0x10,
                dev: (0, 0),
                inode: 1,
                path: "/x".into(),
                executable: true,
                deleted: false,
            };
            let _ = built.load_bias(&mapping);
        }
    }

    #[test]
    fn builds_the_vdso_table_and_its_bias() {
        let built = vdso_table().expect("this process has a vDSO with CFI");
        assert!(built.rows.len() > 10, "{} rows", built.rows.len());
        let maps = crate::process_maps::ProcessMappings::read(std::process::id()).unwrap();
        let vdso = maps.mappings().iter().find(|m| m.is_vdso()).unwrap();
        // The vDSO is linked at 0: its bias is where it is mapped.
        assert_eq!(built.load_bias(vdso), Some(vdso.start));
    }

    #[test]
    fn refuses_non_elf() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        std::fs::write(&path, b"not an elf").unwrap();
        assert!(matches!(
            build_table(&path),
            Err(TableBuildError::NotElf { .. })
        ));
    }
}
