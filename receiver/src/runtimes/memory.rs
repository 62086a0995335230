//! Reading another process's memory from user space, for symbolizing
//! interpreter frames (code objects, names, line tables).

use std::{fs::File, os::unix::fs::FileExt};

/// A read of the target's memory failed.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// `/proc/PID/mem` could not be opened (the process exited, or no permission).
    #[error("cannot open /proc/{pid}/mem: {source}")]
    Open {
        /// The process.
        pid: u32,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The range is not mapped or the process exited.
    #[error("cannot read {len} bytes at {address:#x}: {source}")]
    Read {
        /// First address.
        address: u64,
        /// Bytes asked for.
        len: usize,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A length read from the target exceeds what is read from it at most.
    #[error("object of {0} bytes is larger than the read limit")]
    TooLarge(u64),
}

/// A process's memory, opened at its first use: most processes a plugin
/// attaches to are never read.
#[derive(Debug)]
pub struct LazyMemory {
    pid: u32,
    memory: Option<ProcessMemory>,
}

impl LazyMemory {
    /// The memory of `pid`, not opened yet.
    pub fn new(pid: u32) -> Self {
        LazyMemory { pid, memory: None }
    }

    /// The memory, opened now if it was not (`None` when it cannot be).
    pub fn get(&mut self) -> Option<&ProcessMemory> {
        if self.memory.is_none() {
            self.memory = ProcessMemory::open(self.pid)
                .map_err(|e| tracing::debug!(pid = self.pid, "{e}"))
                .ok();
        }
        self.memory.as_ref()
    }
}

/// Reads of one process's memory through `/proc/PID/mem`.
#[derive(Debug)]
pub struct ProcessMemory {
    file: File,
}

impl ProcessMemory {
    /// Opens the memory of `pid`.
    pub fn open(pid: u32) -> Result<Self, MemoryError> {
        File::open(format!("/proc/{pid}/mem"))
            .map(|file| ProcessMemory { file })
            .map_err(|source| MemoryError::Open { pid, source })
    }

    /// Reads of `file` at offsets equal to addresses: an image of a
    /// process's memory, so that the object readers can run on bytes that
    /// did not come from a live process (the `runtime_objects` fuzz target
    /// writes arbitrary ones) exactly as they run on `/proc/PID/mem`.
    pub fn from_file(file: File) -> Self {
        ProcessMemory { file }
    }

    /// Fills `buf` from `address`; a short read is an error.
    pub fn read_exact(&self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.file
            .read_exact_at(buf, address)
            .map_err(|source| MemoryError::Read {
                address,
                len: buf.len(),
                source,
            })
    }

    /// `len` bytes from `address`, refusing more than `limit`.
    pub fn read_vec(&self, address: u64, len: u64, limit: u64) -> Result<Vec<u8>, MemoryError> {
        if len > limit {
            return Err(MemoryError::TooLarge(len));
        }
        let mut buf = vec![0u8; len as usize];
        self.read_exact(address, &mut buf)?;
        Ok(buf)
    }

    /// The little-endian u64 at `address`.
    pub fn read_u64(&self, address: u64) -> Result<u64, MemoryError> {
        let mut b = [0u8; 8];
        self.read_exact(address, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// The little-endian u32 at `address`.
    pub fn read_u32(&self, address: u64) -> Result<u32, MemoryError> {
        let mut b = [0u8; 4];
        self.read_exact(address, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pointers at the top of the address space, read from a hostile or
    /// corrupt process: the object readers add field offsets to them, which
    /// overflowed (panics with overflow checks, found by the
    /// `runtime_objects` fuzz target, fuzz/regressions/runtime_objects/).
    /// They must fail or read what the wrapped address holds, not panic.
    #[test]
    fn object_readers_survive_pointers_at_the_top_of_the_address_space() {
        use std::os::unix::fs::FileExt;

        use crate::runtimes::{perl, php, python, ruby};

        const OBJECT: u64 = 0x1000;
        let file = tempfile::tempfile().unwrap();
        let top: Vec<u8> = (0..512)
            .flat_map(|_| (u64::MAX - 7).to_le_bytes())
            .collect();
        file.write_all_at(&top, OBJECT).unwrap();
        let memory = ProcessMemory::from_file(file);
        assert_eq!(memory.read_u64(OBJECT).unwrap(), u64::MAX - 7);
        for layout in &perl::layouts::LAYOUTS {
            let objects = perl::objects::PerlObjects {
                layout,
                memory: &memory,
            };
            let _ = objects.sub_name(OBJECT);
            let _ = objects.first_statement(OBJECT);
            let _ = objects.statement(OBJECT);
        }
        for minor in 0..6 {
            let layout = php::layouts::layout((8, minor)).unwrap();
            let objects = php::objects::Objects::new(&memory, &layout);
            let _ = objects.function(OBJECT);
        }
        for minor in 1..5 {
            let layout = ruby::layouts::layout((3, minor)).unwrap();
            let objects = ruby::objects::Objects::new(&memory, layout).with_symbols(Some(OBJECT));
            let _ = objects.iseq(OBJECT);
            let _ = objects.location(OBJECT, OBJECT);
            let _ = objects.string(OBJECT);
            let _ = objects.id_name(OBJECT);
        }
        for layout in python::layouts::LAYOUTS {
            let _ = python::code::read_code(&memory, layout, OBJECT, None);
        }
    }

    #[test]
    fn reads_own_memory_and_refuses_bad_ranges() {
        let value: u64 = 0x1122_3344_5566_7788;
        let memory = ProcessMemory::open(std::process::id()).unwrap();
        let address = std::ptr::from_ref(&value) as u64;
        assert_eq!(memory.read_u64(address).unwrap(), value);
        assert_eq!(memory.read_u32(address).unwrap(), 0x5566_7788);
        assert!(memory.read_u64(8).is_err(), "page zero is never mapped");
        assert!(matches!(
            memory.read_vec(address, 1 << 40, 1 << 20),
            Err(MemoryError::TooLarge(_))
        ));
    }
}
