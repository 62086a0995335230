//! Reading CRuby objects from another process: Strings, the iseq's label
//! and path, and the line of a frame's `pc` from the iseq's line table.
//! Every read is bounded and every pointer is checked for its type first:
//! the process may be mutating (or freeing) what is read.

use super::layouts::{
    ARRAY_EMBED_LEN_MASK, ARRAY_EMBED_LEN_SHIFT, ARRAY_EMBEDDED, ARRAY_HEAP_LEN, ARRAY_HEAP_PTR,
    RubyLayout, STRING_HEAP_PTR, STRING_LEN, flags,
};
use crate::runtimes::memory::ProcessMemory;

/// Longest String read (labels and paths are short).
const MAX_STRING_BYTES: u64 = 4096;
/// Largest line table believed (CRuby's own sanity bound is far above any
/// real method's).
const MAX_INSNS_INFO: u32 = 1 << 20;
/// Positions the succinct table's immediate part covers.
const IMMEDIATE_POSITIONS: u64 = 54;
/// The succinct table's blocks: their start, size and positions.
const SUCC_BLOCKS_AT: u64 = 48;
const SUCC_BLOCK_BYTES: u64 = 80;
const SUCC_BLOCK_POSITIONS: u64 = 512;
/// `sizeof(iseq_insn_info_entry)`.
const INSN_INFO_ENTRY: u64 = 12;

/// Where a Ruby frame is: its iseq's label and path, and its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IseqLocation {
    /// `location.label` (`leaf`, `block in leaf`, `<main>`).
    pub label: String,
    /// The file (`location.pathobj`'s path).
    pub path: String,
    /// The line of the frame's `pc`, or the iseq's first line; 0 if unknown.
    pub line: u32,
}

/// What one iseq says of itself, whatever its frame's `pc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IseqInfo {
    /// Its `rb_iseq_constant_body`.
    pub body: u64,
    /// `location.label`.
    pub label: String,
    /// The file.
    pub path: String,
    /// `location.first_lineno`.
    pub first_line: u32,
    /// The method iseq a block belongs to (the iseq itself for a method).
    pub local_iseq: u64,
}

/// `ruby_global_symbols`: IDs per chunk of its `ids` Array, and the
/// (String, Symbol) pair per ID in a chunk.
const IDS_PER_CHUNK: u64 = 512;
const ID_ENTRY_WORDS: u64 = 2;
/// `ruby_global_symbols.ids`.
const GLOBAL_SYMBOLS_IDS: u64 = 16;
/// An ID's serial is the ID shifted by this (above the operators).
const ID_SCOPE_SHIFT: u32 = 4;

/// Reads objects of one process laid out as `layout` says.
pub struct Objects<'a> {
    pub(super) memory: &'a ProcessMemory,
    pub(super) layout: RubyLayout,
    /// `ruby_global_symbols` in the process, where found.
    global_symbols: Option<u64>,
}

impl<'a> Objects<'a> {
    /// Objects of the process behind `memory`.
    pub fn new(memory: &'a ProcessMemory, layout: RubyLayout) -> Self {
        Objects {
            memory,
            layout,
            global_symbols: None,
        }
    }

    /// Also names IDs, from `ruby_global_symbols` at `address`.
    pub fn with_symbols(self, address: Option<u64>) -> Self {
        Objects {
            global_symbols: address,
            ..self
        }
    }

    pub(super) fn word(&self, address: u64) -> Option<u64> {
        self.memory.read_u64(address).ok()
    }

    /// The flags of the object `value`, if it is one (not a special constant).
    pub(super) fn flags_of(&self, value: u64) -> Option<u64> {
        if value < 0x1000 || value & 7 != 0 {
            return None;
        }
        self.word(value)
    }

    /// Element `index` of the Array `value`.
    pub fn array_entry(&self, value: u64, index: u64) -> Option<u64> {
        let flags = self.flags_of(value)?;
        if flags & flags::TYPE_MASK != flags::T_ARRAY {
            return None;
        }
        let (elements, len) = if flags & flags::ARRAY_EMBED != 0 {
            (
                value.wrapping_add(ARRAY_EMBEDDED),
                (flags >> ARRAY_EMBED_LEN_SHIFT) & ARRAY_EMBED_LEN_MASK,
            )
        } else {
            (
                self.word(value.wrapping_add(ARRAY_HEAP_PTR))?,
                self.word(value.wrapping_add(ARRAY_HEAP_LEN))?,
            )
        };
        (index < len).then_some(())?;
        self.word(elements.checked_add(index.checked_mul(8)?)?)
    }

    /// The name of the ID `id` (a method's, an instance variable's), from
    /// the process's symbol table, as `rb_id2str` finds it.
    pub fn id_name(&self, id: u64) -> Option<String> {
        let table = self.global_symbols?;
        let serial = if id > self.layout.last_op_id {
            id >> ID_SCOPE_SHIFT
        } else {
            id
        };
        let last = u64::from(self.memory.read_u32(table).ok()?);
        if serial == 0 || serial > last {
            return None;
        }
        let ids = self.word(table.wrapping_add(GLOBAL_SYMBOLS_IDS))?;
        let chunk = self.array_entry(ids, serial / IDS_PER_CHUNK)?;
        let string = self.array_entry(chunk, (serial % IDS_PER_CHUNK) * ID_ENTRY_WORDS)?;
        self.string(string)
    }

    /// The String `value` as text (invalid UTF-8 replaced).
    pub fn string(&self, value: u64) -> Option<String> {
        let flags = self.flags_of(value)?;
        if flags & flags::TYPE_MASK != flags::T_STRING {
            return None;
        }
        let (bytes_at, len) = if flags & flags::STRING_NOEMBED != 0 {
            (
                self.word(value.wrapping_add(STRING_HEAP_PTR))?,
                self.word(value.wrapping_add(STRING_LEN))?,
            )
        } else if self.layout.string_embedded_len_in_flags {
            (
                value.wrapping_add(self.layout.string_embedded_bytes),
                (flags & flags::STRING_EMBED_LEN_MASK_3_1) >> flags::STRING_EMBED_LEN_SHIFT_3_1,
            )
        } else {
            (
                value.wrapping_add(self.layout.string_embedded_bytes),
                self.word(value.wrapping_add(STRING_LEN))?,
            )
        };
        let bytes = self
            .memory
            .read_vec(bytes_at, len.min(MAX_STRING_BYTES), MAX_STRING_BYTES)
            .ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A `pathobj`: a String, or an Array `[path, realpath]`.
    fn path(&self, pathobj: u64) -> Option<String> {
        let flags = self.flags_of(pathobj)?;
        match flags & flags::TYPE_MASK {
            flags::T_STRING => self.string(pathobj),
            flags::T_ARRAY => self.string(self.array_entry(pathobj, 0)?),
            _ => None,
        }
    }

    /// The label, path and line of a frame running `iseq` at `pc`.
    pub fn location(&self, iseq: u64, pc: u64) -> Option<IseqLocation> {
        let info = self.iseq(iseq)?;
        let line = self.line(info.body, pc).unwrap_or(info.first_line);
        Some(IseqLocation {
            label: info.label,
            path: info.path,
            line,
        })
    }

    /// What `iseq` says of itself.
    pub fn iseq(&self, iseq: u64) -> Option<IseqInfo> {
        let l = &self.layout;
        // An iseq is an imemo (`imemo_iseq`); anything else at the address
        // is not read as one.
        let flags = self.flags_of(iseq)?;
        if flags & flags::TYPE_MASK != flags::T_IMEMO {
            return None;
        }
        let body = self.word(iseq.wrapping_add(l.iseq_body))?;
        if body == 0 {
            return None;
        }
        let label = self.string(self.word(body.wrapping_add(l.body_label))?)?;
        let path = self.path(self.word(body.wrapping_add(l.body_pathobj))?)?;
        let first_line = self
            .word(body.wrapping_add(l.body_first_lineno))
            .map_or(0, |v| {
                if l.first_lineno_is_value {
                    (v >> 1) as u32
                } else {
                    v as u32
                }
            });
        let local_iseq = self.word(body.wrapping_add(l.body_local_iseq)).unwrap_or(0);
        Some(IseqInfo {
            body,
            label,
            path,
            first_line,
            local_iseq,
        })
    }

    /// The line of `pc` from the body's line table, as CRuby's `calc_pos`
    /// computes it (the succinct index; release builds free `positions`).
    pub fn line(&self, body: u64, pc: u64) -> Option<u32> {
        let l = &self.layout;
        let encoded = self.word(body.wrapping_add(l.body_iseq_encoded))?;
        let words = u64::from(
            self.memory
                .read_u32(body.wrapping_add(l.body_iseq_size))
                .ok()?,
        );
        let n = pc.checked_sub(encoded)? / 8;
        if n > words {
            // A stale pc (a JIT's top frame): not this iseq's.
            return None;
        }
        // The pc points after the instruction running.
        let pos = n.saturating_sub(1);
        let size = self
            .memory
            .read_u32(body.wrapping_add(l.body_insns_info_size))
            .ok()?;
        let entries = self.word(body.wrapping_add(l.body_insns_info))?;
        let index = match size {
            0 => return None,
            1 => 1,
            2..=MAX_INSNS_INFO => {
                self.succ_index(self.word(body.wrapping_add(l.body_succ_index_table))?, pos)?
            }
            _ => return None,
        };
        if index == 0 || index > u64::from(size) {
            return None;
        }
        let line = self
            .memory
            .read_u32(entries.wrapping_add((index - 1) * INSN_INFO_ENTRY))
            .ok()?;
        Some(line)
    }

    /// The number of set bits up to `pos` (inclusive) of the succinct
    /// bit vector at `table`: the 1-based line-table entry of `pos`.
    fn succ_index(&self, table: u64, pos: u64) -> Option<u64> {
        if pos < IMMEDIATE_POSITIONS {
            let word = self.word(table.wrapping_add((pos / 9) * 8))?;
            return Some((word >> ((pos % 9) * 7)) & 0x7f);
        }
        let pos = pos - IMMEDIATE_POSITIONS;
        let block =
            table.wrapping_add(SUCC_BLOCKS_AT + (pos / SUCC_BLOCK_POSITIONS) * SUCC_BLOCK_BYTES);
        let in_block = pos % SUCC_BLOCK_POSITIONS;
        let small = in_block / 64;
        let rank = u64::from(self.memory.read_u32(block).ok()?);
        let small_ranks = self.word(block.wrapping_add(8))?;
        let bits = self.word(block.wrapping_add(16 + small * 8))?;
        let small_rank = if small == 0 {
            0
        } else {
            (small_ranks >> ((small - 1) * 9)) & 0x1ff
        };
        let below = u64::from((bits << (63 - in_block % 64)).count_ones());
        Some(rank + small_rank + below)
    }
}
