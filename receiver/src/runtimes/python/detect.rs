//! Finding CPython in a process: which mapped file is the interpreter
//! (the executable, or `libpython3.X.so`), its version, and the addresses
//! BPF and symbolization need, read from the file's symbols.

use std::{fs::File, ops::Range, path::Path};

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, read::ReadCache};

use super::layouts::{PythonLayout, layout};

/// Why a file is not a usable CPython.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not ELF, or its symbols cannot be parsed.
    #[error("{path}: {message}")]
    NotElf {
        /// The file.
        path: String,
        /// The parser's complaint.
        message: String,
    },
    /// The file does not define `_PyRuntime` (a launcher linking libpython,
    /// or not CPython at all).
    #[error("{0} defines no _PyRuntime")]
    NoRuntime(String),
    /// The file does not define `_PyEval_EvalFrameDefault`.
    #[error("{0} defines no _PyEval_EvalFrameDefault")]
    NoEvalLoop(String),
    /// The version could not be told from `Py_Version` or the file name.
    #[error("{0}: CPython version unknown")]
    UnknownVersion(String),
    /// A version icecore has no layout for.
    #[error("{path}: CPython {major}.{minor} is not supported (3.8 to 3.13 are)")]
    Unsupported {
        /// The file.
        path: String,
        /// Major version.
        major: u8,
        /// Minor version.
        minor: u8,
    },
}

/// What one CPython file offers, in ELF virtual addresses (add the load bias).
#[derive(Debug, Clone)]
pub struct PythonBinary {
    /// The version's struct layout.
    pub layout: &'static PythonLayout,
    /// `_PyRuntime`.
    pub runtime: u64,
    /// `_PyEval_EvalFrameDefault`, and its `.cold` part when the symbol table names it.
    pub eval_loop: Vec<Range<u64>>,
    /// `PyCode_Type`, to check that a pointer BPF reported is a code object.
    pub code_type: Option<u64>,
    /// `PT_LOAD` segments: (file offset, file size, virtual address).
    segments: Vec<(u64, u64, u64)>,
}

impl PythonBinary {
    /// Process address minus ELF virtual address, from one mapping of the file.
    pub fn load_bias(&self, mapping_start: u64, file_offset: u64) -> Option<u64> {
        // A mapping starts on a page, which may be before its segment's
        // unaligned file offset; vaddr - offset is constant across the page.
        let &(offset, _, vaddr) = self.segments.iter().find(|&&(offset, size, _)| {
            offset & !0xfff <= file_offset && file_offset < offset + size
        })?;
        let vaddr_of_start = vaddr.wrapping_add(file_offset).wrapping_sub(offset);
        Some(mapping_start.wrapping_sub(vaddr_of_start))
    }
}

/// The (major, minor) version a file name promises: `libpython3.11.so.1.0`,
/// `python3.11`, `python3.11d`; `(3, 0)` for a bare `python3` or `python`
/// (the version must then come from `Py_Version`). None for other files.
pub fn version_from_name(path: &str) -> Option<(u8, u8)> {
    let name = path.rsplit('/').next()?;
    let rest = name
        .strip_prefix("libpython")
        .or_else(|| name.strip_prefix("python"))?;
    if rest.is_empty() {
        return Some((3, 0));
    }
    let rest = rest.strip_prefix('3')?;
    if rest.is_empty() {
        return Some((3, 0));
    }
    let digits: String = rest
        .strip_prefix('.')?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let after = &rest[1 + digits.len()..];
    // What may follow the version: a library suffix or a build flag.
    let tail_ok = after.is_empty()
        || after.starts_with(".so")
        || after.starts_with('d')
        || after.starts_with('m')
        || after.starts_with('t');
    (tail_ok && !digits.is_empty())
        .then(|| digits.parse().ok())
        .flatten()
        .map(|minor| (3, minor))
}

/// Reads what icecore needs of a CPython file. `name_version` is
/// [`version_from_name`]'s answer for it.
pub fn inspect(path: &Path, name_version: (u8, u8)) -> Result<PythonBinary, DetectError> {
    let shown = || path.display().to_string();
    let file = File::open(path).map_err(|source| DetectError::Io {
        path: shown(),
        source,
    })?;
    let cache = ReadCache::new(file);
    let elf = object::File::parse(&cache).map_err(|e| DetectError::NotElf {
        path: shown(),
        message: e.to_string(),
    })?;
    let mut runtime = None;
    let mut eval_loop = Vec::new();
    let mut code_type = None;
    let mut py_version = None;
    for symbol in elf.dynamic_symbols().chain(elf.symbols()) {
        if symbol.is_undefined() {
            continue;
        }
        let range = symbol.address()..symbol.address() + symbol.size();
        match symbol.name() {
            Ok("_PyRuntime") => runtime = Some(symbol.address()),
            Ok("_PyEval_EvalFrameDefault" | "_PyEval_EvalFrameDefault.cold")
                if symbol.size() > 0 && !eval_loop.contains(&range) =>
            {
                eval_loop.push(range);
            }
            Ok("PyCode_Type") => code_type = Some(symbol.address()),
            Ok("Py_Version") => py_version = Some(symbol.address()),
            _ => {}
        }
    }
    let runtime = runtime.ok_or_else(|| DetectError::NoRuntime(shown()))?;
    if eval_loop.is_empty() {
        return Err(DetectError::NoEvalLoop(shown()));
    }
    // Py_Version (3.11+) is PY_VERSION_HEX: 0x030B02F0 is 3.11.2 final.
    let hex_version = py_version.and_then(|address| {
        elf.sections().find_map(|s| {
            let bytes = s.data_range(address, 4).ok()??;
            Some(u32::from_le_bytes(bytes.try_into().ok()?))
        })
    });
    let (major, minor) = match hex_version {
        Some(hex) => ((hex >> 24) as u8, (hex >> 16) as u8),
        None if name_version.1 != 0 => name_version,
        None => return Err(DetectError::UnknownVersion(shown())),
    };
    let layout = layout(major, minor).ok_or(DetectError::Unsupported {
        path: shown(),
        major,
        minor,
    })?;
    let segments = elf
        .segments()
        .map(|s| {
            let (offset, size) = s.file_range();
            (offset, size, s.address())
        })
        .collect();
    Ok(PythonBinary {
        layout,
        runtime,
        eval_loop,
        code_type,
        segments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_file_names() {
        assert_eq!(version_from_name("/usr/bin/python3.11"), Some((3, 11)));
        assert_eq!(
            version_from_name("/x/lib/libpython3.8.so.1.0"),
            Some((3, 8))
        );
        assert_eq!(version_from_name("/usr/bin/python3.11d"), Some((3, 11)));
        assert_eq!(version_from_name("/usr/bin/python3"), Some((3, 0)));
        assert_eq!(version_from_name("/usr/bin/python"), Some((3, 0)));
        assert_eq!(version_from_name("/usr/lib/libpython3.so"), None);
        assert_eq!(version_from_name("/usr/bin/python3-config"), None);
        assert_eq!(version_from_name("/usr/bin/pythonista"), None);
        assert_eq!(version_from_name("/usr/lib/libc.so.6"), None);
    }

    fn pyenv_root() -> Option<std::path::PathBuf> {
        std::env::var_os("PYENV_ROOT")
            .map(Into::into)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")))
            .filter(|p: &std::path::PathBuf| p.join("versions").is_dir())
    }

    #[test]
    fn inspects_the_interpreters_on_this_machine() {
        let mut seen = 0;
        let mut files: Vec<std::path::PathBuf> = vec!["/usr/bin/python3.11".into()];
        if let Some(root) = pyenv_root() {
            for v in ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13"] {
                let Ok(dir) = std::fs::read_dir(root.join("versions")) else {
                    continue;
                };
                for entry in dir.flatten() {
                    let lib = entry.path().join(format!("lib/libpython{v}.so.1.0"));
                    if entry
                        .file_name()
                        .to_string_lossy()
                        .starts_with(&format!("{v}."))
                        && lib.exists()
                    {
                        files.push(lib);
                    }
                }
            }
        }
        for file in files.iter().filter(|f| f.exists()) {
            let name = version_from_name(&file.to_string_lossy()).unwrap();
            let binary = inspect(file, name).unwrap();
            assert_eq!(
                (binary.layout.major, binary.layout.minor),
                name,
                "{}",
                file.display()
            );
            assert!(binary.runtime != 0 && !binary.eval_loop.is_empty());
            assert!(binary.code_type.is_some(), "{}", file.display());
            println!(
                "{}: {}.{}, _PyRuntime {:#x}, eval loop {:x?}",
                file.display(),
                binary.layout.major,
                binary.layout.minor,
                binary.runtime,
                binary.eval_loop
            );
            seen += 1;
        }
        assert!(seen > 0, "no CPython found on this machine");
    }

    #[test]
    fn a_launcher_without_the_runtime_is_refused() {
        // pyenv's executables link libpython: they define no _PyRuntime.
        let Some(root) = pyenv_root() else {
            return;
        };
        let exe = root.join("versions/3.12.1/bin/python3.12");
        if exe.exists() {
            assert!(matches!(
                inspect(&exe, (3, 12)),
                Err(DetectError::NoRuntime(_))
            ));
        }
    }
}
