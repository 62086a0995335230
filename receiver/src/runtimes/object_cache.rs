//! Runtime objects read from processes (CPython code objects, CRuby iseqs),
//! cached by (pid, address). The runtime's garbage collector may free an
//! object and place another at its address, so an entry still in use is
//! read again once it is older than the cache's `reread_after`, and the
//! caller learns when it changed (to drop what it made from it).

use std::{
    hash::Hash,
    num::NonZeroUsize,
    sync::Arc,
    time::{Duration, Instant},
};

use lru::LruCache;

use super::services::remove_where;

/// An LRU cache of at most `capacity` entries (at least one).
pub fn lru<K: Hash + Eq, V>(capacity: usize) -> LruCache<K, V> {
    LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN))
}

/// One cached read: `None` when it failed (not such an object, unreadable).
struct Cached<V> {
    read_at: Instant,
    value: Option<Arc<V>>,
}

/// Objects of many processes, by (pid, address).
pub struct ObjectCache<V> {
    entries: LruCache<(u32, u64), Cached<V>>,
    reread_after: Duration,
}

impl<V: PartialEq> ObjectCache<V> {
    /// A cache of at most `capacity` objects.
    pub fn new(capacity: usize, reread_after: Duration) -> Self {
        ObjectCache {
            entries: lru(capacity),
            reread_after,
        }
    }

    /// The cached read of `address`, if any and, with `fresh` (a read while
    /// the process surely runs), not older than `reread_after`.
    pub fn cached(&mut self, pid: u32, address: u64, fresh: bool) -> Option<Option<Arc<V>>> {
        let entry = self.entries.get(&(pid, address))?;
        (!fresh || entry.read_at.elapsed() < self.reread_after).then(|| entry.value.clone())
    }

    /// Stores a read of `address`; true when it replaced a different one.
    /// A failed read (`None`) does not replace a value read before: the
    /// address is still sampled, so the object is still there and the
    /// process's memory could not be read (it is exiting, most often),
    /// and the samples not symbolized yet keep their names.
    pub fn store(&mut self, pid: u32, address: u64, value: Option<Arc<V>>) -> bool {
        self.store_read_at(pid, address, value, Instant::now())
    }

    /// [`store`](Self::store), as if read at `read_at`.
    pub(crate) fn store_read_at(
        &mut self,
        pid: u32,
        address: u64,
        value: Option<Arc<V>>,
        read_at: Instant,
    ) -> bool {
        let key = (pid, address);
        if value.is_none()
            && let Some(known) = self.entries.get_mut(&key)
            && known.value.is_some()
        {
            known.read_at = read_at;
            return false;
        }
        let previous = self.entries.put(
            key,
            Cached {
                read_at,
                value: value.clone(),
            },
        );
        previous.is_some_and(|p| p.value != value)
    }

    /// Drops every object of `pid`.
    pub fn forget_process(&mut self, pid: u32) {
        remove_where(&mut self.entries, |k| k.0 == pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_reread_when_old_and_changes_are_told() {
        let mut cache = ObjectCache::<u32>::new(4, Duration::ZERO);
        assert_eq!(cache.cached(1, 0x10, false), None);
        assert!(!cache.store(1, 0x10, Some(Arc::new(7))));
        assert_eq!(cache.cached(1, 0x10, false), Some(Some(Arc::new(7))));
        // Old at once: a fresh read goes to the process.
        assert_eq!(cache.cached(1, 0x10, true), None);
        assert!(!cache.store(1, 0x10, Some(Arc::new(7))));
        assert!(cache.store(1, 0x10, Some(Arc::new(8))));
        // A failed re-read keeps what was read before.
        assert!(!cache.store(1, 0x10, None));
        assert_eq!(cache.cached(1, 0x10, false), Some(Some(Arc::new(8))));
        cache.store(2, 0x10, None);
        cache.forget_process(1);
        assert_eq!(cache.cached(1, 0x10, false), None);
        assert_eq!(cache.cached(2, 0x10, false), Some(None));
    }
}
