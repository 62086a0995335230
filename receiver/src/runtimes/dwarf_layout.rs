//! Test harness: a runtime's hand-written struct layouts checked against the
//! DWARF of a real build of that runtime. A runtime lists, per field of its
//! layout, the C type and member that field stands for ([`Check`]); the
//! harness reads each build's `.debug_info` once ([`StructIndex`]), compares
//! every field, prints one table (a row per field, a column per build) and
//! fails on any difference ([`assert_layouts_match`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::error::Error;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use gimli::constants::{self as dw, *};
use gimli::{AttributeValue, DwAt, DwTag, EndianRcSlice, Reader, RunTimeEndian, UnitOffset};
use object::{Object, ObjectSection};

type R = EndianRcSlice<RunTimeEndian>;
/// Errors of reading DWARF: a test reports them and fails.
pub type Res<T> = Result<T, Box<dyn Error>>;
/// A DIE: index of its unit in `StructIndex::units`, offset in that unit.
type Die = (usize, UnitOffset);

/// The named types of one file's `.debug_info`, indexed once: `struct X`,
/// `union X`, `enum X` and typedefs (plain `X`), each to its first definition
/// (declarations are skipped).
pub struct StructIndex {
    dwarf: gimli::Dwarf<R>,
    units: Vec<gimli::Unit<R>>,
    by_name: HashMap<String, Die>,
}

impl StructIndex {
    /// Indexes the DWARF of the ELF file at `path` (compressed sections of
    /// distributions' debug files included).
    pub fn open(path: &Path) -> Res<Self> {
        let data = std::fs::read(path)?;
        let file = object::File::parse(&*data)?;
        let endian = if file.is_little_endian() {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
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
                    dw::DW_TAG_union_type => "union ",
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
        if index.by_name.is_empty() {
            return Err(format!("{}: no DWARF types", path.display()).into());
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

    /// The bit offset of the member at the dotted `path` (e.g.
    /// `interpreters.head`) from the start of type `ty`; None if the type or
    /// a member is absent.
    pub fn bit_offset(&self, ty: &str, path: &str) -> Res<Option<u64>> {
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
                        let unit = self.udata(member, DW_AT_byte_size)?.ok_or("no byte size")?;
                        let width = self.udata(member, DW_AT_bit_size)?.ok_or("no bit size")?;
                        8 * bytes + 8 * unit - from_msb - width
                    }
                    None => 8 * bytes,
                },
                // Union members have no location: they all start at 0.
                (None, None) if self.entry(self.strip(die)?)?.tag() == DW_TAG_union_type => 0,
                (None, None) => return Err(format!("{ty}.{path}: no location").into()),
            };
            die = self.type_of(member)?;
        }
        Ok(Some(bits))
    }

    /// `sizeof` the named type.
    pub fn size(&self, ty: &str) -> Res<Option<u64>> {
        let Some(die) = self.resolve(ty)? else {
            return Ok(None);
        };
        self.udata(die, DW_AT_byte_size)
    }

    /// The value of enumerator `name` of the named enum.
    pub fn enumerator(&self, ty: &str, name: &str) -> Res<Option<u64>> {
        let Some(die) = self.resolve(ty)? else {
            return Ok(None);
        };
        let Some(value) = self.child(die, DW_TAG_enumerator, name)? else {
            return Ok(None);
        };
        self.udata(value, DW_AT_const_value)
    }

    /// What the DWARF says for `query`; None when a type or member is absent.
    pub fn answer(&self, query: &Query) -> Res<Option<u64>> {
        Ok(match *query {
            Query::Offset(ty, member) => self.bit_offset(ty, member)?.map(|bits| bits / 8),
            Query::BitWithin(ty, word, bit) => {
                let word_bits = self.bit_offset(ty, word)?;
                let bits = self.bit_offset(ty, &format!("{word}.{bit}"))?;
                bits.zip(word_bits)
                    .and_then(|(bits, word_bits)| bits.checked_sub(word_bits))
            }
            Query::Size(ty) => self.size(ty)?,
            Query::Enumerator(ty, name) => self.enumerator(ty, name)?,
        })
    }
}

/// A section's bytes, SHF_COMPRESSED zlib sections (distributions' debug
/// files) inflated.
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

/// What the DWARF must say about one field. Type names are C's: `struct _ts`,
/// `enum _frameowner`, or a typedef's plain name.
#[derive(Debug, Clone, Copy)]
pub enum Query {
    /// Byte offset of a member (dotted path) of a named type.
    Offset(&'static str, &'static str),
    /// Bit of bitfield `.2` of member `.1` of a named type, counted from
    /// that member's first bit.
    BitWithin(&'static str, &'static str, &'static str),
    /// `sizeof` a named type.
    Size(&'static str),
    /// Value of an enumerator of a named enum.
    Enumerator(&'static str, &'static str),
}

/// One field of a layout: its name, the layout's value (None: the layout
/// says the member does not exist in this version) and what DWARF must say.
pub struct Check {
    /// The layout field's name, a row of the table.
    pub field: &'static str,
    /// The layout's value.
    pub expected: Option<u64>,
    /// Where DWARF holds the truth.
    pub query: Query,
}

/// `Check { field: "f", expected: layout.f, query }`; `opt` for an `Option`
/// field.
macro_rules! layout_check {
    (opt $l:ident . $f:ident, $query:expr) => {
        $crate::runtimes::dwarf_layout::Check {
            field: stringify!($f),
            expected: $l.$f.map(u64::from),
            query: $query,
        }
    };
    ($l:ident . $f:ident, $query:expr) => {
        $crate::runtimes::dwarf_layout::Check {
            field: stringify!($f),
            expected: Some(u64::from($l.$f)),
            query: $query,
        }
    };
}
pub(crate) use layout_check;

/// One build to check: a column label, its DWARF file, and its layout's checks.
pub struct Build {
    /// Column label, e.g. the version.
    pub label: String,
    /// An ELF file with DWARF (the library itself or its debug file).
    pub dwarf: PathBuf,
    /// Every field of the layout the runtime uses for this build.
    pub checks: Vec<Check>,
}

/// Checks every build, prints the table (a row per field, a column per build,
/// the DWARF's values; `-` where a member is absent) and panics listing every
/// field whose layout value differs from its build's DWARF.
pub fn assert_layouts_match(runtime: &str, builds: &[Build]) {
    assert!(
        !builds.is_empty(),
        "{runtime}: no build with DWARF to check"
    );
    let mut columns: Vec<(&str, Vec<(&str, String)>)> = Vec::new();
    let mut errors = Vec::new();
    for build in builds {
        let index = StructIndex::open(&build.dwarf)
            .unwrap_or_else(|e| panic!("{}: {e}", build.dwarf.display()));
        let mut cells = Vec::new();
        for check in &build.checks {
            let found = index
                .answer(&check.query)
                .unwrap_or_else(|e| panic!("{}: {:?}: {e}", build.dwarf.display(), check.query));
            if found != check.expected {
                errors.push(format!(
                    "{runtime} {} {}: layout {:?}, DWARF {found:?} ({:?})",
                    build.label, check.field, check.expected, check.query
                ));
            }
            cells.push((check.field, found.map_or("-".to_owned(), |v| v.to_string())));
        }
        columns.push((&build.label, cells));
    }
    // One row per field, in first-seen order (some rows exist in some versions only).
    let mut fields: Vec<&str> = Vec::new();
    for (field, _) in columns.iter().flat_map(|(_, cells)| cells) {
        if !fields.contains(field) {
            fields.push(field);
        }
    }
    print!("{:<26}", format!("{runtime} (DWARF)"));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The checker itself, on a C file compiled here with known offsets: it
    /// must find them, and must report a wrong layout value.
    #[test]
    fn finds_offsets_bits_sizes_and_enumerators_of_a_compiled_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let source = dir.path().join("layout.c");
        std::fs::write(
            &source,
            "struct inner { long a; struct { unsigned int interned:2, kind:3, compact:1, ascii:1; } state; };\n\
             union either { long l; char c; };\n\
             typedef struct outer { char pad[24]; struct inner in; union either u; } outer_t;\n\
             enum owner { OWNED_BY_THREAD = 0, OWNED_BY_CSTACK = 3 };\n\
             outer_t o; enum owner e;\n",
        )
        .expect("write source");
        // Linked, so the DWARF's string offsets are relocated.
        let object = dir.path().join("layout.so");
        let status = std::process::Command::new("cc")
            .args(["-g", "-shared", "-fPIC", "-o"])
            .arg(&object)
            .arg(&source)
            .status();
        match status {
            Ok(status) if status.success() => {}
            other => {
                crate::test_support::missing_prerequisite(&format!("cc -g: {other:?}"));
                return;
            }
        }
        let index = StructIndex::open(&object).expect("index");
        let answer = |q| index.answer(&q).expect("answer");
        assert_eq!(answer(Query::Offset("outer_t", "in.a")), Some(24));
        assert_eq!(answer(Query::Offset("struct outer", "u")), Some(40));
        assert_eq!(answer(Query::Offset("struct outer", "u.c")), Some(40));
        assert_eq!(answer(Query::BitWithin("struct inner", "a", "x")), None);
        assert_eq!(answer(Query::Offset("struct inner", "missing")), None);
        assert_eq!(answer(Query::Size("outer_t")), Some(48));
        assert_eq!(answer(Query::Size("struct nothing")), None);
        assert_eq!(
            answer(Query::Enumerator("enum owner", "OWNED_BY_CSTACK")),
            Some(3)
        );
        // Bitfields of the anonymous `state` word at byte 8 of `struct inner`.
        assert_eq!(answer(Query::Offset("struct inner", "state")), Some(8));
        let bit = |name| index.bit_offset("struct inner", name).expect("bits");
        assert_eq!(bit("state.kind"), Some(66));
        assert_eq!(
            answer(Query::BitWithin("struct inner", "state", "kind")),
            Some(2)
        );
        assert_eq!(
            answer(Query::BitWithin("struct inner", "state", "compact")),
            Some(5)
        );
        assert_eq!(
            answer(Query::BitWithin("struct inner", "state", "ascii")),
            Some(6)
        );

        let build = |expected| Build {
            label: "test".to_owned(),
            dwarf: object.clone(),
            checks: vec![Check {
                field: "in_a",
                expected,
                query: Query::Offset("outer_t", "in.a"),
            }],
        };
        assert_layouts_match("test", &[build(Some(24))]);
        let wrong = std::panic::catch_unwind(|| assert_layouts_match("test", &[build(Some(16))]));
        assert!(wrong.is_err(), "a wrong offset must fail the check");
    }
}
