//! HotSpot's own description of itself: the `gHotSpotVMStructs`,
//! `gHotSpotVMTypes`, `gHotSpotVMIntConstants` and `gHotSpotVMLongConstants`
//! tables that the Serviceability Agent reads, read here from the running
//! JVM's memory. Field offsets are written by libjvm's static initializers
//! (they are 0 in the file), so the tables are read from the process, with
//! the strides and entry offsets the JVM exports next to them.

use std::collections::HashMap;

use crate::runtimes::memory::{MemoryError, ProcessMemory};

/// Entries read per table at most (JDK 17 has 788 fields, 768 types).
const MAX_ENTRIES: usize = 20_000;
/// Longest type or field name read.
const MAX_NAME: u64 = 256;
/// Largest stride believed (the entries are 16 to 48 bytes).
const MAX_STRIDE: u64 = 256;

/// Why a JVM's tables could not be read.
#[derive(Debug, thiserror::Error)]
pub enum VmStructsError {
    /// The process's memory could not be read.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A stride or entry offset the JVM exports makes no sense.
    #[error("{0} reads {1}: not a vmStructs table")]
    BadLayout(&'static str, u64),
    /// A table has no end within [`MAX_ENTRIES`] entries.
    #[error("{0} has no end marker within {MAX_ENTRIES} entries")]
    Unterminated(&'static str),
    /// An entry icecore needs is not in this JVM's tables.
    #[error("this JVM's vmStructs have no {0}")]
    Missing(String),
    /// An entry has a type icecore does not know how to read.
    #[error("this JVM's vmStructs declare {0}, which icecore cannot read")]
    Unsupported(String),
}

/// The addresses (in the process) of the exported table symbols.
#[derive(Debug, Clone, Default)]
pub struct TableSymbols {
    /// Symbol name (`gHotSpotVMStructs`, `gHotSpotVMStructEntryArrayStride`,
    /// …) → its address in the process.
    pub addresses: HashMap<String, u64>,
}

impl TableSymbols {
    fn address(&self, name: &'static str) -> Result<u64, VmStructsError> {
        self.addresses
            .get(name)
            .copied()
            .ok_or_else(|| VmStructsError::Missing(name.to_owned()))
    }
}

/// A JVM's tables, as read from its memory.
#[derive(Debug, Default, Clone)]
pub struct VmStructs {
    /// `Type::field` → offset in the object.
    fields: HashMap<String, u64>,
    /// `Type::field` → the field's declared type (`int`, `int16_t`, …).
    field_types: HashMap<String, String>,
    /// `Type::field` → address of the static.
    statics: HashMap<String, u64>,
    /// Type → `sizeof`.
    sizes: HashMap<String, u64>,
    /// Int constants.
    ints: HashMap<String, i64>,
    /// Long constants.
    longs: HashMap<String, u64>,
}

/// Reads one table's strides and field offsets.
struct Reader<'a> {
    memory: &'a ProcessMemory,
    symbols: &'a TableSymbols,
    strings: HashMap<u64, Option<String>>,
}

impl Reader<'_> {
    /// The `u64` at the exported symbol `name` (a stride or an entry offset).
    fn exported(&self, name: &'static str, limit: u64) -> Result<u64, VmStructsError> {
        let value = self.memory.read_u64(self.symbols.address(name)?)?;
        if value >= limit {
            return Err(VmStructsError::BadLayout(name, value));
        }
        Ok(value)
    }

    /// The first entry of the table the pointer symbol `name` points to.
    fn table(&self, name: &'static str) -> Result<u64, VmStructsError> {
        Ok(self.memory.read_u64(self.symbols.address(name)?)?)
    }

    /// The C string at `address`, cached (names repeat across entries).
    fn string(&mut self, address: u64) -> Option<String> {
        if address == 0 {
            return None;
        }
        if let Some(known) = self.strings.get(&address) {
            return known.clone();
        }
        let mut buf = [0u8; MAX_NAME as usize];
        // A name may end near the end of a mapping: read less on failure.
        let text = [MAX_NAME, 64, 16].iter().find_map(|&len| {
            let part = &mut buf[..len as usize];
            self.memory.read_exact(address, part).ok()?;
            let end = part.iter().position(|&b| b == 0)?;
            Some(String::from_utf8_lossy(&part[..end]).into_owned())
        });
        self.strings.insert(address, text.clone());
        text
    }

    /// Each entry of a table: calls `each(entry address)` until `name_at`
    /// (an offset in the entry) holds NULL.
    fn entries(
        &mut self,
        what: &'static str,
        first: u64,
        stride: u64,
        name_at: u64,
        mut each: impl FnMut(&mut Self, u64) -> Result<(), VmStructsError>,
    ) -> Result<(), VmStructsError> {
        if stride == 0 {
            return Err(VmStructsError::BadLayout(what, stride));
        }
        for i in 0..MAX_ENTRIES as u64 {
            let entry = first.wrapping_add(i * stride);
            if self.memory.read_u64(entry + name_at)? == 0 {
                return Ok(());
            }
            each(self, entry)?;
        }
        Err(VmStructsError::Unterminated(what))
    }
}

impl VmStructs {
    /// Reads the tables of the JVM whose exported symbols are at `symbols`.
    pub fn read(memory: &ProcessMemory, symbols: &TableSymbols) -> Result<Self, VmStructsError> {
        let mut r = Reader {
            memory,
            symbols,
            strings: HashMap::new(),
        };
        let mut out = VmStructs::default();

        let stride = r.exported("gHotSpotVMStructEntryArrayStride", MAX_STRIDE)?;
        let type_name = r.exported("gHotSpotVMStructEntryTypeNameOffset", stride)?;
        let field_name = r.exported("gHotSpotVMStructEntryFieldNameOffset", stride)?;
        let is_static = r.exported("gHotSpotVMStructEntryIsStaticOffset", stride)?;
        let offset = r.exported("gHotSpotVMStructEntryOffsetOffset", stride)?;
        let address = r.exported("gHotSpotVMStructEntryAddressOffset", stride)?;
        let type_string = r.exported("gHotSpotVMStructEntryTypeStringOffset", stride)?;
        let first = r.table("gHotSpotVMStructs")?;
        r.entries("gHotSpotVMStructs", first, stride, type_name, |r, e| {
            let ty = r.string(memory.read_u64(e + type_name)?);
            let field = r.string(memory.read_u64(e + field_name)?);
            let (Some(ty), Some(field)) = (ty, field) else {
                return Ok(());
            };
            let key = format!("{ty}::{field}");
            if memory.read_u32(e + is_static)? != 0 {
                out.statics.insert(key, memory.read_u64(e + address)?);
            } else {
                if let Some(declared) = r.string(memory.read_u64(e + type_string)?) {
                    out.field_types.insert(key.clone(), declared);
                }
                out.fields.insert(key, memory.read_u64(e + offset)?);
            }
            Ok(())
        })?;

        let stride = r.exported("gHotSpotVMTypeEntryArrayStride", MAX_STRIDE)?;
        let type_name = r.exported("gHotSpotVMTypeEntryTypeNameOffset", stride)?;
        let size = r.exported("gHotSpotVMTypeEntrySizeOffset", stride)?;
        let first = r.table("gHotSpotVMTypes")?;
        r.entries("gHotSpotVMTypes", first, stride, type_name, |r, e| {
            if let Some(ty) = r.string(memory.read_u64(e + type_name)?) {
                out.sizes.insert(ty, memory.read_u64(e + size)?);
            }
            Ok(())
        })?;

        let stride = r.exported("gHotSpotVMIntConstantEntryArrayStride", MAX_STRIDE)?;
        let name = r.exported("gHotSpotVMIntConstantEntryNameOffset", stride)?;
        let value = r.exported("gHotSpotVMIntConstantEntryValueOffset", stride)?;
        let first = r.table("gHotSpotVMIntConstants")?;
        r.entries("gHotSpotVMIntConstants", first, stride, name, |r, e| {
            if let Some(n) = r.string(memory.read_u64(e + name)?) {
                out.ints
                    .insert(n, i64::from(memory.read_u32(e + value)? as i32));
            }
            Ok(())
        })?;

        let stride = r.exported("gHotSpotVMLongConstantEntryArrayStride", MAX_STRIDE)?;
        let name = r.exported("gHotSpotVMLongConstantEntryNameOffset", stride)?;
        let value = r.exported("gHotSpotVMLongConstantEntryValueOffset", stride)?;
        let first = r.table("gHotSpotVMLongConstants")?;
        r.entries("gHotSpotVMLongConstants", first, stride, name, |r, e| {
            if let Some(n) = r.string(memory.read_u64(e + name)?) {
                out.longs.insert(n, memory.read_u64(e + value)?);
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// The offset of `Type::field` in its object.
    pub fn field(&self, name: &str) -> Result<u64, VmStructsError> {
        self.field_opt(name)
            .ok_or_else(|| VmStructsError::Missing(name.to_owned()))
    }

    /// The offset of `Type::field`, if this version has it.
    pub fn field_opt(&self, name: &str) -> Option<u64> {
        self.fields.get(name).copied()
    }

    /// The declared type of `Type::field`, if this version has it.
    pub fn field_type(&self, name: &str) -> Option<&str> {
        self.field_types.get(name).map(String::as_str)
    }

    /// The address of the static `Type::field`.
    pub fn static_address(&self, name: &str) -> Result<u64, VmStructsError> {
        self.static_opt(name)
            .ok_or_else(|| VmStructsError::Missing(name.to_owned()))
    }

    /// The address of the static `Type::field`, if this version has it.
    pub fn static_opt(&self, name: &str) -> Option<u64> {
        self.statics.get(name).copied()
    }

    /// `sizeof(ty)`.
    pub fn size(&self, ty: &str) -> Result<u64, VmStructsError> {
        self.sizes
            .get(ty)
            .copied()
            .ok_or_else(|| VmStructsError::Missing(format!("type {ty}")))
    }

    /// The int constant `name`, if this version has it.
    pub fn int_constant(&self, name: &str) -> Option<i64> {
        self.ints.get(name).copied()
    }

    /// Entries read: (fields, statics, types, int constants, long constants).
    pub fn counts(&self) -> [usize; 5] {
        [
            self.fields.len(),
            self.statics.len(),
            self.sizes.len(),
            self.ints.len(),
            self.longs.len(),
        ]
    }

    /// Tables built by hand, for unit tests of what reads them.
    #[cfg(test)]
    pub fn from_entries(
        fields: &[(&str, u64)],
        statics: &[(&str, u64)],
        sizes: &[(&str, u64)],
    ) -> Self {
        let map =
            |entries: &[(&str, u64)]| entries.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        VmStructs {
            fields: map(fields),
            field_types: HashMap::new(),
            statics: map(statics),
            sizes: map(sizes),
            ints: HashMap::new(),
            longs: HashMap::new(),
        }
    }
}
