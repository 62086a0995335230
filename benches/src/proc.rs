//! What the benchmark reads of other processes: CPU time (precise, from
//! schedstat), peak RSS, and the resources of a child that was reaped.

use std::{
    collections::HashMap,
    process::Child,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context, bail};

/// CLOCK_MONOTONIC in nanoseconds: the clock the fixtures stamp their
/// progress with.
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Running CPU time of every thread of a process, polled in the background.
///
/// `/proc/PID/task/TID/schedstat` gives each thread's time on CPU in
/// nanoseconds; `/proc/PID/stat` only has clock ticks (10 ms), too coarse for
/// a profiler that should use 30 ms of CPU in 30 s. A thread's last value is
/// kept after it exits, so at most one poll interval of a dying thread is lost.
pub struct CpuTracker {
    stop: Arc<AtomicBool>,
    points: Arc<Mutex<Vec<(u64, u64)>>>,
    poller: Option<JoinHandle<()>>,
}

const POLL: Duration = Duration::from_millis(250);

impl CpuTracker {
    pub fn start(pid: u32) -> CpuTracker {
        let stop = Arc::new(AtomicBool::new(false));
        let points = Arc::new(Mutex::new(Vec::new()));
        let poller = {
            let (stop, points) = (stop.clone(), points.clone());
            std::thread::spawn(move || {
                let mut threads: HashMap<u32, u64> = HashMap::new();
                while !stop.load(Ordering::Relaxed) {
                    if !read_threads(pid, &mut threads) {
                        break;
                    }
                    let total = threads.values().sum();
                    if let Ok(mut p) = points.lock() {
                        p.push((monotonic_ns(), total));
                    }
                    std::thread::sleep(POLL);
                }
            })
        };
        CpuTracker {
            stop,
            points,
            poller: Some(poller),
        }
    }

    /// CPU nanoseconds used between two monotonic instants (interpolated
    /// between polls); None before two polls cover the window.
    pub fn cpu_ns_between(&self, from: u64, to: u64) -> Option<u64> {
        let points = self.points.lock().ok()?;
        Some(interpolate(&points, to)?.saturating_sub(interpolate(&points, from)?))
    }

    /// CPU nanoseconds used from the start until `at`.
    pub fn cpu_ns_until(&self, at: u64) -> Option<u64> {
        interpolate(&self.points.lock().ok()?, at)
    }
}

impl Drop for CpuTracker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(poller) = self.poller.take() {
            let _ = poller.join();
        }
    }
}

/// Updates each thread's CPU time; false once the process is gone.
fn read_threads(pid: u32, threads: &mut HashMap<u32, u64>) -> bool {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    for entry in dir.flatten() {
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(entry.path().join("schedstat")) else {
            continue;
        };
        if let Some(ns) = text.split_whitespace().next().and_then(|v| v.parse().ok()) {
            threads.insert(tid, ns);
        }
    }
    true
}

/// The value at `t` on a line through sorted (time, value) points.
fn interpolate(points: &[(u64, u64)], t: u64) -> Option<u64> {
    let after = points.iter().position(|&(at, _)| at >= t)?;
    if after == 0 {
        return (points[0].0 == t).then_some(points[0].1);
    }
    let (t0, v0) = points[after - 1];
    let (t1, v1) = points[after];
    let share = (t - t0) as f64 / (t1 - t0).max(1) as f64;
    Some(v0 + ((v1 - v0) as f64 * share) as u64)
}

/// Peak resident set size of a running process, in bytes (`VmHWM`).
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resident memory of a process now (`VmRSS`), in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What the kernel reports of a reaped child.
pub struct Reaped {
    pub success: bool,
    /// User plus system CPU time over its whole life.
    pub cpu_ns: u64,
    pub peak_rss_bytes: u64,
}

/// Waits for `child` with `wait4`, which also returns its resource usage
/// (std's `wait` drops it).
pub fn reap(child: &mut Child) -> anyhow::Result<Reaped> {
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: valid pointers to locals; the pid is our own child.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).with_context(|| format!("wait4({pid})"));
        }
    }
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Ok(Reaped {
        success: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        cpu_ns: (micros(usage.ru_utime) + micros(usage.ru_stime)) * 1000,
        peak_rss_bytes: usage.ru_maxrss as u64 * 1024,
    })
}

/// Sends `signal` to a child that has not been reaped yet.
pub fn signal(child: &Child, signal: i32) -> anyhow::Result<()> {
    // SAFETY: plain syscall; the pid is our unreaped child, so not reused.
    if unsafe { libc::kill(child.id() as libc::pid_t, signal) } != 0 {
        bail!("kill({}): {}", child.id(), std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolates_inside_and_refuses_outside() {
        let points = [(100, 0), (200, 1000), (300, 1500)];
        assert_eq!(interpolate(&points, 150), Some(500));
        assert_eq!(interpolate(&points, 300), Some(1500));
        assert_eq!(interpolate(&points, 100), Some(0));
        assert_eq!(interpolate(&points, 50), None);
        assert_eq!(interpolate(&points, 301), None);
    }

    fn process_cpu_ns() -> u64 {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid timespec to write to.
        unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
        t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
    }

    #[test]
    fn tracks_own_cpu() {
        let tracker = CpuTracker::start(std::process::id());
        std::thread::sleep(POLL);
        let (start, cpu_start) = (monotonic_ns(), process_cpu_ns());
        let mut x = 0u64;
        while monotonic_ns() - start < 600_000_000 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let (end, cpu_end) = (monotonic_ns(), process_cpu_ns());
        std::thread::sleep(POLL * 2);
        let used = tracker.cpu_ns_between(start, end).expect("polled") as f64;
        let truth = (cpu_end - cpu_start) as f64;
        // Interpolation between 250 ms polls blurs the edges a little.
        assert!(
            (used - truth).abs() < truth * 0.5 + 50e6,
            "{used} vs {truth}"
        );
    }
}
