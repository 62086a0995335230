//! The per-CPU ring buffers BPF writes finished samples to.
//!
//! Each sampled CPU gets its own BPF ring buffer, installed at its CPU number
//! in the `SAMPLE_RINGS` array of maps. A ring shared by every CPU makes each
//! sample take a spinlock and move the producer position and record headers
//! between CPUs' caches (about 200 ns of BPF time per sample measured on two
//! CPUs), and on large hosts the CPUs contend for that lock. One epoll set
//! holds every ring, so the reader waits on a single descriptor.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use aya::maps::{ArrayOfMaps, Map, MapData, MapError, RingBuf};
use icecore_unwinders::sample::MAX_CPUS;

/// `BPF_MAP_TYPE_RINGBUF` (a stable UAPI number).
const BPF_MAP_TYPE_RINGBUF: u32 = 27;
/// Bytes of one CPU's ring at least: 16 pages.
const MIN_RING_BYTES: u64 = 64 * 1024;
/// Bytes of one CPU's ring at most.
const MAX_RING_BYTES: u64 = 16 << 20;
/// Bytes a sample is budgeted in the ring (a deep native stack with a
/// Python stack on top takes about that).
const BYTES_PER_SAMPLE: u64 = 2048;

/// Why the per-CPU rings could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SampleRingError {
    /// The array of rings was not an array of maps.
    #[error("SAMPLE_RINGS is not an array of maps: {0}")]
    NotAnArray(MapError),
    /// A CPU number does not fit the array of rings.
    #[error("CPU {cpu} is beyond the {MAX_CPUS} CPUs icecore can sample")]
    CpuOutOfRange {
        /// The CPU number.
        cpu: u32,
    },
    /// The kernel refused to create a CPU's ring.
    #[error("creating the ring buffer of CPU {cpu} ({bytes} bytes): {source}")]
    Create {
        /// The CPU.
        cpu: u32,
        /// The ring's size.
        bytes: u32,
        /// What went wrong.
        source: MapError,
    },
    /// Installing a CPU's ring in the array failed.
    #[error("installing the ring buffer of CPU {cpu}: {source}")]
    Install {
        /// The CPU.
        cpu: u32,
        /// What went wrong.
        source: MapError,
    },
    /// The epoll set that watches the rings could not be built.
    #[error("watching the ring buffers with epoll: {0}")]
    Epoll(std::io::Error),
}

/// One ring buffer per sampled CPU, and an epoll set over them.
pub struct SampleRings {
    rings: Vec<RingBuf<MapData>>,
    /// Readable when BPF forced a wakeup on any ring.
    epoll: OwnedFd,
    ring_bytes: u32,
}

impl SampleRings {
    /// Creates a ring of [`ring_bytes_per_cpu`] for each of `cpus` and
    /// installs it in `outer` (the `SAMPLE_RINGS` map) at the CPU's number.
    pub fn create(outer: Map, cpus: &[u32], frequency_hz: u32) -> Result<Self, SampleRingError> {
        let mut outer: ArrayOfMaps<MapData, MapData> =
            ArrayOfMaps::try_from(outer).map_err(SampleRingError::NotAnArray)?;
        let ring_bytes = ring_bytes_per_cpu(frequency_hz);
        let epoll = epoll_create().map_err(SampleRingError::Epoll)?;
        let mut rings = Vec::with_capacity(cpus.len());
        for &cpu in cpus {
            if cpu as usize >= MAX_CPUS {
                return Err(SampleRingError::CpuOutOfRange { cpu });
            }
            let params = aya_obj::Map::new_from_params(BPF_MAP_TYPE_RINGBUF, 0, 0, ring_bytes, 0);
            let create = |source| SampleRingError::Create {
                cpu,
                bytes: ring_bytes,
                source,
            };
            let inner = MapData::create(params, "sample_ring", None).map_err(create)?;
            outer
                .set(cpu, &inner, 0)
                .map_err(|source| SampleRingError::Install { cpu, source })?;
            let ring = RingBuf::try_from(Map::RingBuf(inner)).map_err(create)?;
            epoll_add(epoll.as_fd(), ring.as_fd()).map_err(SampleRingError::Epoll)?;
            rings.push(ring);
        }
        Ok(SampleRings {
            rings,
            epoll,
            ring_bytes,
        })
    }

    /// Hands every waiting record of every ring to `f`; never blocks.
    pub fn drain(&mut self, mut f: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        for ring in &mut self.rings {
            while let Some(item) = ring.next() {
                f(&item);
                n += 1;
            }
        }
        n
    }

    /// Bytes of each CPU's ring.
    pub fn ring_bytes(&self) -> u32 {
        self.ring_bytes
    }
}

impl AsRawFd for SampleRings {
    /// The epoll set's descriptor: readable when BPF woke up any ring.
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.epoll.as_raw_fd()
    }
}

/// Room for about one second of samples of [`BYTES_PER_SAMPLE`] at
/// `frequency_hz` on one CPU, as a power of two within bounds (the kernel
/// requires a power-of-two number of pages).
pub fn ring_bytes_per_cpu(frequency_hz: u32) -> u32 {
    let wanted = u64::from(frequency_hz).saturating_mul(BYTES_PER_SAMPLE);
    let bytes = wanted
        .clamp(MIN_RING_BYTES, MAX_RING_BYTES)
        .next_power_of_two();
    // MAX_RING_BYTES is a power of two below u32::MAX, so this never fails.
    u32::try_from(bytes).unwrap_or(MAX_RING_BYTES as u32)
}

fn epoll_create() -> std::io::Result<OwnedFd> {
    // SAFETY: no pointer arguments; the result is checked before use.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn epoll_add(epoll: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let mut event = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd.as_raw_fd() as u64,
    };
    // SAFETY: both descriptors are open; `event` is a valid epoll_event.
    let ret = unsafe {
        libc::epoll_ctl(
            epoll.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            fd.as_raw_fd(),
            &raw mut event,
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_size_is_a_bounded_power_of_two() {
        assert_eq!(ring_bytes_per_cpu(19), 64 * 1024);
        assert_eq!(ring_bytes_per_cpu(100), 256 * 1024);
        assert_eq!(ring_bytes_per_cpu(997), 2 << 20);
        assert_eq!(ring_bytes_per_cpu(1_000_000), 16 << 20);
        assert_eq!(ring_bytes_per_cpu(0), 64 * 1024);
        for hz in [1, 97, 4999, u32::MAX] {
            assert!(ring_bytes_per_cpu(hz).is_power_of_two());
        }
    }

    #[test]
    fn an_epoll_set_over_no_rings_is_not_readable() {
        let epoll = epoll_create().expect("epoll_create1");
        let mut events = [libc::epoll_event { events: 0, u64: 0 }];
        // SAFETY: a valid buffer of one event.
        let n = unsafe { libc::epoll_wait(epoll.as_raw_fd(), events.as_mut_ptr(), 1, 0) };
        assert_eq!(n, 0);
    }
}
