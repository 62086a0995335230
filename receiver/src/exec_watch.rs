//! A thread that follows new process images the moment they exist: on each
//! `exec` BPF reports, it reads the process's mappings and identity and
//! opens its executable files, then reads the mappings again over the next
//! fraction of a second, while the dynamic loader maps the libraries.
//!
//! The profiler's own loop can be busy for a hundred milliseconds and more
//! (a batch being symbolized, an unwind table installed), and a process of
//! a build or a cron job may live a few milliseconds: what this thread
//! reads, and the files it holds open, let the profiler symbolize such a
//! process's samples after it is gone. The profiler takes the results in
//! order through a bounded channel at each drain.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use aya::maps::{MapData, RingBuf};
use icecore_unwinders::events::{ProcessEvent, ProcessEventKind};
use tracing::{debug, warn};

use crate::process_maps::{MappedFile, ProcessMappings};
use crate::processes::ImageSnapshot;

/// When the mappings of a new image are read again, after its exec: by the
/// last one a dynamically linked program has run its loader.
const REREAD_AFTER: [Duration; 3] = [
    Duration::from_millis(2),
    Duration::from_millis(20),
    Duration::from_millis(200),
];
/// Results waiting for the profiler; beyond this, events are dropped and
/// counted (those processes are learned at their first sample instead).
const QUEUE: usize = 8192;
/// Images followed at once; beyond this the oldest is no longer re-read.
const MAX_FOLLOWED: usize = 1024;
/// How long the thread sleeps when nothing happens, so it notices shutdown.
const IDLE_WAIT: Duration = Duration::from_millis(250);

/// An executable file of a process, open: readable through
/// `/proc/self/fd/N` after the process (and, for a deleted file or one in a
/// container, the path to it) is gone.
#[derive(Debug, Clone)]
pub struct HeldFile {
    /// Device of the file as (major, minor).
    pub dev: (u32, u32),
    /// Inode of the file.
    pub inode: u64,
    /// The open file.
    pub file: Arc<File>,
}

impl HeldFile {
    /// A path that opens this very file while it is held.
    pub fn path(&self) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// What the thread learned, in the order it happened.
#[derive(Debug)]
pub enum Lifecycle {
    /// `pid` ran `exec` at `ktime_ns`; the new image as read right after.
    Exec {
        /// The process.
        pid: u32,
        /// When the exec happened (`CLOCK_MONOTONIC`).
        ktime_ns: u64,
        /// The image read after it.
        snapshot: Box<ImageSnapshot>,
        /// Its executable files, open.
        files: Vec<HeldFile>,
    },
    /// The image of the exec at `ktime_ns` now maps more (its libraries).
    Mappings {
        /// The process.
        pid: u32,
        /// The exec that started the image.
        ktime_ns: u64,
        /// Its mappings now.
        mappings: ProcessMappings,
        /// Executable files it maps that the earlier reads did not.
        files: Vec<HeldFile>,
    },
    /// BPF dropped a sample of `pid` because it has no mapping table for it
    /// (a child forked from a described process, a process whose first
    /// description failed, or an image whose exec is being read).
    Unknown {
        /// The process.
        pid: u32,
    },
    /// A process described to BPF exited.
    Exit {
        /// The process.
        pid: u32,
        /// When its main thread exited.
        ktime_ns: u64,
    },
}

/// Counters of the thread.
#[derive(Debug, Default)]
pub struct ExecWatchStats {
    /// Execs seen.
    pub execs: AtomicU64,
    /// Events dropped because the profiler fell behind.
    pub dropped: AtomicU64,
    /// Execs whose process was gone before it could be read.
    pub gone_at_exec: AtomicU64,
}

/// The running thread; stopped and joined when dropped.
pub struct ExecWatcher {
    results: Receiver<Lifecycle>,
    /// Notified when results wait, so that a new process is described to
    /// BPF at once rather than at the profiler's next poll.
    ready: Arc<tokio::sync::Notify>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<ExecWatchStats>,
}

impl ExecWatcher {
    /// Starts following the events of `ring` (BPF's `PROCESS_EVENTS`).
    pub fn spawn(ring: RingBuf<MapData>) -> std::io::Result<Self> {
        let (sender, results) = sync_channel(QUEUE);
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(ExecWatchStats::default());
        let ready = Arc::new(tokio::sync::Notify::new());
        let thread = {
            let stop = stop.clone();
            let stats = stats.clone();
            let ready = ready.clone();
            std::thread::Builder::new()
                .name("icecore-exec".into())
                .spawn(move || Follower::new(sender, stats, ready).run(ring, &stop))?
        };
        Ok(Self {
            results,
            ready,
            stop,
            thread: Some(thread),
            stats,
        })
    }

    /// Hands every result waiting to `f`, in order; never blocks.
    pub fn drain(&self, mut f: impl FnMut(Lifecycle)) {
        while let Ok(result) = self.results.try_recv() {
            f(result);
        }
    }

    /// Notified when results wait (see [`Self::drain`]).
    pub fn ready_notifier(&self) -> Arc<tokio::sync::Notify> {
        self.ready.clone()
    }

    /// The thread's counters, live.
    pub fn stats(&self) -> Arc<ExecWatchStats> {
        self.stats.clone()
    }
}

impl Drop for ExecWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A new image being read again over its first moments.
struct Followed {
    pid: u32,
    ktime_ns: u64,
    exec_seen: Instant,
    rereads_done: usize,
    mappings: ProcessMappings,
}

struct Follower {
    sender: SyncSender<Lifecycle>,
    stats: Arc<ExecWatchStats>,
    ready: Arc<tokio::sync::Notify>,
    followed: Vec<Followed>,
}

impl Follower {
    fn new(
        sender: SyncSender<Lifecycle>,
        stats: Arc<ExecWatchStats>,
        ready: Arc<tokio::sync::Notify>,
    ) -> Self {
        Self {
            sender,
            stats,
            ready,
            followed: Vec::new(),
        }
    }

    fn run(mut self, mut ring: RingBuf<MapData>, stop: &AtomicBool) {
        while !stop.load(Relaxed) {
            let wait = self.next_reread().unwrap_or(IDLE_WAIT).min(IDLE_WAIT);
            if let Err(e) = wait_readable(&ring, wait) {
                warn!("process events: waiting failed, polling instead: {e}");
                std::thread::sleep(IDLE_WAIT);
            }
            while let Some(item) = ring.next() {
                if let Some(event) = decode(&item) {
                    self.event(event);
                }
            }
            self.reread_due();
        }
    }

    fn send(&self, result: Lifecycle) {
        match self.sender.try_send(result) {
            Ok(()) => self.ready.notify_one(),
            Err(TrySendError::Full(_)) => {
                self.stats.dropped.fetch_add(1, Relaxed);
            }
            // The profiler stopped; the thread is about to be told to stop.
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    fn event(&mut self, event: ProcessEvent) {
        match event.kind() {
            Some(ProcessEventKind::Exec) => {
                self.stats.execs.fetch_add(1, Relaxed);
                let snapshot = ImageSnapshot::read(event.pid, "");
                if snapshot.mappings.is_empty() {
                    self.stats.gone_at_exec.fetch_add(1, Relaxed);
                }
                let files = hold_files(event.pid, snapshot.mappings.mappings(), &[]);
                if self.followed.len() >= MAX_FOLLOWED {
                    self.followed.remove(0);
                }
                // A pid that execs again starts over.
                self.followed.retain(|f| f.pid != event.pid);
                self.followed.push(Followed {
                    pid: event.pid,
                    ktime_ns: event.ktime_ns,
                    exec_seen: Instant::now(),
                    rereads_done: 0,
                    mappings: snapshot.mappings.clone(),
                });
                self.send(Lifecycle::Exec {
                    pid: event.pid,
                    ktime_ns: event.ktime_ns,
                    snapshot: Box::new(snapshot),
                    files,
                });
            }
            Some(ProcessEventKind::Exit) => {
                self.followed.retain(|f| f.pid != event.pid);
                self.send(Lifecycle::Exit {
                    pid: event.pid,
                    ktime_ns: event.ktime_ns,
                });
            }
            // Counted by BPF (`unknown_process`).
            Some(ProcessEventKind::Unknown) => self.send(Lifecycle::Unknown { pid: event.pid }),
            None => debug!(kind = event.kind, "unknown process event"),
        }
    }

    /// Time until the next re-read is due.
    fn next_reread(&self) -> Option<Duration> {
        self.followed
            .iter()
            .filter_map(|f| {
                let after = REREAD_AFTER.get(f.rereads_done)?;
                Some(after.saturating_sub(f.exec_seen.elapsed()))
            })
            .min()
    }

    fn reread_due(&mut self) {
        let mut updates = Vec::new();
        self.followed.retain_mut(|f| {
            let Some(after) = REREAD_AFTER.get(f.rereads_done) else {
                return false;
            };
            if f.exec_seen.elapsed() < *after {
                return true;
            }
            f.rereads_done += 1;
            let Ok(now) = ProcessMappings::read(f.pid) else {
                return false; // gone: nothing more to learn
            };
            if now != f.mappings && !now.is_empty() {
                let files = hold_files(f.pid, now.mappings(), f.mappings.mappings());
                f.mappings = now.clone();
                updates.push(Lifecycle::Mappings {
                    pid: f.pid,
                    ktime_ns: f.ktime_ns,
                    mappings: now,
                    files,
                });
            }
            f.rereads_done < REREAD_AFTER.len()
        });
        for update in updates {
            self.send(update);
        }
    }
}

/// Opens the executable files of `mappings` not in `known`: through
/// `map_files` (the very file mapped, even deleted), else through the
/// process's root.
fn hold_files(pid: u32, mappings: &[MappedFile], known: &[MappedFile]) -> Vec<HeldFile> {
    let mut held: Vec<HeldFile> = Vec::new();
    for m in mappings.iter().filter(|m| m.executable && !m.is_vdso()) {
        let seen = |list: &[MappedFile]| list.iter().any(|k| k.dev == m.dev && k.inode == m.inode);
        if seen(known) || held.iter().any(|h| h.dev == m.dev && h.inode == m.inode) {
            continue;
        }
        let candidates = [
            format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end),
            format!("/proc/{pid}/root{}", m.path),
        ];
        if let Some(file) = candidates.iter().find_map(|p| File::open(p).ok()) {
            held.push(HeldFile {
                dev: m.dev,
                inode: m.inode,
                file: Arc::new(file),
            });
        }
    }
    held
}

fn wait_readable(ring: &RingBuf<MapData>, timeout: Duration) -> std::io::Result<()> {
    let mut poll = libc::pollfd {
        fd: ring.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd, its count, and a timeout.
    let ret = unsafe { libc::poll(&mut poll, 1, millis.max(1)) };
    if ret < 0 {
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
    Ok(())
}

fn decode(bytes: &[u8]) -> Option<ProcessEvent> {
    let pid = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?);
    let kind = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?);
    let ktime_ns = u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?);
    Some(ProcessEvent {
        pid,
        kind,
        ktime_ns,
    })
}
