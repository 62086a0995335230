//! The per-process mapping tables BPF reads, in pages of
//! [`PROCESS_TABLES_PER_PAGE`] tables (the inner arrays of
//! `PROCESS_MAPPINGS`), each mapped into this process and written in place.
//!
//! Inserting an inner map into an array of maps makes the kernel wait for
//! an RCU grace period (`maybe_wait_bpf_programs`: tens of milliseconds on
//! a busy host), so a page is inserted once, when its first slot is used,
//! and a table is then rewritten through memory: no system call, no wait.
//! Each write is a sequence lock (`ProcessMappingTable::seq` odd while it
//! lasts); BPF ignores a table being written and drops a sample whose
//! table changed under its walk.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, Ordering, fence};

use aya::maps::{ArrayOfMaps, MapData};
use icecore_unwinders::native::{
    ProcessMappingTable,
    mappings::{MAX_PROCESS_MAPPINGS, PROCESS_TABLES_PER_PAGE},
};

use crate::inner_array::{InnerArrays, InnerKind, MappedArray};
use crate::map_memory::map_memlock;
use crate::unwind_maps::UnwindMapError;

/// `BPF_F_MMAPABLE`: the flags of every page (`ebpf/src/maps.rs`).
pub const PROCESS_PAGE_FLAGS: u32 = 0x400;

/// One page: its inner map, mapped read-write.
struct Page {
    /// Kept open: the mapping holds the map, but the descriptor names it.
    map: MapData,
    tables: MappedArray,
}

impl Page {
    fn table(&mut self, index: usize) -> *mut ProcessMappingTable {
        let tables = self.tables.as_ptr().cast::<ProcessMappingTable>();
        // SAFETY: the mapping holds PROCESS_TABLES_PER_PAGE tables.
        unsafe { tables.add(index % PROCESS_TABLES_PER_PAGE) }
    }
}

/// The pages of `PROCESS_MAPPINGS` in use.
pub struct ProcessPages {
    outer: ArrayOfMaps<MapData, MapData>,
    kind: InnerKind,
    pages: Vec<Option<Page>>,
    /// Kernel memory of one page (all are alike); 0 before the first.
    page_memlock: u64,
}

impl ProcessPages {
    /// Takes `PROCESS_MAPPINGS`; `kind` is what its template accepts.
    pub fn new(outer: ArrayOfMaps<MapData, MapData>, kind: InnerKind) -> Self {
        let pages = (0..outer.len()).map(|_| None).collect();
        ProcessPages {
            outer,
            kind,
            pages,
            page_memlock: 0,
        }
    }

    /// Slots the pages can hold.
    pub fn capacity(&self) -> u32 {
        u32::try_from(self.pages.len() * PROCESS_TABLES_PER_PAGE).unwrap_or(u32::MAX)
    }

    /// Kernel memory of the pages inserted.
    pub fn memlock(&self) -> u64 {
        self.pages.iter().flatten().count() as u64 * self.page_memlock
    }

    /// Writes `table` (its `seq` ignored) at `slot`, inserting its page
    /// first if needed.
    pub fn write(
        &mut self,
        inner: &mut InnerArrays,
        slot: u32,
        table: &ProcessMappingTable,
    ) -> Result<(), UnwindMapError> {
        let page = self.page(inner, slot as usize / PROCESS_TABLES_PER_PAGE)?;
        let dst = page.table(slot as usize % PROCESS_TABLES_PER_PAGE);
        let count = (table.count as usize).min(MAX_PROCESS_MAPPINGS);
        // SAFETY: `dst` points at a table of the mapped page; BPF only reads
        // it, and this is its only writer (the `exec` tracepoint's store of
        // `pid` aside, which a torn write cannot make unsafe).
        unsafe {
            let seq = AtomicU32::from_ptr(&raw mut (*dst).seq);
            let before = seq.load(Ordering::Relaxed);
            seq.store(before.wrapping_add(1) | 1, Ordering::Relaxed);
            fence(Ordering::Release);
            (&raw mut (*dst).deferred_threads).write_volatile(table.deferred_threads);
            (&raw mut (*dst).count).write_volatile(table.count.min(MAX_PROCESS_MAPPINGS as u32));
            (&raw mut (*dst).reserved).write_volatile(0);
            (&raw mut (*dst).deferred_program).write_volatile(table.deferred_program);
            (&raw mut (*dst).pid).write_volatile(table.pid);
            std::ptr::copy_nonoverlapping(
                table.entries.as_ptr(),
                (&raw mut (*dst).entries).cast(),
                count,
            );
            fence(Ordering::Release);
            seq.store((before | 1).wrapping_add(1), Ordering::Release);
        }
        Ok(())
    }

    /// Marks the table at `slot` as no process's (BPF compares `pid`).
    pub fn clear(&mut self, slot: u32) {
        let Some(Some(page)) = self.pages.get_mut(slot as usize / PROCESS_TABLES_PER_PAGE) else {
            return;
        };
        let dst = page.table(slot as usize % PROCESS_TABLES_PER_PAGE);
        // SAFETY: as in `write`; one aligned store.
        unsafe {
            let seq = AtomicU32::from_ptr(&raw mut (*dst).seq);
            let before = seq.load(Ordering::Relaxed);
            seq.store(before.wrapping_add(1) | 1, Ordering::Relaxed);
            fence(Ordering::Release);
            (&raw mut (*dst).pid).write_volatile(0);
            (&raw mut (*dst).count).write_volatile(0);
            fence(Ordering::Release);
            seq.store((before | 1).wrapping_add(1), Ordering::Release);
        }
    }

    /// The pid the table at `slot` names (0 for none), as BPF sees it.
    pub fn pid_at(&mut self, slot: u32) -> u32 {
        let Some(Some(page)) = self.pages.get_mut(slot as usize / PROCESS_TABLES_PER_PAGE) else {
            return 0;
        };
        let table = page.table(slot as usize % PROCESS_TABLES_PER_PAGE);
        // SAFETY: an aligned load from the mapped page.
        unsafe { (&raw const (*table).pid).read_volatile() }
    }

    fn page(&mut self, inner: &mut InnerArrays, index: usize) -> Result<&mut Page, UnwindMapError> {
        let update = |source| UnwindMapError::Update {
            map: "PROCESS_MAPPINGS",
            source,
        };
        let Some(entry) = self.pages.get(index) else {
            return Err(UnwindMapError::NoFreeProcessSlot(self.capacity()));
        };
        if entry.is_none() {
            let map = inner
                .create(
                    self.kind,
                    size_of::<ProcessMappingTable>() as u32,
                    PROCESS_TABLES_PER_PAGE as u32,
                    PROCESS_PAGE_FLAGS,
                )
                .map_err(update)?;
            let tables = MappedArray::new(
                &map,
                PROCESS_TABLES_PER_PAGE * size_of::<ProcessMappingTable>(),
            )
            .map_err(UnwindMapError::Mmap)?;
            let page = Page { map, tables };
            // The one wait for a grace period, for the whole page.
            self.outer.set(index as u32, &page.map, 0).map_err(update)?;
            if self.page_memlock == 0 {
                self.page_memlock = map_memlock(page.map.fd().as_fd()).unwrap_or(0);
            }
            self.pages[index] = Some(page);
        }
        let capacity = self.capacity();
        match self.pages.get_mut(index) {
            Some(Some(page)) => Ok(page),
            _ => Err(UnwindMapError::NoFreeProcessSlot(capacity)),
        }
    }
}
