//! A small per-CPU cache of unwind-table lookups.
//!
//! A profiler sees the same return addresses again and again: the hot
//! functions of a process and the callers above them. A table search touches
//! a fence chunk and a data chunk, about twenty cache lines on two pages that
//! are cold again by the next sample; a cache hit touches one line of the
//! scratch space. Entries are keyed by the file's content ID and the ELF
//! address, and a file's table never changes once built, so the cache needs
//! no invalidation when tables come and go: a stale entry is still correct
//! for its file, and an unused one is simply overwritten.

use super::UnwindRow;

/// Entries per CPU (direct-mapped).
pub const ROW_CACHE_ENTRIES: usize = 256;

/// One cached lookup. An empty entry is all zeros: a lookup of address 0 in
/// a file with ID 0 would hit it and get a `NoInfo` row, which means the
/// same as no row (frame pointers); real file IDs are never 0.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RowCacheEntry {
    /// Content ID of the file whose table was searched.
    pub file_id: u64,
    /// The ELF virtual address searched for.
    pub pc: u32,
    /// Zero.
    pub reserved: u32,
    /// The row that covers `pc`.
    pub row: UnwindRow,
}

/// Direct-mapped cache from (file, address) to the row that covers it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RowCache {
    /// The entries, indexed by [`RowCache::index`].
    pub entries: [RowCacheEntry; ROW_CACHE_ENTRIES],
}

const _: () = assert!(core::mem::size_of::<RowCacheEntry>() == 24);
const _: () = assert!(core::mem::size_of::<RowCache>() == 24 * ROW_CACHE_ENTRIES);
const _: () = assert!(ROW_CACHE_ENTRIES.is_power_of_two());

impl Default for RowCache {
    fn default() -> Self {
        Self {
            entries: [RowCacheEntry::default(); ROW_CACHE_ENTRIES],
        }
    }
}

impl RowCache {
    /// The entry a (file, address) pair maps to: a multiplicative hash, so
    /// nearby return addresses of one function spread over the cache.
    #[inline(always)]
    pub fn index(file_id: u64, pc: u32) -> usize {
        let mixed = (pc ^ (file_id as u32) ^ ((file_id >> 32) as u32)).wrapping_mul(0x9E37_79B1);
        (mixed >> 24) as usize & (ROW_CACHE_ENTRIES - 1)
    }

    /// The cached row for `pc` in the file `file_id`, if any.
    #[inline(always)]
    pub fn get(&self, file_id: u64, pc: u32) -> Option<UnwindRow> {
        let index = Self::index(file_id, pc);
        if self.holds(index, file_id, pc) {
            Some(self.row_at(index))
        } else {
            None
        }
    }

    /// Whether the entry at `index` is the lookup of `pc` in `file_id`.
    /// (No test of `file_id` against 0: in BPF it would give the verifier a
    /// path where the ID is a constant, which it cannot prune against.)
    #[inline(always)]
    pub fn holds(&self, index: usize, file_id: u64, pc: u32) -> bool {
        let entry = &self.entries[index & (ROW_CACHE_ENTRIES - 1)];
        entry.file_id == file_id && entry.pc == pc
    }

    /// The row stored at `index`. BPF reads every row it steps with through
    /// here, after a hit or after inserting a table's row, so that both paths
    /// join in one state the verifier can prune.
    #[inline(always)]
    pub fn row_at(&self, index: usize) -> UnwindRow {
        let entry = &self.entries[index & (ROW_CACHE_ENTRIES - 1)];
        // Loaded whole: otherwise LLVM sinks each field's load into the
        // branches that use it.
        // SAFETY: `entry.row` is a valid reference to plain integers.
        unsafe { core::ptr::read_volatile(&entry.row) }
    }

    /// Remembers at `index` that `row` covers `pc` in the file `file_id`.
    #[inline(always)]
    pub fn insert(&mut self, index: usize, file_id: u64, pc: u32, row: UnwindRow) {
        let entry = &mut self.entries[index & (ROW_CACHE_ENTRIES - 1)];
        entry.file_id = file_id;
        entry.pc = pc;
        entry.row = row;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pc: u32) -> UnwindRow {
        UnwindRow {
            pc,
            rules: 1,
            rbp_offset: -2,
            cfa_offset: 16,
        }
    }

    #[test]
    fn hit_after_insert_and_miss_for_other_keys() {
        let mut cache = RowCache::default();
        assert_eq!(cache.get(7, 0x1234), None);
        cache.insert(RowCache::index(7, 0x1234), 7, 0x1234, row(0x1200));
        assert_eq!(cache.get(7, 0x1234), Some(row(0x1200)));
        assert_eq!(cache.get(8, 0x1234), None, "another file");
        assert_eq!(cache.get(7, 0x1235), None, "another address");
    }

    #[test]
    fn an_empty_entry_reads_as_no_info() {
        let cache = RowCache::default();
        let empty = cache
            .get(0, 0)
            .expect("the all-zero key matches an empty entry");
        assert_eq!(empty.cfa_rule(), crate::native::CfaRule::NoInfo);
        assert_eq!(cache.get(0, 1), None);
    }

    #[test]
    fn colliding_keys_replace_each_other() {
        let mut cache = RowCache::default();
        let index = RowCache::index(1, 100);
        let other = (101..)
            .find(|&pc| RowCache::index(1, pc) == index)
            .expect("256 slots: a collision exists");
        cache.insert(index, 1, 100, row(90));
        cache.insert(index, 1, other, row(95));
        assert_eq!(cache.get(1, 100), None);
        assert_eq!(cache.get(1, other), Some(row(95)));
    }

    #[test]
    fn return_addresses_of_one_function_spread() {
        let mut used = [false; ROW_CACHE_ENTRIES];
        for i in 0..64 {
            used[RowCache::index(0xdead_beef_0123_4567, 0x40_1000 + i * 7)] = true;
        }
        let distinct = used.iter().filter(|&&u| u).count();
        assert!(distinct > 48, "only {distinct} of 64 distinct");
    }
}
