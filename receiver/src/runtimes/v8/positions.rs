//! From a function and a bytecode offset to a script and a line, as V8's
//! `BytecodeArray::SourcePosition` and `Script::GetPositionInfo` do: the
//! bytecode's source-position table (zig-zag VLQ deltas) gives a character
//! offset in the script, and the script's line ends (V8's, or computed
//! here from its source when V8 has not computed them) give the line.

use super::names::{V8Objects, smi_value, untag};

/// Longest script source read to compute its line ends, in characters.
pub const MAX_SOURCE_CHARS: u64 = 16 << 20;
/// Most line ends read from a script's own table.
const MAX_LINES: u64 = 4 << 20;

/// A function's script: its name (a path or URL, "" for eval code) and
/// where each of its lines ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptLines {
    /// `Script::name`.
    pub name: String,
    /// The character offset of each line's terminator (the last is the
    /// source's length).
    pub line_ends: Vec<u64>,
}

impl ScriptLines {
    /// The 1-based line of character offset `position`.
    pub fn line_of(&self, position: u64) -> Option<u32> {
        if self.line_ends.last().is_none_or(|&last| position > last) {
            return None;
        }
        let line = self.line_ends.partition_point(|&end| end < position);
        u32::try_from(line + 1).ok()
    }

    /// The 1-based line and column of character offset `position` (columns
    /// count UTF-16 units, as V8's positions do).
    pub fn line_and_column(&self, position: u64) -> Option<(u32, u32)> {
        let line = self.line_of(position)?;
        let start = match line {
            1 => 0,
            _ => self.line_ends.get(line as usize - 2)? + 1,
        };
        let column = u32::try_from(position.checked_sub(start)? + 1).ok()?;
        Some((line, column))
    }
}

impl V8Objects<'_> {
    /// The BytecodeArray of the tagged SharedFunctionInfo `shared`: its
    /// function data, directly or through baseline code or InterpreterData.
    pub fn bytecode_of(&self, shared: u64) -> Option<u64> {
        self.bytecode_in(self.field(shared, self.layout.sfi_function_data)?)
    }

    /// The BytecodeArray `data` is or leads to (through baseline code or
    /// InterpreterData).
    pub fn bytecode_in(&self, data: u64) -> Option<u64> {
        let l = self.layout;
        let mut data = data;
        for _ in 0..2 {
            let kind = self.instance_type(data)?;
            if kind == l.bytecode_array_type {
                return Some(data);
            }
            data = if kind == l.code_type {
                self.field(data, l.source.code_bytecode)?
            } else if kind == l.source.interpreter_data_type {
                self.field(data, l.source.interpreter_data_bytecode)?
            } else {
                return None;
            };
        }
        None
    }

    /// The script character offset of `bytecode_offset` in the tagged
    /// BytecodeArray `bytecode`: the last table entry at or before it.
    pub fn source_position(&self, bytecode: u64, bytecode_offset: u64) -> Option<u64> {
        position_in_table(&self.bytecode_position_table(bytecode)?, bytecode_offset)
    }

    /// The source-position table of the tagged BytecodeArray `bytecode`
    /// (`None` while V8 has not collected it: a Smi).
    pub fn bytecode_position_table(&self, bytecode: u64) -> Option<Vec<u8>> {
        self.byte_array(self.field(bytecode, self.layout.source.bytecode_positions)?)
    }

    /// The script of the tagged SharedFunctionInfo `shared`.
    pub fn script_of(&self, shared: u64) -> Option<u64> {
        let l = self.layout;
        let script = self.field(shared, l.sfi_script)?;
        let kind = self.instance_type(script)?;
        if kind == l.script_type {
            return Some(script);
        }
        let at = l.source.debug_info_script?;
        if kind != l.source.debug_info_type {
            return None;
        }
        let script = self.field(script, at)?;
        (self.instance_type(script)? == l.script_type).then_some(script)
    }

    /// The tagged Script `script`'s name and line ends.
    pub fn script_lines(&self, script: u64) -> Option<ScriptLines> {
        let l = &self.layout.source;
        let name_word = self.field(script, l.script_name)?;
        let name = if self
            .instance_type(name_word)
            .is_some_and(|t| t < self.layout.first_nonstring_type)
        {
            self.string(name_word)?
        } else {
            String::new()
        };
        let ends = self.field(script, l.script_line_ends)?;
        let line_ends = if self.instance_type(ends) == Some(l.fixed_array_type) {
            self.fixed_smis(ends)?
        } else {
            // Not computed yet: computed from the source, as V8 would.
            let source = self.field(script, l.script_source)?;
            let mut text = String::new();
            self.append_string(source, 0, MAX_SOURCE_CHARS, &mut text, 0)?;
            line_ends_of(&text)
        };
        Some(ScriptLines { name, line_ends })
    }

    /// The Smis of a FixedArray.
    fn fixed_smis(&self, array: u64) -> Option<Vec<u64>> {
        let length = u64::try_from(smi_value(self.field(array, 8)?)?).ok()?;
        if length > MAX_LINES {
            return None;
        }
        let bytes = self
            .memory
            .read_vec(untag(array)? + 16, length * 8, MAX_LINES * 8)
            .ok()?;
        bytes
            .chunks_exact(8)
            .map(|c| {
                let word = u64::from_le_bytes(c.try_into().ok()?);
                u64::try_from(smi_value(word)?).ok()
            })
            .collect()
    }
}

/// V8's `String::CalculateLineEnds`: the offset (in UTF-16 units, as
/// positions count) of each LF, lone CR, U+2028 and U+2029, then the
/// source's length.
pub fn line_ends_of(source: &str) -> Vec<u64> {
    let mut ends = Vec::new();
    let mut offset = 0u64;
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        let ends_line = match c {
            '\n' | '\u{2028}' | '\u{2029}' => true,
            '\r' => chars.peek() != Some(&'\n'),
            _ => false,
        };
        if ends_line {
            ends.push(offset);
        }
        offset += c.len_utf16() as u64;
    }
    ends.push(offset);
    ends
}

/// A source position: a script offset, and the inlined function it is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourcePosition {
    /// Character offset in the function's script.
    pub script_offset: u64,
    /// Index into the code's inlining positions; `None` in the outermost
    /// function.
    pub inlining_id: Option<usize>,
}

impl SourcePosition {
    /// Decodes V8's packed position (source-position.h: bit 0 external,
    /// bits 1-30 the script offset + 1, bits 31-46 the inlining id + 1).
    pub fn unpack(raw: u64) -> Option<SourcePosition> {
        let script_offset = ((raw >> 1) & 0x3fff_ffff).checked_sub(1)?;
        let inlining = (raw >> 31) & 0xffff;
        Some(SourcePosition {
            script_offset,
            inlining_id: inlining
                .checked_sub(1)
                .and_then(|i| usize::try_from(i).ok()),
        })
    }
}

/// The script offset at `code_offset` in a source-position table.
pub fn position_in_table(table: &[u8], code_offset: u64) -> Option<u64> {
    entry_at(table, code_offset).map(|p| p.script_offset)
}

/// The position of the last entry at or before `code_offset` in a
/// source-position table, as `Code::SourcePosition` and
/// `BytecodeArray::SourcePosition` find it: each entry is a zig-zag VLQ
/// code delta (negative: not a statement) and a zig-zag VLQ delta of the
/// packed position; both start from the function's entry (code offset -1,
/// position 0).
pub fn entry_at(table: &[u8], code_offset: u64) -> Option<SourcePosition> {
    let mut at = 0;
    let (mut code, mut raw) = (-1i64, 0i64);
    let mut found = None;
    while at < table.len() {
        let code_delta = vlq(table, &mut at)?;
        let code_delta = if code_delta >= 0 {
            code_delta
        } else {
            -(code_delta + 1)
        };
        let source_delta = vlq(table, &mut at)?;
        code = code.checked_add(code_delta)?;
        raw = raw.checked_add(source_delta)?;
        if code > i64::try_from(code_offset).ok()? {
            break;
        }
        found = Some(raw);
    }
    SourcePosition::unpack(u64::try_from(found?).ok()?)
}

/// One zig-zag VLQ integer: an unsigned one whose bit 0 is the sign.
fn vlq(bytes: &[u8], at: &mut usize) -> Option<i64> {
    let value = vlq_unsigned(bytes, at)?;
    Some(((value >> 1) as i64) ^ -((value & 1) as i64))
}

/// One unsigned VLQ (`base::VLQDecodeUnsigned`: 7 bits per byte, low
/// first, bit 7 set while more follow).
pub(super) fn vlq_unsigned(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zigzag(v: i64) -> Vec<u8> {
        let mut u = ((v << 1) ^ (v >> 63)) as u64;
        let mut out = Vec::new();
        loop {
            let byte = (u & 0x7f) as u8;
            u >>= 7;
            if u == 0 {
                out.push(byte);
                return out;
            }
            out.push(byte | 0x80);
        }
    }

    #[test]
    fn positions_come_from_the_last_entry_at_or_before_the_offset() {
        // (code 0, script 31), (code 5, 40, not a statement), (code 12,
        // 95); code offsets count from the entry, -1.
        let mut table = Vec::new();
        for (code_delta, position_delta) in [(1i64, 32i64 << 1), (-6, 9 << 1), (7, 55 << 1)] {
            table.extend(zigzag(code_delta));
            table.extend(zigzag(position_delta));
        }
        assert_eq!(position_in_table(&table, 0), Some(31));
        assert_eq!(position_in_table(&table, 4), Some(31));
        assert_eq!(position_in_table(&table, 5), Some(40));
        assert_eq!(position_in_table(&table, 30), Some(95));
        assert_eq!(position_in_table(&[0x80], 0), None);
        // Inlined: script offset 7 in inlined function 2 (id + 1 = 3).
        let raw = (3i64 << 31) | (8 << 1);
        let mut inlined = zigzag(1);
        inlined.extend(zigzag(raw));
        assert_eq!(
            entry_at(&inlined, 0),
            Some(SourcePosition {
                script_offset: 7,
                inlining_id: Some(2)
            })
        );
    }

    #[test]
    fn line_ends_follow_v8() {
        let ends = line_ends_of("a\nbc\r\nd\re\u{2028}f");
        assert_eq!(ends, [1, 5, 7, 9, 11]);
        let lines = ScriptLines {
            name: String::new(),
            line_ends: ends,
        };
        assert_eq!(lines.line_of(0), Some(1));
        assert_eq!(lines.line_of(1), Some(1));
        assert_eq!(lines.line_of(2), Some(2));
        assert_eq!(lines.line_of(11), Some(5));
        assert_eq!(lines.line_of(12), None);
        // "a\n" "bc\r\n" "d\r" "e\u{2028}" "f": columns from 1.
        assert_eq!(lines.line_and_column(0), Some((1, 1)));
        assert_eq!(lines.line_and_column(2), Some((2, 1)));
        assert_eq!(lines.line_and_column(3), Some((2, 2)));
        assert_eq!(lines.line_and_column(6), Some((3, 1)));
        assert_eq!(lines.line_and_column(10), Some((5, 1)));
    }
}
