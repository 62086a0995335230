//! Go's `.gopclntab` (Go 1.16 to 1.20+ layouts, either byte order):
//! `GoTable::parse`, then `GoTable::frames` at PCs around the table's text
//! start and its first functions, which walks the function table, the
//! pc-value tables (files, lines) and the name tables.
//!
//! The input is the section's bytes. The text address given to `parse`
//! (used when the header's is 0, as in PIE binaries) is 0x1000.
//! `GoTable::load`, which also reads the inline trees through the ELF
//! file's `moduledata`, needs a whole Go ELF file and is not reached here.

use icecore_receiver::symbolize::gopclntab::GoTable;

const TEXT: u64 = 0x1000;

/// The header's text start (Go 1.18+: the third pointer-sized word), as
/// the parser reads it, to look up PCs where the functions are.
fn header_text_start(data: &[u8]) -> Option<u64> {
    let magic = data.get(..4)?;
    let big = magic[..] == [0xff, 0xff, 0xff, 0xf0] || magic[..] == [0xff, 0xff, 0xff, 0xf1];
    let ptr = usize::from(*data.get(7)?);
    let at = 8 + 2 * ptr;
    let word = data.get(at..at + ptr)?;
    let mut value = 0u64;
    for i in 0..ptr.min(8) {
        let byte = if big { word[i] } else { word[ptr - 1 - i] };
        value = value << 8 | u64::from(byte);
    }
    Some(value)
}

/// Runs one input through the entry points above; panics are the bugs
/// looked for (errors are expected answers to bad input).
pub fn run(data: &[u8]) {
    let Ok(table) = GoTable::parse(data.to_vec(), TEXT) else {
        return;
    };
    let _ = table.heap_size();
    let _ = table.has_inline_trees();
    let start = header_text_start(data).filter(|&t| t != 0).unwrap_or(TEXT);
    for base in [start, TEXT] {
        for pc in crate::probe_addresses(base) {
            for frame in table.frames(pc) {
                let _ = (frame.name.len(), frame.file, frame.line);
            }
        }
    }
}
