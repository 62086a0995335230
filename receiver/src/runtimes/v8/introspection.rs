//! What a V8 binary (`node`, or a library embedding V8) says about itself:
//! the `v8dbg_*` constants V8 exports for post-mortem debuggers (frame
//! slot offsets, object layouts, instance types, frame-type numbers), its
//! version, where its embedded builtins are, and the addresses of the few
//! builtins and globals the unwinder needs.
//!
//! Every `v8dbg_*` symbol is a 4-byte data object whose contents are the
//! value (zero-valued ones live in `.bss`); they are in `.dynsym`, so a
//! stripped binary keeps them. `Builtins_*` and the embedded blob's symbols
//! are in `.symtab` only.

use std::collections::BTreeMap;
use std::path::Path;

use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolSection};

use crate::runtimes::services::{ElfFileError, LoadSegments, open_elf, parse_elf};

/// The builtins whose addresses the unwinder needs: where an interpreted
/// frame's callee returns to (the interpreter's dispatch loop), and the
/// ways in from C++ (whose frames end a JavaScript stretch).
pub const NEEDED_BUILTINS: [&str; 9] = [
    "Builtins_InterpreterEntryTrampoline",
    "Builtins_InterpreterEnterAtBytecode",
    "Builtins_InterpreterEnterAtNextBytecode",
    "Builtins_BaselineOutOfLinePrologue",
    "Builtins_BaselineOutOfLinePrologueDeopt",
    "Builtins_JSEntry",
    "Builtins_JSConstructEntry",
    "Builtins_JSRunMicrotasksEntry",
    "Builtins_JSEntryTrampoline",
];

/// Why a file is not a V8 icecore can read.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The file could not be read as ELF.
    #[error(transparent)]
    File(#[from] ElfFileError),
    /// The file exports no `v8dbg_*` constants (not V8, or built without
    /// the post-mortem metadata).
    #[error("{0} exports no v8dbg_* constants")]
    NoConstants(String),
    /// The file names no V8 version (`v8::internal::Version::major_`).
    #[error("{0} has no V8 version symbols")]
    NoVersion(String),
}

/// V8's version, as `v8::internal::Version` holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct V8Version {
    /// Major (10 in Node 18 … 13 in Node 24).
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Build.
    pub build: u32,
    /// Patch.
    pub patch: u32,
}

impl std::fmt::Display for V8Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{}.{}.{}",
            self.major, self.minor, self.build, self.patch
        )
    }
}

/// A function's ELF address range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRange {
    /// First address.
    pub start: u64,
    /// One past the last.
    pub end: u64,
}

impl AddressRange {
    /// Whether `address` is in the range.
    pub fn contains(&self, address: u64) -> bool {
        self.start <= address && address < self.end
    }
}

/// What one V8 binary offers, in ELF virtual addresses.
#[derive(Debug, Clone)]
pub struct V8Binary {
    /// Its V8 version.
    pub version: V8Version,
    /// `v8dbg_<name>` → value, by `<name>`.
    constants: BTreeMap<String, i64>,
    /// [`NEEDED_BUILTINS`] found, by name.
    builtins: BTreeMap<String, AddressRange>,
    /// The embedded builtins' code (`v8_Default_embedded_blob_code_`), if
    /// the symbol table says where it is.
    pub embedded_blob: Option<AddressRange>,
    /// Where the file's segments load.
    pub segments: LoadSegments,
    /// `interpreter::Bytecodes::kBytecodeSizes`: each bytecode's size with
    /// its operands, for operand scales 1, 2 and 4 (empty when missing).
    pub bytecode_sizes: Vec<u8>,
    /// `IsolateGroup::default_isolate_group_` (V8 13), whose group holds
    /// the JS dispatch table.
    pub isolate_group: Option<u64>,
}

impl V8Binary {
    /// The constant `v8dbg_<name>`.
    pub fn constant(&self, name: &str) -> Option<i64> {
        self.constants.get(name).copied()
    }

    /// The first constant whose name starts with `prefix`.
    pub fn constant_with_prefix(&self, prefix: &str) -> Option<i64> {
        self.constants
            .range(prefix.to_owned()..)
            .next()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, &value)| value)
    }

    /// How many `v8dbg_*` constants the binary exports.
    pub fn constant_count(&self) -> usize {
        self.constants.len()
    }

    /// The address range of builtin `name` (one of [`NEEDED_BUILTINS`]).
    pub fn builtin(&self, name: &str) -> Option<AddressRange> {
        self.builtins.get(name).copied()
    }
}

/// Reads the introspection data of the V8 binary at `path`.
pub fn inspect(path: &Path) -> Result<V8Binary, InspectError> {
    let cache = open_elf(path)?;
    let elf = parse_elf(path, &cache)?;
    // V8 exports its post-mortem constants: a file whose dynamic symbols
    // have none is not read further. Its `.symtab` may be huge (a Rust
    // binary with debug info: 350 ms to walk), and the probe runs on the
    // profiler's loop at a process's first description.
    let exports_constants = elf
        .dynamic_symbols()
        .any(|s| !s.is_undefined() && s.name().is_ok_and(|n| n.starts_with("v8dbg_")));
    if !exports_constants {
        return Err(InspectError::NoConstants(path.display().to_string()));
    }
    let mut constants = BTreeMap::new();
    let mut version = [None; 4];
    let mut builtins = BTreeMap::new();
    let mut blob_code = None;
    let mut blob_data = None;
    let mut blob_size = None;
    let mut bytecode_sizes = Vec::new();
    let mut isolate_group = None;
    // `.symtab` has everything when present; `.dynsym` keeps the constants
    // and the version of a stripped binary.
    for symbol in elf.symbols().chain(elf.dynamic_symbols()) {
        if symbol.is_undefined() {
            continue;
        }
        let Ok(name) = symbol.name() else {
            continue;
        };
        if let Some(constant) = name.strip_prefix("v8dbg_") {
            if !constants.contains_key(constant)
                && let Some(value) = symbol_int(&elf, &symbol)
            {
                constants.insert(constant.to_owned(), value);
            }
            continue;
        }
        let version_part = match name {
            "_ZN2v88internal7Version6major_E" => Some(0),
            "_ZN2v88internal7Version6minor_E" => Some(1),
            "_ZN2v88internal7Version6build_E" => Some(2),
            "_ZN2v88internal7Version6patch_E" => Some(3),
            _ => None,
        };
        if let Some(part) = version_part {
            version[part] = symbol_int(&elf, &symbol).and_then(|v| u32::try_from(v).ok());
            continue;
        }
        match name {
            "v8_Default_embedded_blob_code_" => blob_code = Some(symbol_location(&elf, &symbol)),
            "v8_Default_embedded_blob_code_data_" => blob_data = Some(symbol.address()),
            "_ZN2v88internal11interpreter9Bytecodes14kBytecodeSizesE" => {
                bytecode_sizes = symbol_bytes(&elf, &symbol).unwrap_or_default();
            }
            "_ZN2v88internal12IsolateGroup22default_isolate_group_E" => {
                isolate_group = Some(symbol.address());
            }
            "v8_Default_embedded_blob_code_size_" => {
                blob_size = symbol_int(&elf, &symbol).and_then(|v| u64::try_from(v).ok());
            }
            _ if NEEDED_BUILTINS.contains(&name) && symbol.size() > 0 => {
                builtins.insert(
                    name.to_owned(),
                    AddressRange {
                        start: symbol.address(),
                        end: symbol.address() + symbol.size(),
                    },
                );
            }
            _ => {}
        }
    }
    let display = path.display().to_string();
    if constants.is_empty() {
        return Err(InspectError::NoConstants(display));
    }
    let [Some(major), Some(minor), Some(build), Some(patch)] = version else {
        return Err(InspectError::NoVersion(display));
    };
    // Node 18's `v8_Default_embedded_blob_code_` is a pointer to the code
    // (`…_data_`); later ones are the code itself.
    let blob_start = match blob_code {
        Some(SymbolLocation::Code(at)) => Some(at),
        Some(SymbolLocation::Pointer(at)) if at != 0 => Some(at),
        _ => blob_data,
    };
    let embedded_blob = blob_start.zip(blob_size).map(|(start, size)| AddressRange {
        start,
        end: start + size,
    });
    Ok(V8Binary {
        version: V8Version {
            major,
            minor,
            build,
            patch,
        },
        constants,
        builtins,
        embedded_blob,
        segments: LoadSegments::of(&elf),
        bytecode_sizes,
        isolate_group,
    })
}

/// Where a symbol leads: code at its address, or a pointer stored there.
enum SymbolLocation {
    Code(u64),
    Pointer(u64),
}

fn symbol_location<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
    symbol: &object::Symbol<'data, '_, R>,
) -> SymbolLocation {
    let section = match symbol.section() {
        SymbolSection::Section(index) => elf.section_by_index(index).ok(),
        _ => None,
    };
    match section {
        Some(section) if section.kind() != SectionKind::Text => {
            let pointer = section
                .data_range(symbol.address(), 8)
                .ok()
                .flatten()
                .and_then(|bytes| bytes.try_into().ok())
                .map_or(0, u64::from_le_bytes);
            SymbolLocation::Pointer(pointer)
        }
        _ => SymbolLocation::Code(symbol.address()),
    }
}

/// The bytes of a data symbol (at most 4 KiB).
fn symbol_bytes<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
    symbol: &object::Symbol<'data, '_, R>,
) -> Option<Vec<u8>> {
    let SymbolSection::Section(index) = symbol.section() else {
        return None;
    };
    if symbol.size() > 4096 {
        return None;
    }
    let section = elf.section_by_index(index).ok()?;
    let bytes = section.data_range(symbol.address(), symbol.size()).ok()??;
    Some(bytes.to_vec())
}

/// The integer a data symbol holds (4 or 8 bytes, little-endian, signed);
/// 0 for one in `.bss`.
fn symbol_int<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
    symbol: &object::Symbol<'data, '_, R>,
) -> Option<i64> {
    let SymbolSection::Section(index) = symbol.section() else {
        return None;
    };
    let section = elf.section_by_index(index).ok()?;
    if section.kind() == SectionKind::UninitializedData
        || section.kind() == SectionKind::UninitializedTls
    {
        return Some(0);
    }
    match symbol.size() {
        8 => {
            let bytes = section.data_range(symbol.address(), 8).ok()??;
            Some(i64::from_le_bytes(bytes.try_into().ok()?))
        }
        // V8 declares its constants `int`; a size of 0 is read as one too.
        0 | 4 => {
            let bytes = section.data_range(symbol.address(), 4).ok()??;
            Some(i64::from(i32::from_le_bytes(bytes.try_into().ok()?)))
        }
        _ => None,
    }
}
