//! Which unwind tables and mapping entries BPF holds: tables installed
//! while a process uses them and within the budget, the samples that keep
//! them there, and the descriptions that follow when they come and go.

use std::time::Instant;

use tracing::{debug, warn};

use super::{BUDGET_ROUNDS, FileKey, NativeUnwindInfo, TABLE_LINGER, budget::Sampled};
use crate::{process_maps::ProcessMappings, unwind_maps::UnwindMaps, unwind_table::BuiltTable};

impl NativeUnwindInfo {
    /// Records that `pid` uses a file's table, installing it if needed
    /// (making room in the budget), and returns its slot and whether BPF
    /// sees it yet; `None` when the table is not in BPF (left out by the
    /// budget, or failed).
    pub(super) fn use_table(
        &mut self,
        pid: u32,
        key: FileKey,
        built: &BuiltTable,
    ) -> Option<(u32, bool)> {
        let file_id = built.file_id;
        self.idle.remove(&file_id);
        self.users.entry(key).or_default().insert(pid);
        self.table_of.insert(key, file_id);
        // Out for the budget's sake (perhaps still in BPF on its way out):
        // frame pointers until a sample through it asks it back.
        if self.budget.is_outside(file_id) {
            return None;
        }
        let now = Instant::now();
        let new = !self.maps.has_table(file_id);
        let bytes = UnwindMaps::table_bytes(built.rows.len());
        if new {
            let Some(leaving) = self.budget.make_room(bytes, now) else {
                debug!(
                    file_id,
                    bytes,
                    used = self.budget.used(),
                    limit = self.budget.limit(),
                    installed = self.maps.installed_bytes(),
                    "unwind table left out: its budget is spent by recently sampled tables"
                );
                self.stats.tables_over_budget += 1;
                self.budget.leave_out(file_id);
                self.returning.remove(&file_id);
                return None;
            };
            if !leaving.is_empty() {
                debug!(file_id, ?leaving, "unwind tables leave for another");
            }
            self.stats.tables_evicted += leaving.len() as u64;
            self.leaving.extend(leaving);
        }
        match self
            .maps
            .install_rows(file_id, built.rows.len(), built.rows.iter())
        {
            Ok(slot) => {
                if new {
                    self.budget.admit(file_id, bytes, now);
                    if self.returning.remove(&file_id) {
                        // Back because a sample went through it: as
                        // recently sampled as that, not a never-sampled
                        // newcomer the next one would push out.
                        self.budget.sampled(file_id, now);
                        self.stats.tables_readmitted += 1;
                    }
                }
                let live = self.maps.is_live(file_id);
                if !live {
                    let waiting = self.installing.entry(file_id).or_default();
                    if !waiting.contains(&key) {
                        waiting.push(key);
                    }
                }
                Some((slot, live))
            }
            Err(e) => {
                self.stats.map_update_failures += 1;
                warn!("cannot install unwind table: {e}");
                None
            }
        }
    }

    pub(super) fn release_table(&mut self, pid: u32, key: FileKey) {
        let Some(users) = self.users.get_mut(&key) else {
            return;
        };
        users.remove(&pid);
        if users.is_empty() {
            self.users.remove(&key);
            if let Some(file_id) = self.table_of.remove(&key) {
                self.idle.insert(file_id, Instant::now());
            }
        }
    }

    /// Removes the tables idle for longer than [`TABLE_LINGER`].
    pub(super) fn remove_idle_tables(&mut self) {
        if self.idle.is_empty() {
            return;
        }
        let expired: Vec<u64> = self
            .idle
            .iter()
            .filter(|(_, since)| since.elapsed() >= TABLE_LINGER)
            .map(|(&file_id, _)| file_id)
            .collect();
        for file_id in expired {
            self.idle.remove(&file_id);
            self.maps.remove_table(file_id);
            self.budget.forget(file_id);
        }
    }

    /// Notes which files a sample's native frames are in: the budget keeps
    /// the most recently sampled tables, and a file whose table was left
    /// out comes back at the next poll.
    pub fn note_sample(&mut self, pid: u32, frames: impl Iterator<Item = u64>, now: Instant) {
        let Some(ranges) = self.file_ranges.get_mut(&pid) else {
            return;
        };
        let mut last = None;
        for address in frames {
            let index = ranges.partition_point(|r| r.start <= address);
            let Some(range) = index.checked_sub(1).and_then(|i| ranges.get_mut(i)) else {
                continue;
            };
            // Consecutive frames are mostly in one file.
            if address >= range.end || last == Some(range.file_id) {
                continue;
            }
            last = Some(range.file_id);
            range.last_sampled = Some(now);
            if !range.in_table {
                self.stats.mappings_sampled_left_out += 1;
                self.left_out.note(pid);
            }
            // A sampled file's table stays in the bounded cache of built
            // tables: dropped from it, the file would lose its range here
            // (so its samples would not count) and be rebuilt.
            self.files.promote(&range.key);
            if self.budget.sampled(range.file_id, now) == Sampled::Outside {
                self.sampled_outside.insert(range.file_id);
            }
        }
    }

    /// Takes the tables the budget chose to leave out of BPF, after
    /// describing their processes without them (a slot is reused only once
    /// no mapping table points at it), then lets the files sampled while
    /// out back in.
    pub(super) fn settle_budget<'a>(
        &mut self,
        mappings_of: &mut impl FnMut(u32) -> Option<&'a ProcessMappings>,
        described: &mut Vec<u32>,
    ) {
        for pid in self.left_out.due(Instant::now()) {
            debug!(pid, "a mapping left out of the process's table was sampled");
            self.describe_again(pid, mappings_of, described);
        }
        for _ in 0..BUDGET_ROUNDS {
            let leaving = std::mem::take(&mut self.leaving);
            let back: Vec<u64> = self.sampled_outside.drain().collect();
            if leaving.is_empty() && back.is_empty() {
                return;
            }
            for pid in self.processes_mapping(&leaving) {
                self.describe_again(pid, mappings_of, described);
            }
            for &file_id in &leaving {
                self.maps.remove_table(file_id);
            }
            for &file_id in &back {
                debug!(file_id, "unwind table sampled while out");
                if self.budget.readmit(file_id) {
                    self.returning.insert(file_id);
                }
            }
            for pid in self.processes_mapping(&back) {
                self.describe_again(pid, mappings_of, described);
            }
        }
    }

    /// The described processes that map any of `files`.
    pub(super) fn processes_mapping(&self, files: &[u64]) -> Vec<u32> {
        if files.is_empty() {
            return Vec::new();
        }
        self.file_ranges
            .iter()
            .filter(|(_, ranges)| ranges.iter().any(|r| files.contains(&r.file_id)))
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// Describes `pid` again with its current mappings, or forgets it
    /// when it has none any more.
    pub(super) fn describe_again<'a>(
        &mut self,
        pid: u32,
        mappings_of: &mut impl FnMut(u32) -> Option<&'a ProcessMappings>,
        described: &mut Vec<u32>,
    ) {
        match mappings_of(pid) {
            Some(mappings) => {
                let runtimes = self.runtimes.get(&pid).cloned().unwrap_or_default();
                self.describe_process(pid, mappings, &runtimes);
                described.push(pid);
            }
            None => self.forget_process(pid),
        }
    }
}
