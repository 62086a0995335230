//! The BPF maps that describe native code to the unwinder: one unwind table
//! per executable file (an exactly-sized array filled through mmap, inserted
//! into `UNWIND_TABLES`) and one mapping table per process.

use std::{
    collections::HashMap as StdHashMap,
    os::fd::{AsFd, AsRawFd},
};

use aya::maps::{Array, HashOfMaps, Map, MapData, MapError};
use icecore_unwinders::native::{ProcessMappingTable, UnwindRow};

/// The flags every unwind table must have: the kernel only accepts inner maps
/// whose flags match the template's (`ebpf/src/maps.rs`).
const UNWIND_TABLE_FLAGS: u32 = 0x400 /* BPF_F_MMAPABLE */ | 0x1000 /* BPF_F_INNER_MAP */;
const BPF_MAP_TYPE_ARRAY: u32 = 2;

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
    /// An update of `UNWIND_TABLES` or `PROCESS_MAPPINGS` failed.
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
}

/// Owner of the unwinder's maps.
pub struct UnwindMaps {
    tables: HashOfMaps<MapData, u64, MapData>,
    processes: HashOfMaps<MapData, u32, Array<MapData, ProcessMappingTable>>,
    installed: StdHashMap<u64, usize>,
    installed_bytes: usize,
}

impl UnwindMaps {
    /// Wraps the maps taken from the loaded object.
    pub fn new(tables: Map, processes: Map) -> Result<Self, UnwindMapError> {
        let tables = HashOfMaps::try_from(tables).map_err(|source| UnwindMapError::Update {
            map: "UNWIND_TABLES",
            source,
        })?;
        let processes =
            HashOfMaps::try_from(processes).map_err(|source| UnwindMapError::Update {
                map: "PROCESS_MAPPINGS",
                source,
            })?;
        Ok(UnwindMaps {
            tables,
            processes,
            installed: StdHashMap::new(),
            installed_bytes: 0,
        })
    }

    /// Installs (or replaces) the unwind table of a file.
    pub fn install_table(
        &mut self,
        file_id: u64,
        rows: &[UnwindRow],
    ) -> Result<(), UnwindMapError> {
        let count = u32::try_from(rows.len())
            .ok()
            .filter(|&n| n > 0 && n <= icecore_unwinders::native::dwarf::MAX_TABLE_ROWS)
            .ok_or(UnwindMapError::BadSize(rows.len()))?;
        let params = aya_obj::Map::new_from_params(
            BPF_MAP_TYPE_ARRAY,
            4,
            size_of::<UnwindRow>() as u32,
            count,
            UNWIND_TABLE_FLAGS,
        );
        let inner = MapData::create(params, "unwind_table", None).map_err(|source| {
            UnwindMapError::Create {
                rows: rows.len(),
                source,
            }
        })?;
        write_through_mmap(&inner, rows)?;
        self.tables
            .insert(file_id, &inner, 0)
            .map_err(|source| UnwindMapError::Update {
                map: "UNWIND_TABLES",
                source,
            })?;
        // The outer map now holds the kernel's reference; `inner` may close.
        let bytes = std::mem::size_of_val(rows);
        if let Some(old) = self.installed.insert(file_id, bytes) {
            self.installed_bytes -= old;
        }
        self.installed_bytes += bytes;
        Ok(())
    }

    /// Removes a file's table; a missing one is not an error.
    pub fn remove_table(&mut self, file_id: u64) {
        if let Some(bytes) = self.installed.remove(&file_id) {
            self.installed_bytes -= bytes;
            let _ = self.tables.remove(&file_id);
        }
    }

    /// Whether a file's table is installed.
    pub fn has_table(&self, file_id: u64) -> bool {
        self.installed.contains_key(&file_id)
    }

    /// Bytes of table rows installed.
    pub fn installed_bytes(&self) -> usize {
        self.installed_bytes
    }

    /// Tables installed.
    pub fn table_count(&self) -> usize {
        self.installed.len()
    }

    /// Writes a process's mapping table.
    pub fn set_process(
        &mut self,
        pid: u32,
        table: &ProcessMappingTable,
    ) -> Result<(), UnwindMapError> {
        let update = |source| UnwindMapError::Update {
            map: "PROCESS_MAPPINGS",
            source,
        };
        // A fresh inner array per write: the kernel swaps the pointer
        // atomically, so BPF never sees a half-written table.
        let mut inner = Array::<MapData, ProcessMappingTable>::create(1, 0).map_err(update)?;
        inner.set(0, table, 0).map_err(update)?;
        self.processes.insert(pid, &inner, 0).map_err(update)
    }

    /// Removes a process's mapping table; a missing one is not an error.
    pub fn remove_process(&mut self, pid: u32) {
        let _ = self.processes.remove(&pid);
    }

    /// Processes with a mapping table in BPF (walks the map: for tests and metrics).
    pub fn process_count(&self) -> usize {
        self.processes.keys().filter(Result::is_ok).count()
    }
}

/// Copies `rows` into a freshly created mmap-able array: one memcpy instead
/// of one syscall per row.
fn write_through_mmap(map: &MapData, rows: &[UnwindRow]) -> Result<(), UnwindMapError> {
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let bytes = std::mem::size_of_val(rows);
    let length = bytes.div_ceil(page) * page;
    let fd = map.fd().as_fd().as_raw_fd();
    // SAFETY: a fresh shared mapping of the array's whole (page-rounded) size.
    let address = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            length,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if address == libc::MAP_FAILED {
        return Err(UnwindMapError::Mmap(std::io::Error::last_os_error()));
    }
    // SAFETY: the mapping is at least `bytes` long and not aliased; rows are POD.
    unsafe {
        std::ptr::copy_nonoverlapping(rows.as_ptr().cast::<u8>(), address.cast::<u8>(), bytes);
        libc::munmap(address, length);
    }
    Ok(())
}
