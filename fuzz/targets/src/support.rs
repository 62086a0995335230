//! Helpers shared by the fuzz targets.

use std::path::PathBuf;
use std::sync::OnceLock;

/// A file holding `data`, for entry points that take a path (the config
/// file, ELF files). One file per target process, rewritten on each call:
/// in `/dev/shm` when there is one (no disk writes), else the temp dir.
/// `scripts/fuzz.sh` removes the `icecore-fuzz-*` files after its runs,
/// the replay test calls [`remove_scratch_files`].
pub fn scratch_file(tag: &str, data: &[u8]) -> PathBuf {
    let path = scratch_path(tag);
    if let Err(e) = std::fs::write(&path, data) {
        // Not the code under test: stop rather than report a crash in it.
        eprintln!("cannot write the scratch file {}: {e}", path.display());
        std::process::exit(2);
    }
    path
}

/// A file holding `data` at offset `base`, the rest of it before `base` a
/// hole (zeros, no memory used): a process's memory with `data` at address
/// `base`, for `ProcessMemory::from_file`. Reads past its end fail.
pub fn scratch_memory(tag: &str, base: u64, data: &[u8]) -> std::fs::File {
    use std::os::unix::fs::FileExt;
    let path = scratch_path(tag);
    let written = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .and_then(|file| file.write_all_at(data, base).map(|()| file));
    match written {
        Ok(file) => file,
        Err(e) => {
            // Not the code under test: stop rather than report a crash in it.
            eprintln!("cannot write the scratch file {}: {e}", path.display());
            std::process::exit(2);
        }
    }
}

/// Where [`scratch_file`] writes the files tagged `tag` of this process.
fn scratch_path(tag: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let shm = PathBuf::from("/dev/shm");
        if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        }
    });
    dir.join(format!("icecore-fuzz-{tag}-{}", std::process::id()))
}

/// Removes this process's scratch files: the replay test runs inside
/// `cargo test`, whose process would otherwise leave them in `/dev/shm`.
pub fn remove_scratch_files() {
    for tag in SCRATCH_TAGS {
        let _ = std::fs::remove_file(scratch_path(tag));
    }
}

/// Every tag the targets pass to [`scratch_file`] and [`scratch_memory`].
const SCRATCH_TAGS: &[&str] = &["config", "elf", "elf-symbols", "memory"];

/// Addresses to look up in a table built from fuzz input: around `base`
/// and at a few points spread over the address space, so that lookups hit
/// the first and last entries and miss on both sides.
pub fn probe_addresses(base: u64) -> impl Iterator<Item = u64> {
    let near = (0..64u64).map(move |i| base.wrapping_add(i * 7).wrapping_sub(8));
    let far = [
        0,
        1,
        0x1000,
        0xffff_ffff,
        0x1_0000_0000,
        u64::MAX - 1,
        u64::MAX,
    ];
    near.chain(far)
}
