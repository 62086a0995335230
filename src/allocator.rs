//! How the process's allocator (glibc malloc) is asked to give memory back.
//!
//! By default glibc raises its mmap threshold to the size of each large
//! block freed (up to 32 MiB), so after one large request or unwind table
//! every later one comes from a heap arena, where it fragments and stays:
//! the agent's RSS then grows with its largest past work, not its present
//! work. A fixed threshold keeps large blocks (request bodies, decoded
//! requests, table builds) in their own mappings, returned whole on free.
//! Fewer arenas bound what the runtime's threads each keep around.

/// Blocks at least this large are mapped on their own (glibc's own initial
/// threshold, kept fixed).
const MMAP_THRESHOLD: i32 = 128 << 10;
/// Malloc arenas shared by all threads.
const ARENAS: i32 = 2;
/// How often free memory inside the arenas is given back.
pub const TRIM_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Sets the allocator's policy; call first thing in `main`.
pub fn tune() {
    // SAFETY: mallopt only changes allocator parameters; it is called before
    // any thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}

/// Returns the free memory at the top of every arena, and free whole pages
/// inside them, to the kernel.
pub fn trim() {
    // SAFETY: malloc_trim takes the arenas' locks itself; any thread may call it.
    unsafe {
        libc::malloc_trim(0);
    }
}
