//! Finding CPython in a process: which mapped file is the interpreter
//! (the executable, or `libpython3.X.so`), its version, its struct layout
//! (from `_Py_DebugOffsets` in 3.13+, from the table before) and the
//! addresses BPF and symbolization need, read from the file's symbols.

use std::{
    fs::File,
    ops::Range,
    path::{Path, PathBuf},
};

use object::{Object, ObjectSection, ObjectSymbol, read::ReadCache};

use super::{
    debug_offsets::{DebugOffsetsError, layout_from},
    layouts::{PythonLayout, layout},
};
use crate::{
    runtimes::services::{ElfFileError, LoadSegments, eh_frame_functions, open_elf, parse_elf},
    symbolize::debug_file,
};

/// The first version whose `_PyRuntime` starts with `_Py_DebugOffsets`.
const DEBUG_OFFSETS_SINCE: (u8, u8) = (3, 13);
/// An exported `_PyEval_EvalFrameDefault` smaller than this is the hot
/// prologue of a loop whose body the compiler moved into `.cold` (GCC's PGO
/// builds, Debian's among them); the whole loop is tens of KiB.
const SPLIT_EVAL_LOOP: u64 = 16 * 1024;
/// Largest debug file read for the `.cold` symbol.
const MAX_DEBUG_FILE: u64 = 512 << 20;

/// Why a file is not a usable CPython.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// The file could not be read as ELF.
    #[error(transparent)]
    File(#[from] ElfFileError),
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
    /// The file's `_Py_DebugOffsets` cannot be used (free-threaded build,
    /// unknown shape, implausible values).
    #[error("{path}: {source}")]
    DebugOffsets {
        /// The file.
        path: String,
        /// What is wrong with it.
        source: DebugOffsetsError,
    },
    /// A version icecore has no layout for.
    #[error("{path}: CPython {major}.{minor} is not supported (3.8 to 3.15 are)")]
    Unsupported {
        /// The file.
        path: String,
        /// Major version.
        major: u8,
        /// Minor version.
        minor: u8,
    },
}

impl DetectError {
    /// Whether the file is CPython that icecore refuses (a version or build
    /// it does not support), rather than not CPython at all: worth a warning.
    pub fn is_refused_cpython(&self) -> bool {
        matches!(
            self,
            DetectError::Unsupported { .. } | DetectError::DebugOffsets { .. }
        )
    }
}

/// Where to look for a file's separate debug file (for the eval loop's
/// `.cold` part in stripped builds).
#[derive(Debug, Clone, Default)]
pub struct DebugSearch {
    /// Roots to try (the process's, then ours); see [`debug_file::roots`].
    pub roots: Vec<PathBuf>,
    /// The file's path as its process sees it.
    pub binary_path: String,
}

/// What one CPython file offers, in ELF virtual addresses (add the load bias).
#[derive(Debug, Clone)]
pub struct PythonBinary {
    /// The version's struct layout.
    pub layout: PythonLayout,
    /// `_PyRuntime`.
    pub runtime: u64,
    /// `_PyEval_EvalFrameDefault`, and its `.cold` part when the symbol table names it.
    pub eval_loop: Vec<Range<u64>>,
    /// `PyCode_Type`, to check that a pointer BPF reported is a code object.
    pub code_type: Option<u64>,
    /// Where the file's segments load.
    segments: LoadSegments,
}

impl PythonBinary {
    /// Process address minus ELF virtual address, from one mapping of the file.
    pub fn load_bias(&self, mapping_start: u64, file_offset: u64) -> Option<u64> {
        self.segments.load_bias(mapping_start, file_offset)
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
    inspect_with(path, name_version, &DebugSearch::default())
}

/// [`inspect`], looking for a separate debug file as `debug` says when the
/// file's own symbols do not cover the whole eval loop.
pub fn inspect_with(
    path: &Path,
    name_version: (u8, u8),
    debug: &DebugSearch,
) -> Result<PythonBinary, DetectError> {
    let shown = || path.display().to_string();
    let cache = open_elf(path)?;
    let elf = parse_elf(path, &cache)?;
    let mut runtime = None;
    let mut runtime_size = None;
    let mut eval_loop = Vec::new();
    let mut code_type = None;
    let mut py_version = None;
    for symbol in elf.dynamic_symbols().chain(elf.symbols()) {
        if symbol.is_undefined() {
            continue;
        }
        let range = symbol.address()..symbol.address() + symbol.size();
        match symbol.name() {
            Ok("_PyRuntime") => {
                runtime = Some(symbol.address());
                runtime_size = Some(symbol.size());
            }
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
    let layout = if (major, minor) >= DEBUG_OFFSETS_SINCE {
        // The struct is read from the file: a few hundred bytes.
        let bytes = elf
            .sections()
            .find_map(|s| s.data_range(runtime, 1024).ok().flatten())
            .or_else(|| {
                let size = runtime_size.unwrap_or(0).min(1024);
                elf.sections()
                    .find_map(|s| s.data_range(runtime, size).ok().flatten())
            })
            .unwrap_or_default();
        layout_from(bytes, major, minor, runtime_size).map_err(|source| match source {
            DebugOffsetsError::UnknownShape { major, minor } => DetectError::Unsupported {
                path: shown(),
                major,
                minor,
            },
            source => DetectError::DebugOffsets {
                path: shown(),
                source,
            },
        })?
    } else {
        *layout(major, minor).ok_or(DetectError::Unsupported {
            path: shown(),
            major,
            minor,
        })?
    };
    if eval_loop.len() == 1 && eval_loop[0].end - eval_loop[0].start < SPLIT_EVAL_LOOP {
        let hot = eval_loop[0].clone();
        if let Some(cold) =
            cold_part_from_debug_file(path, debug).or_else(|| cold_part_from_eh_frame(&elf, &hot))
        {
            eval_loop.push(cold);
        }
    }
    let segments = LoadSegments::of(&elf);
    Ok(PythonBinary {
        layout,
        runtime,
        eval_loop,
        code_type,
        segments,
    })
}

/// `_PyEval_EvalFrameDefault.cold` from the file's separate debug file
/// (found by build ID under the process's root, then ours).
fn cold_part_from_debug_file(path: &Path, debug: &DebugSearch) -> Option<Range<u64>> {
    let build_id = debug_file::build_id_of(path, MAX_DEBUG_FILE)?;
    let mut roots = debug.roots.clone();
    if roots.is_empty() {
        roots.push(PathBuf::new());
    }
    let binary_path = if debug.binary_path.is_empty() {
        path.to_string_lossy().into_owned()
    } else {
        debug.binary_path.clone()
    };
    let found = debug_file::find(
        &roots,
        &debug_file::Wanted {
            binary_path: &binary_path,
            build_id: Some(&build_id),
            debuglink: None,
            max_file_size: MAX_DEBUG_FILE,
        },
    )
    .found?;
    let file = File::open(found).ok()?;
    let cache = ReadCache::new(file);
    let elf = object::File::parse(&cache).ok()?;
    elf.symbols().find_map(|symbol| {
        (symbol.name() == Ok("_PyEval_EvalFrameDefault.cold") && symbol.size() > 0)
            .then(|| symbol.address()..symbol.address() + symbol.size())
    })
}

/// The eval loop's `.cold` part of a stripped file, from its unwind info:
/// GCC emits the FDE of a function's `.cold` part right after the FDE of its
/// hot part. Accepted only when it is large (it holds the loop), outside the
/// hot part, and no exported function starts inside it.
fn cold_part_from_eh_frame<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
    hot: &Range<u64>,
) -> Option<Range<u64>> {
    let functions = eh_frame_functions(elf);
    let cold = functions
        .iter()
        .position(|f| f.start == hot.start)
        .and_then(|hot_at| functions.get(hot_at + 1))
        .cloned();
    let cold = cold?;
    let overlaps_hot = cold.start < hot.end && hot.start < cold.end;
    if overlaps_hot || cold.end - cold.start < SPLIT_EVAL_LOOP {
        return None;
    }
    let function_inside = elf.dynamic_symbols().any(|symbol| {
        symbol.kind() == object::SymbolKind::Text
            && !symbol.is_undefined()
            && cold.contains(&symbol.address())
    });
    (!function_inside).then_some(cold)
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

    /// Debian's executables are stripped PGO builds whose eval loop is
    /// almost all in `_PyEval_EvalFrameDefault.cold`, named only in the
    /// `-dbg` package's debug file: found there, and without it from the
    /// unwind info, the same range.
    #[test]
    fn the_cold_part_of_a_stripped_eval_loop_is_found() {
        let sid = crate::test_support::sid_root();
        let nowhere = tempfile::tempdir().expect("tempdir");
        for minor in 13..=15 {
            let exe = sid.join(format!("usr/bin/python3.{minor}"));
            if !exe.exists() {
                crate::test_support::missing_prerequisite(&format!(
                    "Debian python3.{minor} in {} (scripts/cpython-chroots.sh)",
                    sid.display()
                ));
                continue;
            }
            let search = |root: &Path| DebugSearch {
                roots: vec![root.to_path_buf()],
                binary_path: format!("/usr/bin/python3.{minor}"),
            };
            let debug = inspect_with(&exe, (3, minor), &search(&sid)).unwrap();
            let unwind_info = inspect_with(&exe, (3, minor), &search(nowhere.path())).unwrap();
            println!(
                "python3.{minor}: eval loop {:x?} (debug file), {:x?} (unwind info)",
                debug.eval_loop, unwind_info.eval_loop
            );
            assert_eq!(debug.eval_loop.len(), 2, "hot and cold parts");
            let cold = &debug.eval_loop[1];
            assert!(cold.end - cold.start > 64 * 1024, "{cold:x?}");
            assert_eq!(unwind_info.eval_loop, debug.eval_loop);
        }
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
