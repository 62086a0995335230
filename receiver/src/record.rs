//! Decoding the sample records BPF writes to the ring buffer.

use icecore_unwinders::{SampleHeader, runtime::tag_of, sample::MAX_FRAMES};

/// A ring-buffer record that cannot be a sample.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Shorter than the fixed header.
    #[error("record of {0} bytes is shorter than the {HEADER} byte header")]
    TooShort(usize),
    /// The frame counts disagree with the record's length or capacity.
    #[error("record claims {kernel}+{user} words but carries {carried}")]
    FrameCount {
        /// Kernel frames claimed.
        kernel: u32,
        /// User words claimed.
        user: u32,
        /// Frames actually present.
        carried: usize,
    },
}

const HEADER: usize = core::mem::size_of::<SampleHeader>();

/// One decoded sample, borrowing its frames from the ring buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawSample<'a> {
    /// The fixed part.
    pub header: SampleHeader,
    /// Kernel frames, leaf first, as little-endian words.
    kernel: &'a [u8],
    /// User words, leaf first, as little-endian words.
    user: &'a [u8],
}

fn words(bytes: &[u8]) -> impl ExactSizeIterator<Item = u64> + '_ {
    bytes.chunks_exact(8).map(|w| {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        u64::from_le_bytes(b)
    })
}

impl<'a> RawSample<'a> {
    /// Decodes a record; the length must match the frame counts exactly.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, RecordError> {
        let Some((head, frames)) = bytes.split_at_checked(HEADER) else {
            return Err(RecordError::TooShort(bytes.len()));
        };
        // SAFETY: SampleHeader is repr(C), integers only, no padding (size
        // asserted in icecore-unwinders); read_unaligned copes with alignment.
        let header = unsafe { head.as_ptr().cast::<SampleHeader>().read_unaligned() };
        let kernel = header.kernel_frames as usize;
        let user = header.user_words as usize;
        let total = kernel.saturating_add(user);
        if total > MAX_FRAMES || frames.len() != total * 8 {
            return Err(RecordError::FrameCount {
                kernel: header.kernel_frames,
                user: header.user_words,
                carried: frames.len() / 8,
            });
        }
        let (kernel, user) = frames.split_at(kernel * 8);
        Ok(RawSample {
            header,
            kernel,
            user,
        })
    }

    /// Kernel frames, leaf first.
    pub fn kernel_frames(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        words(self.kernel)
    }

    /// User words, leaf first: native frames' addresses (the first is the
    /// interrupted instruction, the others are return addresses) and
    /// runtimes' tagged words (see `icecore_unwinders::runtime`).
    pub fn user_words(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        words(self.user)
    }

    /// The native frames among the user words.
    pub fn native_frames(&self) -> impl Iterator<Item = u64> + '_ {
        self.user_words().filter(|&w| tag_of(w) == 0)
    }

    /// Whether a runtime appended words to the native frames.
    pub fn has_runtime_words(&self) -> bool {
        self.user_words().any(|w| tag_of(w) != 0)
    }

    /// The thread name, up to its NUL.
    pub fn comm(&self) -> &[u8] {
        let comm = &self.header.comm;
        let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
        &comm[..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kernel: &[u64], user: &[u64], comm: &[u8]) -> Vec<u8> {
        let mut c = [0u8; 16];
        c[..comm.len()].copy_from_slice(comm);
        let header = SampleHeader {
            ktime_ns: 42,
            pid: 7,
            tid: 8,
            cpu: 1,
            flags: 0,
            kernel_frames: kernel.len() as u32,
            user_words: user.len() as u32,
            off_cpu_ns: 0,
            comm: c,
        };
        // SAFETY: test-only view of a POD header as bytes.
        let mut bytes =
            unsafe { core::slice::from_raw_parts((&raw const header).cast::<u8>(), HEADER) }
                .to_vec();
        for w in kernel.iter().chain(user) {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        bytes
    }

    #[test]
    fn decodes_frames_and_comm() {
        let bytes = record(
            &[0xffff_ffff_8100_0000, 2],
            &[0x40_1000, 0x40_2000, 3],
            b"worker",
        );
        let sample = RawSample::decode(&bytes).unwrap();
        assert_eq!(sample.header.pid, 7);
        assert_eq!(sample.comm(), b"worker");
        assert_eq!(
            sample.kernel_frames().collect::<Vec<_>>(),
            [0xffff_ffff_8100_0000, 2]
        );
        assert_eq!(
            sample.user_words().collect::<Vec<_>>(),
            [0x40_1000, 0x40_2000, 3]
        );
    }

    #[test]
    fn rejects_inconsistent_lengths() {
        let mut bytes = record(&[1], &[2, 3], b"x");
        bytes.pop();
        assert!(matches!(
            RawSample::decode(&bytes),
            Err(RecordError::FrameCount { .. })
        ));
        assert_eq!(
            RawSample::decode(&bytes[..10]),
            Err(RecordError::TooShort(10))
        );
        let mut lying = record(&[], &[], b"x");
        lying[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(RawSample::decode(&lying).is_err());
    }

    #[test]
    fn runtime_words_are_told_from_native_frames() {
        let tags = icecore_unwinders::python::CPYTHON.tags;
        let code = tags.word(0, 0x7f00_0000_1000);
        let instr = tags.word(3, 0x30);
        let bytes = record(&[1], &[0x40_1000, code, instr, 0x40_2000], b"py");
        let sample = RawSample::decode(&bytes).unwrap();
        assert!(sample.has_runtime_words());
        assert_eq!(
            sample.native_frames().collect::<Vec<_>>(),
            [0x40_1000, 0x40_2000]
        );
        let plain = record(&[1], &[0x40_1000], b"c");
        assert!(!RawSample::decode(&plain).unwrap().has_runtime_words());
    }
}
