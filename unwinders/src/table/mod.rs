//! User-space construction of the native unwind tables BPF searches.
//!
//! [`UnwindTable::from_elf`] turns an ELF file's call frame information
//! (`.eh_frame` and `.debug_frame`) into sorted 8-byte [`UnwindRow`]s, the
//! format [`find_row`] and [`dwarf_step`](crate::native::dwarf_step) read
//! in BPF. [`FileId`] names a file by its content so every process mapping
//! it shares one table, and [`unwind`] is a host unwinder running the same
//! steps the BPF program runs, for tests and for replaying captured stacks.
//!
//! How rows are made:
//!
//! - Every FDE of both sections is evaluated with gimli. CFA = rsp + n and
//!   rbp + n become `Rsp`/`Rbp` (n must fit a `u16`); the standard `.plt`
//!   expression becomes `Plt` (or, for its IBT/MPX variants, two `Rsp` rows
//!   per PLT entry); CFA = *(rsp or rbp + 8a) + 8b (a value saved in the
//!   frame: OpenSSL's assembly, GCC's stack realignment) becomes
//!   `RspDeref`/`RbpDeref`; glibc's signal trampoline (CFA, rip and rbp
//!   read from the kernel's `ucontext` at rsp) becomes `SignalFrame`. The
//!   return address must be saved at CFA - 8 (an undefined return address
//!   marks the outermost frame: `EndOfStack`); rbp must be unchanged or
//!   saved at CFA + 8k with k an `i8`. Anything else is `Unsupported`, so
//!   BPF falls back to frame pointers instead of guessing.
//! - **Overlaps** are resolved per FDE: `.debug_frame` FDEs are taken first,
//!   then `.eh_frame` FDEs that overlap none already taken (so `.debug_frame`
//!   wins where both describe a PC, and a file's duplicated FDEs keep the
//!   first), then PLT sections no FDE covers get rows decoded from their
//!   bytes.
//! - A `NoInfo` row ends every FDE whose successor does not start right at
//!   its end, consecutive rows with identical rules are merged (the first is
//!   kept), and the table is rejected, with a typed [`TableError`], when an
//!   address does not fit 32 bits or it has more than [`MAX_TABLE_ROWS`]
//!   rows.
//!
//! A malformed FDE costs only its own rows (see
//! [`TableStats::malformed_fdes`]); a section whose entries cannot be
//! walked is an error. Corrupt input never panics, and memory stays bounded
//! by the input's size (a table holds at most one row per CFI instruction
//! byte, plus a capped number per PLT section).

mod cfi;
mod file_id;
mod host;
mod packed;
mod plt;

use std::vec::Vec;

pub use cfi::CollectedCfi;
pub use file_id::{FileId, htlhash_of_bytes, htlhash_of_file};
pub use host::{
    AddressSpace, Frame, Mapping, StopReason, Unwound, elf_load_bias, unwind, unwind_detailed,
};
pub use packed::PackedRows;

use crate::native::chunks::{UnwindChunk, find_row, to_chunks};
use crate::native::dwarf::{CfaRule, MAX_TABLE_ROWS, UnwindRow};

/// Why a table could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// The file is not an ELF file `object` can read.
    #[error("unreadable ELF file: {0}")]
    Elf(#[from] object::read::Error),
    /// The file is not for x86-64, the only architecture the rows describe.
    #[error("not an x86-64 ELF file")]
    UnsupportedArchitecture,
    /// A CFI section is malformed.
    #[error("malformed {section}: {error}")]
    Cfi {
        /// `.eh_frame` or `.debug_frame`.
        section: &'static str,
        /// What gimli found wrong.
        error: gimli::Error,
    },
    /// A covered address does not fit the rows' 32-bit `pc`.
    #[error("address {0:#x} does not fit in 32 bits")]
    AddressTooLarge(u64),
    /// The table would exceed [`MAX_TABLE_ROWS`] rows.
    #[error("more than {MAX_TABLE_ROWS} rows")]
    TooManyRows,
    /// Rows given to [`UnwindTable::from_rows`] are not sorted by `pc`.
    #[error("rows are not sorted by pc")]
    Unsorted,
}

/// What went into a table, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Bytes of `.eh_frame`.
    pub eh_frame_bytes: usize,
    /// Bytes of `.debug_frame` (0 when absent or compressed).
    pub debug_frame_bytes: usize,
    /// `.debug_frame` is compressed and was left out (decompression is not built in).
    pub debug_frame_compressed: bool,
    /// FDEs read from `.eh_frame`.
    pub eh_frame_fdes: usize,
    /// FDEs read from `.debug_frame`.
    pub debug_frame_fdes: usize,
    /// FDEs left out because an earlier-taken FDE covers part of their range.
    pub overlapping_fdes: usize,
    /// FDEs whose CIE could not be read (left out) or whose instructions
    /// are malformed (`Unsupported` from the bad instruction on).
    pub malformed_fdes: usize,
    /// PLT sections (`.plt`, `.plt.got`, `.plt.sec`) given synthesized rows.
    pub synthesized_plt_sections: usize,
    /// Rows whose rule cannot be expressed (`Unsupported`), after merging.
    pub unsupported_rows: usize,
}

/// A file's unwind table: rows sorted by `pc`, consecutive rules distinct.
#[derive(Debug, Clone, Default)]
pub struct UnwindTable {
    rows: Vec<UnwindRow>,
    stats: TableStats,
    /// The rows as BPF stores them, made on the first [`UnwindTable::lookup`].
    chunks: std::sync::OnceLock<Vec<UnwindChunk>>,
}

impl PartialEq for UnwindTable {
    fn eq(&self, other: &Self) -> bool {
        self.rows == other.rows && self.stats == other.stats
    }
}

impl Eq for UnwindTable {}

impl UnwindTable {
    /// Builds the table of an ELF file from its bytes.
    pub fn from_elf(data: &[u8]) -> Result<Self, TableError> {
        cfi::build(data)
    }

    /// Builds the table of an ELF file read through `data`: given an
    /// `object::ReadCache` over the file, only the headers and the sections
    /// the table comes from are read (a binary's debug information, often
    /// most of its size, never is).
    pub fn from_elf_reader<'data, R: object::ReadRef<'data>>(data: R) -> Result<Self, TableError> {
        cfi::build(data)
    }

    /// A table from rows already built (a cache, a test), checked to be
    /// sorted by `pc` and within [`MAX_TABLE_ROWS`].
    pub fn from_rows(rows: Vec<UnwindRow>) -> Result<Self, TableError> {
        if rows.len() > MAX_TABLE_ROWS as usize {
            return Err(TableError::TooManyRows);
        }
        if rows.windows(2).any(|w| w[0].pc > w[1].pc) {
            return Err(TableError::Unsorted);
        }
        let stats = TableStats {
            unsupported_rows: count_unsupported(&rows),
            ..TableStats::default()
        };
        Ok(UnwindTable::new(rows, stats))
    }

    /// The rows, sorted by `pc`.
    pub fn rows(&self) -> &[UnwindRow] {
        &self.rows
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the table has no rows (the file has no usable CFI).
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Bytes the rows take in a BPF map.
    pub fn size_bytes(&self) -> usize {
        core::mem::size_of_val(self.rows.as_slice())
    }

    /// What went into the table.
    pub fn stats(&self) -> &TableStats {
        &self.stats
    }

    /// The row covering ELF virtual address `pc`, found with the same
    /// [`find_row`] BPF runs, over the same chunks. `None` below the first row
    /// and for addresses above 32 bits (no row covers them).
    pub fn lookup(&self, pc: u64) -> Option<UnwindRow> {
        let pc = u32::try_from(pc).ok()?;
        let rows = u32::try_from(self.rows.len()).ok()?;
        let chunks = self
            .chunks
            .get_or_init(|| to_chunks(&self.rows).unwrap_or_default());
        find_row(rows, pc, 0, |i| chunks.get(i as usize))
    }

    fn new(rows: Vec<UnwindRow>, stats: TableStats) -> Self {
        UnwindTable {
            rows,
            stats,
            chunks: std::sync::OnceLock::new(),
        }
    }
}

fn count_unsupported(rows: &[UnwindRow]) -> usize {
    rows.iter()
        .filter(|r| r.cfa_rule() == CfaRule::Unsupported)
        .count()
}
