//! Which unwind tables BPF holds when their memory budget
//! (`--unwind-table-memory`) is spent.
//!
//! A crowded host maps more distinct executables than the budget holds. The
//! tables no sample went through leave first (most files a process maps
//! are never on a sampled stack), then those least recently sampled; a file
//! whose table left is unwound with frame pointers, and when a sample goes
//! through it again its table comes back, making room the same way. A table
//! sampled within [`RECENTLY_SAMPLED`] never leaves for another, nor one
//! installed within [`JUST_INSTALLED`]: when the budget cannot hold both,
//! the newcomer stays out (counted), so that a working set larger than the
//! budget does not thrash through the kernel's RCU waits (each table set or
//! cleared waits for one).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// A table used this recently is not taken out for another.
pub const RECENTLY_SAMPLED: Duration = Duration::from_secs(5);
/// A table installed this recently and not sampled yet is not taken out for
/// another (the tables of one process's description would push each other
/// out).
pub const JUST_INSTALLED: Duration = Duration::from_secs(1);

/// A table in BPF.
#[derive(Debug, Clone, Copy)]
struct Resident {
    bytes: usize,
    /// When a sample last went through the file, or when it was installed.
    last_used: Instant,
    /// Whether a sample went through the file since it was installed.
    sampled: bool,
}

impl Resident {
    /// Whether the table may leave for another at `now`.
    fn may_leave(&self, now: Instant) -> bool {
        let kept = if self.sampled {
            RECENTLY_SAMPLED
        } else {
            JUST_INSTALLED
        };
        now.saturating_duration_since(self.last_used) >= kept
    }
}

/// What a sample through a file means for its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sampled {
    /// The table is in BPF; its recency is renewed.
    Resident,
    /// The table is out of BPF for the budget's sake: it should come back.
    Outside,
    /// The budget knows no table of the file.
    Unknown,
}

/// The tables in BPF, their bytes and recency, and the files left out.
#[derive(Debug)]
pub struct TableBudget {
    limit: usize,
    used: usize,
    resident: HashMap<u64, Resident>,
    /// Files (by id) whose table is out of BPF for the budget's sake.
    outside: HashSet<u64>,
}

impl TableBudget {
    /// A budget of `limit` bytes of table rows.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            used: 0,
            resident: HashMap::new(),
            outside: HashSet::new(),
        }
    }

    /// The budget.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes of the tables in BPF that are not on their way out.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Whether the file's table is out of BPF for the budget's sake.
    pub fn is_outside(&self, file_id: u64) -> bool {
        self.outside.contains(&file_id)
    }

    /// Records a table put into BPF.
    pub fn admit(&mut self, file_id: u64, bytes: usize, now: Instant) {
        self.outside.remove(&file_id);
        let old = self.resident.insert(
            file_id,
            Resident {
                bytes,
                last_used: now,
                sampled: false,
            },
        );
        self.used = self.used + bytes - old.map_or(0, |r| r.bytes);
    }

    /// Forgets a file: its table left BPF because no process maps it.
    pub fn forget(&mut self, file_id: u64) {
        if let Some(resident) = self.resident.remove(&file_id) {
            self.used -= resident.bytes;
        }
        self.outside.remove(&file_id);
    }

    /// A sample went through the file.
    pub fn sampled(&mut self, file_id: u64, now: Instant) -> Sampled {
        if let Some(resident) = self.resident.get_mut(&file_id) {
            resident.last_used = resident.last_used.max(now);
            resident.sampled = true;
            Sampled::Resident
        } else if self.outside.contains(&file_id) {
            Sampled::Outside
        } else {
            Sampled::Unknown
        }
    }

    /// Keeps a file's table out: it did not fit.
    pub fn leave_out(&mut self, file_id: u64) {
        if !self.resident.contains_key(&file_id) {
            self.outside.insert(file_id);
        }
    }

    /// Lets a file left out in again (it was sampled); false if it was not out.
    pub fn readmit(&mut self, file_id: u64) -> bool {
        self.outside.remove(&file_id)
    }

    /// Makes room for a table of `bytes`: the tables that may leave (see
    /// the module's text) are marked outside and returned, never-sampled
    /// ones first, then the least recently sampled, for the caller to take
    /// out of BPF. None, and nothing leaves, when even all of them would not
    /// make room.
    pub fn make_room(&mut self, bytes: usize, now: Instant) -> Option<Vec<u64>> {
        if self.used + bytes <= self.limit {
            return Some(Vec::new());
        }
        if bytes > self.limit {
            return None;
        }
        let mut candidates: Vec<(bool, Instant, u64, usize)> = self
            .resident
            .iter()
            .filter(|(_, r)| r.may_leave(now))
            .map(|(&file_id, r)| (r.sampled, r.last_used, file_id, r.bytes))
            .collect();
        candidates.sort_unstable();
        let need = self.used + bytes - self.limit;
        let mut freed = 0;
        let mut leaving = Vec::new();
        for (_, _, file_id, table_bytes) in candidates {
            if freed >= need {
                break;
            }
            freed += table_bytes;
            leaving.push(file_id);
        }
        if freed < need {
            return None;
        }
        for file_id in &leaving {
            if let Some(resident) = self.resident.remove(file_id) {
                self.used -= resident.bytes;
            }
            self.outside.insert(*file_id);
        }
        Some(leaving)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1024;

    fn at(base: Instant, secs: u64) -> Instant {
        base + Duration::from_secs(secs)
    }

    #[test]
    fn the_least_recently_sampled_leave_first() {
        let t0 = Instant::now();
        let mut budget = TableBudget::new(100 * KIB);
        for id in 1..=4 {
            assert_eq!(budget.make_room(25 * KIB, t0), Some(Vec::new()));
            budget.admit(id, 25 * KIB, t0);
        }
        assert_eq!(budget.used(), 100 * KIB);
        // 1 and 3 are sampled later than 2 and 4; 4 later than 2.
        assert_eq!(budget.sampled(1, at(t0, 10)), Sampled::Resident);
        assert_eq!(budget.sampled(3, at(t0, 11)), Sampled::Resident);
        assert_eq!(budget.sampled(4, at(t0, 2)), Sampled::Resident);
        assert_eq!(budget.sampled(2, at(t0, 1)), Sampled::Resident);
        // 40 KiB more: 2 (sampled at 1 s), then 4 (2 s) leave.
        let now = at(t0, 20);
        assert_eq!(budget.make_room(40 * KIB, now), Some(vec![2, 4]));
        assert!(budget.is_outside(2) && budget.is_outside(4));
        assert_eq!(budget.used(), 50 * KIB);
        budget.admit(5, 40 * KIB, now);
        assert_eq!(budget.used(), 90 * KIB);
        // A sample through a table that left asks for it back.
        assert_eq!(budget.sampled(2, now), Sampled::Outside);
        assert_eq!(budget.sampled(9, now), Sampled::Unknown);
        assert!(budget.readmit(2));
        assert!(!budget.readmit(2));
        assert!(!budget.is_outside(2));
    }

    #[test]
    fn recently_sampled_tables_stay_and_the_newcomer_is_left_out() {
        let t0 = Instant::now();
        let mut budget = TableBudget::new(100 * KIB);
        budget.admit(1, 60 * KIB, t0);
        budget.admit(2, 40 * KIB, t0);
        let now = at(t0, 30);
        budget.sampled(1, at(t0, 28));
        // Only 2 may leave, and 40 KiB is not enough for 50.
        assert_eq!(budget.make_room(50 * KIB, now), None);
        assert!(!budget.is_outside(2), "nothing leaves for nothing");
        assert_eq!(budget.used(), 100 * KIB);
        budget.leave_out(3);
        assert!(budget.is_outside(3));
        // A table larger than the whole budget never fits.
        assert_eq!(budget.make_room(101 * KIB, at(t0, 1000)), None);
        // 40 KiB is.
        assert_eq!(budget.make_room(40 * KIB, now), Some(vec![2]));
    }

    #[test]
    fn tables_never_sampled_leave_first_after_a_grace() {
        let t0 = Instant::now();
        let mut budget = TableBudget::new(64 * KIB);
        budget.admit(1, 32 * KIB, t0);
        budget.sampled(1, t0);
        budget.admit(2, 32 * KIB, at(t0, 5));
        // 2 was never sampled, but installed under a second ago.
        assert_eq!(
            budget.make_room(32 * KIB, at(t0, 5) + Duration::from_millis(500)),
            Some(vec![1])
        );
        budget.admit(3, 32 * KIB, at(t0, 6));
        budget.sampled(3, at(t0, 6));
        // At 20 s both may leave: 2, never sampled, goes before 3.
        assert_eq!(budget.make_room(32 * KIB, at(t0, 20)), Some(vec![2]));
    }

    #[test]
    fn forgotten_files_free_their_bytes_and_their_place_outside() {
        let t0 = Instant::now();
        let mut budget = TableBudget::new(64 * KIB);
        budget.admit(1, 32 * KIB, t0);
        budget.admit(1, 16 * KIB, t0);
        assert_eq!(
            budget.used(),
            16 * KIB,
            "a table admitted twice counts once"
        );
        budget.leave_out(2);
        budget.leave_out(1);
        assert!(!budget.is_outside(1), "a resident table is not outside");
        budget.forget(1);
        budget.forget(2);
        assert_eq!(budget.used(), 0);
        assert!(!budget.is_outside(2));
        assert_eq!(budget.sampled(1, t0), Sampled::Unknown);
    }
}
