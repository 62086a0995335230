//! Kernel memory of icecore's BPF maps, as the kernel accounts it.
//!
//! Each map file descriptor's `/proc/self/fdinfo` entry has `memlock`: the
//! bytes the kernel charged for the map (its actual usage since Linux 6.4,
//! the preallocated size before). Maps this process holds descriptors of are
//! summed by scanning its fdinfo; inner maps (unwind tables, process mapping
//! tables) are only referenced by their outer map once installed, so their
//! size is read when they are created and kept by their owner.

use std::collections::HashSet;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The `memlock` of one map file descriptor; None when the kernel does not
/// say (no such line, or not a map).
pub fn map_memlock(fd: BorrowedFd<'_>) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    parse_fdinfo(&info).map(|(_, bytes)| bytes)
}

/// Bytes of the distinct BPF maps this process holds descriptors of (a map
/// open through two descriptors counts once).
pub fn held_map_bytes() -> std::io::Result<u64> {
    let mut seen = HashSet::new();
    let mut total = 0u64;
    for entry in std::fs::read_dir("/proc/self/fdinfo")? {
        let Ok(entry) = entry else { continue };
        // A descriptor closed since the listing has no entry any more.
        let Ok(info) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        if let Some((id, bytes)) = parse_fdinfo(&info)
            && seen.insert(id)
        {
            total = total.saturating_add(bytes);
        }
    }
    Ok(total)
}

/// `(map_id, memlock)` of a map's fdinfo text. Kernels before 4.15 print no
/// `map_id`; each descriptor then counts as its own map (id 0 is never
/// deduplicated against another).
fn parse_fdinfo(info: &str) -> Option<(u64, u64)> {
    let mut id = None;
    let mut memlock = None;
    let mut is_map = false;
    for line in info.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "map_type" => is_map = true,
            "map_id" => id = value.parse().ok(),
            "memlock" => memlock = value.parse().ok(),
            _ => {}
        }
    }
    if !is_map {
        return None;
    }
    Some((id.unwrap_or_else(unique_anonymous_id), memlock?))
}

/// An id no real map has (real ids are u32), distinct per call.
fn unique_anonymous_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1 << 32);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_map_fdinfo() {
        let info = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t2063\nmap_type:\t2\n\
                    key_size:\t4\nvalue_size:\t8\nmax_entries:\t22\nmap_flags:\t0x0\n\
                    map_extra:\t0x0\nmemlock:\t488\nmap_id:\t91\nfrozen:\t0\n";
        assert_eq!(parse_fdinfo(info), Some((91, 488)));
    }

    #[test]
    fn ignores_other_descriptors() {
        assert_eq!(parse_fdinfo("pos:\t0\nflags:\t02\nmnt_id:\t15\n"), None);
        let prog = "pos:\t0\nprog_type:\t7\nprog_jited:\t1\nmemlock:\t4096\nprog_id:\t3\n";
        assert_eq!(parse_fdinfo(prog), None);
    }

    #[test]
    fn maps_without_ids_are_counted_apart() {
        let info = "map_type:\t2\nmemlock:\t100\n";
        let (a, _) = parse_fdinfo(info).unwrap();
        let (b, _) = parse_fdinfo(info).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn garbage_is_not_a_map() {
        assert_eq!(parse_fdinfo("map_type:\t2\nmemlock:\tlots\n"), None);
        assert_eq!(parse_fdinfo("\0\0\0:::\n\n"), None);
    }
}
