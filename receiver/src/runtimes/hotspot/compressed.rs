//! HotSpot's compressed debug information, decoded: UNSIGNED5 integers
//! (the JIT's scope records, the line-number tables), a method's line
//! table, an nmethod's scope records (which method, at which bytecode, for
//! every level of inlining) and the PcDesc that describes a code address.
//! Pure functions over bytes already read from the process.

/// UNSIGNED5 bytes below this end a number (`L`); the byte offset `X` is
/// subtracted first (0 before JDK 20, 1 from JDK 20).
const L: u32 = 192;
/// Each continuation byte carries 6 bits (`lg_H`).
const LG_H: u32 = 6;
/// An UNSIGNED5 number has at most 5 bytes.
const MAX_BYTES: usize = 5;

/// Reads UNSIGNED5 numbers from a byte slice.
#[derive(Debug, Clone)]
pub struct Unsigned5<'a> {
    bytes: &'a [u8],
    /// The next byte to read.
    pub position: usize,
    /// `X`: 0 up to JDK 19, 1 from JDK 20.
    base: u8,
}

impl<'a> Unsigned5<'a> {
    /// A reader of `bytes` from `position`, for a JDK whose UNSIGNED5 byte
    /// offset is `base`.
    pub fn new(bytes: &'a [u8], position: usize, base: u8) -> Self {
        Unsigned5 {
            bytes,
            position,
            base,
        }
    }

    /// The next raw byte.
    pub fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.position)?;
        self.position += 1;
        Some(b)
    }

    /// The next unsigned number.
    pub fn unsigned(&mut self) -> Option<u32> {
        let mut value: u32 = 0;
        for i in 0..MAX_BYTES {
            let b = u32::from(self.byte()?.checked_sub(self.base)?);
            value = value.checked_add(b.checked_shl(LG_H * i as u32)?)?;
            // `L - X` and above continue (the threshold moves with `X`).
            if b < L - u32::from(self.base) || i == MAX_BYTES - 1 {
                return Some(value);
            }
        }
        None
    }

    /// The next signed number (zigzag: 0, -1, 1, -2, …).
    pub fn signed(&mut self) -> Option<i32> {
        let u = self.unsigned()?;
        Some(((u >> 1) as i32) ^ -((u & 1) as i32))
    }
}

/// A method's (bytecode index, line) pairs from its compressed line-number
/// table (`CompressedLineNumberReadStream`), in table order.
pub fn line_table(bytes: &[u8], base: u8) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut stream = Unsigned5::new(bytes, 0, base);
    let (mut bci, mut line) = (0i64, 0i64);
    while let Some(b) = stream.byte() {
        match b {
            0 => break,
            0xff => {
                let (Some(db), Some(dl)) = (stream.signed(), stream.signed()) else {
                    break;
                };
                bci += i64::from(db);
                line += i64::from(dl);
            }
            _ => {
                bci += i64::from(b >> 3);
                line += i64::from(b & 7);
            }
        }
        let (Ok(b), Ok(l)) = (u32::try_from(bci), u32::try_from(line)) else {
            break;
        };
        out.push((b, l));
    }
    out
}

/// The line of bytecode `bci`: the entry with the largest bci not above it
/// (entries are not sorted); 0 when none.
pub fn line_of(table: &[(u32, u32)], bci: u32) -> u32 {
    table
        .iter()
        .filter(|(b, _)| *b <= bci)
        .max_by_key(|(b, _)| *b)
        .map_or(0, |(_, line)| *line)
}

/// One inlining level of a compiled frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope {
    /// The caller's record (0 at the outermost method).
    pub sender: u32,
    /// The method, as a 1-based index into the nmethod's metadata (0: none).
    pub method_index: u32,
    /// The bytecode index (-1 at an inlined callee's entry).
    pub bci: i32,
}

/// The scope record at `offset` in an nmethod's scope data.
pub fn scope_at(scopes: &[u8], offset: u32, base: u8) -> Option<Scope> {
    let mut stream = Unsigned5::new(scopes, usize::try_from(offset).ok()?, base);
    let sender = stream.unsigned()?;
    let method_index = stream.unsigned()?;
    // Stored plus one (`InvocationEntryBci` is -1).
    let bci = i64::from(stream.unsigned()?) - 1;
    Some(Scope {
        sender,
        method_index,
        bci: i32::try_from(bci).ok()?,
    })
}

/// Levels of inlining followed at most.
pub const MAX_INLINING: usize = 64;

/// The scopes of the record at `offset`, innermost first.
pub fn scope_chain(scopes: &[u8], offset: u32, base: u8) -> Vec<Scope> {
    let mut out = Vec::new();
    let mut at = offset;
    while at != 0 && out.len() < MAX_INLINING {
        let Some(scope) = scope_at(scopes, at, base) else {
            break;
        };
        out.push(scope);
        // Records are written callers first: a sender lies before its callee.
        if scope.sender >= at {
            break;
        }
        at = scope.sender;
    }
    out
}

/// A `PcDesc`: 16 bytes, `pc_offset` (from the code's start) and
/// `scope_decode_offset` first.
pub const PC_DESC_BYTES: usize = 16;

/// The scope offset describing code offset `target`: for a return address
/// (`exact`), the PcDesc at that offset; for the sampled instruction, the
/// first PcDesc after it (as `AsyncGetCallTrace` looks up `pc + 1`).
pub fn scope_for_pc(pc_descs: &[u8], target: u32, exact: bool) -> Option<u32> {
    let target = i64::from(target);
    pc_descs.chunks_exact(PC_DESC_BYTES).find_map(|desc| {
        let pc_offset = i64::from(i32::from_le_bytes(desc[0..4].try_into().ok()?));
        let scope = u32::from_le_bytes(desc[4..8].try_into().ok()?);
        let hit = if exact {
            pc_offset == target
        } else {
            pc_offset > target
        };
        (hit && scope != 0).then_some(scope)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned5_before_and_from_jdk_20() {
        for (bytes, base, value) in [
            (&[0x00][..], 0, 0),
            (&[0x05], 0, 5),
            (&[0xec, 0x01], 0, 300),
            (&[0x01], 1, 0),
            (&[0x06], 1, 5),
            (&[0xed, 0x02], 1, 300),
        ] {
            assert_eq!(
                Unsigned5::new(bytes, 0, base).unsigned(),
                Some(value),
                "{bytes:x?} base {base}"
            );
        }
        // Byte 0 is never written from JDK 20 on; a cut number is none.
        assert_eq!(Unsigned5::new(&[0x00], 0, 1).unsigned(), None);
        assert_eq!(Unsigned5::new(&[0xec], 0, 0).unsigned(), None);
        let mut s = Unsigned5::new(&[0x01, 0x14, 0x02], 0, 0);
        assert_eq!(
            (s.signed(), s.signed(), s.signed()),
            (Some(-1), Some(10), Some(1))
        );
    }

    #[test]
    fn line_tables_decode_both_encodings() {
        // (bci, line) = (0,10), (4,11), (9,13), (300,12).
        let expected = vec![(0, 10), (4, 11), (9, 13), (300, 12)];
        let old = [0xff, 0x00, 0x14, 0x21, 0x2a, 0xff, 0xc6, 0x06, 0x01, 0x00];
        let new = [0xff, 0x01, 0x15, 0x21, 0x2a, 0xff, 0xc7, 0x07, 0x02, 0x00];
        assert_eq!(line_table(&old, 0), expected);
        assert_eq!(line_table(&new, 1), expected);
        assert_eq!(line_of(&expected, 0), 10);
        assert_eq!(line_of(&expected, 8), 11);
        assert_eq!(line_of(&expected, 299), 13);
        assert_eq!(line_of(&expected, 5000), 12);
        assert_eq!(line_of(&[], 3), 0);
        // A table cut short keeps what it has.
        assert_eq!(line_table(&old[..4], 0), vec![(0, 10), (4, 11)]);
    }

    #[test]
    fn scope_chains_go_outwards_and_stop_on_bad_links() {
        // JDK 17 bytes: offset 7 is the root (`String.hashCode` at 27),
        // offset 28 inlined into it (`StringLatin1.hashCode` at 37).
        let mut data = vec![0xff; 40];
        data[7..10].copy_from_slice(&[0x00, 0x01, 0x1c]);
        data[28..32].copy_from_slice(&[0x07, 0x02, 0x26, 0x0d]);
        let chain = scope_chain(&data, 28, 0);
        assert_eq!(
            chain,
            vec![
                Scope {
                    sender: 7,
                    method_index: 2,
                    bci: 37
                },
                Scope {
                    sender: 0,
                    method_index: 1,
                    bci: 27
                }
            ]
        );
        // JDK 25 bytes (base 1): sender 7, method 2, bci 5.
        assert_eq!(
            scope_at(&[0x08, 0x03, 0x07, 0x0e], 0, 1),
            Some(Scope {
                sender: 7,
                method_index: 2,
                bci: 5
            })
        );
        // A sender after its callee would loop: the chain stops.
        data[28] = 0x1e;
        assert_eq!(scope_chain(&data, 28, 0).len(), 1);
        assert!(scope_chain(&data, 0, 0).is_empty());
    }

    #[test]
    fn pc_descs_match_return_addresses_exactly_and_samples_after() {
        let desc = |pc: i32, scope: u32| {
            let mut d = [0u8; PC_DESC_BYTES];
            d[..4].copy_from_slice(&pc.to_le_bytes());
            d[4..8].copy_from_slice(&scope.to_le_bytes());
            d
        };
        let table: Vec<u8> = [desc(-1, 0), desc(0x20, 5), desc(0x48, 9), desc(0x90, 0)].concat();
        assert_eq!(scope_for_pc(&table, 0x48, true), Some(9));
        assert_eq!(scope_for_pc(&table, 0x47, true), None);
        assert_eq!(scope_for_pc(&table, 0x10, false), Some(5));
        assert_eq!(scope_for_pc(&table, 0x20, false), Some(9));
        // The end sentinel has no scope.
        assert_eq!(scope_for_pc(&table, 0x50, false), None);
    }
}
