//! Reading the sampled process's memory.
//!
//! Each `bpf_probe_read_user` costs about as much as the rest of an unwind
//! step (≈80 ns measured on the CI machines, whose kernels pay for SRSO and
//! retpoline mitigations on every call). Unwinding reads upward from the
//! stack pointer, two words per frame, so [`WindowedReader`] copies a block of
//! the stack once and serves the following reads from the copy.

/// Reads words from a target address space: `bpf_probe_read_user` in BPF, a
/// captured stack or core file in host tests.
pub trait MemoryReader {
    /// Reads the little-endian u64 at `address`, or `None` when it is not readable.
    fn read_u64(&mut self, address: u64) -> Option<u64>;

    /// Reads `N` consecutive words from `address`: one helper call in BPF,
    /// for a small object read whole. A [`WindowedReader`] passes it to its
    /// inner reader and keeps its window.
    #[inline(always)]
    fn read_words<const N: usize>(&mut self, address: u64) -> Option<[u64; N]> {
        let mut words = [0; N];
        let mut at = address;
        for word in &mut words {
            *word = self.read_u64(at)?;
            at = at.wrapping_add(8);
        }
        Some(words)
    }
}

/// glibc's `tcbhead_t.dtv`, from the FS base.
const TCB_DTV: u64 = 8;
/// Bytes per DTV entry (a pointer and a flag).
const DTV_ENTRY: u64 = 16;

/// The start of TLS module `module`'s block for the thread whose FS base
/// (`pthread_self()`) is `fs_base`, through the thread's DTV, as
/// `__tls_get_addr` finds it (the executable's and initially loaded
/// libraries' blocks are in the DTV too); `None` when the thread has not
/// allocated it yet or it cannot be read.
#[inline(always)]
pub fn tls_block<M: MemoryReader>(fs_base: u64, module: u32, memory: &mut M) -> Option<u64> {
    let dtv = memory.read_u64(fs_base.wrapping_add(TCB_DTV))?;
    let block = memory.read_u64(dtv.wrapping_add(DTV_ENTRY.wrapping_mul(u64::from(module))))?;
    // Not allocated yet (glibc's TLS_DTV_UNALLOCATED is -1).
    (block != 0 && block != u64::MAX).then_some(block)
}

/// Bytes one window read copies at most: about ten typical frames, while
/// copying costs little next to a helper call.
pub const STACK_WINDOW_BYTES: usize = 1024;
/// Words in a [`StackWindow`].
pub const STACK_WINDOW_WORDS: usize = STACK_WINDOW_BYTES / 8;
const _: () = assert!(STACK_WINDOW_WORDS.is_power_of_two());

/// Window reads never cross a page: if the first word is mapped, so is the
/// rest of its page, while the next page may not be (the top of the stack).
const PAGE_SIZE: u64 = 4096;

/// A copy of part of the sampled thread's stack, kept in per-CPU scratch
/// space for the whole tail-call chain of one sample.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StackWindow {
    /// Address of `words[0]`.
    pub base: u64,
    /// Valid bytes from `base`, a multiple of 8; 0 when empty.
    pub bytes: u64,
    /// The copied stack.
    pub words: [u64; STACK_WINDOW_WORDS],
}

const _: () = assert!(core::mem::size_of::<StackWindow>() == 16 + STACK_WINDOW_BYTES);

impl StackWindow {
    /// An empty window.
    pub const fn new() -> Self {
        StackWindow {
            base: 0,
            bytes: 0,
            words: [0; STACK_WINDOW_WORDS],
        }
    }

    /// Forgets the copy (a new sample starts).
    #[inline(always)]
    pub fn clear(&mut self) {
        self.bytes = 0;
    }
}

impl Default for StackWindow {
    fn default() -> Self {
        Self::new()
    }
}

/// Memory that can also be copied in blocks.
pub trait BlockReader: MemoryReader {
    /// Copies `len` bytes (a multiple of 8, at most [`STACK_WINDOW_BYTES`])
    /// from `address` to the start of `dst`; false if any byte is unreadable.
    fn read_block(&mut self, address: u64, dst: &mut [u64; STACK_WINDOW_WORDS], len: u32) -> bool;
}

/// Serves word reads from a [`StackWindow`], refilling it from `inner` on a miss.
pub struct WindowedReader<'a, R> {
    window: &'a mut StackWindow,
    inner: R,
    /// Bytes one refill copies at most.
    block: u64,
}

impl<'a, R: BlockReader> WindowedReader<'a, R> {
    /// A reader over `inner` that keeps its copy in `window`.
    pub fn new(window: &'a mut StackWindow, inner: R) -> Self {
        Self::with_block(window, inner, STACK_WINDOW_BYTES as u32)
    }

    /// A reader whose refills copy at most `block` bytes (rounded down to
    /// words, at most [`STACK_WINDOW_BYTES`]): for walks that hop between
    /// small objects, where copying a whole window would mostly be waste.
    pub fn with_block(window: &'a mut StackWindow, inner: R, block: u32) -> Self {
        let block = u64::from(block).min(STACK_WINDOW_BYTES as u64) & !7;
        WindowedReader {
            window,
            inner,
            block,
        }
    }
}

impl<R: BlockReader> WindowedReader<'_, R> {
    /// Makes the window hold `[address, address + span)` and as much of the
    /// same page *below* it as a window holds, unless it holds that range
    /// already: for walks that go down in memory, such as CPython 3.11+
    /// frames, whose callers sit just below them on the interpreter's stack.
    /// Failure is harmless: the reads that follow fall back to their own.
    #[inline(always)]
    pub fn prefetch_below(&mut self, address: u64, span: u64) {
        let end = address.wrapping_add(span);
        let offset = address.wrapping_sub(self.window.base);
        if offset < self.window.bytes && end.wrapping_sub(self.window.base) <= self.window.bytes {
            return;
        }
        if address & 7 != 0 || span > STACK_WINDOW_BYTES as u64 {
            return;
        }
        // Offsets in the page rather than addresses: `address` is read from
        // the process (a frame's caller), and in the address space's last
        // page `page + PAGE_SIZE` and `address + span` overflow (found by
        // the `runtime_walk` fuzz target: a block longer than the window).
        let page = address & !(PAGE_SIZE - 1);
        let end_in_page = (address - page) + span;
        if end_in_page > PAGE_SIZE {
            return;
        }
        let start_in_page = end_in_page.saturating_sub(STACK_WINDOW_BYTES as u64);
        let len = end_in_page - start_in_page;
        if len == 0 || len & 7 != 0 {
            return;
        }
        let start = page + start_in_page;
        if self
            .inner
            .read_block(start, &mut self.window.words, len as u32)
        {
            self.window.base = start;
            self.window.bytes = len;
        } else {
            self.window.bytes = 0;
        }
    }
}

impl<R: BlockReader> MemoryReader for WindowedReader<'_, R> {
    #[inline(always)]
    fn read_words<const N: usize>(&mut self, address: u64) -> Option<[u64; N]> {
        self.inner.read_words(address)
    }

    #[inline(always)]
    fn read_u64(&mut self, address: u64) -> Option<u64> {
        let offset = address.wrapping_sub(self.window.base);
        if offset < self.window.bytes && offset & 7 == 0 {
            // The mask is a no-op (offset < bytes <= STACK_WINDOW_BYTES) that
            // proves the bound to the verifier.
            return self
                .window
                .words
                .get((offset / 8) as usize & (STACK_WINDOW_WORDS - 1))
                .copied();
        }
        if address & 7 != 0 {
            // Stack slots are aligned; an odd address is read on its own.
            return self.inner.read_u64(address);
        }
        let to_page_end = PAGE_SIZE - (address & (PAGE_SIZE - 1));
        let len = if to_page_end < self.block {
            to_page_end as u32
        } else {
            self.block as u32
        };
        if self.inner.read_block(address, &mut self.window.words, len) {
            self.window.base = address;
            self.window.bytes = u64::from(len);
            return Some(self.window.words[0]);
        }
        self.window.bytes = 0;
        self.inner.read_u64(address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readable memory from `start` to `end`, word i holding `start + 8i`;
    /// counts the reads that reach it.
    struct Fake {
        start: u64,
        end: u64,
        blocks: u32,
        words: u32,
    }

    impl Fake {
        fn word(&self, address: u64) -> Option<u64> {
            let end = address.checked_add(8)?;
            (address >= self.start && end <= self.end).then_some(address ^ 0xff)
        }
    }

    impl MemoryReader for Fake {
        fn read_u64(&mut self, address: u64) -> Option<u64> {
            self.words += 1;
            self.word(address)
        }
    }

    impl BlockReader for Fake {
        fn read_block(
            &mut self,
            address: u64,
            dst: &mut [u64; STACK_WINDOW_WORDS],
            len: u32,
        ) -> bool {
            self.blocks += 1;
            assert!(len.is_multiple_of(8) && len as usize <= STACK_WINDOW_BYTES && len > 0);
            for i in 0..len as u64 / 8 {
                match self.word(address + 8 * i) {
                    Some(w) => dst[i as usize] = w,
                    None => return false,
                }
            }
            true
        }
    }

    fn fake(start: u64, end: u64) -> Fake {
        Fake {
            start,
            end,
            blocks: 0,
            words: 0,
        }
    }

    #[test]
    fn reads_upward_come_from_one_copy() {
        let mut window = StackWindow::new();
        let mut reader = WindowedReader::new(&mut window, fake(0x10_0000, 0x10_8000));
        let end = 0x10_0000 + STACK_WINDOW_BYTES as u64;
        for a in (0x10_0000..end).step_by(8) {
            assert_eq!(reader.read_u64(a), Some(a ^ 0xff));
        }
        assert_eq!((reader.inner.blocks, reader.inner.words), (1, 0));
        // The next word starts a new window; an odd address reads directly.
        assert_eq!(reader.read_u64(end), Some(end ^ 0xff));
        assert_eq!(reader.read_u64(0x10_0803), Some(0x10_0803 ^ 0xff));
        assert_eq!((reader.inner.blocks, reader.inner.words), (2, 1));
    }

    #[test]
    fn windows_stop_at_the_page_end() {
        // The stack's last page: a window must not run past it.
        let mut window = StackWindow::new();
        let mut reader = WindowedReader::new(&mut window, fake(0x20_0000, 0x20_1000));
        assert_eq!(reader.read_u64(0x20_0ff0), Some(0x20_0ff0 ^ 0xff));
        assert_eq!(reader.window.bytes, 16);
        assert_eq!(reader.read_u64(0x20_0ff8), Some(0x20_0ff8 ^ 0xff));
        assert_eq!(reader.inner.blocks, 1);
        assert_eq!(reader.read_u64(0x20_1000), None);
        assert_eq!(reader.window.bytes, 0, "a failed fill leaves no stale copy");
    }

    #[test]
    fn unreadable_memory_reads_as_none() {
        let mut window = StackWindow::new();
        let mut reader = WindowedReader::new(&mut window, fake(0x30_0000, 0x30_0100));
        assert_eq!(reader.read_u64(0x2f_fff8), None);
        assert_eq!(reader.read_u64(0x30_0000), Some(0x30_00ff));
        // A block that runs past the readable end falls back to a word read.
        assert_eq!(reader.read_u64(0x30_00f8), Some(0x30_00f8 ^ 0xff));
        window.clear();
        assert_eq!(window.bytes, 0);
    }

    #[test]
    fn small_blocks_copy_only_what_was_asked() {
        let mut window = StackWindow::new();
        let mut reader = WindowedReader::with_block(&mut window, fake(0x40_0000, 0x40_8000), 100);
        assert_eq!(reader.read_u64(0x40_0100), Some(0x40_0100 ^ 0xff));
        assert_eq!(reader.window.bytes, 96, "rounded down to words");
        assert_eq!(reader.read_u64(0x40_0158), Some(0x40_0158 ^ 0xff));
        assert_eq!(reader.inner.blocks, 1);
        assert_eq!(reader.read_u64(0x40_0160), Some(0x40_0160 ^ 0xff));
        assert_eq!(reader.inner.blocks, 2);
    }

    #[test]
    fn prefetching_below_serves_a_downward_walk() {
        let mut window = StackWindow::new();
        let mut reader = WindowedReader::with_block(&mut window, fake(0x50_0000, 0x50_2000), 192);
        // A frame at 0x50_1800 and its callers below it, 96 bytes apart.
        reader.prefetch_below(0x50_1800, 80);
        assert_eq!(reader.window.base, 0x50_1850 - STACK_WINDOW_BYTES as u64);
        for frame in (0..8).map(|i| 0x50_1800 - 96 * i) {
            reader.prefetch_below(frame, 80);
            assert_eq!(reader.read_u64(frame + 8), Some((frame + 8) ^ 0xff));
        }
        assert_eq!((reader.inner.blocks, reader.inner.words), (1, 0));
        // Never below the page: a frame near the page start gets a short copy.
        reader.prefetch_below(0x50_1010, 80);
        assert_eq!(reader.window.base, 0x50_1000);
        assert_eq!(reader.window.bytes, 0x60);
        // Unreadable: no stale window is left.
        reader.prefetch_below(0x60_0000, 80);
        assert_eq!(reader.window.bytes, 0);
    }

    #[test]
    fn prefetching_in_the_last_page_of_the_address_space_stays_in_it() {
        // A frame pointer read from a hostile process: `page + PAGE_SIZE`
        // and the frame's end overflow there (fuzz/regressions/runtime_walk/).
        let mut window = StackWindow::new();
        let last_page = 0u64.wrapping_sub(PAGE_SIZE);
        let mut reader = WindowedReader::with_block(&mut window, fake(last_page, u64::MAX), 192);
        for (frame, span) in [
            (u64::MAX - 7, 8),
            (u64::MAX - 71, 72),
            (u64::MAX - 79, 72),
            (last_page, 72),
        ] {
            // The fake asserts that no block is longer than the window.
            reader.prefetch_below(frame, span);
        }
        // A frame ending exactly at the top: copied from its page, which this
        // fake can read but for its last word.
        let mut window = StackWindow::new();
        let mut reader =
            WindowedReader::with_block(&mut window, fake(last_page, u64::MAX - 7), 192);
        reader.prefetch_below(u64::MAX - 71, 64);
        assert_eq!(reader.window.base, u64::MAX - 7 - STACK_WINDOW_BYTES as u64);
        assert_eq!(reader.window.bytes, STACK_WINDOW_BYTES as u64);
    }
}

/// A sparse memory image for the walks' unit tests.
#[cfg(test)]
pub(crate) mod test_image {
    extern crate std;
    use std::collections::BTreeMap;

    use super::MemoryReader;

    /// Words at addresses; anything else is unreadable.
    #[derive(Default)]
    pub(crate) struct Image(BTreeMap<u64, u64>);

    impl Image {
        /// Writes `value` at `address`.
        pub(crate) fn put(&mut self, address: u64, value: u64) {
            self.0.insert(address, value);
        }

        /// The word at `address`, if written.
        pub(crate) fn get(&self, address: u64) -> Option<u64> {
            self.0.get(&address).copied()
        }
    }

    impl MemoryReader for Image {
        fn read_u64(&mut self, address: u64) -> Option<u64> {
            self.0.get(&address).copied()
        }
    }
}
