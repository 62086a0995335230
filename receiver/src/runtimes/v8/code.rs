//! Compiled frames: from a JSFunction to the Code object it runs (its code
//! field, or the JS dispatch table in V8 13), and from a PC in that code to
//! source positions: through the bytecode-offset table of Sparkplug code,
//! or the source-position table of Maglev and TurboFan code, as V8's
//! `BaselineFrame::GetBytecodeOffset` and `Code::SourcePosition` do.

use super::names::{V8Objects, is_smi, smi_value, untag};
use super::positions::{SourcePosition, vlq_unsigned};

/// Largest table (positions, bytecodes) read from a process, in bytes.
pub const MAX_TABLE_BYTES: u64 = 4 << 20;
/// `Code::flags`: the kind in the low four bits (code-kind.h, V8 10-13).
const CODE_KIND_MASK: u64 = 0xf;
/// Inlined functions read of one code object, at most.
const MAX_INLINED: u64 = 4096;
/// Bytes of one `InliningPosition` (a packed position, an int, padding).
const INLINING_POSITION_BYTES: usize = 16;

/// The functions an optimized Code inlined (its DeoptimizationData).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inlining {
    /// The inlined functions' SharedFunctionInfos (tagged).
    pub functions: Vec<u64>,
    /// Per inlining id: the call site in its parent (a packed position
    /// whose own inlining id is the parent's) and the inlined function's
    /// index in [`Self::functions`] (-1: the outermost function again).
    pub positions: Vec<(u64, i32)>,
}

impl Inlining {
    /// The functions at `position` of code compiled for `outer`, innermost
    /// first, each with its script offset (as `SourcePosition::InliningStack`
    /// unwinds it). A broken chain ends where it breaks.
    pub fn stack(&self, outer: u64, position: SourcePosition) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = position;
        // Each step goes to a parent; more steps than ids is a cycle.
        for _ in 0..=self.positions.len() {
            let Some(id) = at.inlining_id else {
                out.push((outer, at.script_offset));
                break;
            };
            let Some(&(call, function)) = self.positions.get(id) else {
                break;
            };
            let shared = match usize::try_from(function) {
                Ok(index) => match self.functions.get(index) {
                    Some(&shared) => shared,
                    None => break,
                },
                Err(_) => outer,
            };
            out.push((shared, at.script_offset));
            match SourcePosition::unpack(call) {
                Some(parent) => at = parent,
                None => break,
            }
        }
        out
    }
}

/// Instructions start this aligned, at least (`kCodeAlignment`: 32 or 64).
const CODE_ALIGNMENT: u64 = 32;
/// How far back from a PC its code's start is looked for.
const MAX_CODE_SCAN: u64 = 1 << 20;
const PAGE: u64 = 4096;
/// The prefix bytecodes (bytecodes.h): `Wide`, `ExtraWide`,
/// `DebugBreakWide`, `DebugBreakExtraWide`.
const PREFIX_SCALES: [usize; 4] = [1, 2, 1, 2];

/// What tier compiled a Code object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeTier {
    /// Sparkplug: positions through the bytecode offset.
    Baseline,
    /// Maglev or TurboFan: positions (and inlined functions) in its own table.
    Optimized,
    /// Anything else (a builtin, a stub): no positions.
    Other,
}

/// A Code object's instructions and tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeRange {
    /// The tagged Code object.
    pub code: u64,
    /// First instruction.
    pub start: u64,
    /// One past the last.
    pub end: u64,
    /// Its tier.
    pub tier: CodeTier,
}

impl CodeRange {
    /// Whether `pc` is in the instructions.
    pub fn contains(&self, pc: u64) -> bool {
        self.start <= pc && pc < self.end
    }
}

impl V8Objects<'_> {
    /// The Code the tagged JSFunction `function` runs now. `dispatch_table`
    /// is the JS dispatch table's address where V8 has one (V8 13).
    pub fn code_of(&self, function: u64, dispatch_table: Option<u64>) -> Option<u64> {
        let l = self.layout;
        let code = match (l.js_function_code, l.code.dispatch, dispatch_table) {
            (Some(at), _, _) => self.field(function, at)?,
            (None, Some((handle_at, _)), Some(table)) => {
                // js-dispatch-table.h: 16-byte entries, handle >> 8 indexes
                // them; the entry's second word is the code pointer << 16
                // and the parameter count.
                let handle = self.field(function, handle_at)? & 0xffff_ffff;
                let entry = table.checked_add((handle >> 8).checked_mul(16)?)?;
                (self.word(entry.checked_add(8)?)? >> 16) | 1
            }
            _ => return None,
        };
        (self.instance_type(code)? == l.code_type).then_some(code)
    }

    /// The Code whose instructions hold `pc`, wherever V8 keeps its Code
    /// (a function's on-stack-replacement code, code a function has left):
    /// instructions start aligned, right after the header of the object
    /// that holds them (`layout.code.header_object`), so each aligned
    /// address below `pc` whose header would hold a map of that type is a
    /// candidate, and the first whose Code starts there and covers `pc`
    /// is it. Reads a page at a time, at most [`MAX_CODE_SCAN`] bytes.
    pub fn code_containing(&self, pc: u64) -> Option<CodeRange> {
        let (header_type, header) = self.layout.code.header_object;
        let mut page = pc & !(PAGE - 1);
        let mut bytes = vec![0u8; PAGE as usize];
        let mut maps_seen: Vec<(u64, bool)> = Vec::new();
        while pc - page < MAX_CODE_SCAN {
            self.memory.read_exact(page, &mut bytes).ok()?;
            let word_at = |address: u64| -> Option<u64> {
                let at = usize::try_from(address.checked_sub(page)?).ok()?;
                Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
            };
            let mut start = pc & !(CODE_ALIGNMENT - 1);
            while start >= page + header {
                let object = start - header;
                if let Some(map) = word_at(object).filter(|&m| m & 3 == 1) {
                    let is_header = match maps_seen.iter().find(|(m, _)| *m == map) {
                        Some(&(_, known)) => known,
                        None => {
                            let known = self.instance_type(object + 1) == Some(header_type);
                            maps_seen.push((map, known));
                            known
                        }
                    };
                    if is_header {
                        let code = if header_type == self.layout.code_type {
                            Some(object + 1)
                        } else {
                            word_at(object + 8)
                        };
                        if let Some(range) = code.and_then(|c| self.code_range(c))
                            && range.start == start
                            && range.contains(pc)
                        {
                            return Some(range);
                        }
                    }
                }
                start -= CODE_ALIGNMENT;
            }
            page = page.checked_sub(PAGE)?;
        }
        None
    }

    /// The instructions and tier of the tagged Code object `code`.
    pub fn code_range(&self, code: u64) -> Option<CodeRange> {
        let l = self.layout;
        let start = if l.code_instructions_inline {
            untag(code)?.checked_add(l.code_instruction_start)?
        } else {
            self.field(code, l.code_instruction_start)?
        };
        let size = self.field(code, l.code.instruction_size)? & 0xffff_ffff;
        let kind = (self.field(code, l.code_flags)? & CODE_KIND_MASK) as i64;
        let baseline = l.code_kind_baseline;
        // code-kind.h: MAGLEV and TURBOFAN follow BASELINE.
        let tier = if kind == baseline {
            CodeTier::Baseline
        } else if kind == baseline + 1 || kind == baseline + 2 {
            CodeTier::Optimized
        } else {
            CodeTier::Other
        };
        Some(CodeRange {
            code,
            start,
            end: start.checked_add(size)?,
            tier,
        })
    }

    /// The bytes of the tagged ByteArray `array` (a Smi length at 8, the
    /// bytes from 16); `None` for anything else, or a longer one.
    pub fn byte_array(&self, array: u64) -> Option<Vec<u8>> {
        if is_smi(array) {
            return None;
        }
        let length = u64::try_from(smi_value(self.field(array, 8)?)?).ok()?;
        if length > MAX_TABLE_BYTES {
            return None;
        }
        self.memory
            .read_vec(untag(array)? + 16, length, MAX_TABLE_BYTES)
            .ok()
    }

    /// The position table of the tagged Code `code`: source positions of
    /// optimized code, bytecode offsets of baseline code.
    pub fn code_positions(&self, code: u64) -> Option<Vec<u8>> {
        self.byte_array(self.field(code, self.layout.code.position_table)?)
    }

    /// The inlined functions of the tagged optimized Code `code`.
    pub fn inlining(&self, code: u64) -> Option<Inlining> {
        let deopt = self.field(code, self.layout.code.deoptimization_data)?;
        let length = u64::try_from(smi_value(self.field(deopt, 8)?)?).ok()?;
        let [count_at, literals_at, positions_at] = self.layout.code.deopt_indices;
        if length <= count_at.max(literals_at).max(positions_at) {
            // No deoptimization exits: nothing recorded.
            return Some(Inlining::default());
        }
        let element = |index: u64| self.field(deopt, 16 + 8 * index);
        let count = u64::try_from(smi_value(element(count_at)?)?).ok()?;
        let literals = element(literals_at)?;
        let stored = u64::try_from(smi_value(self.field(literals, 8)?)?).ok()?;
        if count > stored || count > MAX_INLINED {
            return None;
        }
        let words = self
            .memory
            .read_vec(untag(literals)? + 16, count * 8, MAX_INLINED * 8)
            .ok()?;
        // Inlined functions are strong references; mask a weak tag anyway.
        let functions = words
            .chunks_exact(8)
            .filter_map(|c| c.try_into().ok().map(u64::from_le_bytes))
            .map(|w| (w & !3) | 1)
            .collect();
        let positions = self
            .byte_array(element(positions_at)?)?
            .chunks_exact(INLINING_POSITION_BYTES)
            .filter_map(|c| {
                let position = u64::from_le_bytes(c.get(0..8)?.try_into().ok()?);
                let function = i32::from_le_bytes(c.get(8..12)?.try_into().ok()?);
                Some((position, function))
            })
            .collect();
        Some(Inlining {
            functions,
            positions,
        })
    }

    /// The bytecodes of the tagged BytecodeArray `bytecode`.
    pub fn bytecodes(&self, bytecode: u64) -> Option<Vec<u8>> {
        let length = u64::try_from(smi_value(self.field(bytecode, 8)?)?).ok()?;
        if length > MAX_TABLE_BYTES {
            return None;
        }
        let data = u64::try_from(self.layout.bytecode_offset_bias + 1).ok()?;
        self.memory
            .read_vec(untag(bytecode)? + data, length, MAX_TABLE_BYTES)
            .ok()
    }
}

/// The bytecode offset at `pc_offset` in Sparkplug code, as V8's
/// `BytecodeOffsetIterator::AdvanceToPCOffset` finds it: the table holds
/// the prologue's end, then one PC delta per bytecode, in bytecode order
/// (`bytecodes`, whose lengths `sizes` gives: V8's `kBytecodeSizes`, one
/// row per operand scale). -1 is the function's entry (its prologue).
pub fn baseline_bytecode_offset(
    table: &[u8],
    bytecodes: &[u8],
    sizes: &[u8],
    pc_offset: u64,
) -> Option<i64> {
    let count = sizes.len() / 3;
    if count == 0 {
        return None;
    }
    let mut at = 0;
    let mut pc_end = vlq_unsigned(table, &mut at)?;
    let mut current = -1i64;
    let mut next = 0usize;
    while pc_end < pc_offset {
        if at >= table.len() || next >= bytecodes.len() {
            break;
        }
        pc_end = pc_end.checked_add(vlq_unsigned(table, &mut at)?)?;
        current = i64::try_from(next).ok()?;
        next = next.checked_add(bytecode_size(bytecodes, next, sizes, count)?)?;
    }
    Some(current)
}

/// The length of the bytecode at `at`, its prefix and operands included.
fn bytecode_size(bytecodes: &[u8], at: usize, sizes: &[u8], count: usize) -> Option<usize> {
    let first = usize::from(*bytecodes.get(at)?);
    let size = match PREFIX_SCALES.get(first) {
        Some(&scale) => {
            let bytecode = usize::from(*bytecodes.get(at + 1)?);
            1 + usize::from(*sizes.get(scale * count + bytecode)?)
        }
        None => usize::from(*sizes.get(first)?),
    };
    (size != 0).then_some(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packed as V8 packs positions: offset + 1 from bit 1, id + 1 from 31.
    fn packed(script_offset: u64, inlining_id: Option<u64>) -> u64 {
        ((script_offset + 1) << 1) | (inlining_id.map_or(0, |i| i + 1) << 31)
    }

    #[test]
    fn inlined_functions_unwind_innermost_first() {
        const OUTER: u64 = 0x1001;
        // outer → mid (id 0, called at 100) → inner (id 1, called in mid
        // at 40); a recursive copy of outer (id 2, function -1) in inner.
        let inlining = Inlining {
            functions: vec![0x2001, 0x3001],
            positions: vec![
                (packed(100, None), 0),
                (packed(40, Some(0)), 1),
                (packed(7, Some(1)), -1),
            ],
        };
        let at = |offset, id| SourcePosition {
            script_offset: offset,
            inlining_id: id,
        };
        assert_eq!(inlining.stack(OUTER, at(5, None)), [(OUTER, 5)]);
        assert_eq!(
            inlining.stack(OUTER, at(12, Some(1))),
            [(0x3001, 12), (0x2001, 40), (OUTER, 100)]
        );
        assert_eq!(
            inlining.stack(OUTER, at(3, Some(2))),
            [(OUTER, 3), (0x3001, 7), (0x2001, 40), (OUTER, 100)]
        );
        // An id past the table, or a cycle, ends the chain.
        assert_eq!(inlining.stack(OUTER, at(3, Some(9))), []);
        let cyclic = Inlining {
            functions: vec![0x2001],
            positions: vec![(packed(1, Some(0)), 0)],
        };
        assert_eq!(cyclic.stack(OUTER, at(3, Some(0))).len(), 2);
    }

    #[test]
    fn baseline_pcs_map_to_the_bytecode_they_belong_to() {
        // Three bytecodes: a 1-byte one (id 5), a 3-byte one (id 6), and
        // a Wide-prefixed id 6 (1 + 5 bytes at scale 2).
        let count = 8;
        let mut sizes = vec![0u8; 3 * count];
        sizes[5] = 1;
        sizes[6] = 3;
        sizes[count + 6] = 5;
        let bytecodes = [5, 6, 0, 0, 0 /* Wide */, 6, 0, 0, 0, 0];
        // Prologue ends at 10; the bytecodes' code ends at 14, 20, 200.
        let table = [10, 4, 6, 0x80 | 52, 1];
        let at = |pc| baseline_bytecode_offset(&table, &bytecodes, &sizes, pc);
        assert_eq!(at(0), Some(-1));
        assert_eq!(at(10), Some(-1));
        assert_eq!(at(11), Some(0));
        assert_eq!(at(14), Some(0));
        assert_eq!(at(15), Some(1));
        assert_eq!(at(20), Some(1));
        assert_eq!(at(21), Some(4));
        assert_eq!(at(500), Some(4));
        // A bytecode of unknown size ends the walk rather than looping.
        let unknown = [7, 7, 7];
        assert_eq!(
            baseline_bytecode_offset(&table, &unknown, &sizes, 100),
            None
        );
    }
}
