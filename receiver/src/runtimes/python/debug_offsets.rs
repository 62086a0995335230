//! CPython 3.13+ layouts read from the interpreter itself: `_PyRuntime`
//! begins with `_Py_DebugOffsets` (cookie `xdebugpy`), the offsets CPython
//! publishes for out-of-process tools. It is initialized statically, so it is
//! read from the file, before any process is touched.
//!
//! The struct is all `uint64_t` after the 8-byte cookie, but fields are added
//! between minor versions, so where each offset sits in it is per-version
//! data ([`SHAPES`], from `Include/internal/pycore_runtime.h` in 3.13 and
//! `pycore_debug_offsets.h` in 3.14 and 3.15). What it does not carry (enum
//! values, the unicode `state` bits) is per-version data here too.

use super::layouts::{EntryMarker, InstrEncoding, LineTableFormat, PythonLayout};

/// The first bytes of `_Py_DebugOffsets`.
pub const COOKIE: &[u8; 8] = b"xdebugpy";

/// Why a file's `_Py_DebugOffsets` cannot give a layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DebugOffsetsError {
    /// Fewer bytes than the version's struct.
    #[error("_Py_DebugOffsets: {0} bytes, too short")]
    TooShort(usize),
    /// The struct does not start with `xdebugpy`.
    #[error("_Py_DebugOffsets: no xdebugpy cookie")]
    NoCookie,
    /// The struct's version is not the one the file's `Py_Version` says.
    #[error("_Py_DebugOffsets: version {found:#x}, expected {major}.{minor}")]
    VersionMismatch {
        /// `PY_VERSION_HEX` in the struct.
        found: u64,
        /// Expected major version.
        major: u8,
        /// Expected minor version.
        minor: u8,
    },
    /// A free-threaded (`Py_GIL_DISABLED`) build: other object headers.
    #[error("free-threaded CPython {major}.{minor}t is not supported (only GIL builds are)")]
    FreeThreaded {
        /// Major version.
        major: u8,
        /// Minor version.
        minor: u8,
    },
    /// A version whose struct shape icecore does not know.
    #[error("CPython {major}.{minor}: unknown _Py_DebugOffsets layout (3.13 to 3.15 are known)")]
    UnknownShape {
        /// Major version.
        major: u8,
        /// Minor version.
        minor: u8,
    },
    /// An offset outside its struct, or one that does not fit the BPF fields.
    #[error("_Py_DebugOffsets: implausible {field} = {value}")]
    Implausible {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// `runtime_state.size` differs from the size of the `_PyRuntime` symbol.
    #[error("_Py_DebugOffsets: runtime size {found}, _PyRuntime is {symbol} bytes")]
    RuntimeSize {
        /// The struct's `runtime_state.size`.
        found: u64,
        /// The symbol's size.
        symbol: u64,
    },
}

/// Where, in one minor version's `_Py_DebugOffsets`, each value icecore
/// needs is (byte offsets of `uint64_t` fields; `struct.field` names are
/// CPython's), and what the struct does not say.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Minor version (major is 3).
    pub minor: u8,
    /// `sizeof(_Py_DebugOffsets)`.
    pub size: usize,
    runtime_size: usize,
    interpreters_head: usize,
    interpreter_size: usize,
    threads_head: usize,
    thread_size: usize,
    thread_next: usize,
    thread_current_frame: usize,
    thread_id: usize,
    native_thread_id: usize,
    frame_size: usize,
    frame_previous: usize,
    frame_executable: usize,
    frame_instr_ptr: usize,
    frame_owner: usize,
    code_size: usize,
    code_filename: usize,
    code_name: usize,
    code_qualname: usize,
    code_linetable: usize,
    code_firstlineno: usize,
    code_adaptive: usize,
    bytes_size: usize,
    bytes_ob_size: usize,
    bytes_ob_sval: usize,
    unicode_size: usize,
    unicode_state: usize,
    unicode_length: usize,
    unicode_ascii_size: usize,
    /// `unicode_object.compactunicodeobject_size` (3.15+); before, the
    /// compact header is the ASCII one plus `utf8_length` and `utf8`.
    unicode_compact_size: Option<usize>,
    /// `owner` of the frame a C call of the eval loop pushes first:
    /// `FRAME_OWNED_BY_CSTACK` (3.13), `FRAME_OWNED_BY_INTERPRETER` (3.14+).
    entry_owner: u8,
}

/// Every known shape. Offsets: 8 × the field's index (every field is a
/// `uint64_t`); checked against the DWARF of Debian's 3.13.18, 3.14.10 and
/// 3.15.2 and pyenv's 3.13.0 (tests below).
#[rustfmt::skip]
pub const SHAPES: &[Shape] = &[
    Shape {
        minor: 13, size: 584, runtime_size: 24, interpreters_head: 40, interpreter_size: 48, threads_head: 72,
        thread_size: 152, thread_next: 168, thread_current_frame: 184, thread_id: 192, native_thread_id: 200,
        frame_size: 224, frame_previous: 232, frame_executable: 240, frame_instr_ptr: 248, frame_owner: 264,
        code_size: 272, code_filename: 280, code_name: 288, code_qualname: 296, code_linetable: 304,
        code_firstlineno: 312, code_adaptive: 344,
        bytes_size: 512, bytes_ob_size: 520, bytes_ob_sval: 528,
        unicode_size: 536, unicode_state: 544, unicode_length: 552, unicode_ascii_size: 560, unicode_compact_size: None,
        entry_owner: 3,
    },
    Shape {
        minor: 14, size: 760, runtime_size: 24, interpreters_head: 40, interpreter_size: 48, threads_head: 72,
        thread_size: 176, thread_next: 192, thread_current_frame: 208, thread_id: 216, native_thread_id: 224,
        frame_size: 248, frame_previous: 256, frame_executable: 264, frame_instr_ptr: 272, frame_owner: 288,
        code_size: 312, code_filename: 320, code_name: 328, code_qualname: 336, code_linetable: 344,
        code_firstlineno: 352, code_adaptive: 384,
        bytes_size: 592, bytes_ob_size: 600, bytes_ob_sval: 608,
        unicode_size: 616, unicode_state: 624, unicode_length: 632, unicode_ascii_size: 640, unicode_compact_size: None,
        entry_owner: 3,
    },
    Shape {
        minor: 15, size: 888, runtime_size: 24, interpreters_head: 40, interpreter_size: 48, threads_head: 72,
        thread_size: 176, thread_next: 192, thread_current_frame: 208, thread_id: 240, native_thread_id: 248,
        frame_size: 312, frame_previous: 320, frame_executable: 328, frame_instr_ptr: 336, frame_owner: 352,
        code_size: 376, code_filename: 384, code_name: 392, code_qualname: 400, code_linetable: 408,
        code_firstlineno: 416, code_adaptive: 448,
        bytes_size: 688, bytes_ob_size: 696, bytes_ob_sval: 704,
        unicode_size: 712, unicode_state: 720, unicode_length: 728, unicode_ascii_size: 736, unicode_compact_size: Some(744),
        entry_owner: 3,
    },
];

/// The shape of `3.minor`'s struct, if known.
pub fn shape(major: u8, minor: u8) -> Option<&'static Shape> {
    (major == 3)
        .then(|| SHAPES.iter().find(|s| s.minor == minor))
        .flatten()
}

/// Byte offset of `free_threaded` (stable since 3.13, like the cookie and
/// the version).
const FREE_THREADED: usize = 16;
/// Byte offset of `version` (`PY_VERSION_HEX`).
const VERSION: usize = 8;
/// The unicode `state` bits of GIL builds, 3.12+ (`interned:2`, `kind:3`,
/// `compact:1`, `ascii:1`): not in the struct.
const UNICODE_KIND_SHIFT: u8 = 2;
const UNICODE_COMPACT_BIT: u8 = 5;
const UNICODE_ASCII_BIT: u8 = 6;

/// The layout `bytes` (the start of `_PyRuntime` in the file, at least the
/// shape's size) describe for CPython `major.minor`. `runtime_symbol_size`
/// (the `_PyRuntime` symbol's size) is checked against the struct's
/// `runtime_state.size` when known.
pub fn layout_from(
    bytes: &[u8],
    major: u8,
    minor: u8,
    runtime_symbol_size: Option<u64>,
) -> Result<PythonLayout, DebugOffsetsError> {
    if bytes.len() < 24 {
        return Err(DebugOffsetsError::TooShort(bytes.len()));
    }
    if &bytes[..8] != COOKIE {
        return Err(DebugOffsetsError::NoCookie);
    }
    let word = |at: usize| -> u64 {
        bytes
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    let version = word(VERSION);
    if version >> 16 != (u64::from(major) << 8 | u64::from(minor)) {
        return Err(DebugOffsetsError::VersionMismatch {
            found: version,
            major,
            minor,
        });
    }
    if word(FREE_THREADED) != 0 {
        return Err(DebugOffsetsError::FreeThreaded { major, minor });
    }
    let shape = shape(major, minor).ok_or(DebugOffsetsError::UnknownShape { major, minor })?;
    if bytes.len() < shape.size {
        return Err(DebugOffsetsError::TooShort(bytes.len()));
    }
    let runtime_size = word(shape.runtime_size);
    if let Some(symbol) = runtime_symbol_size
        && symbol != 0
        && symbol != runtime_size
    {
        return Err(DebugOffsetsError::RuntimeSize {
            found: runtime_size,
            symbol,
        });
    }
    // An offset, checked to lie inside its struct (whose size the struct
    // gives) and to fit the layout's 16-bit fields.
    let offset = |field: &'static str, at: usize, size_at: usize| {
        let value = word(at);
        let size = word(size_at);
        if value.saturating_add(8) > size {
            return Err(DebugOffsetsError::Implausible { field, value });
        }
        u16::try_from(value).map_err(|_| DebugOffsetsError::Implausible { field, value })
    };
    let runtime = shape.runtime_size;
    let interp = shape.interpreter_size;
    let thread = shape.thread_size;
    let frame = shape.frame_size;
    let code = shape.code_size;
    let unicode = shape.unicode_size;
    let bytes_object = shape.bytes_size;
    let owner = offset("interpreter_frame.owner", shape.frame_owner, frame)?;
    let ascii_size = word(shape.unicode_ascii_size);
    let compact_size = match shape.unicode_compact_size {
        Some(at) => word(at),
        // PyCompactUnicodeObject: PyASCIIObject, then utf8_length and utf8.
        None => ascii_size + 16,
    };
    let small = |field: &'static str, value: u64| {
        u16::try_from(value).map_err(|_| DebugOffsetsError::Implausible { field, value })
    };
    Ok(PythonLayout {
        major,
        minor,
        runtime_interpreters_head: offset(
            "runtime_state.interpreters_head",
            shape.interpreters_head,
            runtime,
        )?,
        interp_threads_head: offset("interpreter_state.threads_head", shape.threads_head, interp)?,
        tstate_next: offset("thread_state.next", shape.thread_next, thread)?,
        tstate_thread_id: offset("thread_state.thread_id", shape.thread_id, thread)?,
        tstate_native_thread_id: Some(offset(
            "thread_state.native_thread_id",
            shape.native_thread_id,
            thread,
        )?),
        tstate_frame: offset(
            "thread_state.current_frame",
            shape.thread_current_frame,
            thread,
        )?,
        cframe_current_frame: None,
        frame_code: offset(
            "interpreter_frame.executable",
            shape.frame_executable,
            frame,
        )?,
        frame_previous: offset("interpreter_frame.previous", shape.frame_previous, frame)?,
        frame_instr: offset("interpreter_frame.instr_ptr", shape.frame_instr_ptr, frame)?,
        instr: InstrEncoding::InstrPointer,
        entry: EntryMarker::CStackShim {
            owner,
            cstack: shape.entry_owner,
        },
        code_filename: offset("code_object.filename", shape.code_filename, code)?,
        code_name: offset("code_object.name", shape.code_name, code)?,
        code_qualname: Some(offset("code_object.qualname", shape.code_qualname, code)?),
        code_firstlineno: offset("code_object.firstlineno", shape.code_firstlineno, code)?,
        code_linetable: offset("code_object.linetable", shape.code_linetable, code)?,
        line_table: LineTableFormat::Locations,
        code_code_adaptive: Some(offset(
            "code_object.co_code_adaptive",
            shape.code_adaptive,
            code,
        )?),
        unicode_ascii_data: small("unicode_object.asciiobject_size", ascii_size)?,
        unicode_compact_data: small("unicode compact object size", compact_size)?,
        unicode_length: offset("unicode_object.length", shape.unicode_length, unicode)?,
        unicode_state: offset("unicode_object.state", shape.unicode_state, unicode)?,
        unicode_kind_shift: UNICODE_KIND_SHIFT,
        unicode_compact_bit: UNICODE_COMPACT_BIT,
        unicode_ascii_bit: UNICODE_ASCII_BIT,
        bytes_size: offset("bytes_object.ob_size", shape.bytes_ob_size, bytes_object)?,
        bytes_data: offset("bytes_object.ob_sval", shape.bytes_ob_sval, bytes_object)?,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{runtimes::python::detect, test_support::sid_root};

    /// A 3.14 `_Py_DebugOffsets` with the values of Debian's 3.14.10.
    fn debug_offsets_3_14() -> Vec<u8> {
        let shape = shape(3, 14).expect("3.14");
        let mut bytes = vec![0u8; shape.size];
        let mut put =
            |at: usize, value: u64| bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        put(VERSION, 0x030e_0af0);
        for (at, value) in [
            (shape.runtime_size, 316_616),
            (shape.interpreters_head, 808),
            (shape.interpreter_size, 225_864),
            (shape.threads_head, 7344),
            (shape.thread_size, 832),
            (shape.thread_next, 8),
            (shape.thread_current_frame, 72),
            (shape.thread_id, 152),
            (shape.native_thread_id, 160),
            (shape.frame_size, 88),
            (shape.frame_previous, 8),
            (shape.frame_executable, 0),
            (shape.frame_instr_ptr, 56),
            (shape.frame_owner, 74),
            (shape.code_size, 216),
            (shape.code_filename, 112),
            (shape.code_name, 120),
            (shape.code_qualname, 128),
            (shape.code_linetable, 136),
            (shape.code_firstlineno, 68),
            (shape.code_adaptive, 208),
            (shape.bytes_size, 40),
            (shape.bytes_ob_size, 16),
            (shape.bytes_ob_sval, 32),
            (shape.unicode_size, 64),
            (shape.unicode_state, 32),
            (shape.unicode_length, 16),
            (shape.unicode_ascii_size, 40),
        ] {
            put(at, value);
        }
        bytes[..8].copy_from_slice(COOKIE);
        bytes
    }

    #[test]
    fn a_3_14_struct_gives_the_3_14_layout() {
        let layout = layout_from(&debug_offsets_3_14(), 3, 14, Some(316_616)).expect("layout");
        assert_eq!((layout.major, layout.minor), (3, 14));
        assert_eq!(layout.runtime_interpreters_head, 808);
        assert_eq!(layout.tstate_thread_id, 152);
        assert_eq!(
            layout.entry,
            EntryMarker::CStackShim {
                owner: 74,
                cstack: 3
            }
        );
        assert_eq!(layout.code_code_adaptive, Some(208));
        assert_eq!(
            (layout.unicode_ascii_data, layout.unicode_compact_data),
            (40, 56)
        );
    }

    #[test]
    fn bad_structs_are_refused_with_their_reason() {
        let good = debug_offsets_3_14();
        let shape = shape(3, 14).expect("3.14");
        assert_eq!(
            layout_from(&good[..100], 3, 14, None),
            Err(DebugOffsetsError::TooShort(100))
        );
        let mut no_cookie = good.clone();
        no_cookie[0] = b'X';
        assert_eq!(
            layout_from(&no_cookie, 3, 14, None),
            Err(DebugOffsetsError::NoCookie)
        );
        assert!(matches!(
            layout_from(&good, 3, 13, None),
            Err(DebugOffsetsError::VersionMismatch {
                found: 0x030e_0af0,
                ..
            })
        ));
        let mut free_threaded = good.clone();
        free_threaded[FREE_THREADED] = 1;
        assert_eq!(
            layout_from(&free_threaded, 3, 14, None),
            Err(DebugOffsetsError::FreeThreaded {
                major: 3,
                minor: 14
            })
        );
        let mut future = good.clone();
        future[VERSION + 2] = 16;
        assert_eq!(
            layout_from(&future, 3, 16, None),
            Err(DebugOffsetsError::UnknownShape {
                major: 3,
                minor: 16
            })
        );
        assert_eq!(
            layout_from(&good, 3, 14, Some(4096)),
            Err(DebugOffsetsError::RuntimeSize {
                found: 316_616,
                symbol: 4096
            })
        );
        // An offset beyond its struct (hostile or corrupt memory).
        let mut outside = good.clone();
        outside[shape.frame_owner..shape.frame_owner + 8].copy_from_slice(&4096u64.to_le_bytes());
        assert_eq!(
            layout_from(&outside, 3, 14, None),
            Err(DebugOffsetsError::Implausible {
                field: "interpreter_frame.owner",
                value: 4096
            })
        );
        let mut huge = good;
        huge[shape.interpreter_size..shape.interpreter_size + 8]
            .copy_from_slice(&u64::MAX.to_le_bytes());
        huge[shape.threads_head..shape.threads_head + 8].copy_from_slice(&70_000u64.to_le_bytes());
        assert!(matches!(
            layout_from(&huge, 3, 14, None),
            Err(DebugOffsetsError::Implausible {
                field: "interpreter_state.threads_head",
                ..
            })
        ));
    }

    /// Debian's 3.13–3.15 (executables and libpython) read through
    /// `_Py_DebugOffsets`: the values the helper decoded from live processes
    /// of these builds, and the executable and the library agree.
    #[test]
    fn debian_builds_publish_the_expected_offsets() {
        let root = sid_root();
        // (minor, interpreters head, threads head, thread id, owner, co_code_adaptive)
        for (minor, head, threads, thread_id, owner, adaptive) in [
            (13, 632, 7344, 152, 70, 200),
            (14, 808, 7344, 152, 74, 208),
            (15, 936, 7336, 176, 74, 208),
        ] {
            let files = [
                root.join(format!("usr/bin/python3.{minor}")),
                root.join(format!(
                    "usr/lib/x86_64-linux-gnu/libpython3.{minor}.so.1.0"
                )),
            ];
            for file in files.iter().filter(|f| Path::exists(f)) {
                let binary = detect::inspect(file, (3, minor)).unwrap_or_else(|e| panic!("{e}"));
                let l = binary.layout;
                assert_eq!(
                    (
                        l.runtime_interpreters_head,
                        l.interp_threads_head,
                        l.tstate_thread_id
                    ),
                    (head, threads, thread_id),
                    "{}",
                    file.display()
                );
                assert_eq!(
                    l.entry,
                    EntryMarker::CStackShim { owner, cstack: 3 },
                    "{}",
                    file.display()
                );
                assert_eq!(l.code_code_adaptive, Some(adaptive), "{}", file.display());
            }
            if !files[0].exists() {
                crate::test_support::missing_prerequisite(&format!(
                    "Debian python3.{minor} in {} (scripts/cpython-chroots.sh)",
                    root.display()
                ));
            }
        }
    }
}
