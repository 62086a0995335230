//! Per-version CPython struct layouts (x86-64), as data.
//!
//! One row per supported minor version (py-spy style): readers take every offset from the row
//! instead of branching on the version. Every offset was read from the DWARF of CPython builds
//! (pyenv 3.8.18, 3.9.18, 3.10.13, 3.11.7, 3.12.1, 3.13.0; Debian 3.11.2 matches 3.11.7) and is
//! re-checked against the DWARF of the interpreters present by the tests below. Only the default
//! (GIL) builds: free-threaded (3.13t) builds have another `PyObject` header, so other offsets.

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
    /// 3.12+: a shim frame whose `owner` (a char at this offset) is `FRAME_OWNED_BY_CSTACK` (value given) precedes the first frame.
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
    /// 3.13: `instr_ptr`, a pointer to the instruction executing (in `co_code_adaptive`).
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

/// Every supported version, oldest first.
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
    PythonLayout {
        major: 3, minor: 13, runtime_interpreters_head: 632, interp_threads_head: 7344,
        tstate_next: 8, tstate_thread_id: 152, tstate_native_thread_id: Some(160), tstate_frame: 72, cframe_current_frame: None,
        frame_code: 0, frame_previous: 8, frame_instr: 56, instr: InstrEncoding::InstrPointer,
        entry: EntryMarker::CStackShim { owner: 70, cstack: 3 },
        code_filename: 112, code_name: 120, code_qualname: Some(128), code_firstlineno: 68, code_code_adaptive: Some(200),
        code_linetable: 136, line_table: LineTableFormat::Locations,
        unicode_ascii_data: 40, unicode_compact_data: 56, unicode_length: 16, unicode_state: 32,
        unicode_kind_shift: 2, unicode_compact_bit: 5, unicode_ascii_bit: 6, bytes_size: 16, bytes_data: 32,
    },
];

/// The layout of `major.minor`, if supported.
pub fn layout(major: u8, minor: u8) -> Option<&'static PythonLayout> {
    LAYOUTS
        .iter()
        .find(|layout| layout.major == major && layout.minor == minor)
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::collections::HashMap;
    use std::error::Error;
    use std::io::Read;
    use std::path::{Path, PathBuf};
    use std::rc::Rc;

    use gimli::constants::{self as dw, *};
    use gimli::{AttributeValue, DwAt, DwTag, EndianRcSlice, Reader, RunTimeEndian, UnitOffset};
    use object::{Object, ObjectSection};

    use super::*;

    type R = EndianRcSlice<RunTimeEndian>;
    type Res<T> = Result<T, Box<dyn Error>>;
    /// A DIE: index of its unit in `StructIndex::units`, offset in that unit.
    type Die = (usize, UnitOffset);

    /// The named types of one file's `.debug_info`, indexed once: `struct X`, `enum X` and
    /// typedefs (plain `X`), each to its first definition (declarations are skipped).
    struct StructIndex {
        dwarf: gimli::Dwarf<R>,
        units: Vec<gimli::Unit<R>>,
        by_name: HashMap<String, Die>,
    }

    impl StructIndex {
        fn open(path: &Path) -> Res<Self> {
            let data = std::fs::read(path)?;
            let file = object::File::parse(&*data)?;
            let endian = RunTimeEndian::Little; // x86-64
            let dwarf = gimli::Dwarf::load(|id| -> Res<R> {
                let bytes = match file.section_by_name(id.name()) {
                    Some(section) => section_bytes(&section)?,
                    None => Cow::Borrowed(&[][..]),
                };
                Ok(R::new(Rc::from(&*bytes), endian))
            })?;
            let mut index = StructIndex {
                dwarf,
                units: Vec::new(),
                by_name: HashMap::new(),
            };
            for header in index.dwarf.units() {
                let unit = index.dwarf.unit(header?)?;
                let mut entries = unit.entries();
                while let Some(entry) = entries.next_dfs()? {
                    let prefix = match entry.tag() {
                        dw::DW_TAG_structure_type => "struct ",
                        dw::DW_TAG_enumeration_type => "enum ",
                        dw::DW_TAG_typedef => "",
                        _ => continue,
                    };
                    let Some(name) = entry.attr_value(DW_AT_name) else {
                        continue;
                    };
                    if entry.attr(DW_AT_declaration).is_none() {
                        let name = index
                            .dwarf
                            .attr_string(&unit, name)?
                            .to_string_lossy()?
                            .into_owned();
                        let die = (index.units.len(), entry.offset());
                        index
                            .by_name
                            .entry(format!("{prefix}{name}"))
                            .or_insert(die);
                    }
                }
                index.units.push(unit);
            }
            Ok(index)
        }

        fn entry(&self, (unit, offset): Die) -> Res<gimli::DebuggingInformationEntry<R>> {
            Ok(self.units[unit].entry(offset)?)
        }

        fn name(&self, die: Die) -> Res<Option<String>> {
            let Some(name) = self.entry(die)?.attr_value(DW_AT_name) else {
                return Ok(None);
            };
            let name = self.dwarf.attr_string(&self.units[die.0], name)?;
            Ok(Some(name.to_string_lossy()?.into_owned()))
        }

        fn udata(&self, die: Die, attr: DwAt) -> Res<Option<u64>> {
            Ok(self
                .entry(die)?
                .attr_value(attr)
                .and_then(|value| value.udata_value()))
        }

        /// The DIE that `die`'s `DW_AT_type` refers to.
        fn type_of(&self, die: Die) -> Res<Die> {
            match self.entry(die)?.attr_value(DW_AT_type) {
                Some(AttributeValue::UnitRef(offset)) => Ok((die.0, offset)),
                other => Err(format!("unsupported DW_AT_type {other:?}").into()),
            }
        }

        /// A type through typedefs and qualifiers.
        fn strip(&self, mut die: Die) -> Res<Die> {
            loop {
                match self.entry(die)?.tag() {
                    dw::DW_TAG_typedef | dw::DW_TAG_const_type | dw::DW_TAG_volatile_type => {
                        die = self.type_of(die)?
                    }
                    _ => return Ok(die),
                }
            }
        }

        fn resolve(&self, name: &str) -> Res<Option<Die>> {
            self.by_name
                .get(name)
                .map(|&die| self.strip(die))
                .transpose()
        }

        /// The child of `parent` with this tag and name.
        fn child(&self, parent: Die, tag: DwTag, name: &str) -> Res<Option<Die>> {
            let mut tree = self.units[parent.0].entries_tree(Some(parent.1))?;
            let mut children = tree.root()?.children();
            while let Some(child) = children.next()? {
                let die = (parent.0, child.entry().offset());
                if child.entry().tag() == tag && self.name(die)?.as_deref() == Some(name) {
                    return Ok(Some(die));
                }
            }
            Ok(None)
        }

        /// The bit offset of the member at the dotted `path` (e.g. `interpreters.head`) from the
        /// start of type `ty`; None if the type or a member is absent.
        fn bit_offset(&self, ty: &str, path: &str) -> Res<Option<u64>> {
            let Some(mut die) = self.resolve(ty)? else {
                return Ok(None);
            };
            let mut bits = 0;
            for name in path.split('.') {
                let Some(member) = self.child(self.strip(die)?, DW_TAG_member, name)? else {
                    return Ok(None);
                };
                let bytes = self.udata(member, DW_AT_data_member_location)?;
                bits += match (self.udata(member, DW_AT_data_bit_offset)?, bytes) {
                    (Some(bit), _) => bit,
                    // DWARF 2/3 bitfields count `DW_AT_bit_offset` from the storage unit's MSB.
                    (None, Some(bytes)) => match self.udata(member, DW_AT_bit_offset)? {
                        Some(from_msb) => {
                            let unit =
                                self.udata(member, DW_AT_byte_size)?.ok_or("no byte size")?;
                            let width = self.udata(member, DW_AT_bit_size)?.ok_or("no bit size")?;
                            8 * bytes + 8 * unit - from_msb - width
                        }
                        None => 8 * bytes,
                    },
                    (None, None) => return Err(format!("{ty}.{path}: no location").into()),
                };
                die = self.type_of(member)?;
            }
            Ok(Some(bits))
        }

        fn size(&self, ty: &str) -> Res<Option<u64>> {
            let Some(die) = self.resolve(ty)? else {
                return Ok(None);
            };
            self.udata(die, DW_AT_byte_size)
        }

        fn enumerator(&self, ty: &str, name: &str) -> Res<Option<u64>> {
            let Some(die) = self.resolve(ty)? else {
                return Ok(None);
            };
            let Some(value) = self.child(die, DW_TAG_enumerator, name)? else {
                return Ok(None);
            };
            self.udata(value, DW_AT_const_value)
        }
    }

    /// A section's bytes, SHF_COMPRESSED zlib sections (distributions' debug files) inflated.
    fn section_bytes<'data>(section: &object::Section<'data, '_>) -> Res<Cow<'data, [u8]>> {
        let compressed = section.compressed_data()?;
        match compressed.format {
            object::CompressionFormat::None => Ok(Cow::Borrowed(compressed.data)),
            object::CompressionFormat::Zlib => {
                let mut out = Vec::with_capacity(usize::try_from(compressed.uncompressed_size)?);
                flate2::read::ZlibDecoder::new(compressed.data).read_to_end(&mut out)?;
                Ok(Cow::Owned(out))
            }
            other => Err(format!("unsupported compression {other:?}").into()),
        }
    }

    /// What the DWARF must say about one field.
    enum Query {
        /// Byte offset of a member (dotted path) of a named type; None when absent.
        Offset(&'static str, &'static str),
        /// Bit of a member of `PyASCIIObject.state`, counted from that word's first byte.
        StateBit(&'static str),
        /// `sizeof` a named type.
        Size(&'static str),
        /// Value of an enumerator of a named enum.
        Enumerator(&'static str, &'static str),
    }

    /// `(field name, layout value, query)` for field `$f` of layout `$l` (`opt`: an `Option`).
    macro_rules! check {
        (opt $l:ident . $f:ident, $query:expr) => {
            (stringify!($f), $l.$f.map(u64::from), $query)
        };
        ($l:ident . $f:ident, $query:expr) => {
            (stringify!($f), Some(u64::from($l.$f)), $query)
        };
    }

    /// Every field of `l`, with the C names of its version.
    #[rustfmt::skip]
    fn checks(l: &PythonLayout) -> Vec<(&'static str, Option<u64>, Query)> {
        use Query::{Enumerator, Offset, Size, StateBit};
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
            check!(l.unicode_kind_shift, StateBit("kind")),
            check!(l.unicode_compact_bit, StateBit("compact")),
            check!(l.unicode_ascii_bit, StateBit("ascii")),
            check!(l.bytes_size, Offset("PyBytesObject", "ob_base.ob_size")),
            check!(l.bytes_data, Offset("PyBytesObject", "ob_sval")),
        ];
        let owner = Offset(frame, "owner");
        checks.extend(match l.entry {
            EntryMarker::EveryFrame => vec![("entry owner", None, owner)],
            EntryMarker::IsEntry(is_entry) => vec![("entry is_entry", Some(is_entry.into()), Offset(frame, "is_entry"))],
            EntryMarker::CStackShim { owner: offset, cstack } => vec![
                ("entry owner", Some(offset.into()), owner),
                ("FRAME_OWNED_BY_CSTACK", Some(cstack.into()), Enumerator("enum _frameowner", "FRAME_OWNED_BY_CSTACK")),
            ],
        });
        checks
    }

    /// `(field, value found)` table cells of one version.
    type Cells = Vec<(&'static str, String)>;

    /// Checks every field of `l` against the DWARF of `path`: the table cells, in `checks`
    /// order, and the mismatches.
    fn verify(l: &PythonLayout, path: &Path) -> Res<(Cells, Vec<String>)> {
        let index = StructIndex::open(path)?;
        let (mut cells, mut errors) = (Vec::new(), Vec::new());
        for (field, expected, query) in checks(l) {
            let found = match query {
                Query::Offset(ty, member) => index.bit_offset(ty, member)?.map(|bits| bits / 8),
                Query::StateBit(bit) => {
                    let bits = index.bit_offset("PyASCIIObject", &format!("state.{bit}"))?;
                    bits.and_then(|bits| bits.checked_sub(8 * u64::from(l.unicode_state)))
                }
                Query::Size(ty) => index.size(ty)?,
                Query::Enumerator(ty, name) => index.enumerator(ty, name)?,
            };
            if found != expected {
                errors.push(format!(
                    "{}.{} {field}: layout {expected:?}, DWARF {found:?}",
                    l.major, l.minor
                ));
            }
            cells.push((field, found.map_or("-".to_owned(), |v| v.to_string())));
        }
        Ok((cells, errors))
    }

    /// `(label, layout, libpython)` for the pyenv builds present, and for each entry of
    /// `ICECORE_PY_DWARF_EXTRA=3.11=/usr/lib/debug/.build-id/….debug,…` (e.g. a distribution's).
    fn interpreters() -> Vec<(String, &'static PythonLayout, PathBuf)> {
        let home = std::env::var_os("HOME").map(|home| Path::new(&home).join(".pyenv"));
        let root = std::env::var_os("PYENV_ROOT")
            .map(PathBuf::from)
            .or(home)
            .unwrap_or_default();
        let mut found = Vec::new();
        for (l, patch) in LAYOUTS
            .iter()
            .zip(["3.8.18", "3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0"])
        {
            let lib = root.join(format!(
                "versions/{patch}/lib/libpython{}.{}.so.1.0",
                l.major, l.minor
            ));
            if lib.exists() {
                found.push((patch.to_owned(), l, lib));
            } else {
                crate::test_support::missing_prerequisite(&format!(
                    "CPython {patch}: no {}",
                    lib.display()
                ));
            }
        }
        let extra = std::env::var("ICECORE_PY_DWARF_EXTRA").unwrap_or_default();
        for (version, path) in extra.split(',').filter_map(|entry| entry.split_once('=')) {
            let (major, minor) = version
                .split_once('.')
                .expect("ICECORE_PY_DWARF_EXTRA: MAJOR.MINOR=PATH");
            let l = layout(major.parse().expect("major"), minor.parse().expect("minor"))
                .expect("a supported version");
            found.push((format!("{version}+"), l, PathBuf::from(path)));
        }
        found
    }

    #[test]
    fn offsets_match_dwarf() {
        let interpreters = interpreters();
        assert!(
            !interpreters.is_empty(),
            "no pyenv CPython 3.8–3.13 found (PYENV_ROOT or ~/.pyenv)"
        );
        let (mut columns, mut errors) = (Vec::new(), Vec::new());
        for (label, l, path) in &interpreters {
            let (cells, mismatches) =
                verify(l, path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            columns.push((label, cells));
            errors.extend(mismatches);
        }
        // One row per field (the entry-marker rows differ between versions).
        let mut fields: Vec<&str> = Vec::new();
        for (field, _) in columns.iter().flat_map(|(_, cells)| cells) {
            if !fields.contains(field) {
                fields.push(field);
            }
        }
        print!("{:<26}", "field (DWARF)");
        columns.iter().for_each(|(label, _)| print!("{label:>9}"));
        for field in fields {
            print!("\n{field:<26}");
            for (_, cells) in &columns {
                let cell = cells
                    .iter()
                    .find(|(f, _)| *f == field)
                    .map_or("", |(_, v)| v.as_str());
                print!("{cell:>9}");
            }
        }
        println!();
        assert!(
            errors.is_empty(),
            "layouts disagree with DWARF:\n{}",
            errors.join("\n")
        );
    }

    #[test]
    fn lookup() {
        for minor in 8..=13 {
            let l = layout(3, minor).expect("supported");
            assert_eq!((l.major, l.minor), (3, minor));
        }
        assert_eq!(layout(3, 7), None);
        assert_eq!(layout(3, 14), None);
        assert_eq!(layout(2, 7), None);
        assert!(
            LAYOUTS
                .windows(2)
                .all(|w| (w[0].major, w[0].minor) < (w[1].major, w[1].minor))
        );
    }
}
