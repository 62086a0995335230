//! Converts BPF timestamps (CLOCK_MONOTONIC) to Unix time.

/// Nanoseconds of a clock.
fn now(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; both clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The offset between CLOCK_REALTIME and CLOCK_MONOTONIC, refreshed on demand
/// (NTP can step the wall clock).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicToUnix {
    offset: i128,
}

impl MonotonicToUnix {
    /// Measures the current offset.
    pub fn measure() -> Self {
        let before = now(libc::CLOCK_MONOTONIC);
        let real = now(libc::CLOCK_REALTIME);
        let after = now(libc::CLOCK_MONOTONIC);
        let mono = before / 2 + after / 2;
        MonotonicToUnix {
            offset: i128::from(real) - i128::from(mono),
        }
    }

    /// Unix nanoseconds of a CLOCK_MONOTONIC timestamp.
    pub fn to_unix(self, monotonic_ns: u64) -> u64 {
        u64::try_from(i128::from(monotonic_ns) + self.offset).unwrap_or(0)
    }

    /// The current Unix time in nanoseconds.
    pub fn unix_now() -> u64 {
        now(libc::CLOCK_REALTIME)
    }

    /// The current CLOCK_MONOTONIC time in nanoseconds.
    pub fn monotonic_now() -> u64 {
        now(libc::CLOCK_MONOTONIC)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_now_to_now() {
        let clock = MonotonicToUnix::measure();
        let converted = clock.to_unix(MonotonicToUnix::monotonic_now());
        let real = MonotonicToUnix::unix_now();
        assert!(
            converted.abs_diff(real) < 50_000_000,
            "{converted} vs {real}"
        );
    }
}
