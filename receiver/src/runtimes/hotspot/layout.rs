//! Where HotSpot keeps what the unwinder reads, taken from the JVM's own
//! tables ([`VmStructs`]) rather than typed by hand per version. What the
//! tables leave out (the interpreter frame's slots, UNSIGNED5's byte
//! offset) follows the JDK's major version. Field names per version:
//! `shared/notes/hotspot-internals.md` §2–6.

use super::vmstructs::{VmStructs, VmStructsError};

/// Where a blob keeps an address: a pointer field (JDK 9–22), or an int
/// offset from the blob's start (JDK 8, 23+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// `*(blob + offset)`.
    Pointer(u64),
    /// `blob + *(i32 *)(blob + offset)`.
    Offset(u64),
}

/// How to find the code heaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heaps {
    /// JDK 9+: `CodeCache::_heaps`, a `GrowableArray<CodeHeap*>*`.
    Array {
        /// Address of `CodeCache::_heaps` (in the process: the tables hold relocated addresses).
        heaps: u64,
        /// `GrowableArrayBase::_len`.
        len: u64,
        /// `GrowableArray<int>::_data`.
        data: u64,
    },
    /// JDK 8: `CodeCache::_heap`, one `CodeHeap*`.
    Single {
        /// Address of `CodeCache::_heap` (in the process: the tables hold relocated addresses).
        heap: u64,
    },
}

/// The code cache's heaps and blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeCacheLayout {
    /// Where the heaps are.
    pub heaps: Heaps,
    /// `CodeHeap::_memory` (a `VirtualSpace`).
    pub heap_memory: u64,
    /// `CodeHeap::_segmap` (a `VirtualSpace`).
    pub heap_segmap: u64,
    /// `CodeHeap::_log2_segment_size` (int).
    pub heap_log2_segment_size: u64,
    /// `VirtualSpace::_low` (committed start: the segment map's first byte).
    pub space_low: u64,
    /// `VirtualSpace::_low_boundary` (reserved start).
    pub space_low_boundary: u64,
    /// `VirtualSpace::_high_boundary` (reserved end: code is committed,
    /// and blobs placed, up to it while the JVM runs).
    pub space_high_boundary: u64,
    /// `sizeof(HeapBlock)`: the blob follows its block's header.
    pub heap_block_size: u64,
    /// `HeapBlock::Header::_length` (segments; size_t, or u32 from 25).
    pub block_length: u64,
    /// `HeapBlock::Header::_used` (bool).
    pub block_used: u64,
}

/// A `CodeBlob`'s fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobLayout {
    /// `_name` (const char*).
    pub name: u64,
    /// `_size` (int, bytes).
    pub size: u64,
    /// `_frame_size` (int, words; -1 for none).
    pub frame_size: u64,
    /// Where the code starts.
    pub code_begin: Location,
    /// `_frame_complete_offset` (bytes from the code's start).
    pub frame_complete: u64,
    /// Its width: 4 (`int`), or 2 (`int16_t`, JDK 23+).
    pub frame_complete_bytes: u8,
}

/// Where an nmethod's debug information is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DebugData {
    /// JDK 8–22: in the nmethod, after its code.
    InBlob {
        /// Scope records.
        scopes_data: Location,
        /// `nmethod::_scopes_pcs_offset`.
        pcs_begin: u64,
        /// `nmethod::_dependencies_offset` (the PcDescs end there).
        pcs_end: u64,
        /// `nmethod::_metadata_offset`.
        metadata: u64,
    },
    /// JDK 23+: scopes and PcDescs in a separate "immutable data" block.
    Immutable {
        /// `nmethod::_immutable_data` (pointer).
        immutable_data: u64,
        /// `nmethod::_scopes_pcs_offset` in it (int).
        pcs_begin: u64,
        /// `nmethod::_scopes_data_offset` in it (int): PcDescs end, scopes begin.
        scopes_data: u64,
        /// `nmethod::_immutable_data_size` (int): the scopes end before it.
        immutable_data_size: u64,
        /// Where the metadata table is.
        metadata: MetadataAt,
    },
}

/// Where a JDK 23+ nmethod's metadata table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataAt {
    /// 23–24: blob + `CodeBlob::_data_offset` + `nmethod::_metadata_offset` (u16).
    DataOffset {
        /// `CodeBlob::_data_offset`.
        data_offset: u64,
        /// `nmethod::_metadata_offset`.
        metadata_offset: u64,
    },
    /// 25+: `*CodeBlob::_mutable_data` + `CodeBlob::_relocation_size`.
    MutableData {
        /// `CodeBlob::_mutable_data` (pointer).
        mutable_data: u64,
        /// `CodeBlob::_relocation_size` (int).
        relocation_size: u64,
    },
}

/// An nmethod's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NMethodLayout {
    /// The `Method*` compiled.
    pub method: u64,
    /// `_comp_level` (int up to 20, a byte from 21: read the low byte).
    pub comp_level: u64,
    /// `_compile_id` (int): tells a reused address from the nmethod it held.
    pub compile_id: u64,
    /// Where the deoptimization handler is, and `_orig_pc_offset` (int):
    /// where a frame pending deoptimization saved its return address.
    /// `None` when the JVM does not describe both.
    pub deopt: Option<(Location, u64)>,
    /// Where PcDescs, scopes and metadata are.
    pub debug: DebugData,
}

/// What names a `Method*` and finds its lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodLayout {
    /// `Method::_constMethod`.
    pub const_method: u64,
    /// `ConstMethod::_constants`.
    pub constants: u64,
    /// The ConstMethod flags word (bit 0: has a line number table).
    pub flags: u64,
    /// `ConstMethod::_code_size` (u16).
    pub code_size: u64,
    /// `ConstMethod::_name_index` (u16).
    pub name_index: u64,
    /// `ConstMethod::_signature_index` (u16).
    pub signature_index: u64,
    /// `sizeof(ConstMethod)`: the bytecodes follow it.
    pub const_method_size: u64,
    /// `ConstantPool::_pool_holder`.
    pub pool_holder: u64,
    /// `sizeof(ConstantPool)`: the entries follow it.
    pub constant_pool_size: u64,
    /// The source file's constant-pool index (u16): in the pool from 15,
    /// in the class before.
    pub source_file_index: SourceFileIndex,
    /// `Klass::_name`.
    pub klass_name: u64,
    /// `Symbol::_length` (u16).
    pub symbol_length: u64,
    /// `Symbol::_body`.
    pub symbol_body: u64,
}

/// Where a class's source file name index is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFileIndex {
    /// `ConstantPool::_source_file_name_index` (JDK 15+).
    InPool(u64),
    /// `InstanceKlass::_source_file_name_index` (JDK 8–14).
    InKlass(u64),
}

/// Everything the HotSpot unwinder reads, for one JVM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotSpotLayout {
    /// The JDK's major version.
    pub major: u32,
    /// The code cache.
    pub code_cache: CodeCacheLayout,
    /// Code blobs.
    pub blob: BlobLayout,
    /// nmethods.
    pub nmethod: NMethodLayout,
    /// Methods.
    pub method: MethodLayout,
}

impl HotSpotLayout {
    /// The layout of a JVM of major version `major` with tables `vm`.
    pub fn new(vm: &VmStructs, major: u32) -> Result<Self, VmStructsError> {
        let heaps = match vm.static_opt("CodeCache::_heaps") {
            Some(heaps) => Heaps::Array {
                heaps,
                len: vm
                    .field_opt("GrowableArrayBase::_len")
                    .map_or_else(|| vm.field("GenericGrowableArray::_len"), Ok)?,
                data: vm.field("GrowableArray<int>::_data")?,
            },
            None => Heaps::Single {
                heap: vm.static_address("CodeCache::_heap")?,
            },
        };
        let code_cache = CodeCacheLayout {
            heaps,
            heap_memory: vm.field("CodeHeap::_memory")?,
            heap_segmap: vm.field("CodeHeap::_segmap")?,
            heap_log2_segment_size: vm.field("CodeHeap::_log2_segment_size")?,
            space_low: vm.field("VirtualSpace::_low")?,
            space_low_boundary: vm.field("VirtualSpace::_low_boundary")?,
            space_high_boundary: vm.field("VirtualSpace::_high_boundary")?,
            heap_block_size: vm.size("HeapBlock")?,
            block_length: vm.field("HeapBlock::Header::_length")?,
            block_used: vm.field("HeapBlock::Header::_used")?,
        };
        let code_begin = match vm.field_opt("CodeBlob::_code_begin") {
            Some(pointer) => Location::Pointer(pointer),
            None => Location::Offset(vm.field("CodeBlob::_code_offset")?),
        };
        let blob = BlobLayout {
            name: vm.field("CodeBlob::_name")?,
            size: vm.field("CodeBlob::_size")?,
            frame_size: vm.field("CodeBlob::_frame_size")?,
            code_begin,
            frame_complete: vm.field("CodeBlob::_frame_complete_offset")?,
            frame_complete_bytes: match vm.field_type("CodeBlob::_frame_complete_offset") {
                None | Some("int" | "jint" | "int32_t") => 4,
                Some("int16_t" | "short" | "jshort") => 2,
                Some(other) => {
                    return Err(VmStructsError::Unsupported(format!(
                        "CodeBlob::_frame_complete_offset of type {other}"
                    )));
                }
            },
        };
        // `CompiledMethod` (JDK 9–22) held what nmethod holds before and after.
        let nm = |name: &str| {
            vm.field_opt(&format!("CompiledMethod::{name}"))
                .map_or_else(|| vm.field(&format!("nmethod::{name}")), Ok)
        };
        let debug = match vm.field_opt("nmethod::_immutable_data") {
            Some(immutable_data) => DebugData::Immutable {
                immutable_data,
                pcs_begin: vm.field("nmethod::_scopes_pcs_offset")?,
                scopes_data: vm.field("nmethod::_scopes_data_offset")?,
                immutable_data_size: vm.field("nmethod::_immutable_data_size")?,
                metadata: match vm.field_opt("CodeBlob::_mutable_data") {
                    Some(mutable_data) => MetadataAt::MutableData {
                        mutable_data,
                        relocation_size: vm.field("CodeBlob::_relocation_size")?,
                    },
                    None => MetadataAt::DataOffset {
                        data_offset: vm.field("CodeBlob::_data_offset")?,
                        metadata_offset: vm.field("nmethod::_metadata_offset")?,
                    },
                },
            },
            None => DebugData::InBlob {
                scopes_data: match vm.field_opt("CompiledMethod::_scopes_data_begin") {
                    Some(pointer) => Location::Pointer(pointer),
                    None => Location::Offset(vm.field("nmethod::_scopes_data_offset")?),
                },
                pcs_begin: vm.field("nmethod::_scopes_pcs_offset")?,
                pcs_end: vm.field("nmethod::_dependencies_offset")?,
                metadata: vm.field("nmethod::_metadata_offset")?,
            },
        };
        // Renamed over the versions; a pointer only while CompiledMethod existed.
        let deopt_handler = vm
            .field_opt("CompiledMethod::_deopt_handler_begin")
            .map(Location::Pointer)
            .or_else(|| {
                [
                    "nmethod::_deoptimize_offset",
                    "nmethod::_deopt_handler_offset",
                    "nmethod::_deopt_handler_entry_offset",
                ]
                .into_iter()
                .find_map(|name| vm.field_opt(name))
                .map(Location::Offset)
            });
        let nmethod = NMethodLayout {
            method: nm("_method")?,
            comp_level: vm.field("nmethod::_comp_level")?,
            compile_id: vm.field("nmethod::_compile_id")?,
            deopt: deopt_handler.zip(vm.field_opt("nmethod::_orig_pc_offset")),
            debug,
        };
        let source_file_index = match vm.field_opt("ConstantPool::_source_file_name_index") {
            Some(at) => SourceFileIndex::InPool(at),
            None => SourceFileIndex::InKlass(vm.field("InstanceKlass::_source_file_name_index")?),
        };
        let method = MethodLayout {
            const_method: vm.field("Method::_constMethod")?,
            constants: vm.field("ConstMethod::_constants")?,
            flags: vm
                .field_opt("ConstMethod::_flags._flags")
                .map_or_else(|| vm.field("ConstMethod::_flags"), Ok)?,
            code_size: vm.field("ConstMethod::_code_size")?,
            name_index: vm.field("ConstMethod::_name_index")?,
            signature_index: vm.field("ConstMethod::_signature_index")?,
            const_method_size: vm.size("ConstMethod")?,
            pool_holder: vm.field("ConstantPool::_pool_holder")?,
            constant_pool_size: vm.size("ConstantPool")?,
            source_file_index,
            klass_name: vm.field("Klass::_name")?,
            symbol_length: vm.field("Symbol::_length")?,
            symbol_body: vm.field("Symbol::_body")?,
        };
        Ok(HotSpotLayout {
            major,
            code_cache,
            blob,
            nmethod,
            method,
        })
    }

    /// UNSIGNED5's byte offset in this version: 1 from JDK 20 on, where the
    /// byte 0 is never written (JDK-8292758).
    pub fn unsigned5_base(&self) -> u8 {
        u8::from(self.major >= 20)
    }
}
