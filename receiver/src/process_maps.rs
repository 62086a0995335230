//! Reading a process's memory layout and identity from `/proc`.
//!
//! [`ProcessMappings`] parses `/proc/<pid>/maps` into the file-backed mappings
//! (plus the `[vdso]`) that native frames are symbolized against; anonymous
//! memory, `[heap]`, `[stack]` and the other pseudo mappings are dropped.
//! [`executable_path`] and [`start_time_ticks`] read the other two `/proc` facts
//! a process tracker needs: the executable and a start time that tells a
//! reused PID from the process that had it before.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::sync::Arc;

/// Largest `/proc/<pid>/maps` accepted, in bytes.
pub const MAX_MAPS_BYTES: u64 = 64 << 20;
/// Largest number of lines accepted in `/proc/<pid>/maps`.
pub const MAX_MAPS_LINES: usize = 1 << 20;
/// Name of the pseudo mapping of the kernel's virtual DSO.
pub const VDSO_NAME: &str = "[vdso]";
const DELETED_SUFFIX: &str = " (deleted)";
/// `/proc/<pid>/stat` is a single short line; anything longer is corrupt.
const MAX_STAT_BYTES: u64 = 64 << 10;

/// Why a `/proc` file of a process could not be read or understood.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The process no longer exists (ENOENT/ESRCH on its `/proc` entry).
    #[error("process {pid} is gone")]
    Gone {
        /// The process that vanished.
        pid: u32,
    },
    /// Reading the file was refused; the profiler lacks privileges.
    #[error("permission denied reading {path}")]
    PermissionDenied {
        /// The file that could not be read.
        path: String,
    },
    /// The process exists but has no executable (a kernel thread).
    #[error("process {pid} has no executable (kernel thread?)")]
    NoExecutable {
        /// The process without executable.
        pid: u32,
    },
    /// Any other I/O failure.
    #[error("reading {path}: {source}")]
    Io {
        /// The file that could not be read.
        path: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A line of a maps file is not in the kernel's format.
    #[error("maps line {line_number} is malformed ({reason}): {line:?}")]
    MapsLine {
        /// 1-based line number.
        line_number: usize,
        /// The offending line, truncated to 200 bytes.
        line: String,
        /// Which field was wrong.
        reason: &'static str,
    },
    /// A stat file is not in the kernel's format.
    #[error("malformed stat line: {reason}")]
    Stat {
        /// What was wrong.
        reason: &'static str,
    },
    /// A maps file exceeds [`MAX_MAPS_BYTES`] or [`MAX_MAPS_LINES`].
    #[error("{path} is too large (limit {limit} {unit})")]
    TooLarge {
        /// The file that was refused.
        path: String,
        /// The limit that was exceeded.
        limit: u64,
        /// Unit of the limit: "bytes" or "lines".
        unit: &'static str,
    },
}

impl ProcessError {
    /// Whether the error only means the process exited meanwhile.
    pub fn is_gone(&self) -> bool {
        matches!(self, ProcessError::Gone { .. })
    }

    fn from_io(pid: u32, path: &str, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::NotFound || source.raw_os_error() == Some(libc::ESRCH) {
            ProcessError::Gone { pid }
        } else if source.kind() == io::ErrorKind::PermissionDenied {
            ProcessError::PermissionDenied {
                path: path.to_owned(),
            }
        } else {
            ProcessError::Io {
                path: path.to_owned(),
                source,
            }
        }
    }
}

/// One file-backed mapping of a process (or its `[vdso]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MappedFile {
    /// First address of the mapping.
    pub start: u64,
    /// One past the last address of the mapping.
    pub end: u64,
    /// Offset in the file of `start`.
    pub file_offset: u64,
    /// Device of the file as (major, minor).
    pub dev: (u32, u32),
    /// Inode of the file; 0 for the `[vdso]`.
    pub inode: u64,
    /// Path as the process sees it, without a " (deleted)" suffix, or `[vdso]`.
    pub path: Arc<str>,
    /// Whether the mapping is executable (`x` permission).
    pub executable: bool,
    /// Whether the file was deleted (or replaced) after being mapped.
    pub deleted: bool,
}

impl MappedFile {
    /// Whether this is the kernel's virtual DSO rather than a file.
    pub fn is_vdso(&self) -> bool {
        &*self.path == VDSO_NAME
    }

    /// Whether `addr` falls in the mapping.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// The file offset of `addr`, or `None` when `addr` is outside the mapping.
    pub fn file_offset_of(&self, addr: u64) -> Option<u64> {
        if !self.contains(addr) {
            return None;
        }
        (addr - self.start).checked_add(self.file_offset)
    }
}

/// An executable mapping backed by no file on disk: JIT code (anonymous
/// memory, `[anon:…]`, or a `memfd:` double mapping).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AnonymousCode {
    /// First address of the mapping.
    pub start: u64,
    /// One past the last address of the mapping.
    pub end: u64,
}

impl AnonymousCode {
    /// Whether `addr` falls in the mapping.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }
}

/// The file-backed mappings of one process, sorted by address, and its
/// executable anonymous mappings (JIT code).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessMappings {
    mappings: Vec<MappedFile>,
    anonymous_code: Vec<AnonymousCode>,
}

impl ProcessMappings {
    /// Reads and parses `/proc/<pid>/maps`.
    pub fn read(pid: u32) -> Result<Self, ProcessError> {
        let path = format!("/proc/{pid}/maps");
        let bytes = read_bounded(pid, &path, MAX_MAPS_BYTES)?;
        // Paths need not be UTF-8; a lossy path still names the mapping.
        let text = String::from_utf8_lossy(&bytes);
        Self::parse_with_name(&text, &path)
    }

    /// Parses the text of a maps file.
    pub fn parse(text: &str) -> Result<Self, ProcessError> {
        Self::parse_with_name(text, "maps")
    }

    fn parse_with_name(text: &str, name: &str) -> Result<Self, ProcessError> {
        Self::parse_bounded(text, name, MAX_MAPS_LINES)
    }

    fn parse_bounded(text: &str, name: &str, max_lines: usize) -> Result<Self, ProcessError> {
        if text.len() as u64 > MAX_MAPS_BYTES {
            return Err(ProcessError::TooLarge {
                path: name.to_owned(),
                limit: MAX_MAPS_BYTES,
                unit: "bytes",
            });
        }
        let mut mappings: Vec<MappedFile> = Vec::new();
        let mut anonymous_code = Vec::new();
        for (index, line) in text.lines().enumerate() {
            if index >= max_lines {
                return Err(ProcessError::TooLarge {
                    path: name.to_owned(),
                    limit: max_lines as u64,
                    unit: "lines",
                });
            }
            if line.trim().is_empty() {
                continue;
            }
            let raw = parse_line(line).map_err(|reason| ProcessError::MapsLine {
                line_number: index + 1,
                line: truncate(line, 200).to_owned(),
                reason,
            })?;
            if raw.executable && is_anonymous_code(raw.path) {
                anonymous_code.push(AnonymousCode {
                    start: raw.start,
                    end: raw.end,
                });
                continue;
            }
            let Some((path, deleted)) = keep_path(raw.path) else {
                continue;
            };
            // Consecutive mappings of one file share its path.
            let path = match mappings.last() {
                Some(prev) if *prev.path == *path => Arc::clone(&prev.path),
                _ => Arc::from(path),
            };
            mappings.push(MappedFile {
                start: raw.start,
                end: raw.end,
                file_offset: raw.offset,
                dev: raw.dev,
                inode: raw.inode,
                path,
                executable: raw.executable,
                deleted,
            });
        }
        // The kernel lists mappings in address order; text from elsewhere may not.
        if !mappings.is_sorted_by_key(|m| m.start) {
            mappings.sort_by_key(|m| m.start);
        }
        if !anonymous_code.is_sorted_by_key(|m| m.start) {
            anonymous_code.sort_by_key(|m| m.start);
        }
        Ok(ProcessMappings {
            mappings,
            anonymous_code,
        })
    }

    /// The executable anonymous mapping containing `addr`, if any.
    pub fn find_anonymous_code(&self, addr: u64) -> Option<&AnonymousCode> {
        let index = self.anonymous_code.partition_point(|m| m.start <= addr);
        let code = self.anonymous_code.get(index.checked_sub(1)?)?;
        code.contains(addr).then_some(code)
    }

    /// Whether `addr` lies in executable memory as these mappings know it: a
    /// file mapped executable or anonymous code. A sampled PC or return
    /// address outside it means the mappings are stale, even where a
    /// non-executable mapping covers it: the dynamic loader first maps a
    /// library's whole span read-only, then maps its text over that.
    pub fn covers_code(&self, addr: u64) -> bool {
        self.find(addr).is_some_and(|m| m.executable) || self.find_anonymous_code(addr).is_some()
    }

    /// The executable anonymous mappings (JIT code), sorted by start address.
    pub fn anonymous_code(&self) -> &[AnonymousCode] {
        &self.anonymous_code
    }

    /// The mapping containing `addr`, whatever its permissions.
    pub fn find(&self, addr: u64) -> Option<&MappedFile> {
        let index = self.mappings.partition_point(|m| m.start <= addr);
        let mapping = self.mappings.get(index.checked_sub(1)?)?;
        mapping.contains(addr).then_some(mapping)
    }

    /// All kept mappings, sorted by start address.
    pub fn mappings(&self) -> &[MappedFile] {
        &self.mappings
    }

    /// The executable mappings only.
    pub fn executable(&self) -> impl Iterator<Item = &MappedFile> {
        self.mappings.iter().filter(|m| m.executable)
    }

    /// Number of kept mappings.
    pub fn len(&self) -> usize {
        self.mappings.len()
    }

    /// Whether no mapping was kept (e.g. a kernel thread).
    pub fn is_empty(&self) -> bool {
        self.mappings.is_empty()
    }
}

/// The fields of one maps line before filtering.
struct RawLine<'a> {
    start: u64,
    end: u64,
    executable: bool,
    offset: u64,
    dev: (u32, u32),
    inode: u64,
    path: &'a str,
}

/// Splits `start-end perms offset major:minor inode   path`.
fn parse_line(line: &str) -> Result<RawLine<'_>, &'static str> {
    let (range, rest) = next_field(line).ok_or("missing address range")?;
    let (perms, rest) = next_field(rest).ok_or("missing permissions")?;
    let (offset, rest) = next_field(rest).ok_or("missing offset")?;
    let (dev, rest) = next_field(rest).ok_or("missing device")?;
    let (inode, rest) = next_field(rest).unwrap_or((rest, ""));
    let (start, end) = range.split_once('-').ok_or("address range without '-'")?;
    let start = u64::from_str_radix(start, 16).map_err(|_| "bad start address")?;
    let end = u64::from_str_radix(end, 16).map_err(|_| "bad end address")?;
    if end < start {
        return Err("end address before start address");
    }
    let perms = perms.as_bytes();
    if perms.len() != 4 {
        return Err("bad permissions");
    }
    let offset = u64::from_str_radix(offset, 16).map_err(|_| "bad offset")?;
    let (major, minor) = dev.split_once(':').ok_or("device without ':'")?;
    let major = u32::from_str_radix(major, 16).map_err(|_| "bad device major")?;
    let minor = u32::from_str_radix(minor, 16).map_err(|_| "bad device minor")?;
    let inode = inode.parse::<u64>().map_err(|_| "bad inode")?;
    Ok(RawLine {
        start,
        end,
        executable: perms[2] == b'x',
        offset,
        dev: (major, minor),
        inode,
        // The path is padded with spaces and may itself contain spaces.
        path: rest.trim_start_matches(' '),
    })
}

/// The next space-separated field and the text after it.
fn next_field(text: &str) -> Option<(&str, &str)> {
    let text = text.trim_start_matches(' ');
    if text.is_empty() {
        return None;
    }
    Some(match text.find(' ') {
        Some(at) => (&text[..at], &text[at + 1..]),
        None => (text, ""),
    })
}

/// Whether an executable mapping's path says it holds code of no file:
/// anonymous memory, a named anonymous region, or a `memfd` (runtimes that
/// map their JIT code twice, writable and executable, use one).
fn is_anonymous_code(path: &str) -> bool {
    path.is_empty()
        || path.starts_with("[anon:")
        || path.starts_with("/memfd:")
        || is_shared_anonymous(path)
}

/// Shared anonymous memory, which the kernel names after the file it
/// pretends to map: `mmap(MAP_SHARED | MAP_ANONYMOUS)` shows as a deleted
/// `/dev/zero`, System V shared memory as `/SYSV<key>`. PHP's opcache keeps
/// its JIT code in one or the other.
fn is_shared_anonymous(path: &str) -> bool {
    path == "/dev/zero (deleted)" || path.starts_with("/SYSV")
}

/// The path to keep for a mapping with its deleted flag, or `None` to drop it.
fn keep_path(path: &str) -> Option<(&str, bool)> {
    if path == VDSO_NAME {
        return Some((path, false));
    }
    // Anonymous memory, [heap], [stack], [vvar], [anon:...], anon_inode:...
    if !path.starts_with('/') || is_shared_anonymous(path) {
        return None;
    }
    match path.strip_suffix(DELETED_SUFFIX) {
        Some(stripped) => Some((stripped, true)),
        None => Some((path, false)),
    }
}

fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Reads a `/proc` file, refusing more than `limit` bytes.
fn read_bounded(pid: u32, path: &str, limit: u64) -> Result<Vec<u8>, ProcessError> {
    let file = File::open(path).map_err(|e| ProcessError::from_io(pid, path, e))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ProcessError::from_io(pid, path, e))?;
    if bytes.len() as u64 > limit {
        return Err(ProcessError::TooLarge {
            path: path.to_owned(),
            limit,
            unit: "bytes",
        });
    }
    Ok(bytes)
}

/// The path of the process's executable from the `/proc/<pid>/exe` link, without
/// a " (deleted)" suffix.
pub fn executable_path(pid: u32) -> Result<String, ProcessError> {
    let link = format!("/proc/{pid}/exe");
    match std::fs::read_link(&link) {
        Ok(target) => {
            let target = target.to_string_lossy();
            let target = target.strip_suffix(DELETED_SUFFIX).unwrap_or(&target);
            Ok(target.to_owned())
        }
        // Kernel threads have an `exe` that cannot be resolved.
        Err(e)
            if e.kind() == io::ErrorKind::NotFound
                && Path::new(&format!("/proc/{pid}")).exists() =>
        {
            Err(ProcessError::NoExecutable { pid })
        }
        Err(e) => Err(ProcessError::from_io(pid, &link, e)),
    }
}

/// The process's start time in clock ticks after boot (field 22 of `/proc/<pid>/stat`).
///
/// Together with the PID it identifies a process across PID reuse.
pub fn start_time_ticks(pid: u32) -> Result<u64, ProcessError> {
    let path = format!("/proc/{pid}/stat");
    let bytes = read_bounded(pid, &path, MAX_STAT_BYTES)?;
    parse_start_time(&String::from_utf8_lossy(&bytes))
}

/// The process's start time (as [`start_time_ticks`]) and its state letter
/// (`R`, `S`, `Z` for a zombie, …).
pub fn start_time_and_state(pid: u32) -> Result<(u64, char), ProcessError> {
    let path = format!("/proc/{pid}/stat");
    let bytes = read_bounded(pid, &path, MAX_STAT_BYTES)?;
    let stat = String::from_utf8_lossy(&bytes);
    let start = parse_start_time(&stat)?;
    let state = stat
        .rfind(')')
        .and_then(|close| stat[close + 1..].split_ascii_whitespace().next())
        .and_then(|field| field.chars().next())
        .ok_or(ProcessError::Stat {
            reason: "no state after comm",
        })?;
    Ok((start, state))
}

/// The process's start time (as [`start_time_ticks`]) and its parent's PID,
/// from one read of `/proc/<pid>/stat`.
pub fn start_time_and_parent(pid: u32) -> Result<(u64, u32), ProcessError> {
    let path = format!("/proc/{pid}/stat");
    let bytes = read_bounded(pid, &path, MAX_STAT_BYTES)?;
    let stat = String::from_utf8_lossy(&bytes);
    Ok((parse_start_time(&stat)?, parse_parent_pid(&stat)?))
}

/// Extracts the parent's PID (field 4) from the text of a `/proc/<pid>/stat` file.
pub fn parse_parent_pid(stat: &str) -> Result<u32, ProcessError> {
    let close = stat.rfind(')').ok_or(ProcessError::Stat {
        reason: "no ')' after comm",
    })?;
    stat[close + 1..]
        .split_ascii_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .ok_or(ProcessError::Stat {
            reason: "no parent PID",
        })
}

/// Extracts the start time (field 22) from the text of a `/proc/<pid>/stat` file.
///
/// The command name (field 2) is in parentheses and may itself contain spaces and
/// parentheses, so fields are counted after the last `)`.
pub fn parse_start_time(stat: &str) -> Result<u64, ProcessError> {
    let close = stat.rfind(')').ok_or(ProcessError::Stat {
        reason: "no ')' after comm",
    })?;
    // Field 3 (state) is the first after the comm; field 22 is 19 further.
    let field = stat[close + 1..]
        .split_ascii_whitespace()
        .nth(19)
        .ok_or(ProcessError::Stat {
            reason: "fewer than 22 fields",
        })?;
    field.parse().map_err(|_| ProcessError::Stat {
        reason: "start time is not a number",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 fd:01 1311017                    /usr/bin/my app
55d0c0a02000-55d0c0a07000 r-xp 00002000 fd:01 1311017                    /usr/bin/my app
55d0c0a07000-55d0c0a09000 r--p 00007000 fd:01 1311017                    /usr/bin/my app
55d0c1f4e000-55d0c1f6f000 rw-p 00000000 00:00 0                          [heap]
7f2a3c000000-7f2a3c021000 rw-p 00000000 00:00 0 
7f2a3d600000-7f2a3d628000 r--p 00000000 fd:01 1315329                    /usr/lib/x86_64-linux-gnu/libc.so.6
7f2a3d628000-7f2a3d79d000 r-xp 00028000 fd:01 1315329                    /usr/lib/x86_64-linux-gnu/libc.so.6
7f2a3d900000-7f2a3d910000 r-xp 00001000 08:10 42                         /tmp/plugin (1).so (deleted)
7f2a3da00000-7f2a3da01000 rw-s 00000000 00:01 1024                       /memfd:shm (deleted)
7f2a3db00000-7f2a3db01000 rw-p 00000000 00:0e 2048                       anon_inode:[perf_event]
7ffd6b5d2000-7ffd6b5f3000 rw-p 00000000 00:00 0                          [stack]
7ffd6b5fa000-7ffd6b5fe000 r--p 00000000 00:00 0                          [vvar]
7ffd6b5fe000-7ffd6b600000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn code_is_only_where_mappings_are_executable() {
        // Mid-dlopen: the library's whole span is mapped read-only; its
        // text is mapped over that a moment later.
        let loading = "\
7f2a3d600000-7f2a3d605000 r--p 00000000 fd:01 42                         /tmp/libwork.so
7f2a3d700000-7f2a3d701000 r-xp 00000000 00:00 0                          [anon:jit]
";
        let loaded = "\
7f2a3d600000-7f2a3d601000 r--p 00000000 fd:01 42                         /tmp/libwork.so
7f2a3d601000-7f2a3d602000 r-xp 00001000 fd:01 42                         /tmp/libwork.so
7f2a3d602000-7f2a3d605000 r--p 00002000 fd:01 42                         /tmp/libwork.so
";
        let text_pc = 0x7f2a3d601234;
        let loading = ProcessMappings::parse(loading).unwrap();
        assert!(loading.find(text_pc).is_some());
        assert!(!loading.covers_code(text_pc));
        assert!(loading.covers_code(0x7f2a3d700010));
        assert!(!loading.covers_code(0x7f2a3d800000));
        let loaded = ProcessMappings::parse(loaded).unwrap();
        assert!(loaded.covers_code(text_pc));
        assert!(!loaded.covers_code(0x7f2a3d600010));
    }

    #[test]
    fn parses_realistic_maps() {
        let maps = ProcessMappings::parse(SAMPLE).unwrap();
        let paths: Vec<&str> = maps.mappings().iter().map(|m| &*m.path).collect();
        assert_eq!(
            paths,
            [
                "/usr/bin/my app",
                "/usr/bin/my app",
                "/usr/bin/my app",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "/tmp/plugin (1).so",
                "/memfd:shm",
                "[vdso]",
            ]
        );
        let text = &maps.mappings()[1];
        assert_eq!(
            (text.start, text.end, text.file_offset),
            (0x55d0c0a02000, 0x55d0c0a07000, 0x2000)
        );
        assert_eq!((text.dev, text.inode), ((0xfd, 1), 1311017));
        assert!(text.executable && !text.deleted && !text.is_vdso());
        assert!(Arc::ptr_eq(&maps.mappings()[0].path, &text.path));
        let plugin = &maps.mappings()[5];
        assert!(plugin.deleted && plugin.executable);
        assert_eq!(plugin.dev, (8, 0x10));
        assert!(maps.mappings()[7].is_vdso());
        assert_eq!(maps.executable().count(), 4);
    }

    #[test]
    fn find_by_binary_search() {
        let maps = ProcessMappings::parse(SAMPLE).unwrap();
        assert_eq!(
            maps.find(0x55d0c0a02000).map(|m| m.file_offset),
            Some(0x2000)
        );
        assert_eq!(
            maps.find(0x55d0c0a06fff).map(|m| m.file_offset),
            Some(0x2000)
        );
        assert_eq!(
            maps.find(0x55d0c0a07000).map(|m| m.file_offset),
            Some(0x7000)
        );
        assert!(maps.find(0x55d0c1f4e100).is_none(), "heap is not kept");
        assert!(maps.find(0).is_none());
        assert!(maps.find(u64::MAX).is_none());
        assert!(maps.find(0x7ffd6b5fe010).unwrap().is_vdso());
        let m = maps.find(0x7f2a3d628010).unwrap();
        assert_eq!(m.file_offset_of(0x7f2a3d628010), Some(0x28010));
        assert_eq!(m.file_offset_of(0x7f2a3d600000), None);
    }

    #[test]
    fn executable_anonymous_mappings_are_kept_as_jit_code() {
        let text = "\
7f0000000000-7f0000001000 r-xp 00000000 fd:01 1 /lib/a.so
7f1000000000-7f1000800000 rwxp 00000000 00:00 0
7f2000000000-7f2000100000 r-xp 00000000 00:00 0 [anon:v8 code]
7f3000000000-7f3000100000 r-xs 00000000 00:01 7 /memfd:doublemapper (deleted)
7f4000000000-7f4000100000 rw-p 00000000 00:00 0
7f5000000000-7f5000100000 rw-s 00000000 00:01 1222 /dev/zero (deleted)
7f5000100000-7f5000200000 r-xs 08000000 00:01 1222 /dev/zero (deleted)
7f6000000000-7f6000100000 rwxs 00000000 00:01 65538 /SYSV00000000 (deleted)
";
        let maps = ProcessMappings::parse(text).unwrap();
        assert_eq!(maps.mappings().len(), 1, "JIT code is not a file");
        let starts: Vec<u64> = maps.anonymous_code().iter().map(|c| c.start).collect();
        // Shared anonymous memory (PHP's opcache JIT) too.
        assert_eq!(
            starts,
            [
                0x7f10_0000_0000,
                0x7f20_0000_0000,
                0x7f30_0000_0000,
                0x7f50_0010_0000,
                0x7f60_0000_0000
            ]
        );
        assert_eq!(
            maps.find_anonymous_code(0x7f10_0000_0010).map(|c| c.end),
            Some(0x7f10_0080_0000)
        );
        assert!(
            maps.find_anonymous_code(0x7f40_0000_0000).is_none(),
            "not executable"
        );
        assert!(
            maps.find_anonymous_code(0x7f00_0000_0000).is_none(),
            "a file"
        );
        // The anonymous code of the realistic sample: none but the vsyscall
        // page, which the kernel serves and is not JIT code.
        assert!(
            ProcessMappings::parse(SAMPLE)
                .unwrap()
                .anonymous_code()
                .is_empty()
        );
    }

    #[test]
    fn unsorted_input_is_sorted() {
        let text = "\
7f0000002000-7f0000003000 r-xp 00001000 fd:01 2 /lib/b.so
7f0000000000-7f0000001000 r-xp 00000000 fd:01 1 /lib/a.so
";
        let maps = ProcessMappings::parse(text).unwrap();
        assert_eq!(&*maps.find(0x7f0000000010).unwrap().path, "/lib/a.so");
        assert_eq!(&*maps.find(0x7f0000002010).unwrap().path, "/lib/b.so");
    }

    #[test]
    fn parse_errors_name_the_line() {
        let text = "7f0000000000-7f0000001000 r-xp 00000000 fd:01 1 /lib/a.so\nzzzz-1000 r-xp 0 fd:01 1 /x\n";
        let err = ProcessMappings::parse(text).unwrap_err();
        match &err {
            ProcessError::MapsLine {
                line_number, line, ..
            } => {
                assert_eq!(*line_number, 2);
                assert!(line.starts_with("zzzz"));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains("line 2"), "{err}");
        for bad in [
            "1000-0 r-xp 0 fd:01 1 /x",
            "0-1000 r-xp",
            "0-1000 r-xp 0 fd01 1 /x",
            "0-1000 r-xp 0 fd:01 inode /x",
            "0-1000 rx 0 fd:01 1 /x",
        ] {
            assert!(ProcessMappings::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn too_many_lines_is_refused() {
        let line = "0-1000 r-xp 00000000 00:00 0\n";
        let err = ProcessMappings::parse_bounded(&line.repeat(4), "maps", 3).unwrap_err();
        assert!(
            matches!(
                err,
                ProcessError::TooLarge {
                    unit: "lines",
                    limit: 3,
                    ..
                }
            ),
            "{err}"
        );
        assert!(ProcessMappings::parse_bounded(&line.repeat(3), "maps", 3).is_ok());
    }

    #[test]
    fn reads_own_maps() {
        let maps = ProcessMappings::read(std::process::id()).unwrap();
        let here = reads_own_maps as *const () as u64;
        let mapping = maps.find(here).unwrap();
        assert!(mapping.executable);
        let exe = executable_path(std::process::id()).unwrap();
        assert_eq!(&*mapping.path, exe);
    }

    #[test]
    fn gone_process_is_distinct() {
        // PIDs are at most 2^22; this one cannot exist.
        let pid = u32::MAX - 1;
        assert!(ProcessMappings::read(pid).unwrap_err().is_gone());
        assert!(start_time_ticks(pid).unwrap_err().is_gone());
        assert!(executable_path(pid).unwrap_err().is_gone());
    }

    #[test]
    fn start_time_of_self_and_tricky_comm() {
        let ticks = start_time_ticks(std::process::id()).unwrap();
        assert!(ticks > 0);
        let stat = "1234 (we ird) (x) 9) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 987654 1000 10 18446744073709551615";
        assert_eq!(parse_start_time(stat).unwrap(), 987654);
        assert!(parse_start_time("1234 (no close S 1").is_err());
        assert!(parse_start_time("1234 (short) S 1 2 3").is_err());
        assert_eq!(parse_parent_pid(stat).unwrap(), 1);
        assert!(parse_parent_pid("1234 (no parent)").is_err());
        assert!(parse_parent_pid("1234 (x) S notanumber").is_err());
        let (start, parent) = start_time_and_parent(std::process::id()).unwrap();
        assert_eq!(start, ticks);
        assert_eq!(parent, std::os::unix::process::parent_id());
    }

    #[test]
    fn kernel_thread_has_no_executable() {
        // PID 2 is kthreadd on Linux, unless PIDs are namespaced (containers).
        let comm = std::fs::read_to_string("/proc/2/comm").unwrap_or_default();
        if comm.trim() == "kthreadd" {
            let err = executable_path(2).unwrap_err();
            assert!(
                matches!(
                    err,
                    ProcessError::NoExecutable { .. } | ProcessError::PermissionDenied { .. }
                ),
                "{err:?}"
            );
        }
    }
}
