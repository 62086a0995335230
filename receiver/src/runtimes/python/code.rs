//! Reading CPython code objects from the target process: names, file and
//! line table, and turning a frame's raw instruction position into a line.

use std::sync::Arc;

use super::{
    layouts::{InstrEncoding, PythonLayout},
    line_table::line_for_offset,
};
use crate::runtimes::memory::{MemoryError, ProcessMemory};

/// Characters of a name or file name read at most.
const MAX_STRING_CHARS: u64 = 4096;
/// Bytes of a line table read at most.
const MAX_LINE_TABLE_BYTES: u64 = 1 << 20;

/// Why a code object could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    /// The target's memory could not be read.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The object's type is not `PyCode_Type`: BPF read a stale or torn frame.
    #[error("object at {0:#x} is not a code object")]
    NotCode(u64),
    /// A string is not a compact unicode object.
    #[error("string at {0:#x} has an unexpected representation")]
    BadString(u64),
}

/// What symbolization needs of one code object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeInfo {
    /// `co_qualname` (3.11+) or `co_name`.
    pub name: Arc<str>,
    /// `co_filename`.
    pub filename: Arc<str>,
    /// `co_firstlineno`.
    pub first_line: u32,
    /// `co_lnotab` or `co_linetable`.
    pub line_table: Box<[u8]>,
}

/// Reads the code object at `address`; `code_type` is `PyCode_Type`'s
/// address in the process, when known, to reject anything else.
pub fn read_code(
    memory: &ProcessMemory,
    layout: &PythonLayout,
    address: u64,
    code_type: Option<u64>,
) -> Result<CodeInfo, CodeError> {
    const OB_TYPE: u16 = 8;
    let name_at = layout.code_qualname.unwrap_or(layout.code_name);
    // One read of the object's head holds every field (each read of
    // /proc/PID/mem is a system call, about 2 µs).
    let end = [
        OB_TYPE,
        name_at,
        layout.code_filename,
        layout.code_linetable,
        layout.code_firstlineno,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let head = memory.read_vec(address, u64::from(end) + 8, 4096)?;
    let word = |offset: u16| {
        let at = usize::from(offset);
        head.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    if let Some(expected) = code_type
        && word(OB_TYPE) != expected
    {
        return Err(CodeError::NotCode(address));
    }
    let name = word(name_at);
    let filename = word(layout.code_filename);
    let table = word(layout.code_linetable);
    let first_line = word(layout.code_firstlineno) as u32;
    Ok(CodeInfo {
        name: read_string(memory, layout, name)?.into(),
        filename: read_string(memory, layout, filename)?.into(),
        first_line,
        line_table: read_bytes(memory, layout, table)?.into_boxed_slice(),
    })
}

/// A `str` object's text (compact ASCII, Latin-1, UCS-2 or UCS-4).
pub fn read_string(
    memory: &ProcessMemory,
    layout: &PythonLayout,
    address: u64,
) -> Result<String, CodeError> {
    let head = memory.read_vec(address, u64::from(layout.unicode_state) + 4, 4096)?;
    let at = |offset: u16, len: usize| {
        let at = usize::from(offset);
        head.get(at..at + len).map_or(0, |b| {
            b.iter()
                .rev()
                .fold(0u64, |acc, &byte| (acc << 8) | u64::from(byte))
        })
    };
    let length = at(layout.unicode_length, 8);
    let state = at(layout.unicode_state, 4) as u32;
    let kind = (state >> layout.unicode_kind_shift) & 0b111;
    let compact = state >> layout.unicode_compact_bit & 1 == 1;
    let ascii = state >> layout.unicode_ascii_bit & 1 == 1;
    if !compact {
        return Err(CodeError::BadString(address));
    }
    let chars = length.min(MAX_STRING_CHARS);
    let data = address.wrapping_add(u64::from(if ascii {
        layout.unicode_ascii_data
    } else {
        layout.unicode_compact_data
    }));
    let width = u64::from(kind);
    if !matches!(kind, 1 | 2 | 4) {
        return Err(CodeError::BadString(address));
    }
    let bytes = memory.read_vec(data, chars * width, MAX_STRING_CHARS * 4)?;
    let text = match kind {
        1 => bytes.iter().map(|&b| char::from(b)).collect(),
        2 => char::decode_utf16(
            bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]])),
        )
        .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
    };
    Ok(text)
}

/// A `bytes` object's content.
pub fn read_bytes(
    memory: &ProcessMemory,
    layout: &PythonLayout,
    address: u64,
) -> Result<Vec<u8>, CodeError> {
    let size = memory.read_u64(address.wrapping_add(u64::from(layout.bytes_size)))?;
    Ok(memory.read_vec(
        address.wrapping_add(u64::from(layout.bytes_data)),
        size,
        MAX_LINE_TABLE_BYTES,
    )?)
}

/// The byte offset into the bytecode of a frame's raw instruction position
/// (as BPF reported it) in the code object at `code`.
pub fn bytecode_offset(layout: &PythonLayout, code: u64, instr: u64) -> Option<u32> {
    match layout.instr {
        // f_lasti is -1 before the first instruction.
        InstrEncoding::LastiBytes => u32::try_from(instr as u32 as i32).ok(),
        InstrEncoding::LastiCodeUnits => u32::try_from(instr as u32 as i32).ok()?.checked_mul(2),
        InstrEncoding::PrevInstrPointer | InstrEncoding::InstrPointer => {
            let start = code + u64::from(layout.code_code_adaptive?);
            // prev_instr sits one unit before the start until the first instruction.
            let offset = instr.saturating_sub(start);
            u32::try_from(offset).ok()
        }
    }
}

/// The source line of a frame at `instr` in `code`; 0 when unknown.
pub fn line_of(layout: &PythonLayout, info: &CodeInfo, code: u64, instr: u64) -> u32 {
    bytecode_offset(layout, code, instr)
        .and_then(|offset| {
            line_for_offset(layout.line_table, &info.line_table, info.first_line, offset)
        })
        .unwrap_or(0)
}
