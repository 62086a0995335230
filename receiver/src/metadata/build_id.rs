//! The build IDs of a process's executable, for
//! `process.executable.build_id.gnu` and `.go`: read from its `PT_NOTE`
//! segments only (headers and notes, never the whole file), once per file,
//! remembered by the file's identity.

use std::fs::File;
use std::num::NonZeroUsize;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use icecore_otlp::model::ExecutableBuildIds;
use lru::LruCache;
use object::read::ReadCache;
use object::read::elf::{FileHeader, ProgramHeader};
use object::{Endianness, FileKind, elf};

/// Files remembered: more than the distinct executables of a busy host.
const REMEMBERED: usize = 1024;
/// Largest note segment read: build IDs are tens of bytes.
const MAX_NOTES_BYTES: u64 = 64 << 10;
/// Name and type of the Go toolchain's build ID note.
const GO_NOTE_NAME: &[u8] = b"Go";
const GO_NOTE_BUILD_ID: u32 = 4;

/// A file as the kernel names it, with what changes when it is rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

static REMEMBERED_IDS: Mutex<Option<LruCache<FileKey, ExecutableBuildIds>>> = Mutex::new(None);

/// The build IDs of process `pid`'s executable (through `/proc/PID/exe`, so
/// in the process's own mount namespace); empty when it has none or cannot
/// be read.
pub fn of_process(pid: u32) -> ExecutableBuildIds {
    of_file(Path::new(&format!("/proc/{pid}/exe")))
}

/// The build IDs of the ELF file at `path`.
pub fn of_file(path: &Path) -> ExecutableBuildIds {
    let Ok(file) = File::open(path) else {
        return ExecutableBuildIds::default();
    };
    let Ok(meta) = file.metadata() else {
        return ExecutableBuildIds::default();
    };
    let key = FileKey {
        dev: meta.dev(),
        ino: meta.ino(),
        size: meta.size(),
        mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
    };
    if let Ok(mut cache) = REMEMBERED_IDS.lock()
        && let Some(ids) = cache.as_mut().and_then(|c| c.get(&key))
    {
        return ids.clone();
    }
    let ids = read(file);
    if let Ok(mut cache) = REMEMBERED_IDS.lock() {
        let capacity = NonZeroUsize::new(REMEMBERED).unwrap_or(NonZeroUsize::MIN);
        cache
            .get_or_insert_with(|| LruCache::new(capacity))
            .put(key, ids.clone());
    }
    ids
}

fn read(file: File) -> ExecutableBuildIds {
    let cache = ReadCache::new(file);
    match FileKind::parse(&cache) {
        Ok(FileKind::Elf64) => notes::<elf::FileHeader64<Endianness>>(&cache),
        Ok(FileKind::Elf32) => notes::<elf::FileHeader32<Endianness>>(&cache),
        _ => None,
    }
    .unwrap_or_default()
}

/// The IDs in the note segments; `None` when the headers do not parse.
fn notes<Elf: FileHeader<Endian = Endianness>>(
    data: &ReadCache<File>,
) -> Option<ExecutableBuildIds> {
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let mut ids = ExecutableBuildIds::default();
    for segment in header.program_headers(endian, data).ok()? {
        if segment.p_type(endian) != elf::PT_NOTE
            || segment.p_filesz(endian).into() > MAX_NOTES_BYTES
        {
            continue;
        }
        let Ok(Some(mut notes)) = segment.notes(endian, data) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            let desc = note.desc();
            if desc.is_empty() {
                continue;
            }
            let kind = note.n_type(endian);
            if note.name() == elf::ELF_NOTE_GNU && kind == elf::NT_GNU_BUILD_ID {
                ids.gnu = Arc::from(crate::symbolize::elf::hex(desc));
            } else if note.name() == GO_NOTE_NAME && kind == GO_NOTE_BUILD_ID {
                // Printable by construction (`actionID/contentID`); anything
                // else is not a Go build ID.
                if let Ok(text) = std::str::from_utf8(desc)
                    && text.bytes().all(|b| b.is_ascii_graphic())
                {
                    ids.go = Arc::from(text);
                }
            }
        }
    }
    Some(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_has_a_gnu_build_id() {
        let ids = of_process(std::process::id());
        // Rust test binaries are linked with a GNU build ID by default on Linux.
        assert!(
            ids.gnu.len() >= 16 && ids.gnu.bytes().all(|b| b.is_ascii_hexdigit()),
            "{ids:?}"
        );
        assert!(ids.go.is_empty());
        // Remembered: the same answer from the cache.
        assert_eq!(of_process(std::process::id()), ids);
    }

    /// A C program carrying a Go build ID note as the Go linker writes it
    /// (name `Go`, type 4, in a `PT_NOTE` segment) besides its GNU one.
    #[test]
    fn go_and_gnu_notes_are_both_read() {
        const SOURCE: &str = r#"
__asm__(".section .note.go.buildid,\"a\",@note\n.p2align 2\n"
        ".long 3\n.long 16\n.long 4\n"
        ".asciz \"Go\"\n.p2align 2\n"
        ".ascii \"abcDEF12/xyz_-09\"\n.p2align 2\n.text\n");
int main(void) { return 0; }
"#;
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("gonote.c");
        let exe = dir.path().join("gonote");
        std::fs::write(&source, SOURCE).unwrap();
        let status = std::process::Command::new("cc")
            .args(["-Wl,--build-id=sha1", "-o"])
            .arg(&exe)
            .arg(&source)
            .status()
            .expect("cc runs (the tests need a C compiler)");
        assert!(status.success());
        let ids = of_file(&exe);
        assert_eq!(&*ids.go, "abcDEF12/xyz_-09");
        assert_eq!(ids.gnu.len(), 40, "{ids:?}");
    }

    #[test]
    fn non_elf_and_missing_files_have_none() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("script");
        std::fs::write(&text, "#!/bin/sh\necho hi\n").unwrap();
        assert_eq!(of_file(&text), ExecutableBuildIds::default());
        let elfish = dir.path().join("truncated");
        std::fs::write(&elfish, b"\x7fELF\x02\x01\x01").unwrap();
        assert_eq!(of_file(&elfish), ExecutableBuildIds::default());
        assert_eq!(
            of_file(&dir.path().join("absent")),
            ExecutableBuildIds::default()
        );
    }
}
