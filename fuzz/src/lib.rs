//! Helpers shared by the fuzz targets in `fuzz_targets/`.

use std::path::PathBuf;
use std::sync::OnceLock;

/// A file holding `data`, for entry points that take a path (the config
/// file, ELF files). One file per target process, rewritten on each call:
/// in `/dev/shm` when there is one (no disk writes), else the temp dir.
/// `scripts/fuzz.sh` removes the `icecore-fuzz-*` files after its runs.
pub fn scratch_file(tag: &str, data: &[u8]) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let shm = PathBuf::from("/dev/shm");
        if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        }
    });
    let path = dir.join(format!("icecore-fuzz-{tag}-{}", std::process::id()));
    if let Err(e) = std::fs::write(&path, data) {
        // Not the code under test: stop rather than report a crash in it.
        eprintln!("cannot write the scratch file {}: {e}", path.display());
        std::process::exit(2);
    }
    path
}

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
