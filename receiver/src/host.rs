//! Facts about the host: privileges, kernel version, tracefs, host name.

use std::{fs, io, path::Path};

use crate::sampler::SamplerError;

const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capabilities of this process, from `/proc/self/status`.
fn effective_capabilities() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    parse_cap_eff(&status)
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Whether a capability set allows loading the programs, opening perf events
/// on every CPU and reading other processes' memory maps.
fn capabilities_suffice(caps: u64) -> bool {
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    let bpf_and_perf = has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON));
    bpf_and_perf && (has(CAP_SYS_PTRACE) || has(CAP_SYS_ADMIN))
}

/// Fails with the one-line privilege message unless this process may sample.
pub fn check_privileges() -> Result<(), SamplerError> {
    match effective_capabilities() {
        Some(caps) if capabilities_suffice(caps) => Ok(()),
        // Unknown (no /proc/self/status): let the kernel decide, and map its EPERM.
        None => Ok(()),
        Some(_) => Err(SamplerError::Privileges),
    }
}

/// The running kernel's release string, e.g. `6.18.44-amd64`.
pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "an unknown kernel".to_owned())
}

/// (major, minor) of a release string.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The host's name (`host.name`).
pub fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Where tracefs is mounted on modern systems.
pub const TRACEFS: &str = "/sys/kernel/tracing";

fn is_tracefs_mounted(mounts: &str, at: &str) -> bool {
    mounts.lines().any(|l| {
        let mut fields = l.split_whitespace();
        let _source = fields.next();
        let target = fields.next();
        let fstype = fields.next();
        target == Some(at) && fstype == Some("tracefs")
    })
}

/// Mounts tracefs at [`TRACEFS`] unless it is mounted already (tracepoints
/// need it). Returns whether this call mounted it.
pub fn ensure_tracefs() -> io::Result<bool> {
    let mounts = fs::read_to_string("/proc/self/mounts")?;
    if is_tracefs_mounted(&mounts, TRACEFS) {
        return Ok(false);
    }
    if !Path::new(TRACEFS).is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{TRACEFS} does not exist"),
        ));
    }
    let source = c"nodev";
    let target = c"/sys/kernel/tracing";
    let fstype = c"tracefs";
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(true)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Returns the allocator's free memory to the system (glibc keeps freed
/// memory in its arenas otherwise). Costs well under a millisecond on
/// icecore's heaps; called after large transient work (a table build), so
/// the peak does not wait for the binary's periodic trim.
pub fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions() {
        assert_eq!(kernel_version("6.18.44-amd64"), Some((6, 18)));
        assert_eq!(kernel_version("5.10.0-46-amd64"), Some((5, 10)));
        assert_eq!(kernel_version("garbage"), None);
    }

    #[test]
    fn capability_sets() {
        let root = parse_cap_eff("Name:\tx\nCapEff:\t000001ffffffffff\n").unwrap();
        assert!(capabilities_suffice(root));
        let fine_grained = (1 << CAP_BPF) | (1 << CAP_PERFMON) | (1 << CAP_SYS_PTRACE);
        assert!(capabilities_suffice(fine_grained));
        assert!(!capabilities_suffice((1 << CAP_BPF) | (1 << CAP_PERFMON)));
        assert!(!capabilities_suffice(0));
    }

    #[test]
    fn finds_tracefs_mount() {
        let mounts = "proc /proc proc rw 0 0\nnodev /sys/kernel/tracing tracefs rw 0 0\n";
        assert!(is_tracefs_mounted(mounts, TRACEFS));
        assert!(!is_tracefs_mounted("proc /proc proc rw 0 0\n", TRACEFS));
    }
}
