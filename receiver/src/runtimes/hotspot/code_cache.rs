//! The JIT's code cache, read from the process: its heaps' address ranges
//! (what the native unwinder hands over to HotSpot's unwinder), the code
//! blob at an address (through the heap's segment map, as HotSpot's own
//! `CodeHeap::find_blob` does), and an nmethod's debug information.

use super::{
    compressed::{PC_DESC_BYTES, Scope, scope_chain, scope_for_pc},
    layout::{CodeCacheLayout, DebugData, Heaps, HotSpotLayout, Location, MetadataAt},
};
use crate::runtimes::memory::ProcessMemory;

/// Code heaps believed at most (HotSpot has 1 to 3, or 4 with JVMCI).
const MAX_HEAPS: u64 = 16;
/// Segment-map hops followed at most (a block of 254 segments takes one).
const MAX_SEGMAP_HOPS: usize = 64;
/// A segment-map byte that marks a free segment.
const FREE_SEGMENT: u8 = 0xff;
/// Longest blob name read.
const MAX_BLOB_NAME: u64 = 64;
/// Largest PcDesc or scope table read (bytes).
const MAX_DEBUG_BYTES: u64 = 4 << 20;
/// Largest metadata table read (entries).
const MAX_METADATA: u64 = 1 << 16;

/// One code heap: its reserved code range and its segment map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeHeap {
    /// First address of code.
    pub low: u64,
    /// One past the last reserved address (code is committed up to here
    /// while the JVM runs).
    pub high: u64,
    /// The segment map: one byte per segment.
    pub segmap: u64,
    /// Bytes per segment, as a shift.
    pub log2_segment_size: u32,
}

/// A code blob (an nmethod, the interpreter, a stub).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// Its address.
    pub address: u64,
    /// `_name`: `nmethod`, `native nmethod`, `Interpreter`, `StubRoutines (1)`, …
    pub name: String,
    /// Bytes.
    pub size: u32,
    /// Frame size in words (-1: no frame).
    pub frame_size: i32,
    /// Where its instructions start.
    pub code_begin: u64,
    /// Bytes from `code_begin` to where its frame is built (-1: never).
    pub frame_complete: i32,
}

impl Blob {
    /// Whether it is compiled Java code (not a native method's wrapper).
    pub fn is_java_nmethod(&self) -> bool {
        self.name == "nmethod"
    }
}

/// An nmethod's identity and debug information.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NMethod {
    /// The `Method*` compiled (the outermost, for inlined frames).
    pub method: u64,
    /// 1–3: C1, 4: C2.
    pub comp_level: u8,
    /// Its compile ID, unique per nmethod in the JVM's life.
    pub compile_id: u32,
    /// The PcDescs (16 bytes each).
    pub pc_descs: Vec<u8>,
    /// The scope records.
    pub scopes: Vec<u8>,
    /// The metadata table (`Method*` and other metadata, 1-based in scopes).
    pub metadata: Vec<u64>,
}

impl NMethod {
    /// The methods at code offset `pc_offset`, innermost first, with their
    /// bytecode index: every method inlined there, then the compiled one.
    /// `exact` for a return address (a caller frame), not for the sampled
    /// instruction.
    pub fn frames_at(&self, pc_offset: u32, exact: bool, base: u8) -> Vec<(u64, i32)> {
        let Some(offset) = scope_for_pc(&self.pc_descs, pc_offset, exact) else {
            return Vec::new();
        };
        scope_chain(&self.scopes, offset, base)
            .into_iter()
            .filter_map(
                |Scope {
                     method_index, bci, ..
                 }| {
                    let index = usize::try_from(method_index.checked_sub(1)?).ok()?;
                    Some((*self.metadata.get(index)?, bci))
                },
            )
            .collect()
    }
}

/// A JVM's code cache, read through its memory.
pub struct CodeCache<'a> {
    memory: &'a ProcessMemory,
    layout: HotSpotLayout,
    /// The heaps.
    pub heaps: Vec<CodeHeap>,
}

impl<'a> CodeCache<'a> {
    /// The code cache of the JVM behind `memory`.
    pub fn read(memory: &'a ProcessMemory, layout: HotSpotLayout) -> Option<Self> {
        let l = &layout.code_cache;
        let pointers: Vec<u64> = match l.heaps {
            Heaps::Single { heap } => vec![memory.read_u64(heap).ok()?],
            Heaps::Array { heaps, len, data } => {
                let array = memory.read_u64(heaps).ok()?;
                let n = u64::from(memory.read_u32(array + len).ok()?).min(MAX_HEAPS);
                let data = memory.read_u64(array + data).ok()?;
                (0..n)
                    .filter_map(|i| memory.read_u64(data + 8 * i).ok())
                    .collect()
            }
        };
        let heaps = pointers
            .into_iter()
            .filter(|&h| h != 0)
            .filter_map(|h| heap(memory, l, h))
            .collect();
        Some(CodeCache {
            memory,
            layout,
            heaps,
        })
    }

    /// The blob holding `pc`.
    pub fn blob_at(&self, pc: u64) -> Option<Blob> {
        let heap = self.heaps.iter().find(|h| h.low <= pc && pc < h.high)?;
        let mut segment = (pc - heap.low) >> heap.log2_segment_size;
        for _ in 0..MAX_SEGMAP_HOPS {
            let mut byte = [0u8];
            self.memory
                .read_exact(heap.segmap + segment, &mut byte)
                .ok()?;
            match byte[0] {
                0 => return self.blob_in_block(heap.low + (segment << heap.log2_segment_size)),
                FREE_SEGMENT => return None,
                hop => segment = segment.checked_sub(u64::from(hop))?,
            }
        }
        None
    }

    /// Every blob in use, heap by heap, in address order.
    pub fn blobs(&self) -> Vec<Blob> {
        let l = &self.layout.code_cache;
        let mut out = Vec::new();
        for heap in &self.heaps {
            let mut block = heap.low;
            while block < heap.high {
                // `_length` is a size_t up to 24 and a u32 from 25: its low
                // half is the same little-endian word.
                let Ok(length) = self.memory.read_u32(block + l.block_length) else {
                    break;
                };
                if length == 0 {
                    break;
                }
                if let Some(blob) = self.blob_in_block(block) {
                    out.push(blob);
                }
                block += u64::from(length) << heap.log2_segment_size;
            }
        }
        out
    }

    /// The blob after the block header at `block`, if the block is in use.
    fn blob_in_block(&self, block: u64) -> Option<Blob> {
        let l = &self.layout;
        let mut used = [0u8];
        self.memory
            .read_exact(block + l.code_cache.block_used, &mut used)
            .ok()?;
        if used[0] == 0 {
            return None;
        }
        let address = block + l.code_cache.heap_block_size;
        let name_at = self.memory.read_u64(address + l.blob.name).ok()?;
        let name = self.c_string(name_at)?;
        let size = self.memory.read_u32(address + l.blob.size).ok()?;
        let frame_size = self.memory.read_u32(address + l.blob.frame_size).ok()? as i32;
        let code_begin = self.location(address, l.blob.code_begin)?;
        let complete_at = address + l.blob.frame_complete;
        let frame_complete = if l.blob.frame_complete_bytes == 2 {
            let mut raw = [0u8; 2];
            self.memory.read_exact(complete_at, &mut raw).ok()?;
            i32::from(i16::from_le_bytes(raw))
        } else {
            self.memory.read_u32(complete_at).ok()? as i32
        };
        Some(Blob {
            address,
            name,
            size,
            frame_size,
            code_begin,
            frame_complete,
        })
    }

    /// The nmethod `blob`'s debug information.
    pub fn nmethod(&self, blob: &Blob) -> Option<NMethod> {
        let l = &self.layout.nmethod;
        let at = blob.address;
        let m = self.memory;
        let method = m.read_u64(at + l.method).ok()?;
        let mut level = [0u8];
        m.read_exact(at + l.comp_level, &mut level).ok()?;
        let compile_id = m.read_u32(at + l.compile_id).ok()?;
        let int_at = |offset: u64| m.read_u32(at + offset).ok().map(|v| v as i32);
        let (pcs, scopes_begin, scopes_end, metadata) = match l.debug {
            DebugData::InBlob {
                scopes_data,
                pcs_begin,
                pcs_end,
                metadata,
            } => {
                let pcs = offset_from(at, int_at(pcs_begin)?)?..offset_from(at, int_at(pcs_end)?)?;
                let scopes = self.location(at, scopes_data)?;
                let metadata = offset_from(at, int_at(metadata)?)?;
                // Metadata ends where the scopes begin.
                (pcs.clone(), scopes, pcs.start, (metadata, scopes))
            }
            DebugData::Immutable {
                immutable_data,
                pcs_begin,
                scopes_data,
                immutable_data_size,
                metadata,
            } => {
                let data = m.read_u64(at + immutable_data).ok()?;
                let pcs = offset_from(data, int_at(pcs_begin)?)?
                    ..offset_from(data, int_at(scopes_data)?)?;
                let scopes = pcs.end;
                let metadata = match metadata {
                    MetadataAt::MutableData {
                        mutable_data,
                        relocation_size,
                    } => offset_from(
                        m.read_u64(at + mutable_data).ok()?,
                        int_at(relocation_size)?,
                    )?,
                    MetadataAt::DataOffset {
                        data_offset,
                        metadata_offset,
                    } => {
                        let data = offset_from(at, int_at(data_offset)?)?;
                        let mut half = [0u8; 2];
                        m.read_exact(at + metadata_offset, &mut half).ok()?;
                        data + u64::from(u16::from_le_bytes(half))
                    }
                };
                // The scopes run to the block's end (JDK 26 adds a
                // reference count after them: a few bytes more, never read).
                let end = offset_from(data, int_at(immutable_data_size)?)?;
                (pcs.clone(), scopes, end, (metadata, 0))
            }
        };
        let pc_descs = self.bytes(pcs.start, pcs.end)?;
        if pc_descs.len() % PC_DESC_BYTES != 0 {
            return None;
        }
        let scopes = self.bytes(scopes_begin, scopes_end)?;
        let (metadata_begin, metadata_end) = metadata;
        let entries = if metadata_end > metadata_begin {
            ((metadata_end - metadata_begin) / 8).min(MAX_METADATA)
        } else {
            // Unknown end (JDK 23+): as many entries as the scopes name.
            u64::from(max_method_index(
                &pc_descs,
                &scopes,
                self.layout.unsigned5_base(),
            ))
            .min(MAX_METADATA)
        };
        let metadata = (0..entries)
            .map(|i| m.read_u64(metadata_begin + 8 * i).unwrap_or(0))
            .collect();
        Some(NMethod {
            method,
            comp_level: level[0],
            compile_id,
            pc_descs,
            scopes,
            metadata,
        })
    }

    fn location(&self, blob: u64, location: Location) -> Option<u64> {
        match location {
            Location::Pointer(at) => self.memory.read_u64(blob + at).ok(),
            Location::Offset(at) => offset_from(blob, self.memory.read_u32(blob + at).ok()? as i32),
        }
    }

    fn c_string(&self, at: u64) -> Option<String> {
        let bytes = self
            .memory
            .read_vec(at, MAX_BLOB_NAME, MAX_BLOB_NAME)
            .ok()?;
        let end = bytes.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&bytes[..end]).into_owned())
    }

    fn bytes(&self, start: u64, end: u64) -> Option<Vec<u8>> {
        let len = end.checked_sub(start)?;
        self.memory.read_vec(start, len, MAX_DEBUG_BYTES).ok()
    }
}

/// The heap at `heap`, from its `VirtualSpace`s.
fn heap(memory: &ProcessMemory, l: &CodeCacheLayout, heap: u64) -> Option<CodeHeap> {
    let code = heap + l.heap_memory;
    let segmap = heap + l.heap_segmap;
    let log2 = memory.read_u32(heap + l.heap_log2_segment_size).ok()?;
    let h = CodeHeap {
        low: memory.read_u64(code + l.space_low_boundary).ok()?,
        high: memory.read_u64(code + l.space_high_boundary).ok()?,
        segmap: memory.read_u64(segmap + l.space_low).ok()?,
        log2_segment_size: log2,
    };
    (h.low < h.high && (4..=16).contains(&log2)).then_some(h)
}

fn offset_from(base: u64, offset: i32) -> Option<u64> {
    base.checked_add_signed(i64::from(offset))
}

/// The largest metadata index any scope of `pc_descs` names.
fn max_method_index(pc_descs: &[u8], scopes: &[u8], base: u8) -> u32 {
    pc_descs
        .chunks_exact(PC_DESC_BYTES)
        .filter_map(|d| Some(u32::from_le_bytes(d[4..8].try_into().ok()?)))
        .flat_map(|offset| scope_chain(scopes, offset, base))
        .map(|s| s.method_index)
        .max()
        .unwrap_or(0)
}
