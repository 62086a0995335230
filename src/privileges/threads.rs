//! Changing the credentials of every thread of the process.
//!
//! The calling thread changes its own; each other thread is sent
//! [`signal`] and changes its own in the handler, with raw system calls
//! only (async-signal-safe: no allocation, no lock). Then every thread's
//! `/proc/self/task/TID/status` is compared with the caller's, and threads
//! that differ (one started meanwhile by a thread not yet changed, say) are
//! signalled again, until all agree or the attempts run out.

use std::sync::{
    OnceLock,
    atomic::{AtomicI32, AtomicUsize, Ordering},
};
use std::time::{Duration, Instant};

use super::{PrivilegeError, ThreadCreds};

/// What every thread ends up with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Switch to this UID, GID and supplementary groups.
    pub user: Option<(u32, u32, Vec<u32>)>,
    /// Permitted and effective capabilities (nothing inheritable or ambient).
    pub keep: u64,
    /// Remove every other capability from the bounding set.
    pub drop_bounding: bool,
    /// Set `no_new_privs`.
    pub no_new_privs: bool,
}

/// The target the handler reads (set once, before any signal is sent).
static TARGET: OnceLock<Target> = OnceLock::new();
/// The first step that failed in any thread (index into [`STEPS`] plus 1).
static FAILED_STEP: AtomicUsize = AtomicUsize::new(0);
/// Its errno.
static FAILED_ERRNO: AtomicI32 = AtomicI32::new(0);

const STEPS: [&str; 8] = [
    "prctl(PR_SET_KEEPCAPS)",
    "prctl(PR_CAPBSET_DROP)",
    "setgroups",
    "setresgid",
    "setresuid",
    "capset",
    "prctl(PR_CAP_AMBIENT_CLEAR_ALL)",
    "prctl(PR_SET_NO_NEW_PRIVS)",
];

/// How long the other threads have to follow.
const DEADLINE: Duration = Duration::from_secs(3);

/// The real-time signal the other threads change their credentials on:
/// glibc keeps the first two for itself (its own set*id broadcast among
/// them), and nothing else in icecore uses real-time signals.
fn signal() -> libc::c_int {
    libc::SIGRTMIN() + 6
}

/// Changes every thread to `target`.
pub fn apply_everywhere(target: &Target) -> Result<(), PrivilegeError> {
    let target = TARGET.get_or_init(|| target.clone());
    install_handler()?;
    let result = apply(target)
        .map_err(|(step, errno)| syscall_error(step, errno))
        .and_then(|()| follow());
    // Discards any signal still queued for a thread that changed already.
    // SAFETY: SIG_IGN for a signal only this module sends.
    unsafe { libc::signal(signal(), libc::SIG_IGN) };
    result
}

/// Signals the other threads until they match the caller.
fn follow() -> Result<(), PrivilegeError> {
    let want = ThreadCreds::of_self()?;
    // SAFETY: no arguments; cannot fail.
    let (pid, me) = unsafe { (libc::getpid(), libc::gettid()) };
    let started = Instant::now();
    let mut rounds = 0;
    loop {
        let stragglers = differing_threads(me, &want)?;
        let failed = FAILED_STEP.load(Ordering::Acquire);
        if failed != 0 {
            return Err(syscall_error(
                failed - 1,
                FAILED_ERRNO.load(Ordering::Acquire),
            ));
        }
        if stragglers.is_empty() {
            return Ok(());
        }
        if started.elapsed() > DEADLINE {
            return Err(PrivilegeError::Straggler {
                tids: stragglers,
                rounds,
            });
        }
        rounds += 1;
        for &tid in &stragglers {
            // SAFETY: tgkill with our own pid; a thread gone meanwhile gives ESRCH.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, signal()) };
        }
        std::thread::sleep(Duration::from_millis(2 * u64::from(rounds.min(25))));
    }
}

/// Threads of this process, other than `me`, whose credentials are not `want`.
fn differing_threads(me: i32, want: &ThreadCreds) -> Result<Vec<i32>, PrivilegeError> {
    let tasks = std::fs::read_dir("/proc/self/task")
        .map_err(|e| PrivilegeError::Status(format!("/proc/self/task: {e}")))?;
    let mut differing = Vec::new();
    for entry in tasks.flatten() {
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        if tid == me {
            continue;
        }
        // A thread that exited since the listing has nothing to change.
        if let Ok(creds) = ThreadCreds::read(&format!("/proc/self/task/{tid}/status"))
            && creds != *want
        {
            differing.push(tid);
        }
    }
    Ok(differing)
}

fn syscall_error(step: usize, errno: i32) -> PrivilegeError {
    PrivilegeError::Syscall {
        step: STEPS.get(step).copied().unwrap_or("a step"),
        source: std::io::Error::from_raw_os_error(errno),
    }
}

fn install_handler() -> Result<(), PrivilegeError> {
    // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as *const () as libc::sighandler_t;
        // Interrupted reads and writes resume; epoll and sleeps return
        // EINTR, which tokio and std retry.
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(signal(), &action, std::ptr::null_mut()) != 0 {
            return Err(PrivilegeError::Handler(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

extern "C" fn handler(_signal: libc::c_int) {
    // SAFETY: errno is thread-local; the handler restores it for the code
    // it interrupted.
    let errno = unsafe { *libc::__errno_location() };
    if let Some(target) = TARGET.get()
        && let Err((step, code)) = apply(target)
    {
        // The first failure is the one reported.
        if FAILED_STEP
            .compare_exchange(0, step + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            FAILED_ERRNO.store(code, Ordering::Release);
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const PR_CAP_AMBIENT: libc::c_int = 47;
const PR_CAP_AMBIENT_CLEAR_ALL: libc::c_ulong = 4;

/// Changes the calling thread; the failed step and errno otherwise.
/// Async-signal-safe, and harmless when the thread changed already.
fn apply(target: &Target) -> Result<(), (usize, i32)> {
    let check = |step: usize, rc: libc::c_long| {
        if rc < 0 {
            // SAFETY: errno is thread-local.
            Err((step, unsafe { *libc::__errno_location() }))
        } else {
            Ok(())
        }
    };
    // SAFETY (every call below): raw system calls on this thread's
    // credentials, with pointers to live locals or the static target.
    unsafe {
        let switched = target.user.as_ref().is_some_and(|(uid, _, _)| {
            let (mut r, mut e, mut s) = (0, 0, 0);
            libc::getresuid(&mut r, &mut e, &mut s) == 0 && [r, e, s] == [*uid; 3]
        });
        if target.user.is_some() && !switched {
            // Keeps the permitted set through the UID change.
            check(
                0,
                libc::c_long::from(libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0)),
            )?;
        }
        if target.drop_bounding {
            for cap in 0..64u32 {
                if target.keep & (1 << cap) != 0 {
                    continue;
                }
                // 1: in the set; 0: dropped already; -1: past the last capability.
                if libc::prctl(libc::PR_CAPBSET_READ, libc::c_ulong::from(cap), 0, 0, 0) != 1 {
                    continue;
                }
                check(
                    1,
                    libc::c_long::from(libc::prctl(
                        libc::PR_CAPBSET_DROP,
                        libc::c_ulong::from(cap),
                        0,
                        0,
                        0,
                    )),
                )?;
            }
        }
        if let Some((uid, gid, groups)) = &target.user
            && !switched
        {
            check(
                2,
                libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()),
            )?;
            check(3, libc::syscall(libc::SYS_setresgid, *gid, *gid, *gid))?;
            check(4, libc::syscall(libc::SYS_setresuid, *uid, *uid, *uid))?;
        }
        let low = (target.keep & 0xffff_ffff) as u32;
        let high = (target.keep >> 32) as u32;
        let mut header = CapHeader {
            version: CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [
            CapData {
                effective: low,
                permitted: low,
                inheritable: 0,
            },
            CapData {
                effective: high,
                permitted: high,
                inheritable: 0,
            },
        ];
        check(
            5,
            libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()),
        )?;
        // EINVAL before Linux 4.3, which has no ambient set to clear.
        let rc = libc::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
        if rc < 0 && *libc::__errno_location() != libc::EINVAL {
            check(6, libc::c_long::from(rc))?;
        }
        if target.user.is_some() {
            check(
                0,
                libc::c_long::from(libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0)),
            )?;
        }
        if target.no_new_privs {
            check(
                7,
                libc::c_long::from(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)),
            )?;
        }
    }
    Ok(())
}
