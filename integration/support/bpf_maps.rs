// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The native unwinder's BPF maps of a running icecore, read directly from the
//! kernel (not through icecore's metrics): `PROCESS_SLOTS` (pid → slot),
//! `PROCESS_MAPPINGS` (pages of `PROCESS_TABLES_PER_PAGE` process mapping
//! tables; slot `s` is table `s % N` of page `s / N`, named free by pid 0) and `UNWIND_TABLES` (slot → a file's table). The maps are found by name among the maps the
//! icecore process holds open (`/proc/PID/fdinfo`'s `map_id`), so another
//! agent running on the machine is never confused with the one under test.

use std::collections::{BTreeMap, BTreeSet};

use aya::maps::{Array, ArrayOfMaps, HashMap, Map, MapData, MapInfo, MapType};
use icecore_unwinders::native::{ProcessMappingTable, mappings::PROCESS_TABLES_PER_PAGE};

/// The names as the kernel stores them (at most 15 bytes).
const PROCESS_MAPPINGS: &str = "PROCESS_MAPPING";
const PROCESS_SLOTS: &str = "PROCESS_SLOTS";
const UNWIND_TABLES: &str = "UNWIND_TABLES";

/// One executable mapping of a process as BPF sees it (`table_rows` is 0
/// while the file has no table: frame pointers are used there).
pub use icecore_unwinders::native::MappingEntry;

/// The maps of one icecore process.
pub struct UnwinderMaps {
    slots: HashMap<MapData, u32, u32>,
    processes: ArrayOfMaps<MapData, Array<MapData, ProcessMappingTable>>,
    tables: ArrayOfMaps<MapData, MapData>,
    pub process_map_id: u32,
    pub tables_map_id: u32,
}

/// Ids of the BPF maps process `pid` holds file descriptors of.
fn map_ids_of(pid: u32) -> BTreeSet<u32> {
    let mut ids = BTreeSet::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for entry in dir.flatten() {
        let Ok(info) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        if let Some(id) = info
            .lines()
            .find_map(|l| l.strip_prefix("map_id:"))
            .and_then(|v| v.trim().parse().ok())
        {
            ids.insert(id);
        }
    }
    ids
}

fn find_map(name: &str, kind: MapType, owned: &BTreeSet<u32>) -> Option<MapData> {
    let candidates: Vec<MapInfo> = aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .filter(|info| info.name_as_str() == Some(name))
        .filter(|info| info.map_type().is_ok_and(|t| t == kind))
        .collect();
    // Only a map icecore holds (fdinfo has `map_id` on every kernel icecore
    // supports): before icecore created its maps, a lone map of that name
    // is the previous run's, still being freed.
    let info = candidates.iter().find(|info| owned.contains(&info.id()))?;
    MapData::from_id(info.id()).ok()
}

impl UnwinderMaps {
    /// The maps of icecore process `pid`; None until it has loaded them.
    pub fn of_icecore(pid: u32) -> Option<UnwinderMaps> {
        let owned = map_ids_of(pid);
        let processes = find_map(PROCESS_MAPPINGS, MapType::ArrayOfMaps, &owned)?;
        let slots = find_map(PROCESS_SLOTS, MapType::Hash, &owned)?;
        let tables = find_map(UNWIND_TABLES, MapType::ArrayOfMaps, &owned)?;
        let process_map_id = processes.info().ok()?.id();
        let tables_map_id = tables.info().ok()?.id();
        let processes = ArrayOfMaps::try_from(Map::ArrayOfMaps(processes))
            .unwrap_or_else(|e| panic!("{PROCESS_MAPPINGS} is not an array of maps: {e}"));
        let slots = HashMap::try_from(Map::HashMap(slots))
            .unwrap_or_else(|e| panic!("{PROCESS_SLOTS} is not a u32 → u32 hash: {e}"));
        let tables = ArrayOfMaps::try_from(Map::ArrayOfMaps(tables))
            .unwrap_or_else(|e| panic!("{UNWIND_TABLES} is not an array of maps: {e}"));
        Some(UnwinderMaps {
            slots,
            processes,
            tables,
            process_map_id,
            tables_map_id,
        })
    }

    /// Waits up to `timeout` for icecore process `pid` to have loaded the maps.
    pub fn wait_for(pid: u32, timeout: std::time::Duration) -> UnwinderMaps {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(maps) = UnwinderMaps::of_icecore(pid) {
                println!(
                    "icecore {pid}: {PROCESS_MAPPINGS}(S) is map {}, {UNWIND_TABLES} is map {}",
                    maps.process_map_id, maps.tables_map_id
                );
                return maps;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "icecore {pid} holds no BPF maps named {PROCESS_MAPPINGS}(S) and {UNWIND_TABLES} after {timeout:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Pids with a mapping table.
    pub fn pids(&self) -> BTreeSet<u32> {
        self.slots.keys().filter_map(Result::ok).collect()
    }

    /// Slots of `PROCESS_MAPPINGS` holding a process's table.
    pub fn process_slots(&self) -> BTreeSet<u32> {
        let per_page = PROCESS_TABLES_PER_PAGE as u32;
        (0..self.processes.len())
            .filter_map(|page| Some((page, self.processes.get(&page, 0).ok()?)))
            .flat_map(|(page, inner)| {
                (0..per_page).filter_map(move |index| {
                    let table = inner.get(&index, 0).ok()?;
                    (table.pid != 0).then_some(page * per_page + index)
                })
            })
            .collect()
    }

    /// Slots of `UNWIND_TABLES` holding a table.
    pub fn table_slots(&self) -> BTreeSet<u32> {
        (0..self.tables.len())
            .filter(|slot| self.tables.get(slot, 0).is_ok())
            .collect()
    }

    /// The mapping table of `pid` (entries in use only); None if it has none.
    ///
    /// icecore changes the maps while they are read: a slot read for `pid`
    /// may already be freed (its table names pid 0, as it also does while an
    /// exec'd image waits to be described again) or handed to another
    /// process. Such reads are retried; a slot that keeps naming another
    /// live pid is a real inconsistency and fails the test.
    pub fn mappings_of(&self, pid: u32) -> Option<Vec<MappingEntry>> {
        let per_page = PROCESS_TABLES_PER_PAGE as u32;
        let mut other = 0;
        for _ in 0..5 {
            let slot = self.slots.get(&pid, 0).ok()?;
            let inner = self.processes.get(&(slot / per_page), 0).ok()?;
            let table = inner.get(&(slot % per_page), 0).ok()?;
            if table.pid == pid {
                let count = (table.count as usize).min(table.entries.len());
                return Some(table.entries[..count].to_vec());
            }
            if table.pid == 0 {
                return None;
            }
            other = table.pid;
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("pid {pid}'s slot keeps naming pid {other}'s table");
    }

    /// A consistent view of both maps: every process's mapping table and the
    /// set of installed tables, read until two reads agree (icecore may change
    /// them in between).
    pub fn snapshot(&self) -> Snapshot {
        let mut last: Option<Snapshot> = None;
        for _ in 0..20 {
            let tables = self.table_slots();
            let process_slots = self.process_slots();
            let processes: BTreeMap<u32, Vec<MappingEntry>> = self
                .pids()
                .into_iter()
                .filter_map(|pid| self.mappings_of(pid).map(|m| (pid, m)))
                .collect();
            let snap = Snapshot {
                processes,
                tables,
                process_slots,
            };
            if last.as_ref() == Some(&snap) {
                return snap;
            }
            last = Some(snap);
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
        last.expect("at least one read")
    }
}

/// Both maps' content at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub processes: BTreeMap<u32, Vec<MappingEntry>>,
    /// Occupied slots of `UNWIND_TABLES`.
    pub tables: BTreeSet<u32>,
    /// Occupied slots of `PROCESS_MAPPINGS`.
    pub process_slots: BTreeSet<u32>,
}

impl Snapshot {
    /// The pids that have a mapping table.
    pub fn pids(&self) -> BTreeSet<u32> {
        self.processes.keys().copied().collect()
    }

    /// Table slots that some process's mapping table names with rows.
    pub fn referenced_tables(&self) -> BTreeSet<u32> {
        self.processes
            .values()
            .flatten()
            .filter(|e| e.table_rows > 0)
            .map(|e| e.table_slot)
            .collect()
    }
}

/// The executable mappings of `file` in process `pid`, from /proc/PID/maps
/// (`file` compared after canonicalization).
pub fn exec_mappings(pid: u32, file: &std::path::Path) -> Vec<(u64, u64)> {
    exec_mappings_with_offsets(pid, file)
        .into_iter()
        .map(|(start, end, _)| (start, end))
        .collect()
}

/// `exec_mappings` with each mapping's file offset: (start, end, offset).
pub fn exec_mappings_with_offsets(pid: u32, file: &std::path::Path) -> Vec<(u64, u64, u64)> {
    let file = file.canonicalize().unwrap_or_else(|_| file.to_path_buf());
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (range, perms, offset, path) = (
                fields.first()?,
                fields.get(1)?,
                fields.get(2)?,
                fields.get(5)?,
            );
            if !perms.contains('x') || std::path::Path::new(path) != file {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
                u64::from_str_radix(offset, 16).ok()?,
            ))
        })
        .collect()
}

/// True when BPF has an unwind table (rows > 0) for every executable mapping
/// of `file` in process `pid` (false while the file is not mapped).
pub fn has_tables_for(maps: &UnwinderMaps, pid: u32, file: &std::path::Path) -> bool {
    let wanted = exec_mappings(pid, file);
    let Some(entries) = maps.mappings_of(pid) else {
        return false;
    };
    !wanted.is_empty()
        && wanted.iter().all(|&(start, end)| {
            entries
                .iter()
                .any(|e| e.start <= start && end <= e.end && e.table_rows > 0)
        })
}
