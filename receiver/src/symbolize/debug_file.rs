//! Finding a binary's separate debug file the way GDB does.
//!
//! By build ID first (`/usr/lib/debug/.build-id/xx/yyyy.debug`, accepted when
//! the file carries the same build ID), then by `.gnu_debuglink` name in the
//! binary's directory, its `.debug/` subdirectory and `/usr/lib/debug/<dir>/`,
//! accepted when the file's CRC32 matches the link. Each path is tried under the
//! process's root (`/proc/<pid>/root`) first when the process lives in another
//! root than ours (a container), then on the host.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use object::read::ReadCache;
use object::{Object, ObjectSection};

use super::elf::DebugLink;

/// Where distributions install debug files.
pub const DEBUG_DIR: &str = "/usr/lib/debug";

/// Why a candidate debug file was passed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The file's CRC32 differs from the one in `.gnu_debuglink`.
    CrcMismatch,
    /// The file's build ID differs from the binary's.
    BuildIdMismatch,
    /// The file could not be read or is no ELF file of acceptable size.
    Unreadable,
}

/// The outcome of a search.
#[derive(Debug, Default)]
pub struct Search {
    /// The debug file found, as a path that opens from here.
    pub found: Option<PathBuf>,
    /// Candidates that existed but were refused.
    pub rejected: Vec<(PathBuf, Rejection)>,
}

/// What to look for.
pub struct Wanted<'a> {
    /// The binary's path as its process sees it (absolute).
    pub binary_path: &'a str,
    /// The binary's build ID, lower-case hex.
    pub build_id: Option<&'a str>,
    /// The binary's `.gnu_debuglink`.
    pub debuglink: Option<&'a DebugLink>,
    /// Largest debug file considered.
    pub max_file_size: u64,
}

/// The prefixes paths are tried under: the process's root when it differs from
/// ours (or cannot be compared), then ours.
pub fn roots(pid: u32) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let proc_root = PathBuf::from(format!("/proc/{pid}/root"));
    // Another mount namespace's root reads as "/" through readlink; compare the
    // directories themselves.
    let identity = |path: &Path| std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok();
    let same = match (identity(&proc_root), identity(Path::new("/"))) {
        (Some(theirs), Some(ours)) => theirs == ours,
        _ => false,
    };
    if same || pid == 0 {
        vec![PathBuf::new()]
    } else {
        vec![proc_root, PathBuf::new()]
    }
}

/// `root` + absolute `path`.
fn under(root: &Path, path: &Path) -> PathBuf {
    if root.as_os_str().is_empty() {
        path.to_path_buf()
    } else {
        root.join(path.strip_prefix("/").unwrap_or(path))
    }
}

/// The build-ID path of a debug file, relative to nothing (absolute).
pub fn build_id_path(build_id: &str) -> Option<PathBuf> {
    if build_id.len() < 3 || !build_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let (head, tail) = build_id.split_at(2);
    Some(PathBuf::from(format!(
        "{DEBUG_DIR}/.build-id/{head}/{tail}.debug"
    )))
}

/// Searches the debug file of `wanted` under each of `roots`.
pub fn find(roots: &[PathBuf], wanted: &Wanted<'_>) -> Search {
    let mut search = Search::default();
    let binary = Path::new(wanted.binary_path);
    for root in roots {
        if let Some(id) = wanted.build_id
            && let Some(path) = build_id_path(id)
        {
            let path = under(root, &path);
            if path.is_file() {
                match build_id_of(&path, wanted.max_file_size) {
                    Some(found) if found == id => {
                        search.found = Some(path);
                        return search;
                    }
                    Some(_) => search.rejected.push((path, Rejection::BuildIdMismatch)),
                    None => search.rejected.push((path, Rejection::Unreadable)),
                }
            }
        }
        let (Some(link), Some(dir)) = (wanted.debuglink, binary.parent()) else {
            continue;
        };
        let debug_dir = Path::new(DEBUG_DIR).join(dir.strip_prefix("/").unwrap_or(dir));
        for candidate in [
            dir.join(&link.name),
            dir.join(".debug").join(&link.name),
            debug_dir.join(&link.name),
        ] {
            // The binary itself may carry its own name in the link.
            if candidate == binary {
                continue;
            }
            let path = under(root, &candidate);
            if !path.is_file() {
                continue;
            }
            match crc32_of(&path, wanted.max_file_size) {
                Some(crc) if crc == link.crc => {
                    search.found = Some(path);
                    return search;
                }
                Some(_) => search.rejected.push((path, Rejection::CrcMismatch)),
                None => search.rejected.push((path, Rejection::Unreadable)),
            }
        }
    }
    search
}

/// The dwz supplementary file named by a debug file's `.gnu_debugaltlink`.
pub fn find_sup(roots: &[PathBuf], debug_file: &Path, max_file_size: u64) -> Option<PathBuf> {
    let file = File::open(debug_file).ok()?;
    let cache = ReadCache::new(file);
    let object = object::File::parse(&cache).ok()?;
    let data = object.section_by_name(".gnu_debugaltlink")?.data().ok()?;
    let nul = data.iter().position(|&b| b == 0)?;
    let name = Path::new(std::str::from_utf8(data.get(..nul)?).ok()?);
    let id = super::elf::hex(data.get(nul + 1..)?);
    let mut candidates = Vec::new();
    if name.is_absolute() {
        candidates.extend(roots.iter().map(|root| under(root, name)));
    } else if let Some(dir) = debug_file.parent() {
        candidates.push(dir.join(name));
    }
    if let Some(path) = build_id_path(&id) {
        candidates.extend(roots.iter().map(|root| under(root, &path)));
    }
    candidates
        .into_iter()
        .find(|c| c.is_file() && build_id_of(c, max_file_size).as_deref() == Some(id.as_str()))
}

/// The build ID of an ELF file, reading only its headers and notes.
pub fn build_id_of(path: &Path, max_file_size: u64) -> Option<String> {
    let file = File::open(path).ok()?;
    if file.metadata().ok()?.len() > max_file_size {
        return None;
    }
    let cache = ReadCache::new(file);
    let object = object::File::parse(&cache).ok()?;
    object.build_id().ok()?.map(super::elf::hex)
}

/// CRC32 of a whole file, read in chunks.
pub fn crc32_of(path: &Path, max_file_size: u64) -> Option<u32> {
    let mut file = File::open(path).ok()?;
    let metadata = file.metadata().ok()?;
    if !metadata.is_file() || metadata.len() > max_file_size {
        return None;
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0; 256 << 10];
    loop {
        match file.read(&mut buffer) {
            Ok(0) => return Some(hasher.finalize()),
            Ok(n) => hasher.update(buffer.get(..n)?),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}
