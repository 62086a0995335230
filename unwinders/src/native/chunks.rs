//! Unwind tables as BPF stores them: 4 KiB chunks of rows behind a fence.
//!
//! A table is one BPF array whose elements are [`UnwindChunk`]s. Element 0 is
//! the fence: the first `pc` of every `stride`-th data chunk. Elements 1.. hold
//! the rows, [`ROWS_PER_CHUNK`] per chunk. A lookup reads the fence, picks
//! the data chunk, and binary-searches inside it: two map lookups for any
//! table up to 2^19 rows (stride 1), a few more for larger ones, against one
//! lookup per search step when every row was its own element. Each lookup of
//! an inner map is a real helper call (the kernel cannot inline lookups into
//! `BPF_F_INNER_MAP` arrays), and calls dominate the cost of a step.

use super::dwarf::{MAX_TABLE_ROWS, UnwindRow};

/// Rows in one data chunk.
pub const ROWS_PER_CHUNK: usize = 512;
/// Entries of the fence.
pub const FENCE_SLOTS: usize = 1024;

const ROW_STEPS: usize = 9;
const FENCE_STEPS: usize = 10;
const STRIDE_STEPS: usize = 5;
const _: () = assert!(1 << ROW_STEPS == ROWS_PER_CHUNK);
const _: () = assert!(1 << FENCE_STEPS == FENCE_SLOTS);

/// Data chunks of the largest table.
pub const MAX_DATA_CHUNKS: u32 = MAX_TABLE_ROWS / ROWS_PER_CHUNK as u32;
const _: () = assert!(MAX_DATA_CHUNKS.div_ceil(FENCE_SLOTS as u32) <= 1 << STRIDE_STEPS);

/// One element of a table's BPF array: the fence (element 0) or rows.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnwindChunk {
    /// Rows sorted by `pc`; the last data chunk is padded with rows whose
    /// `pc` is `u32::MAX`.
    pub rows: [UnwindRow; ROWS_PER_CHUNK],
}

const _: () = assert!(core::mem::size_of::<UnwindChunk>() == 4096);
const _: () = assert!(core::mem::size_of::<UnwindChunk>() == FENCE_SLOTS * 4);
const _: () = assert!(core::mem::align_of::<UnwindChunk>() == core::mem::align_of::<u32>());

impl UnwindChunk {
    /// The chunk read as a fence.
    #[inline(always)]
    pub fn fence(&self) -> &[u32; FENCE_SLOTS] {
        // SAFETY: both types are 4096 bytes of plain integers with the same
        // alignment (asserted above); every bit pattern is a valid u32.
        unsafe { &*core::ptr::from_ref(self).cast::<[u32; FENCE_SLOTS]>() }
    }

    /// A fence chunk.
    pub fn from_fence(fence: [u32; FENCE_SLOTS]) -> Self {
        // SAFETY: same size (asserted above); UnwindRow is repr(C) integers
        // without padding, so every bit pattern is a valid row.
        unsafe { core::mem::transmute::<[u32; FENCE_SLOTS], UnwindChunk>(fence) }
    }
}

/// How a table of `rows` rows is split into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLayout {
    /// Chunks holding rows.
    pub data_chunks: u32,
    /// Data chunks per fence entry.
    pub stride: u32,
    /// Fence entries in use.
    pub fences: u32,
}

impl ChunkLayout {
    /// The layout of a table of `rows` rows; `None` when empty or too large.
    #[inline(always)]
    pub const fn of(rows: u32) -> Option<Self> {
        if rows == 0 || rows > MAX_TABLE_ROWS {
            return None;
        }
        let data_chunks = rows.div_ceil(ROWS_PER_CHUNK as u32);
        let stride = data_chunks.div_ceil(FENCE_SLOTS as u32);
        Some(ChunkLayout {
            data_chunks,
            stride,
            fences: data_chunks.div_ceil(stride),
        })
    }

    /// Elements of the table's BPF array: the fence and the data chunks.
    pub const fn elements(&self) -> u32 {
        self.data_chunks + 1
    }
}

/// The last index in `0..2^STEPS` whose key is at most `target`, given
/// that index 0's is and the keys are sorted.
///
/// Exactly `STEPS` probes, from `zero` (see [`find_row`]).
#[inline(always)]
fn last_at_most<const STEPS: usize>(
    zero: u32,
    target: u32,
    mut key: impl FnMut(u32) -> u32,
) -> u32 {
    // Masking every index keeps its range the same on every path, so the
    // verifier can merge them (the masks never change a value).
    let mask = (1u32 << STEPS) - 1;
    let mut base = zero & mask;
    let mut step = 1u32 << (STEPS - 1);
    for _ in 0..STEPS {
        let probe = (base + step) & mask;
        if key(probe) <= target {
            base = probe;
        }
        step >>= 1;
    }
    base
}

/// The row covering `pc` (the last row whose `pc` is at most it) in a table
/// of `rows` rows whose elements `chunk` returns; `None` below the first
/// row, for a bad size, or when an element cannot be read.
///
/// Unused fence slots and rows past the table's end hold `pc = u32::MAX`
/// (see [`to_chunks`]), so the searches run over whole chunks; `pc`
/// `u32::MAX` itself is never covered.
///
/// `zero` must be 0. BPF passes a zero it loaded from a map: the verifier
/// then sees the search indices as unknown values in one range, and prunes
/// the paths through the searches to a few. From a literal 0 it would track
/// every index as a distinct constant and walk all 2^19 paths per frame.
#[inline(always)]
pub fn find_row<'a>(
    rows: u32,
    pc: u32,
    zero: u32,
    mut chunk: impl FnMut(u32) -> Option<&'a UnwindChunk>,
) -> Option<UnwindRow> {
    let layout = ChunkLayout::of(rows)?;
    if pc == u32::MAX {
        return None;
    }
    let fence = chunk(0)?.fence();
    if fence[0] > pc {
        return None;
    }
    // The masks never change an index; they show the BPF verifier the bound.
    let slot = last_at_most::<FENCE_STEPS>(zero, pc, |i| fence[i as usize & (FENCE_SLOTS - 1)]);
    let first = slot * layout.stride;
    // Between two fence entries: the last of `stride` chunks whose first row
    // is at most `pc` (one chunk, no search, below 2^19 rows).
    let span = layout.data_chunks.saturating_sub(first);
    let stride_mask = (1u32 << STRIDE_STEPS) - 1;
    let mut offset = zero & stride_mask;
    let mut step = 1u32 << (STRIDE_STEPS - 1);
    for _ in 0..STRIDE_STEPS {
        let probe = (offset + step) & stride_mask;
        if probe < layout.stride && probe < span && chunk(first + probe + 1)?.rows[0].pc <= pc {
            offset = probe;
        }
        step >>= 1;
    }
    let data = chunk(first + offset + 1)?;
    let at = last_at_most::<ROW_STEPS>(zero, pc, |i| {
        data.rows[i as usize & (ROWS_PER_CHUNK - 1)].pc
    });
    let row = &data.rows[at as usize & (ROWS_PER_CHUNK - 1)];
    // Load the row now, whole: otherwise LLVM sinks each field's load into
    // the branches of the step that use it, keeping a pointer into the map
    // live whose offset differs on every search path, which stops the BPF
    // verifier from merging the paths.
    // SAFETY: `row` is a valid reference to plain integers.
    Some(unsafe { core::ptr::read_volatile(row) })
}

/// The BPF array elements of a table of sorted `rows`; `None` when empty or
/// too large.
#[cfg(feature = "user")]
pub fn to_chunks(rows: &[UnwindRow]) -> Option<std::vec::Vec<UnwindChunk>> {
    let layout = ChunkLayout::of(u32::try_from(rows.len()).ok()?)?;
    let mut chunks = std::vec::Vec::with_capacity(layout.elements() as usize);
    let mut fence = [u32::MAX; FENCE_SLOTS];
    let per_fence = layout.stride as usize * ROWS_PER_CHUNK;
    for (slot, group) in fence.iter_mut().zip(rows.chunks(per_fence)) {
        *slot = group[0].pc;
    }
    chunks.push(UnwindChunk::from_fence(fence));
    for part in rows.chunks(ROWS_PER_CHUNK) {
        // Padding sorts after every row (see `find_row`).
        let mut chunk = UnwindChunk {
            rows: [UnwindRow {
                pc: u32::MAX,
                ..UnwindRow::default()
            }; ROWS_PER_CHUNK],
        };
        chunk.rows[..part.len()].copy_from_slice(part);
        chunks.push(chunk);
    }
    Some(chunks)
}

#[cfg(test)]
#[cfg(feature = "user")]
mod tests {
    use super::*;
    use crate::native::dwarf::{CfaRule, RbpRule};
    use std::vec::Vec;

    fn rows(n: u32, gap: u32) -> Vec<UnwindRow> {
        (0..n)
            .map(|i| {
                UnwindRow::new(
                    100 + i * gap,
                    CfaRule::Rsp,
                    (i % 60000) as u16,
                    RbpRule::Unchanged,
                    0,
                )
            })
            .collect()
    }

    fn check(rows: &[UnwindRow]) {
        let chunks = to_chunks(rows).expect("valid size");
        let layout = ChunkLayout::of(rows.len() as u32).expect("valid size");
        assert_eq!(chunks.len() as u32, layout.elements());
        let find = |pc| find_row(rows.len() as u32, pc, 0, |i| chunks.get(i as usize));
        let expect = |pc: u32| {
            let i = rows.partition_point(|r| r.pc <= pc).checked_sub(1)?;
            (pc != u32::MAX).then_some(rows[i])
        };
        let mut probes = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            if i % 97 == 0 || i % ROWS_PER_CHUNK < 2 || i % ROWS_PER_CHUNK > ROWS_PER_CHUNK - 3 {
                probes.extend([r.pc.wrapping_sub(1), r.pc, r.pc + 1]);
            }
        }
        probes.extend([0, u32::MAX - 1, u32::MAX, rows[rows.len() - 1].pc]);
        for pc in probes {
            assert_eq!(find(pc), expect(pc), "pc {pc} of {} rows", rows.len());
        }
    }

    #[test]
    fn layouts() {
        assert_eq!(ChunkLayout::of(0), None);
        assert_eq!(ChunkLayout::of(MAX_TABLE_ROWS + 1), None);
        let one = ChunkLayout::of(1).expect("one row");
        assert_eq!((one.data_chunks, one.stride, one.fences), (1, 1, 1));
        let full = ChunkLayout::of(512 * 1024).expect("fits stride 1");
        assert_eq!(
            (full.data_chunks, full.stride, full.fences),
            (1024, 1, 1024)
        );
        let big = ChunkLayout::of(512 * 1024 + 1).expect("stride 2");
        assert_eq!((big.data_chunks, big.stride, big.fences), (1025, 2, 513));
        let max = ChunkLayout::of(MAX_TABLE_ROWS).expect("largest");
        assert_eq!((max.stride, max.fences), (32, 1024));
    }

    #[test]
    fn finds_like_a_partition_point() {
        for n in [1, 2, 511, 512, 513, 1024, 5000] {
            check(&rows(n, 3));
        }
    }

    #[test]
    fn finds_in_strided_tables() {
        // Stride 2 and 3: the search between fence entries reads chunk heads.
        check(&rows(512 * 1024 + 700, 2));
        check(&rows(512 * 2100, 1));
    }

    #[test]
    fn duplicate_pcs_across_a_chunk_boundary() {
        let mut r = rows(1500, 4);
        let pc = r[1010].pc;
        for row in &mut r[1010..1040] {
            row.pc = pc;
        }
        check(&r);
    }

    #[test]
    fn a_missing_chunk_reads_as_none() {
        let r = rows(3000, 2);
        let chunks = to_chunks(&r).expect("valid size");
        assert!(find_row(3000, 5000, 0, |i| chunks.get(i as usize)).is_some());
        assert_eq!(
            find_row(3000, 5000, 0, |i| (i == 0).then(|| &chunks[0])),
            None
        );
        assert_eq!(find_row(0, 5000, 0, |i| chunks.get(i as usize)), None);
    }
}
