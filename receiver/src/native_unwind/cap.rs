//! Which of a process's executable mappings its BPF mapping table holds
//! when the process has more than the table's [`MAX_PROCESS_MAPPINGS`]
//! (a program that `dlopen`s hundreds of plugins).
//!
//! A sample through a mapping left out is cut short there (BPF finds no
//! table for the frame and tries frame pointers). So the mappings samples
//! went through most recently stay, and one left out that a sample goes
//! through comes back at the agent's next poll, in place of the least
//! recently sampled. Before any sample, the loader's order decides: the
//! executable (the lowest file mapping) stays, and so do the libraries
//! mapped first, which the loader places highest (`ld.so`, libc, the
//! program's own dependencies: on nearly every stack); the libraries
//! `dlopen`ed last, lowest, leave first. Runtime code entries always stay:
//! they hand frames to the runtimes' programs.

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use icecore_unwinders::{Dispatch, native::MappingEntry};

#[cfg(doc)]
use icecore_unwinders::native::mappings::MAX_PROCESS_MAPPINGS;

/// A process is described again for a mapping sampled while left out at
/// most this often: a working set larger than the table would otherwise be
/// rewritten at every poll.
pub const REDESCRIBE_EVERY: Duration = Duration::from_secs(1);

/// `entries` (sorted by start) cut to at most `max`, sorted by start: runtime
/// code first, then the executable's entries, then the most recently
/// sampled (`last_sampled` says when a sample last went through an entry's
/// mapping), then the highest. The entries dropped are returned second.
pub fn keep_within(
    entries: Vec<MappingEntry>,
    max: usize,
    last_sampled: impl Fn(&MappingEntry) -> Option<Instant>,
) -> (Vec<MappingEntry>, usize) {
    if entries.len() <= max {
        return (entries, 0);
    }
    let is_runtime = |e: &MappingEntry| {
        e.dispatch == Dispatch::Handover as u8 || e.dispatch == Dispatch::Deferred as u8
    };
    // The executable: the file of the lowest entry with a table.
    let executable = entries
        .iter()
        .find(|e| !is_runtime(e) && e.file_id != 0)
        .map(|e| e.file_id);
    // Smaller ranks stay first.
    let rank = |e: &MappingEntry| {
        let class: u8 = if is_runtime(e) {
            0
        } else if e.file_id != 0 && Some(e.file_id) == executable {
            1
        } else {
            2
        };
        (class, Reverse(last_sampled(e)), Reverse(e.start))
    };
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_cached_key(|&i| entries.get(i).map(rank));
    let mut kept: Vec<usize> = order.into_iter().take(max).collect();
    kept.sort_unstable();
    let dropped = entries.len() - kept.len();
    let kept = kept
        .into_iter()
        .filter_map(|i| entries.get(i).copied())
        .collect();
    (kept, dropped)
}

/// The processes with mappings left out of their tables: how many each,
/// those a sample went through one of since (waiting to be described
/// again), and when each last was for that reason.
#[derive(Debug, Default)]
pub struct LeftOut {
    counts: HashMap<u32, usize>,
    waiting: HashSet<u32>,
    described_at: HashMap<u32, Instant>,
}

impl LeftOut {
    /// Records that `pid`'s table now leaves `count` mappings out; true if
    /// it left none out before.
    pub fn set_count(&mut self, pid: u32, count: usize) -> bool {
        if count == 0 {
            self.counts.remove(&pid);
            return false;
        }
        self.counts.insert(pid, count).is_none()
    }

    /// Mappings left out of all processes' tables now.
    pub fn total(&self) -> usize {
        self.counts.values().sum()
    }

    /// A sample of `pid` went through one of its mappings left out.
    pub fn note(&mut self, pid: u32) {
        self.waiting.insert(pid);
    }

    /// The processes to describe again now, at most one per
    /// [`REDESCRIBE_EVERY`] each (the others wait for a later poll).
    pub fn due(&mut self, now: Instant) -> Vec<u32> {
        let due: Vec<u32> = self
            .waiting
            .iter()
            .copied()
            .filter(|pid| {
                self.described_at
                    .get(pid)
                    .is_none_or(|&at| now.saturating_duration_since(at) >= REDESCRIBE_EVERY)
            })
            .collect();
        for pid in &due {
            self.waiting.remove(pid);
            self.described_at.insert(*pid, now);
        }
        due
    }

    /// Forgets a process that exited or exec'd.
    pub fn forget(&mut self, pid: u32) {
        self.counts.remove(&pid);
        self.waiting.remove(&pid);
        self.described_at.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(start: u64, file_id: u64, dispatch: Dispatch) -> MappingEntry {
        MappingEntry {
            start,
            end: start + 0x1000,
            file_id,
            dispatch: dispatch as u8,
            ..MappingEntry::default()
        }
    }

    fn starts(entries: &[MappingEntry]) -> Vec<u64> {
        entries.iter().map(|e| e.start).collect()
    }

    #[test]
    fn within_the_cap_nothing_changes() {
        let entries = vec![
            entry(0x1000, 1, Dispatch::Native),
            entry(0x9000, 2, Dispatch::Native),
        ];
        let (kept, dropped) = keep_within(entries.clone(), 2, |_| None);
        assert_eq!(starts(&kept), starts(&entries));
        assert_eq!(dropped, 0);
    }

    #[test]
    fn unsampled_the_executable_and_the_highest_stay() {
        // The executable low, five libraries above it, the vDSO on top.
        let mut entries = vec![entry(0x10_000, 1, Dispatch::Native)];
        entries.extend((0..5).map(|i| entry(0x100_000 + i * 0x10_000, 10 + i, Dispatch::Native)));
        entries.push(entry(0x7f0_000, 99, Dispatch::Native));
        let (kept, dropped) = keep_within(entries, 4, |_| None);
        assert_eq!(dropped, 3);
        assert_eq!(starts(&kept), [0x10_000, 0x130_000, 0x140_000, 0x7f0_000]);
    }

    #[test]
    fn the_most_recently_sampled_stay_and_runtime_code_always() {
        let t0 = Instant::now();
        let entries = vec![
            entry(0x10_000, 1, Dispatch::Native),
            entry(0x20_000, 0, Dispatch::Handover),
            entry(0x30_000, 2, Dispatch::Native),
            entry(0x40_000, 3, Dispatch::Native),
            entry(0x50_000, 4, Dispatch::Native),
            entry(0x60_000, 5, Dispatch::Native),
        ];
        let sampled = |e: &MappingEntry| match e.file_id {
            2 => Some(t0 + Duration::from_secs(3)),
            3 => Some(t0 + Duration::from_secs(1)),
            4 => Some(t0 + Duration::from_secs(2)),
            _ => None,
        };
        let (kept, dropped) = keep_within(entries, 4, sampled);
        assert_eq!(dropped, 2);
        // Runtime code, the executable, then files 2 and 4 (the most recent).
        assert_eq!(starts(&kept), [0x10_000, 0x20_000, 0x30_000, 0x50_000]);
    }

    #[test]
    fn a_process_is_described_again_at_most_once_a_second() {
        let t0 = Instant::now();
        let mut left_out = LeftOut::default();
        left_out.note(7);
        left_out.note(8);
        let mut due = left_out.due(t0);
        due.sort_unstable();
        assert_eq!(due, [7, 8]);
        assert!(left_out.due(t0).is_empty());
        left_out.note(7);
        assert!(left_out.due(t0 + Duration::from_millis(500)).is_empty());
        assert_eq!(left_out.due(t0 + REDESCRIBE_EVERY), [7]);
        left_out.note(8);
        left_out.forget(8);
        assert!(left_out.due(t0 + 2 * REDESCRIBE_EVERY).is_empty());
    }

    #[test]
    fn counts_are_per_process_and_the_first_is_told() {
        let mut left_out = LeftOut::default();
        assert!(left_out.set_count(7, 48));
        assert!(!left_out.set_count(7, 40));
        assert!(left_out.set_count(8, 2));
        assert_eq!(left_out.total(), 42);
        assert!(!left_out.set_count(8, 0));
        left_out.forget(7);
        assert_eq!(left_out.total(), 0);
        assert!(left_out.set_count(7, 1));
    }
}
