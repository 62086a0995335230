//! Reading the sampled process's memory.

/// Reads words from a target address space: `bpf_probe_read_user` in BPF, a
/// captured stack or core file in host tests.
pub trait MemoryReader {
    /// Reads the little-endian u64 at `address`, or `None` when it is not readable.
    fn read_u64(&mut self, address: u64) -> Option<u64>;
}
