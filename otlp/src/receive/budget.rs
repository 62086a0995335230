//! The receiver's memory budget: every byte a request will cost (its body
//! as it arrives, the body decompressed, the decoded message, what it
//! becomes for the sinks) is reserved before it is allocated, and the
//! reservation travels with the request until the sinks drop it.
//!
//! Reserving never waits: a request that does not fit is refused at once
//! (`RESOURCE_EXHAUSTED`), so a waiting request never holds a connection's
//! flow-control window or a decode slot.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes shared by every request of one receiver.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    used: AtomicUsize,
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// The budget in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn try_take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// An empty reservation, to grow as the request's cost becomes known.
    pub fn reservation(self: &Arc<Self>) -> Reservation {
        Reservation {
            budget: Arc::clone(self),
            bytes: 0,
        }
    }
}

/// Bytes held from a [`MemoryBudget`]; given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<MemoryBudget>,
    bytes: usize,
}

/// The budget cannot hold what was asked for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{wanted} more bytes do not fit the receiver's {limit}-byte memory budget now")]
pub struct OverBudget {
    /// Bytes asked for.
    pub wanted: usize,
    /// The whole budget.
    pub limit: usize,
    /// Whether the request could never fit, even into an empty budget.
    pub never_fits: bool,
}

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `more` bytes on top of what is held.
    pub fn grow(&mut self, more: usize) -> Result<(), OverBudget> {
        if more == 0 {
            return Ok(());
        }
        if self.budget.try_take(more) {
            self.bytes += more;
            return Ok(());
        }
        let limit = self.budget.limit;
        Err(OverBudget {
            wanted: more,
            limit,
            never_fits: self.bytes.saturating_add(more) > limit,
        })
    }

    /// Holds exactly `bytes`: grows, or gives back what is no longer needed.
    pub fn resize(&mut self, bytes: usize) -> Result<(), OverBudget> {
        if bytes >= self.bytes {
            return self.grow(bytes - self.bytes);
        }
        self.budget.give_back(self.bytes - bytes);
        self.bytes = bytes;
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reservations_are_bounded_and_given_back() {
        let budget = MemoryBudget::new(100);
        let mut a = budget.reservation();
        a.grow(60).unwrap();
        let mut b = budget.reservation();
        let refused = b.grow(50).unwrap_err();
        assert!(!refused.never_fits, "50 bytes fit an empty budget");
        assert!(b.grow(101).unwrap_err().never_fits);
        b.grow(40).unwrap();
        assert_eq!(budget.used(), 100);
        a.resize(10).unwrap();
        assert_eq!(budget.used(), 50);
        drop(a);
        drop(b);
        assert_eq!(budget.used(), 0);
    }
}
