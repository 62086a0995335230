//! Finding HotSpot in a process: the mapped `libjvm.so`, the addresses of
//! its exported introspection tables, and the JDK's major version.

use std::path::Path;

use object::{Object, ObjectSymbol};

use super::vmstructs::{TableSymbols, VmStructs, VmStructsError};
use crate::runtimes::{
    memory::ProcessMemory,
    services::{ElfFileError, LoadSegments, ProbeFailure, RuntimeFile, open_elf, parse_elf},
};

/// Why a file is not a usable HotSpot.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// The file could not be read as ELF.
    #[error(transparent)]
    File(#[from] ElfFileError),
    /// The file exports no `gHotSpotVMStructs` (not HotSpot, or a JVM
    /// built without the Serviceability Agent's tables).
    #[error("{0} exports no gHotSpotVMStructs")]
    NoTables(String),
}

/// What one `libjvm.so` offers, in ELF virtual addresses.
#[derive(Debug, Clone)]
pub struct JvmBinary {
    /// `gHotSpot*` symbol → ELF virtual address.
    symbols: Vec<(String, u64)>,
    /// Where the file's segments load.
    segments: LoadSegments,
}

/// Whether a file name is HotSpot's library.
pub fn is_jvm_name(path: &str) -> bool {
    path.rsplit('/').next() == Some("libjvm.so")
}

/// Reads the exported table symbols of a `libjvm.so`.
pub fn inspect(path: &Path) -> Result<JvmBinary, DetectError> {
    let cache = open_elf(path)?;
    let elf = parse_elf(path, &cache)?;
    let symbols: Vec<(String, u64)> = elf
        .dynamic_symbols()
        .filter(|s| !s.is_undefined())
        .filter_map(|s| {
            let name = s.name().ok()?;
            name.starts_with("gHotSpot")
                .then(|| (name.to_owned(), s.address()))
        })
        .collect();
    if !symbols.iter().any(|(n, _)| n == "gHotSpotVMStructs") {
        return Err(DetectError::NoTables(path.display().to_string()));
    }
    Ok(JvmBinary {
        symbols,
        segments: LoadSegments::of(&elf),
    })
}

impl RuntimeFile for JvmBinary {
    fn load_bias(&self, mapping_start: u64, file_offset: u64) -> Option<u64> {
        self.segments.load_bias(mapping_start, file_offset)
    }
}

impl ProbeFailure for DetectError {
    /// Only `libjvm.so` files are probed: every failure is a JVM not profiled.
    fn is_refusal(&self) -> bool {
        true
    }
}

impl JvmBinary {
    /// The table symbols' addresses in a process that loaded the file at `bias`.
    pub fn table_symbols(&self, bias: u64) -> TableSymbols {
        TableSymbols {
            addresses: self
                .symbols
                .iter()
                .map(|(name, at)| (name.clone(), at.wrapping_add(bias)))
                .collect(),
        }
    }

    /// The tables of the JVM that loaded the file at `bias`.
    pub fn vm_structs(
        &self,
        memory: &ProcessMemory,
        bias: u64,
    ) -> Result<VmStructs, VmStructsError> {
        VmStructs::read(memory, &self.table_symbols(bias))
    }
}

/// The JDK's major version (8, 11, …, 25): `JDK_Version::_current`'s
/// first byte up to 21 (JDK 8 calls itself HotSpot 25 in
/// `Abstract_VM_Version::_vm_major_version`), then `_vm_major_version`.
pub fn major_version(vm: &VmStructs, memory: &ProcessMemory) -> Result<u32, VmStructsError> {
    if let Some(current) = vm.static_opt("JDK_Version::_current") {
        return Ok(u32::from(memory.read_u32(current)? as u8));
    }
    let major = vm.static_address("Abstract_VM_Version::_vm_major_version")?;
    Ok(memory.read_u32(major)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_libjvm_is_hotspot() {
        assert!(is_jvm_name(
            "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so"
        ));
        assert!(!is_jvm_name(
            "/usr/lib/jvm/java-17-openjdk-amd64/lib/libjava.so"
        ));
        assert!(!is_jvm_name("/tmp/libjvm.so.bak"));
    }
}
