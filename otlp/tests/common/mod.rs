//! A global allocator that counts the bytes live and their peak, for the
//! tests that bound what the code really allocates (each test binary has
//! its own, so the allocator sees nothing else).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Counts every allocation into [`LIVE`] and [`PEAK`]; install it with
/// `#[global_allocator]`.
pub struct Counting;

/// Bytes allocated and not freed.
pub static LIVE: AtomicUsize = AtomicUsize::new(0);
/// The most [`LIVE`] reached since a test last stored into it.
pub static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
        PEAK.fetch_max(live, Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Count the moment both blocks exist, as the allocator may.
        let live = LIVE.fetch_add(new_size, Relaxed) + new_size;
        PEAK.fetch_max(live, Relaxed);
        LIVE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
