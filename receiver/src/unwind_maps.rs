//! The BPF maps that describe native code to the unwinder: one unwind table
//! per executable file (an exactly-sized array of 4 KiB chunks filled through
//! mmap, set at a free slot of `UNWIND_TABLES`) and one mapping table per
//! process (at a free slot of `PROCESS_MAPPINGS`, found by BPF through the
//! pid → slot hash `PROCESS_SLOTS`).

use std::{collections::HashMap as StdHashMap, os::fd::AsFd};

use crate::inner_array::{InnerArrays, InnerKind, MappedArray};
use crate::map_memory::map_memlock;
use crate::process_pages::{PROCESS_PAGE_FLAGS, ProcessPages};
use crate::table_slots::{SlotWriter, delete_element};
use aya::maps::{Array, ArrayOfMaps, HashMap, Map, MapData, MapError};
use icecore_unwinders::{
    native::{
        ChunkLayout, ProcessMappingTable, UnwindChunk, UnwindRow,
        chunks::{FENCE_SLOTS, ROWS_PER_CHUNK},
        mappings::PROCESS_TABLES_PER_PAGE,
    },
    runtime::unknown_process,
};

/// The flags every unwind table must have: the kernel only accepts inner maps
/// whose flags match the template's (`ebpf/src/maps.rs`).
const UNWIND_TABLE_FLAGS: u32 = 0x400 /* BPF_F_MMAPABLE */ | 0x1000 /* BPF_F_INNER_MAP */;

/// A failure to update the unwinder's maps.
#[derive(Debug, thiserror::Error)]
pub enum UnwindMapError {
    /// Creating a table's array failed (often: the memory cgroup's limit).
    #[error("cannot create an unwind table of {rows} rows: {source}")]
    Create {
        /// Rows of the table.
        rows: usize,
        /// The kernel's answer.
        source: MapError,
    },
    /// Mapping a table's array into memory failed.
    #[error("cannot mmap an unwind table: {0}")]
    Mmap(std::io::Error),
    /// An update of `UNWIND_TABLES`, `PROCESS_MAPPINGS` or `PROCESS_SLOTS` failed.
    #[error("BPF map {map}: {source}")]
    Update {
        /// The map.
        map: &'static str,
        /// The kernel's answer.
        source: MapError,
    },
    /// The table is empty or larger than BPF can search.
    #[error("unwind table of {0} rows is empty or too large")]
    BadSize(usize),
    /// `UNWIND_TABLES` or `PROCESS_MAPPINGS` is not an array of maps, or its descriptor cannot be duplicated.
    #[error("unwind map descriptor: {0}")]
    Descriptor(std::io::Error),
    /// Every slot of `UNWIND_TABLES` holds a table.
    #[error("all {0} unwind table slots are in use")]
    NoFreeSlot(u32),
    /// Every slot of `PROCESS_MAPPINGS` holds a process's table.
    #[error("all {0} process mapping slots are in use")]
    NoFreeProcessSlot(u32),
    /// The thread that sets the slots of `UNWIND_TABLES` cannot start or is gone.
    #[error("unwind table slot writer: {0}")]
    SlotWriter(std::io::Error),
}

/// The maps [`UnwindMaps`] owns, as taken from the loaded object.
pub struct UnwindMapSet {
    /// `UNWIND_TABLES`: array of per-file unwind tables.
    pub tables: Map,
    /// `PROCESS_MAPPINGS`: array of per-process mapping tables.
    pub processes: Map,
    /// `PROCESS_SLOTS`: pid → slot in `PROCESS_MAPPINGS`.
    pub slots: Map,
    /// `UNKNOWN_PROCESS_POLICY`: what BPF does with a sample of a process
    /// without a mapping table.
    pub unknown_process_policy: Map,
}

/// A table in `UNWIND_TABLES`.
#[derive(Debug, Clone, Copy)]
struct Installed {
    slot: u32,
    bytes: usize,
    /// Kernel memory of its inner map (`memlock`).
    memlock: u64,
    /// Whether the slot holds the table yet (the set is done off the
    /// caller's thread, see [`crate::table_slots`]).
    live: bool,
}

/// A table's set that finished (see [`UnwindMaps::poll_installs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstallDone {
    /// The file.
    pub file_id: u64,
    /// Whether BPF can use its table now; false: the set failed, the table
    /// is not installed.
    pub live: bool,
}

/// Owner of the unwinder's maps.
pub struct UnwindMaps {
    tables: ArrayOfMaps<MapData, MapData>,
    /// `PROCESS_MAPPINGS`, a page of tables at a time.
    pages: ProcessPages,
    slots: HashMap<MapData, u32, u32>,
    unknown_process_policy: Array<MapData, u32>,
    /// The slot of each process with a table.
    process_slots: StdHashMap<u32, u32>,
    /// Unused slots of `PROCESS_MAPPINGS`, lowest last.
    free_process_slots: Vec<u32>,
    installed: StdHashMap<u64, Installed>,
    /// Unused slots of `UNWIND_TABLES`, lowest last.
    free_slots: Vec<u32>,
    installed_bytes: usize,
    /// Kernel memory of the installed tables' inner maps.
    tables_memlock: u64,
    /// Creates the inner maps of both outer maps...
    inner: InnerArrays,
    /// ...of the kind the unwind tables' template takes.
    table_kind: InnerKind,
    /// Sets and clears the slots of `UNWIND_TABLES`.
    slot_writer: SlotWriter,
    /// Woken when a set finishes.
    installed_notify: std::sync::Arc<tokio::sync::Notify>,
}

impl UnwindMaps {
    /// Wraps the maps taken from the loaded object.
    pub fn new(maps: UnwindMapSet) -> Result<Self, UnwindMapError> {
        let tables_fd = duplicate_array_of_maps(&maps.tables)?;
        let mut tables: ArrayOfMaps<MapData, MapData> = ArrayOfMaps::try_from(maps.tables)
            .map_err(|source| UnwindMapError::Update {
                map: "UNWIND_TABLES",
                source,
            })?;
        let free_slots = (0..tables.len()).rev().collect();
        let processes_fd = duplicate_array_of_maps(&maps.processes)?;
        let mut processes: ArrayOfMaps<MapData, MapData> = ArrayOfMaps::try_from(maps.processes)
            .map_err(|source| UnwindMapError::Update {
                map: "PROCESS_MAPPINGS",
                source,
            })?;
        let slots = HashMap::try_from(maps.slots).map_err(|source| UnwindMapError::Update {
            map: "PROCESS_SLOTS",
            source,
        })?;
        let unknown_process_policy =
            Array::try_from(maps.unknown_process_policy).map_err(|source| {
                UnwindMapError::Update {
                    map: "UNKNOWN_PROCESS_POLICY",
                    source,
                }
            })?;
        // One trial insert per outer map, into its last slot (handed out
        // last), tells which kind of inner map the kernel accepts.
        let mut inner = InnerArrays::default();
        let table_kind = {
            let last = tables.len() - 1;
            let kind = inner
                .probe(
                    size_of::<UnwindChunk>() as u32,
                    1,
                    UNWIND_TABLE_FLAGS,
                    |map| tables.set(last, &map, 0),
                )
                .map_err(|source| UnwindMapError::Update {
                    map: "UNWIND_TABLES",
                    source,
                })?;
            let _ = delete_element(tables_fd.as_fd(), last);
            kind
        };
        let process_kind = {
            let last = processes.len() - 1;
            let kind = inner
                .probe(
                    size_of::<ProcessMappingTable>() as u32,
                    PROCESS_TABLES_PER_PAGE as u32,
                    PROCESS_PAGE_FLAGS,
                    |map| processes.set(last, &map, 0),
                )
                .map_err(|source| UnwindMapError::Update {
                    map: "PROCESS_MAPPINGS",
                    source,
                })?;
            let _ = delete_element(processes_fd.as_fd(), last);
            kind
        };
        let pages = ProcessPages::new(processes, process_kind);
        let free_process_slots = (0..pages.capacity()).rev().collect();
        let installed_notify = std::sync::Arc::new(tokio::sync::Notify::new());
        let slot_writer = SlotWriter::spawn(tables_fd.as_fd(), installed_notify.clone())
            .map_err(UnwindMapError::SlotWriter)?;
        Ok(UnwindMaps {
            slot_writer,
            installed_notify,
            inner,
            table_kind,
            tables,
            pages,
            slots,
            unknown_process_policy,
            process_slots: StdHashMap::new(),
            free_process_slots,
            installed: StdHashMap::new(),
            free_slots,
            installed_bytes: 0,
            tables_memlock: 0,
        })
    }

    /// From now on BPF drops the samples of processes without a mapping
    /// table (and reports them) instead of walking them with frame pointers:
    /// for when user space describes every process it is told of.
    pub fn drop_unknown_processes(&mut self) -> Result<(), UnwindMapError> {
        self.unknown_process_policy
            .set(0, unknown_process::DROP, 0)
            .map_err(|source| UnwindMapError::Update {
                map: "UNKNOWN_PROCESS_POLICY",
                source,
            })
    }

    /// Installs the unwind table of a file (sorted rows) and returns its
    /// slot; a file already installed keeps its slot. BPF sees the table
    /// once [`Self::poll_installs`] reports it live.
    pub fn install_table(
        &mut self,
        file_id: u64,
        rows: &[UnwindRow],
    ) -> Result<u32, UnwindMapError> {
        self.install_rows(file_id, rows.len(), rows.iter().copied())
    }

    /// [`Self::install_table`] from `len` sorted rows given one by one: they
    /// are written straight into the new map, never gathered in memory.
    pub fn install_rows(
        &mut self,
        file_id: u64,
        len: usize,
        rows: impl Iterator<Item = UnwindRow>,
    ) -> Result<u32, UnwindMapError> {
        if let Some(installed) = self.installed.get(&file_id) {
            return Ok(installed.slot);
        }
        let layout = u32::try_from(len)
            .ok()
            .and_then(ChunkLayout::of)
            .ok_or(UnwindMapError::BadSize(len))?;
        let count = layout.elements();
        let slot = *self
            .free_slots
            .last()
            .ok_or(UnwindMapError::NoFreeSlot(self.tables.len()))?;
        let inner = self
            .inner
            .create(
                self.table_kind,
                size_of::<UnwindChunk>() as u32,
                count,
                UNWIND_TABLE_FLAGS,
            )
            .map_err(|source| UnwindMapError::Create { rows: len, source })?;
        write_rows_through_mmap(&inner, layout, len, rows)?;
        let memlock = map_memlock(inner.fd().as_fd()).unwrap_or(0);
        // The slot is set on the writer's thread (an RCU grace period);
        // the table is live once `poll_installs` says so.
        self.slot_writer
            .set(slot, file_id, inner)
            .map_err(UnwindMapError::SlotWriter)?;
        self.free_slots.pop();
        let bytes = count as usize * size_of::<UnwindChunk>();
        self.installed.insert(
            file_id,
            Installed {
                slot,
                bytes,
                memlock,
                live: false,
            },
        );
        self.installed_bytes += bytes;
        self.tables_memlock += memlock;
        Ok(slot)
    }

    /// Bytes a table of `rows` rows takes in BPF (its chunks).
    pub fn table_bytes(rows: usize) -> usize {
        u32::try_from(rows)
            .ok()
            .and_then(icecore_unwinders::native::ChunkLayout::of)
            .map_or(0, |l| l.elements() as usize * size_of::<UnwindChunk>())
    }

    /// Removes a file's table; a missing one is not an error.
    pub fn remove_table(&mut self, file_id: u64) {
        if let Some(installed) = self.installed.remove(&file_id) {
            self.installed_bytes -= installed.bytes;
            self.tables_memlock -= installed.memlock;
            // Cleared on the writer's thread, in order: a set of the slot
            // asked for later comes after the clear, so it is free now.
            if let Err(e) = self.slot_writer.clear(installed.slot) {
                tracing::warn!(
                    slot = installed.slot,
                    "cannot clear an unwind table slot: {e}"
                );
                return;
            }
            self.free_slots.push(installed.slot);
        }
    }

    /// Whether a file's table is installed (live or being set).
    pub fn has_table(&self, file_id: u64) -> bool {
        self.installed.contains_key(&file_id)
    }

    /// Whether BPF can use a file's table.
    pub fn is_live(&self, file_id: u64) -> bool {
        self.installed.get(&file_id).is_some_and(|i| i.live)
    }

    /// The tables whose slot was set (or failed to be) since the last call.
    /// A failed one is no longer installed and its slot is free again.
    pub fn poll_installs(&mut self) -> Vec<InstallDone> {
        let mut done = Vec::new();
        for set in self.slot_writer.finished() {
            // A table removed (and perhaps installed again elsewhere) while
            // its set waited is not this set's.
            let Some(installed) = self
                .installed
                .get_mut(&set.file_id)
                .filter(|i| i.slot == set.slot)
            else {
                continue;
            };
            match set.result {
                Ok(()) => {
                    installed.live = true;
                    done.push(InstallDone {
                        file_id: set.file_id,
                        live: true,
                    });
                }
                Err(e) => {
                    tracing::warn!(slot = set.slot, "cannot install unwind table: {e}");
                    let installed = *installed;
                    self.installed.remove(&set.file_id);
                    self.installed_bytes -= installed.bytes;
                    self.tables_memlock -= installed.memlock;
                    self.free_slots.push(installed.slot);
                    done.push(InstallDone {
                        file_id: set.file_id,
                        live: false,
                    });
                }
            }
        }
        done
    }

    /// Table sets queued and not yet reported by [`Self::poll_installs`].
    pub fn installs_pending(&self) -> usize {
        self.slot_writer.pending()
    }

    /// Woken each time a table's set finishes.
    pub fn install_notifier(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.installed_notify.clone()
    }

    /// Bytes of table rows installed.
    pub fn installed_bytes(&self) -> usize {
        self.installed_bytes
    }

    /// Kernel memory of the inner maps (tables and process mapping tables),
    /// which no descriptor of this process holds once installed.
    pub fn inner_map_bytes(&self) -> u64 {
        self.tables_memlock + self.pages.memlock()
    }

    /// Tables installed.
    pub fn table_count(&self) -> usize {
        self.installed.len()
    }

    /// Writes a process's mapping table. `table.pid` is set to `pid`: BPF
    /// checks it before trusting a slot it remembered.
    pub fn set_process(
        &mut self,
        pid: u32,
        table: &ProcessMappingTable,
    ) -> Result<(), UnwindMapError> {
        let mut table = *table;
        table.pid = pid;
        if let Some(&slot) = self.process_slots.get(&pid) {
            self.pages.write(&mut self.inner, slot, &table)?;
            // The `exec` tracepoint may have dropped the hash entry's table
            // (it clears `pid`); the write above restored it.
            return Ok(());
        }
        let slot = *self
            .free_process_slots
            .last()
            .ok_or(UnwindMapError::NoFreeProcessSlot(self.pages.capacity()))?;
        // The table first, then the hash entry that leads BPF to it.
        self.pages.write(&mut self.inner, slot, &table)?;
        if let Err(source) = self.slots.insert(pid, slot, 0) {
            // Not published: the slot stays free.
            self.pages.clear(slot);
            return Err(UnwindMapError::Update {
                map: "PROCESS_SLOTS",
                source,
            });
        }
        self.free_process_slots.pop();
        self.process_slots.insert(pid, slot);
        Ok(())
    }

    /// Whether `pid` has a mapping table.
    pub fn has_process(&self, pid: u32) -> bool {
        self.process_slots.contains_key(&pid)
    }

    /// Removes a process's mapping table; a missing one is not an error.
    pub fn remove_process(&mut self, pid: u32) {
        let Some(slot) = self.process_slots.remove(&pid) else {
            return;
        };
        // The hash entry first: from then on BPF only reaches the slot
        // through a CPU's cache, which checks the table's pid.
        let _ = self.slots.remove(&pid);
        self.pages.clear(slot);
        self.free_process_slots.push(slot);
    }

    /// Processes with a mapping table in BPF (walks the map: for tests and metrics).
    pub fn process_count(&self) -> usize {
        self.slots.keys().filter(Result::is_ok).count()
    }
}

/// A second descriptor of an array of maps, for the element calls aya lacks.
fn duplicate_array_of_maps(map: &Map) -> Result<std::os::fd::OwnedFd, UnwindMapError> {
    match map {
        Map::ArrayOfMaps(data) => data.fd().as_fd().try_clone_to_owned(),
        _ => Err(std::io::Error::other("not an array of maps")),
    }
    .map_err(UnwindMapError::Descriptor)
}

/// Writes `len` sorted rows into a freshly created mmap-able array laid out
/// as `layout` (fence, then rows, padded as
/// [`to_chunks`](icecore_unwinders::native::chunks::to_chunks) pads them): one
/// pass over the rows, no copy of the table in between.
fn write_rows_through_mmap(
    map: &MapData,
    layout: ChunkLayout,
    len: usize,
    rows: impl Iterator<Item = UnwindRow>,
) -> Result<(), UnwindMapError> {
    let elements = layout.elements() as usize;
    let mapped =
        MappedArray::new(map, elements * size_of::<UnwindChunk>()).map_err(UnwindMapError::Mmap)?;
    // SAFETY: the mapping holds `elements` chunks, is aligned to a page, not
    // aliased while `chunks` lives, and every bit pattern is a valid chunk.
    let chunks =
        unsafe { std::slice::from_raw_parts_mut(mapped.as_ptr().cast::<UnwindChunk>(), elements) };
    let per_fence = layout.stride as usize * ROWS_PER_CHUNK;
    let mut fence = [u32::MAX; FENCE_SLOTS];
    let mut written = 0usize;
    for (i, row) in rows.take(len).enumerate() {
        if i % per_fence == 0 {
            fence[i / per_fence] = row.pc;
        }
        chunks[1 + i / ROWS_PER_CHUNK].rows[i % ROWS_PER_CHUNK] = row;
        written += 1;
    }
    // Padding sorts after every row (see `find_row`).
    let padding = UnwindRow {
        pc: u32::MAX,
        ..UnwindRow::default()
    };
    for i in written..layout.data_chunks as usize * ROWS_PER_CHUNK {
        chunks[1 + i / ROWS_PER_CHUNK].rows[i % ROWS_PER_CHUNK] = padding;
    }
    chunks[0] = UnwindChunk::from_fence(fence);
    // Unmapped: `chunks` is not used after this.
    drop(mapped);
    if written != len {
        return Err(UnwindMapError::BadSize(written));
    }
    Ok(())
}
