//! Helpers for tests that compile real binaries with the system C and C++ compilers.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use object::{Object, ObjectSegment, ObjectSymbol};

use crate::process_maps::MappedFile;

/// A program with two global functions and a static one, none inlined.
pub const C_SOURCE: &str = r#"
#include <stdio.h>
__attribute__((noinline)) int alpha(int x) { return x * 3 + 1; }
__attribute__((noinline)) int beta(int x) { return alpha(x) + alpha(x + 1); }
__attribute__((noinline)) static int gamma_local(int x) { return beta(x) - 7; }
int main(int argc, char **argv) { (void)argv; printf("%d\n", gamma_local(argc)); return 0; }
"#;

const CXX_SOURCE: &str = r#"
namespace ns {
template <typename T> __attribute__((noinline)) T worker(T x) { return x * 2 + 1; }
}
int main(int argc, char **) { return ns::worker<int>(argc) == 7; }
"#;

/// Compiles `source` with `cc` into `dir/name`.
pub fn compile_c(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    compile("cc", "c", dir, name, source, flags)
}

/// Compiles a C++ program with a template `ns::worker<int>` into `dir/name`.
pub fn compile_cxx(dir: &Path, name: &str) -> PathBuf {
    compile("c++", "cc", dir, name, CXX_SOURCE, &["-O0"])
}

fn compile(
    compiler: &str,
    ext: &str,
    dir: &Path,
    name: &str,
    source: &str,
    flags: &[&str],
) -> PathBuf {
    let src = dir.join(format!("{name}.{ext}"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    let output = Command::new(compiler)
        .args(flags)
        .arg("-Wl,--build-id")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(
        output.status.success(),
        "{compiler} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// The file offset of symbol `name`, computed with `object` directly as an oracle.
pub fn oracle_file_offset(path: &Path, name: &str) -> u64 {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let symbol = file
        .symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.name() == Ok(name))
        .unwrap();
    let vaddr = symbol.address();
    file.segments()
        .find_map(|seg| {
            let (offset, size) = seg.file_range();
            (seg.address() <= vaddr && vaddr < seg.address() + size)
                .then(|| vaddr - seg.address() + offset)
        })
        .unwrap()
}

/// A mapping of the whole file at `start`, as if mapped with offset 0.
pub fn whole_file_mapping(path: &Path, start: u64) -> MappedFile {
    let meta = std::fs::metadata(path).unwrap();
    let dev = meta.dev();
    MappedFile {
        start,
        end: start + meta.len().next_multiple_of(4096),
        file_offset: 0,
        dev: (libc::major(dev), libc::minor(dev)),
        inode: meta.ino(),
        path: Arc::from(path.to_str().unwrap()),
        executable: true,
        deleted: false,
    }
}
