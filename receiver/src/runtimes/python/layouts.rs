//! Per-version CPython struct layouts (x86-64), as data.
//!
//! One row per minor version 3.8–3.12 (py-spy style): readers take every offset from the row
//! instead of branching on the version. Every offset was read from the DWARF of CPython builds
//! (pyenv 3.8.18, 3.9.18, 3.10.13, 3.11.7, 3.12.1; Debian 3.11.2 matches 3.11.7) and is
//! re-checked against the DWARF of the interpreters present by the tests below. From 3.13 on,
//! the interpreter publishes its own offsets (`_Py_DebugOffsets`, see `debug_offsets.rs`), and
//! the layout is built from them; the tests check those layouts against DWARF as well. Only the
//! default (GIL) builds: free-threaded builds have another `PyObject` header.

/// Line-table format of a code object (defined next to its decoder).
pub use super::line_table::LineTableFormat;

/// Where a frame's "entry" boundary is recorded: which frame of the chain was the first one
/// a C-level call of `_PyEval_EvalFrameDefault` evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryMarker {
    /// ≤ 3.10: every Python frame has its own `_PyEval_EvalFrameDefault` call.
    EveryFrame,
    /// 3.11: `_PyInterpreterFrame.is_entry` (a bool at this offset).
    IsEntry(u16),
    /// 3.12+: a shim frame whose `owner` (a char at this offset) is `FRAME_OWNED_BY_CSTACK`
    /// (3.12, 3.13) / `FRAME_OWNED_BY_INTERPRETER` (3.14+), value given, precedes the first
    /// frame. 3.15 also ends every thread's chain with one (its base frame).
    CStackShim { owner: u16, cstack: u8 },
}

/// How a frame records its position in the bytecode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstrEncoding {
    /// ≤ 3.9: `f_lasti`, an int: byte offset of the last instruction.
    LastiBytes,
    /// 3.10: `f_lasti`, an int: index of the last instruction in code units (2 bytes).
    LastiCodeUnits,
    /// 3.11, 3.12: `prev_instr`, a pointer to the last instruction started (in `co_code_adaptive`).
    PrevInstrPointer,
    /// 3.13+: `instr_ptr`, a pointer to the instruction executing (in `co_code_adaptive`).
    InstrPointer,
}

/// The layout of one CPython minor version on x86-64. Offsets are bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PythonLayout {
    /// Major version (3).
    pub major: u8,
    /// Minor version.
    pub minor: u8,
    /// `_PyRuntime.interpreters.head` (`_PyRuntimeState`): the first `PyInterpreterState *`.
    pub runtime_interpreters_head: u16,
    /// `PyInterpreterState.tstate_head` (≤ 3.10) / `threads.head` (3.11+): the first thread.
    pub interp_threads_head: u16,
    /// `PyThreadState.next`: the next thread of the interpreter.
    pub tstate_next: u16,
    /// `PyThreadState.thread_id`: `pthread_self()` of the thread (on glibc x86-64 its `fsbase`).
    pub tstate_thread_id: u16,
    /// `PyThreadState.native_thread_id`: the kernel TID (3.11+; absent in ≤ 3.10).
    pub tstate_native_thread_id: Option<u16>,
    /// `PyThreadState.frame` (≤ 3.10), `cframe` (3.11, 3.12), `current_frame` (3.13).
    pub tstate_frame: u16,
    /// `_PyCFrame.current_frame` (3.11, 3.12); None when `tstate_frame` is the frame itself.
    pub cframe_current_frame: Option<u16>,
    /// `f_code` (≤ 3.12) / `f_executable` (3.13) of `PyFrameObject` (≤ 3.10) / `_PyInterpreterFrame` (3.11+).
    pub frame_code: u16,
    /// `f_back` (≤ 3.10) / `previous` (3.11+): the calling frame.
    pub frame_previous: u16,
    /// `f_lasti` (≤ 3.10) / `prev_instr` (3.11, 3.12) / `instr_ptr` (3.13), read as `instr` says.
    pub frame_instr: u16,
    /// What `frame_instr` holds.
    pub instr: InstrEncoding,
    /// How the first frame of each `_PyEval_EvalFrameDefault` call is marked.
    pub entry: EntryMarker,
    /// `PyCodeObject.co_filename` (a `str`).
    pub code_filename: u16,
    /// `PyCodeObject.co_name` (a `str`).
    pub code_name: u16,
    /// `PyCodeObject.co_qualname` (a `str`; 3.11+).
    pub code_qualname: Option<u16>,
    /// `PyCodeObject.co_firstlineno` (an int).
    pub code_firstlineno: u16,
    /// `PyCodeObject.co_lnotab` (≤ 3.9) / `co_linetable` (3.10+) (a `bytes`).
    pub code_linetable: u16,
    /// Format of the table at `code_linetable`.
    pub line_table: LineTableFormat,
    /// `PyCodeObject.co_code_adaptive` (3.11+): start of the bytecode, inline in the code object.
    pub code_code_adaptive: Option<u16>,
    /// `sizeof(PyASCIIObject)`: where compact ASCII data starts.
    pub unicode_ascii_data: u16,
    /// `sizeof(PyCompactUnicodeObject)`: where compact non-ASCII data starts.
    pub unicode_compact_data: u16,
    /// `PyASCIIObject.length`: length in code points.
    pub unicode_length: u16,
    /// `PyASCIIObject.state`: the 32-bit bitfield word holding `interned`, `kind`, `compact`,
    /// `ascii`. Bits (LSB first) in 3.8–3.13: `interned` 0–1, `kind` 2–4, `compact` 5, `ascii` 6,
    /// then `ready` (≤ 3.11) / `statically_allocated` (3.12+) 7. (Free-threaded 3.14t makes
    /// `interned` a whole byte, moving the others up by 6.)
    pub unicode_state: u16,
    /// Bit of `state` where `kind` (3 bits: 1, 2 or 4 bytes per character) starts.
    pub unicode_kind_shift: u8,
    /// Bit of `state` holding `compact` (data follows the header).
    pub unicode_compact_bit: u8,
    /// Bit of `state` holding `ascii` (data starts at `unicode_ascii_data`).
    pub unicode_ascii_bit: u8,
    /// `PyBytesObject.ob_base.ob_size` (`PyVarObject`): length in bytes.
    pub bytes_size: u16,
    /// `PyBytesObject.ob_sval`: the bytes.
    pub bytes_data: u16,
}

/// Every version before `_Py_DebugOffsets`, oldest first.
#[rustfmt::skip]
pub const LAYOUTS: &[PythonLayout] = &[
    PythonLayout {
        major: 3, minor: 8, runtime_interpreters_head: 32, interp_threads_head: 8,
        tstate_next: 8, tstate_thread_id: 176, tstate_native_thread_id: None, tstate_frame: 24, cframe_current_frame: None,
        frame_code: 32, frame_previous: 24, frame_instr: 104, instr: InstrEncoding::LastiBytes,
        entry: EntryMarker::EveryFrame,
        code_filename: 104, code_name: 112, code_qualname: None, code_firstlineno: 40, code_code_adaptive: None,
        code_linetable: 120, line_table: LineTableFormat::Lnotab,
        unicode_ascii_data: 48, unicode_compact_data: 72, unicode_length: 16, unicode_state: 32,
        unicode_kind_shift: 2, unicode_compact_bit: 5, unicode_ascii_bit: 6, bytes_size: 16, bytes_data: 32,
    },
    PythonLayout {
        major: 3, minor: 9, runtime_interpreters_head: 32, interp_threads_head: 8,
        tstate_next: 8, tstate_thread_id: 176, tstate_native_thread_id: None, tstate_frame: 24, cframe_current_frame: None,
        frame_code: 32, frame_previous: 24, frame_instr: 104, instr: InstrEncoding::LastiBytes,
        entry: EntryMarker::EveryFrame,
        code_filename: 104, code_name: 112, code_qualname: None, code_firstlineno: 40, code_code_adaptive: None,
        code_linetable: 120, line_table: LineTableFormat::Lnotab,
        unicode_ascii_data: 48, unicode_compact_data: 72, unicode_length: 16, unicode_state: 32,
        unicode_kind_shift: 2, unicode_compact_bit: 5, unicode_ascii_bit: 6, bytes_size: 16, bytes_data: 32,
    },
    PythonLayout {
        major: 3, minor: 10, runtime_interpreters_head: 32, interp_threads_head: 8,
        tstate_next: 8, tstate_thread_id: 176, tstate_native_thread_id: None, tstate_frame: 24, cframe_current_frame: None,
        frame_code: 32, frame_previous: 24, frame_instr: 96, instr: InstrEncoding::LastiCodeUnits,
        entry: EntryMarker::EveryFrame,
        code_filename: 104, code_name: 112, code_qualname: None, code_firstlineno: 40, code_code_adaptive: None,
        code_linetable: 120, line_table: LineTableFormat::Pep626,
        unicode_ascii_data: 48, unicode_compact_data: 72, unicode_length: 16, unicode_state: 32,
        unicode_kind_shift: 2, unicode_compact_bit: 5, unicode_ascii_bit: 6, bytes_size: 16, bytes_data: 32,
    },
    PythonLayout {
        major: 3, minor: 11, runtime_interpreters_head: 40, interp_threads_head: 16,
        tstate_next: 8, tstate_thread_id: 152, tstate_native_thread_id: Some(160), tstate_frame: 56, cframe_current_frame: Some(8),
        frame_code: 32, frame_previous: 48, frame_instr: 56, instr: InstrEncoding::PrevInstrPointer,
        entry: EntryMarker::IsEntry(68),
        code_filename: 112, code_name: 120, code_qualname: Some(128), code_firstlineno: 72, code_code_adaptive: Some(184),
        code_linetable: 136, line_table: LineTableFormat::Locations,
        unicode_ascii_data: 48, unicode_compact_data: 72, unicode_length: 16, unicode_state: 32,
        unicode_kind_shift: 2, unicode_compact_bit: 5, unicode_ascii_bit: 6, bytes_size: 16, bytes_data: 32,
    },
    PythonLayout {
        major: 3, minor: 12, runtime_interpreters_head: 40, interp_threads_head: 72,
        tstate_next: 8, tstate_thread_id: 136, tstate_native_thread_id: Some(144), tstate_frame: 56, cframe_current_frame: Some(0),
        frame_code: 0, frame_previous: 8, frame_instr: 56, instr: InstrEncoding::PrevInstrPointer,
        entry: EntryMarker::CStackShim { owner: 70, cstack: 3 },
        code_filename: 112, code_name: 120, code_qualname: Some(128), code_firstlineno: 68, code_code_adaptive: Some(192),
        code_linetable: 136, line_table: LineTableFormat::Locations,
        unicode_ascii_data: 40, unicode_compact_data: 56, unicode_length: 16, unicode_state: 32,
        unicode_kind_shift: 2, unicode_compact_bit: 5, unicode_ascii_bit: 6, bytes_size: 16, bytes_data: 32,
    },
];

/// The hand-written layout of `major.minor` (3.8–3.12).
pub fn layout(major: u8, minor: u8) -> Option<&'static PythonLayout> {
    LAYOUTS
        .iter()
        .find(|layout| layout.major == major && layout.minor == minor)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::runtimes::dwarf_layout::{
        Build, Check, Query, assert_layouts_match, layout_check as check,
    };
    use crate::runtimes::python::detect;
    use crate::symbolize::debug_file;
    use crate::test_support::sid_root;

    /// Every field of `l`, with the C names of its version.
    #[rustfmt::skip]
    fn checks(l: &PythonLayout) -> Vec<Check> {
        use Query::{BitWithin, Enumerator, Offset, Size};
        const ASCII: &str = "PyASCIIObject";
        const CODE: &str = "PyCodeObject";
        const TS: &str = "struct _ts";
        let (frame, tstate_frame, previous, instr) = match l.instr {
            InstrEncoding::LastiBytes | InstrEncoding::LastiCodeUnits => ("struct _frame", "frame", "f_back", "f_lasti"),
            InstrEncoding::PrevInstrPointer => ("struct _PyInterpreterFrame", "cframe", "previous", "prev_instr"),
            InstrEncoding::InstrPointer => ("struct _PyInterpreterFrame", "current_frame", "previous", "instr_ptr"),
        };
        let threads = if l.minor <= 10 { "tstate_head" } else { "threads.head" };
        let code = if l.minor <= 12 { "f_code" } else { "f_executable" };
        let linetable = if l.line_table == LineTableFormat::Lnotab { "co_lnotab" } else { "co_linetable" };
        let mut checks = vec![
            check!(l.runtime_interpreters_head, Offset("struct pyruntimestate", "interpreters.head")),
            check!(l.interp_threads_head, Offset("struct _is", threads)),
            check!(l.tstate_next, Offset(TS, "next")),
            check!(l.tstate_thread_id, Offset(TS, "thread_id")),
            check!(opt l.tstate_native_thread_id, Offset(TS, "native_thread_id")),
            check!(l.tstate_frame, Offset(TS, tstate_frame)),
            check!(opt l.cframe_current_frame, Offset("struct _PyCFrame", "current_frame")),
            check!(l.frame_code, Offset(frame, code)),
            check!(l.frame_previous, Offset(frame, previous)),
            check!(l.frame_instr, Offset(frame, instr)),
            check!(l.code_filename, Offset(CODE, "co_filename")),
            check!(l.code_name, Offset(CODE, "co_name")),
            check!(opt l.code_qualname, Offset(CODE, "co_qualname")),
            check!(l.code_firstlineno, Offset(CODE, "co_firstlineno")),
            check!(l.code_linetable, Offset(CODE, linetable)),
            check!(opt l.code_code_adaptive, Offset(CODE, "co_code_adaptive")),
            check!(l.unicode_ascii_data, Size(ASCII)),
            check!(l.unicode_compact_data, Size("PyCompactUnicodeObject")),
            check!(l.unicode_length, Offset(ASCII, "length")),
            check!(l.unicode_state, Offset(ASCII, "state")),
            check!(l.unicode_kind_shift, BitWithin(ASCII, "state", "kind")),
            check!(l.unicode_compact_bit, BitWithin(ASCII, "state", "compact")),
            check!(l.unicode_ascii_bit, BitWithin(ASCII, "state", "ascii")),
            check!(l.bytes_size, Offset("PyBytesObject", "ob_base.ob_size")),
            check!(l.bytes_data, Offset("PyBytesObject", "ob_sval")),
        ];
        let owner = Offset(frame, "owner");
        let entry = |field, expected: Option<u64>, query| Check { field, expected, query };
        checks.extend(match l.entry {
            EntryMarker::EveryFrame => vec![entry("entry owner", None, owner)],
            EntryMarker::IsEntry(is_entry) => vec![entry("entry is_entry", Some(is_entry.into()), Offset(frame, "is_entry"))],
            EntryMarker::CStackShim { owner: offset, cstack } => vec![
                entry("entry owner", Some(offset.into()), owner),
                // The owner of the frame a C call pushes first: renamed in 3.14.
                if l.minor >= 14 {
                    entry("FRAME_OWNED_BY_INTERPRETER", Some(cstack.into()), Enumerator("enum _frameowner", "FRAME_OWNED_BY_INTERPRETER"))
                } else {
                    entry("FRAME_OWNED_BY_CSTACK", Some(cstack.into()), Enumerator("enum _frameowner", "FRAME_OWNED_BY_CSTACK"))
                },
            ],
        });
        checks
    }

    fn pyenv_root() -> PathBuf {
        let home = std::env::var_os("HOME").map(|home| Path::new(&home).join(".pyenv"));
        std::env::var_os("PYENV_ROOT")
            .map(PathBuf::from)
            .or(home)
            .unwrap_or_default()
    }

    /// The layout icecore uses for the CPython file at `path`.
    fn layout_of(path: &Path) -> PythonLayout {
        let name = detect::version_from_name(&path.to_string_lossy()).expect("a CPython file name");
        detect::inspect(path, name)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .layout
    }

    /// A build for each pyenv CPython present (its libpython carries DWARF), each
    /// Debian sid interpreter of the chroot with its `-dbg` debug file, and each
    /// entry of `ICECORE_PY_DWARF_EXTRA=/path/libpython3.11.so=/usr/lib/debug/….debug,…`.
    fn builds() -> Vec<Build> {
        let root = pyenv_root();
        let mut found = Vec::new();
        for (minor, patch) in
            (8..=13).zip(["3.8.18", "3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0"])
        {
            let lib = root.join(format!("versions/{patch}/lib/libpython3.{minor}.so.1.0"));
            if lib.exists() {
                found.push(Build {
                    label: patch.to_owned(),
                    checks: checks(&layout_of(&lib)),
                    dwarf: lib,
                });
            } else {
                crate::test_support::missing_prerequisite(&format!(
                    "CPython {patch}: no {}",
                    lib.display()
                ));
            }
        }
        let sid = sid_root();
        for minor in 13..=15 {
            let exe = sid.join(format!("usr/bin/python3.{minor}"));
            let debug = debug_file::build_id_of(&exe, u64::MAX)
                .and_then(|id| debug_file::build_id_path(&id))
                .map(|path| sid.join(path.strip_prefix("/").unwrap_or(&path)));
            match debug {
                Some(debug) if debug.exists() => found.push(Build {
                    label: format!("3.{minor} sid"),
                    checks: checks(&layout_of(&exe)),
                    dwarf: debug,
                }),
                _ => crate::test_support::missing_prerequisite(&format!(
                    "Debian sid python3.{minor} with python3.{minor}-dbg in {} (scripts/cpython-chroots.sh)",
                    sid.display()
                )),
            }
        }
        let extra = std::env::var("ICECORE_PY_DWARF_EXTRA").unwrap_or_default();
        for (binary, dwarf) in extra.split(',').filter_map(|entry| entry.split_once('=')) {
            let binary = PathBuf::from(binary);
            let label = binary
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            found.push(Build {
                label,
                checks: checks(&layout_of(&binary)),
                dwarf: PathBuf::from(dwarf),
            });
        }
        found
    }

    #[test]
    fn offsets_match_dwarf() {
        assert_layouts_match("CPython", &builds());
    }

    /// The 3.13 layout as it was written by hand from pyenv 3.13.0's DWARF,
    /// before `_Py_DebugOffsets` replaced it: what the interpreter publishes
    /// must say the same.
    #[rustfmt::skip]
    const HAND_WRITTEN_3_13: PythonLayout = PythonLayout {
        major: 3, minor: 13, runtime_interpreters_head: 632, interp_threads_head: 7344,
        tstate_next: 8, tstate_thread_id: 152, tstate_native_thread_id: Some(160), tstate_frame: 72, cframe_current_frame: None,
        frame_code: 0, frame_previous: 8, frame_instr: 56, instr: InstrEncoding::InstrPointer,
        entry: EntryMarker::CStackShim { owner: 70, cstack: 3 },
        code_filename: 112, code_name: 120, code_qualname: Some(128), code_firstlineno: 68, code_code_adaptive: Some(200),
        code_linetable: 136, line_table: LineTableFormat::Locations,
        unicode_ascii_data: 40, unicode_compact_data: 56, unicode_length: 16, unicode_state: 32,
        unicode_kind_shift: 2, unicode_compact_bit: 5, unicode_ascii_bit: 6, bytes_size: 16, bytes_data: 32,
    };

    #[test]
    fn debug_offsets_of_3_13_say_what_the_hand_written_layout_said() {
        let candidates = [
            pyenv_root().join("versions/3.13.0/lib/libpython3.13.so.1.0"),
            sid_root().join("usr/bin/python3.13"),
        ];
        for path in &candidates {
            if !path.exists() {
                crate::test_support::missing_prerequisite(&format!(
                    "CPython 3.13: no {}",
                    path.display()
                ));
                continue;
            }
            assert_eq!(layout_of(path), HAND_WRITTEN_3_13, "{}", path.display());
        }
    }

    #[test]
    fn lookup() {
        for minor in 8..=12 {
            let l = layout(3, minor).expect("supported");
            assert_eq!((l.major, l.minor), (3, minor));
        }
        assert_eq!(layout(3, 7), None);
        assert_eq!(
            layout(3, 13),
            None,
            "3.13+ layouts come from _Py_DebugOffsets"
        );
        assert_eq!(layout(2, 7), None);
        assert!(
            LAYOUTS
                .windows(2)
                .all(|w| (w[0].major, w[0].minor) < (w[1].major, w[1].minor))
        );
    }
}
