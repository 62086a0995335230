//! Least privilege after start-up: once the BPF programs are loaded and
//! attached, the perf events open, tracefs mounted and the listeners bound,
//! the agent keeps only the capabilities it still uses ([`KEPT`]), optionally
//! runs as another user (`--user`), and sets `no_new_privs`.
//!
//! Capabilities and user IDs belong to each thread, not to the process, and
//! by this point the async runtime, the unwind-table thread and the exec
//! watcher run already; so every thread makes the change itself (see
//! [`threads`]). The `caps` crate and glibc's `setresuid` do not help here:
//! `capset(2)` changes the calling thread only, and glibc's broadcast covers
//! the `set*id` calls, after which the other threads would have lost the
//! capabilities they still need.

mod creds;
mod threads;
mod user;

use std::path::Path;

pub use creds::ThreadCreds;
pub use user::User;

/// Reading and searching files regardless of their permissions.
pub const CAP_DAC_READ_SEARCH: u32 = 2;
/// Sets user and group IDs (`--user`); used by the switch, then dropped.
pub const CAP_SETGID: u32 = 6;
/// See [`CAP_SETGID`].
pub const CAP_SETUID: u32 = 7;
/// Changes the bounding set; used by the drop itself, then dropped.
pub const CAP_SETPCAP: u32 = 8;
/// `ptrace`-mode access to other processes.
pub const CAP_SYS_PTRACE: u32 = 19;
/// Kernel symbol addresses in `/proc/kallsyms`.
pub const CAP_SYSLOG: u32 = 34;
/// BPF objects.
pub const CAP_BPF: u32 = 39;
/// `/proc/PID/map_files`.
pub const CAP_CHECKPOINT_RESTORE: u32 = 40;

/// The capabilities the agent keeps after start-up, and why. Everything
/// else (`CAP_PERFMON`, `CAP_SYS_ADMIN`, `CAP_SYS_RESOURCE`,
/// `CAP_NET_BIND_SERVICE`, `CAP_SETUID`…) is used, if at all, only before
/// the drop: loading and attaching the programs, opening a perf event per
/// CPU, mounting tracefs, raising `RLIMIT_MEMLOCK`, binding the listeners.
/// A kept capability the agent was not started with stays absent (a
/// systemd unit or pod may grant fewer): the feature it serves degrades as
/// it would have without the drop.
pub const KEPT: [(u32, &str, &str); 5] = [
    (
        CAP_BPF,
        "CAP_BPF",
        "creates BPF maps while running: each newly seen binary's unwind table is a new inner map (with its BTF), and so is a grown sample ring",
    ),
    (
        CAP_SYS_PTRACE,
        "CAP_SYS_PTRACE",
        "reads any user's /proc/PID/maps, /proc/PID/mem (the runtime unwinders: Python, Ruby, JVM, V8, PHP, Perl) and files through /proc/PID/root",
    ),
    (
        CAP_DAC_READ_SEARCH,
        "CAP_DAC_READ_SEARCH",
        "reads the binaries, debug files, perf maps and jitdumps of processes of any user, in directories closed to others",
    ),
    (
        CAP_CHECKPOINT_RESTORE,
        "CAP_CHECKPOINT_RESTORE",
        "opens /proc/PID/map_files/*: the mapped file itself, even deleted, replaced or in another mount namespace (Linux 5.9+; CAP_SYS_ADMIN before)",
    ),
    (
        CAP_SYSLOG,
        "CAP_SYSLOG",
        "reads kernel symbol addresses from /proc/kallsyms, loaded on the first kernel frame; the kernel hides them without it unless kptr_restrict is 0 and perf_event_paranoid at most 1",
    ),
];

/// The mask of [`KEPT`].
pub fn kept_mask() -> u64 {
    KEPT.iter().fold(0, |mask, (cap, _, _)| mask | 1 << cap)
}

/// The names of the capabilities in `mask`, for logs and errors.
pub fn names(mask: u64) -> String {
    let mut names = Vec::new();
    for cap in 0..64u32 {
        if mask & (1 << cap) != 0 {
            names.push(KEPT.iter().find(|(c, _, _)| *c == cap).map_or_else(
                || format!("capability {cap}"),
                |(_, name, _)| (*name).to_owned(),
            ));
        }
    }
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// What to do after start-up.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Run as this user (and its groups) from now on.
    pub user: Option<User>,
    /// Keep every capability the agent has (`--keep-capabilities`).
    pub keep_all: bool,
}

/// Why the privileges could not be lowered; the agent stops rather than
/// run with some threads lowered and others not.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    /// `/proc/self/status` or a thread's status could not be read or parsed.
    #[error("cannot read this process's credentials: {0}")]
    Status(String),
    /// Switching user needs `CAP_SETUID` and `CAP_SETGID`.
    #[error(
        "--user {user}: switching user needs CAP_SETUID and CAP_SETGID, which this process lacks"
    )]
    CannotSwitch {
        /// The user asked for.
        user: String,
    },
    /// A system call of the switch failed in some thread.
    #[error("{step} failed")]
    Syscall {
        /// What was being done.
        step: &'static str,
        /// The error the kernel returned.
        source: std::io::Error,
    },
    /// The signal handler that makes each thread change could not be installed.
    #[error("cannot install the signal handler that lowers each thread's privileges: {0}")]
    Handler(std::io::Error),
    /// Some threads kept other credentials after every attempt.
    #[error("threads {tids:?} still hold other credentials after {rounds} attempts")]
    Straggler {
        /// The threads.
        tids: Vec<i32>,
        /// Attempts made.
        rounds: u32,
    },
    /// The pprof directory cannot be written after the switch.
    #[error(
        "--pprof-dir {path}: not writable once running as {user}; give the directory to that user"
    )]
    PprofDir {
        /// The directory.
        path: String,
        /// The user now running.
        user: String,
        /// The write error.
        source: std::io::Error,
    },
}

/// Lowers every thread's privileges according to `plan`; returns the
/// capabilities kept (a subset of what the process had).
pub fn lower(plan: &Plan) -> Result<u64, PrivilegeError> {
    let own = ThreadCreds::of_self()?;
    let keep = if plan.keep_all {
        own.permitted
    } else {
        own.permitted & kept_mask()
    };
    if plan.user.is_some() {
        let setid = 1 << CAP_SETUID | 1 << CAP_SETGID;
        if own.effective & setid != setid {
            return Err(PrivilegeError::CannotSwitch {
                user: plan
                    .user
                    .as_ref()
                    .map(|u| u.name.clone())
                    .unwrap_or_default(),
            });
        }
    }
    // The bounding set can only shrink with CAP_SETPCAP; without it (a
    // systemd unit's CapabilityBoundingSet) it is left as given, and
    // no_new_privs keeps it from mattering: nothing executed gains more.
    let drop_bounding = !plan.keep_all && own.effective & (1 << CAP_SETPCAP) != 0;
    let target = threads::Target {
        user: plan.user.as_ref().map(|u| (u.uid, u.gid, u.groups.clone())),
        keep,
        drop_bounding,
        no_new_privs: !plan.keep_all,
    };
    threads::apply_everywhere(&target)?;
    Ok(keep)
}

/// Checks that `dir` is still writable (after a user switch).
pub fn check_writable(dir: &Path, user: &str) -> Result<(), PrivilegeError> {
    let probe = dir.join(format!(".icecore-write-test-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|source| PrivilegeError::PprofDir {
        path: dir.display().to_string(),
        user: user.to_owned(),
        source,
    })?;
    // Best effort: a leftover empty probe is harmless.
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_set_is_the_documented_one() {
        // BPF 39, SYS_PTRACE 19, DAC_READ_SEARCH 2, CHECKPOINT_RESTORE 40, SYSLOG 34.
        assert_eq!(kept_mask(), 0x0000_0184_0008_0004);
        assert_eq!(
            names(kept_mask()),
            "CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE, CAP_SYSLOG, CAP_BPF, CAP_CHECKPOINT_RESTORE"
        );
        for dropped in [CAP_SETUID, CAP_SETGID, CAP_SETPCAP, 21, 38, 24, 10, 1] {
            assert_eq!(kept_mask() & (1 << dropped), 0, "{dropped}");
        }
        assert_eq!(names(0), "none");
        assert_eq!(names(1 << 21), "capability 21");
    }
}
