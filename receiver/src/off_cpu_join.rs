//! Joins each off-CPU wait's two records: the start (the stack the thread
//! blocked with, sent when it blocked) and the end (how long it waited,
//! sent when it ran again, only for waits of at least the minimum
//! duration). A start answered by no end was a short wait; an end is read
//! at most a drain before its start (they sit in different CPUs' rings).

use std::collections::HashMap;

use crate::{aggregate::Aggregator, clock::MonotonicToUnix, record::RawSample};

/// Waits held at once: threads blocked with a sampled wait. Past it, new
/// starts are dropped (counted), so memory stays bounded.
pub const MAX_PENDING_WAITS: usize = 65_536;

/// Drains an end record waits for its start before it is dropped.
const END_PATIENCE: u8 = 2;

/// A wait whose start was read: the sample as the ring held it.
#[derive(Debug)]
pub struct PendingWait {
    /// The process.
    pub pid: u32,
    /// `ktime_ns` of the start record.
    pub start_ktime_ns: u64,
    /// The process image the start was taken in.
    pub image: Option<u64>,
    /// The start record's bytes.
    pub record: Box<[u8]>,
}

/// The end of a wait, from its end record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitEnd {
    /// The thread.
    pub tid: u32,
    /// When its wait began (its start record's `ktime_ns`).
    pub start_ktime_ns: u64,
    /// How long it waited.
    pub off_cpu_ns: u64,
}

/// A joined wait: its start and how long it lasted.
#[derive(Debug)]
pub struct JoinedWait {
    /// The start, with the stack.
    pub start: PendingWait,
    /// Nanoseconds off CPU.
    pub off_cpu_ns: u64,
}

impl JoinedWait {
    /// Adds the wait to the interval's samples, at the time it ended.
    pub fn add_to(&self, aggregator: &mut Aggregator, clock: &MonotonicToUnix) {
        match RawSample::decode(&self.start.record) {
            Ok(sample) => {
                let end = self.start.start_ktime_ns.saturating_add(self.off_cpu_ns);
                aggregator.add_off_cpu(
                    &sample,
                    clock.to_unix(end),
                    self.start.image,
                    self.off_cpu_ns,
                );
            }
            // Decoded once already, when the start was read.
            Err(e) => tracing::debug!("an off-CPU start no longer decodes: {e}"),
        }
    }
}

/// What became of the records, since the start.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OffCpuJoinStats {
    /// Waits joined (start and end).
    pub joined: u64,
    /// Starts never answered: the wait was shorter than the minimum (or its
    /// end record was lost).
    pub unanswered: u64,
    /// End records whose start never came (lost to a full ring).
    pub orphan_ends: u64,
    /// Starts refused at [`MAX_PENDING_WAITS`].
    pub overflow: u64,
}

/// The join state.
#[derive(Debug, Default)]
pub struct OffCpuJoin {
    /// Starts by (thread, start time).
    pending: HashMap<(u32, u64), PendingWait>,
    /// Each thread's newest start: its thread may still wait.
    newest: HashMap<u32, u64>,
    /// Starts a newer start of their thread superseded, with the drains
    /// they have waited: their end may still be in a ring not read yet.
    superseded: Vec<((u32, u64), u8)>,
    /// Ends read before their start, with the drains they have waited.
    early_ends: Vec<(WaitEnd, u8)>,
    stats: OffCpuJoinStats,
}

impl OffCpuJoin {
    /// Holds `wait`, the start of `tid`'s wait, until its end comes. A
    /// thread waits once at a time, so a start older than the thread's
    /// newest was answered by an end read soon, or was a short wait.
    pub fn start(&mut self, tid: u32, wait: PendingWait) {
        if self.pending.len() >= MAX_PENDING_WAITS {
            self.stats.overflow += 1;
            return;
        }
        let key = (tid, wait.start_ktime_ns);
        match self.newest.get(&tid).copied() {
            Some(newest) if newest > key.1 => self.superseded.push((key, 0)),
            Some(newest) => {
                self.superseded.push(((tid, newest), 0));
                self.newest.insert(tid, key.1);
            }
            None => {
                self.newest.insert(tid, key.1);
            }
        }
        if self.pending.insert(key, wait).is_some() {
            // The same start read twice: the ring does not repeat records.
            self.stats.unanswered += 1;
        }
    }

    /// The wait `end` closes, if its start was read.
    pub fn end(&mut self, end: WaitEnd) -> Option<JoinedWait> {
        match self.take(end) {
            Some(joined) => Some(joined),
            None => {
                self.early_ends.push((end, 0));
                None
            }
        }
    }

    /// After a drain: the ends read early whose start has come since.
    /// Ends without a start, and superseded starts without an end, that
    /// waited [`END_PATIENCE`] drains are dropped.
    pub fn after_drain(&mut self) -> Vec<JoinedWait> {
        let mut joined = Vec::new();
        for (end, age) in std::mem::take(&mut self.early_ends) {
            if let Some(wait) = self.take(end) {
                joined.push(wait);
            } else if age + 1 >= END_PATIENCE {
                self.stats.orphan_ends += 1;
            } else {
                self.early_ends.push((end, age + 1));
            }
        }
        for (key, age) in std::mem::take(&mut self.superseded) {
            if !self.pending.contains_key(&key) {
                continue;
            }
            if age + 1 >= END_PATIENCE {
                self.pending.remove(&key);
                self.stats.unanswered += 1;
            } else {
                self.superseded.push((key, age + 1));
            }
        }
        joined
    }

    fn take(&mut self, end: WaitEnd) -> Option<JoinedWait> {
        let key = (end.tid, end.start_ktime_ns);
        let start = self.pending.remove(&key)?;
        if self.newest.get(&end.tid) == Some(&key.1) {
            self.newest.remove(&end.tid);
        }
        self.stats.joined += 1;
        Some(JoinedWait {
            start,
            off_cpu_ns: end.off_cpu_ns,
        })
    }

    /// Forgets the waits of an exited process's threads: their ends will
    /// not come.
    pub fn forget_process(&mut self, pid: u32) {
        let before = self.pending.len();
        self.pending.retain(|_, wait| wait.pid != pid);
        self.stats.unanswered += (before - self.pending.len()) as u64;
        let pending = &self.pending;
        self.newest
            .retain(|&tid, &mut start| pending.contains_key(&(tid, start)));
    }

    /// Waits held now.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The counts so far.
    pub fn stats(&self) -> OffCpuJoinStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(start: u64) -> PendingWait {
        PendingWait {
            pid: 1,
            start_ktime_ns: start,
            image: None,
            record: Box::new([start as u8]),
        }
    }

    fn end(tid: u32, start: u64, ns: u64) -> WaitEnd {
        WaitEnd {
            tid,
            start_ktime_ns: start,
            off_cpu_ns: ns,
        }
    }

    #[test]
    fn a_start_and_its_end_join() {
        let mut join = OffCpuJoin::default();
        join.start(7, wait(100));
        let joined = join.end(end(7, 100, 5_000)).expect("joined");
        assert_eq!(joined.off_cpu_ns, 5_000);
        assert_eq!(joined.start.start_ktime_ns, 100);
        assert_eq!(join.pending(), 0);
        assert_eq!(join.stats().joined, 1);
    }

    #[test]
    fn an_end_read_before_its_start_joins_after_the_drain() {
        let mut join = OffCpuJoin::default();
        assert!(join.end(end(7, 100, 5)).is_none());
        join.start(7, wait(100));
        let joined = join.after_drain();
        assert_eq!(joined.len(), 1);
        assert_eq!(join.stats().orphan_ends, 0);
    }

    #[test]
    fn an_end_without_a_start_is_dropped_after_two_drains() {
        let mut join = OffCpuJoin::default();
        assert!(join.end(end(7, 100, 5)).is_none());
        assert!(join.after_drain().is_empty());
        assert_eq!(join.stats().orphan_ends, 0);
        assert!(join.after_drain().is_empty());
        assert_eq!(join.stats().orphan_ends, 1);
    }

    #[test]
    fn a_short_wait_is_dropped_once_superseded() {
        let mut join = OffCpuJoin::default();
        join.start(7, wait(100));
        join.start(7, wait(200));
        // The first wait's end may still come, from a ring read later.
        assert!(join.after_drain().is_empty());
        assert_eq!(join.pending(), 2);
        assert!(join.after_drain().is_empty());
        assert_eq!(join.stats().unanswered, 1);
        assert!(join.end(end(7, 200, 9)).is_some());
        assert_eq!(join.pending(), 0);
    }

    #[test]
    fn starts_read_out_of_order_still_join() {
        // Ring A holds two starts of one thread, ring B the first one's
        // end; A is read first.
        let mut join = OffCpuJoin::default();
        join.start(8, wait(300));
        join.start(8, wait(250));
        assert!(join.end(end(8, 250, 40)).is_some());
        assert!(join.end(end(8, 300, 1)).is_some());
        assert!(join.after_drain().is_empty());
        assert!(join.after_drain().is_empty());
        assert_eq!(join.stats().joined, 2);
        assert_eq!(join.stats().unanswered, 0);
    }

    #[test]
    fn pending_waits_are_bounded() {
        let mut join = OffCpuJoin::default();
        for tid in 0..(MAX_PENDING_WAITS as u32 + 10) {
            join.start(tid, wait(u64::from(tid) + 1));
        }
        assert_eq!(join.pending(), MAX_PENDING_WAITS);
        assert_eq!(join.stats().overflow, 10);
        // The newest were refused.
        let last = MAX_PENDING_WAITS as u32 + 5;
        assert!(join.end(end(last, u64::from(last) + 1, 1)).is_none());
        join.forget_process(1);
        assert_eq!(join.pending(), 0);
    }
}
