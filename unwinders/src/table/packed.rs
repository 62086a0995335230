//! A table's rows stored compactly, for keeping built tables in user space:
//! about 2 bytes a row instead of 8 (1 to 2 bytes of LEB128 `pc` delta and
//! one byte indexing the file's 255 most frequent rules, or an escape byte
//! and the row's 4 rule bytes). Decoding is a single pass, so a table is
//! installed straight from this form.

use std::collections::HashMap;
use std::vec::Vec;

use super::TableError;
use super::cfi::CollectedCfi;
use crate::native::dwarf::UnwindRow;

const ESCAPE: u8 = u8::MAX;

/// The rule part of a row (everything but `pc`).
fn rule_bytes(row: &UnwindRow) -> [u8; 4] {
    let [lo, hi] = row.cfa_offset.to_le_bytes();
    [row.rules, row.rbp_offset as u8, lo, hi]
}

fn row_of(pc: u32, rule: [u8; 4]) -> UnwindRow {
    UnwindRow {
        pc,
        rules: rule[0],
        rbp_offset: rule[1] as i8,
        cfa_offset: u16::from_le_bytes([rule[2], rule[3]]),
    }
}

/// Rows sorted by `pc`, compactly encoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackedRows {
    len: usize,
    rules: Vec<[u8; 4]>,
    bytes: Vec<u8>,
}

impl PackedRows {
    /// Packs sorted rows.
    pub fn from_rows(rows: &[UnwindRow]) -> Self {
        let mut packer = Packer::new(rows);
        for row in rows {
            packer.push(*row);
        }
        packer.finish()
    }

    /// Assembles collected CFI straight into packed rows: the table is never
    /// held at 8 bytes a row.
    pub fn assemble(collected: CollectedCfi) -> Result<(Self, super::TableStats), TableError> {
        let mut packer = Packer::new(collected.collected_rows());
        packer.bytes.reserve(collected.max_rows().saturating_mul(2));
        let stats = collected.assemble(|row| packer.push(row))?;
        Ok((packer.finish(), stats))
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes held.
    pub fn heap_size(&self) -> usize {
        self.bytes.capacity() + self.rules.capacity() * 4
    }

    /// The rows, in order.
    pub fn iter(&self) -> impl Iterator<Item = UnwindRow> + '_ {
        let mut at = 0usize;
        let mut pc = 0u32;
        let bytes = &self.bytes;
        (0..self.len).map_while(move |_| {
            let mut delta = 0u32;
            let mut shift = 0;
            loop {
                let byte = *bytes.get(at)?;
                at += 1;
                delta |= u32::from(byte & 0x7f).checked_shl(shift)?;
                shift += 7;
                if byte & 0x80 == 0 {
                    break;
                }
            }
            pc = pc.wrapping_add(delta);
            let index = *bytes.get(at)?;
            at += 1;
            let rule = if index == ESCAPE {
                let rule: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
                at += 4;
                rule
            } else {
                *self.rules.get(usize::from(index))?
            };
            Some(row_of(pc, rule))
        })
    }

    /// The rows, unpacked.
    pub fn to_vec(&self) -> Vec<UnwindRow> {
        self.iter().collect()
    }
}

struct Packer {
    index: HashMap<[u8; 4], u8>,
    rules: Vec<[u8; 4]>,
    bytes: Vec<u8>,
    len: usize,
    pc: u32,
}

impl Packer {
    /// A packer whose dictionary holds the 255 most frequent rules of `rows`.
    fn new(rows: &[UnwindRow]) -> Self {
        let mut counts: HashMap<[u8; 4], usize> = HashMap::new();
        for row in rows {
            *counts.entry(rule_bytes(row)).or_default() += 1;
        }
        let mut by_count: Vec<([u8; 4], usize)> = counts.into_iter().collect();
        by_count.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        by_count.truncate(usize::from(ESCAPE));
        let rules: Vec<[u8; 4]> = by_count.into_iter().map(|(rule, _)| rule).collect();
        let index = rules
            .iter()
            .enumerate()
            .map(|(i, rule)| (*rule, i as u8))
            .collect();
        Packer {
            index,
            rules,
            bytes: Vec::new(),
            len: 0,
            pc: 0,
        }
    }

    fn push(&mut self, row: UnwindRow) {
        let mut delta = row.pc.wrapping_sub(self.pc);
        self.pc = row.pc;
        loop {
            let byte = (delta & 0x7f) as u8;
            delta >>= 7;
            if delta == 0 {
                self.bytes.push(byte);
                break;
            }
            self.bytes.push(byte | 0x80);
        }
        let rule = rule_bytes(&row);
        match self.index.get(&rule) {
            Some(&i) => self.bytes.push(i),
            None => {
                self.bytes.push(ESCAPE);
                self.bytes.extend_from_slice(&rule);
            }
        }
        self.len += 1;
    }

    fn finish(mut self) -> PackedRows {
        self.bytes.shrink_to_fit();
        self.rules.shrink_to_fit();
        PackedRows {
            len: self.len,
            rules: self.rules,
            bytes: self.bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::dwarf::{CfaRule, RbpRule};

    #[test]
    fn round_trips() {
        let mut rows = Vec::new();
        let mut pc = 0x1000u32;
        for i in 0..5000u32 {
            pc += 1 + (i * 7919) % 40000;
            let cfa = if i % 3 == 0 {
                CfaRule::Rbp
            } else {
                CfaRule::Rsp
            };
            rows.push(UnwindRow::new(
                pc,
                cfa,
                (i % 700) as u16,
                RbpRule::CfaOffset,
                -2,
            ));
        }
        let packed = PackedRows::from_rows(&rows);
        assert_eq!(packed.len(), rows.len());
        assert_eq!(packed.to_vec(), rows);
        assert!(packed.heap_size() < rows.len() * 8);
        assert_eq!(PackedRows::from_rows(&[]).to_vec(), Vec::new());
    }
}
