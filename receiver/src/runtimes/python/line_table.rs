//! CPython line tables: from a bytecode offset to a source line.
//!
//! Three on-disk formats cover CPython 3.8–3.15 (see CPython's `Objects/lnotab_notes.txt` and
//! `Objects/codeobject.c` of each version):
//!
//! - ≤ 3.9 `co_lnotab`: pairs `(addr_incr: u8, line_incr: i8)`; the line of an instruction is
//!   `co_firstlineno` plus every `line_incr` whose accumulated address is ≤ the instruction's
//!   (`PyCode_Addr2Line`).
//! - 3.10 `co_linetable` (PEP 626): pairs `(length: u8, line_delta: i8)` describing contiguous
//!   `[start, end)` byte ranges; `line_delta == -128` means "no line" and leaves the running line
//!   untouched; empty ranges only carry line deltas (`PyLineTable_NextAddressRange`).
//! - 3.11+ `co_linetable` (PEP 657): entries starting with a byte with bit 7 set, covering
//!   `(b & 7) + 1` code units, whose kind `(b >> 3) & 15` gives the line delta (`advance`,
//!   `advance_with_locations`).
//!
//! Decoding is pure and bounds-checked: malformed or truncated tables give `None` (never a
//! panic), and each lookup is one forward pass that stops at the range holding the offset.

/// Line-table format of a code object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineTableFormat {
    /// ≤ 3.9 `co_lnotab`.
    Lnotab,
    /// 3.10 `co_linetable` (PEP 626).
    Pep626,
    /// 3.11+ `co_linetable` location table (PEP 657).
    Locations,
}

/// The source line of the instruction at `byte_offset` in the bytecode (offset in bytes from the
/// start of the code; for 3.11+ this counts inline CACHE entries too, as `co_code_adaptive` does),
/// given the code object's `co_firstlineno` and line-table bytes. None when the instruction has
/// no line (e.g. artificial instructions) or the table is malformed/truncated. Never panics and
/// never loops forever on hostile input; runs in O(table length).
pub fn line_for_offset(
    format: LineTableFormat,
    table: &[u8],
    first_line: u32,
    byte_offset: u32,
) -> Option<u32> {
    let first = i64::from(first_line);
    let offset = u64::from(byte_offset);
    let line = match format {
        LineTableFormat::Lnotab => lnotab_line(table, first, offset),
        LineTableFormat::Pep626 => pep626_line(table, first, offset),
        LineTableFormat::Locations => locations_line(table, first, offset),
    }?;
    u32::try_from(line).ok()
}

/// `co_lnotab` (3.8/3.9), as `PyCode_Addr2Line`: the lnotab has no end, so offsets past the last
/// entry keep the last line. An odd length is malformed.
fn lnotab_line(table: &[u8], mut line: i64, offset: u64) -> Option<i64> {
    let (pairs, rest) = table.as_chunks::<2>();
    if !rest.is_empty() {
        return None;
    }
    let mut addr = 0u64;
    for &[addr_incr, line_incr] in pairs {
        addr += u64::from(addr_incr);
        if addr > offset {
            break;
        }
        line += i64::from(i8::from_ne_bytes([line_incr]));
    }
    Some(line)
}

/// 3.10 `co_linetable`, as `_PyCode_CheckLineNumber`: None past the table's last range.
fn pep626_line(table: &[u8], mut line: i64, offset: u64) -> Option<i64> {
    let (pairs, rest) = table.as_chunks::<2>();
    if !rest.is_empty() {
        return None;
    }
    let mut end = 0u64;
    for &[length, line_delta] in pairs {
        end += u64::from(length);
        let delta = i8::from_ne_bytes([line_delta]);
        let this = if delta == -128 {
            None
        } else {
            line += i64::from(delta);
            Some(line)
        };
        // Ranges are contiguous from 0, so the first one ending after `offset` holds it; empty
        // ranges never do.
        if offset < end {
            return this;
        }
    }
    None
}

/// Location-entry kinds (`_PyCodeLocationInfoKind`); 0–9 are the short forms.
const ONE_LINE0: u8 = 10;
const ONE_LINE2: u8 = 12;
const NO_COLUMNS: u8 = 13;
const LONG: u8 = 14;
const NONE: u8 = 15;

/// 3.11+ location table. Each entry is parsed exactly (its payload runs to the next byte with
/// bit 7 set); an entry up to and including the one holding `offset` that does not parse makes
/// the table malformed. None past the table's last entry.
fn locations_line(table: &[u8], mut line: i64, offset: u64) -> Option<i64> {
    let mut rest = table;
    let mut end = 0u64;
    while let Some((&head, tail)) = rest.split_first() {
        if head & 0x80 == 0 {
            return None;
        }
        let payload_len = tail
            .iter()
            .position(|b| b & 0x80 != 0)
            .unwrap_or(tail.len());
        let (mut payload, next) = tail.split_at_checked(payload_len)?;
        rest = next;
        let kind = (head >> 3) & 15;
        let has_line = match kind {
            NONE => false,
            LONG => {
                line = line.checked_add(signed_varint(&mut payload)?)?;
                // End line delta, column + 1, end column + 1.
                for _ in 0..3 {
                    varint(&mut payload)?;
                }
                true
            }
            NO_COLUMNS => {
                line = line.checked_add(signed_varint(&mut payload)?)?;
                true
            }
            ONE_LINE0..=ONE_LINE2 => {
                line += i64::from(kind - ONE_LINE0);
                // Column and end column, one byte each.
                payload = payload.get(2..)?;
                true
            }
            // Short forms: one byte of column bits.
            _ => {
                payload = payload.get(1..)?;
                true
            }
        };
        if !payload.is_empty() {
            return None;
        }
        end += (u64::from(head & 7) + 1) * 2;
        if offset < end {
            return has_line.then_some(line);
        }
    }
    None
}

/// CPython's `read_varint`: little-endian 6-bit chunks, bit 6 = "more follows". At most six
/// chunks (36 bits) are accepted, enough for any `int` CPython writes.
fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..36).step_by(6) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(b & 63) << shift;
        if b & 64 == 0 {
            return Some(value);
        }
    }
    None
}

/// CPython's `read_signed_varint`: the low bit of the varint is the sign.
fn signed_varint(bytes: &mut &[u8]) -> Option<i64> {
    let raw = varint(bytes)?;
    let magnitude = i64::try_from(raw >> 1).ok()?;
    Some(if raw & 1 != 0 { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::LineTableFormat::{Lnotab, Locations, Pep626};
    use super::*;

    /// `(byte_offset, expected line)` checks against one table.
    fn check(format: LineTableFormat, table: &[u8], first: u32, cases: &[(u32, Option<u32>)]) {
        for &(offset, want) in cases {
            let got = line_for_offset(format, table, first, offset);
            assert_eq!(got, want, "{format:?} offset {offset} table {table:02x?}");
        }
    }

    #[test]
    fn lnotab_known_table() {
        // +6 bytes/+1 line, +8/-1 (signed), an address overflow split as (255, 0)+(5, 2), and a
        // line overflow split as (4, 127)+(0, 73), as CPython's compiler emits them.
        let table = [6, 1, 8, 0xff, 255, 0, 5, 2, 4, 127, 0, 73];
        let cases = [(0, Some(10)), (4, Some(10)), (6, Some(11)), (12, Some(11))];
        check(Lnotab, &table, 10, &cases);
        let cases = [
            (14, Some(10)),
            (268, Some(10)),
            (274, Some(12)),
            (276, Some(12)),
        ];
        check(Lnotab, &table, 10, &cases);
        check(
            Lnotab,
            &table,
            10,
            &[(278, Some(212)), (u32::MAX, Some(212))],
        );
        // Empty table: every offset is on the first line.
        check(Lnotab, &[], 7, &[(0, Some(7)), (1000, Some(7))]);
        // Odd length is malformed; lines below zero have no u32 value.
        check(Lnotab, &table[..3], 10, &[(0, None)]);
        check(Lnotab, &[2, 0x80], 100, &[(0, Some(100)), (2, None)]);
    }

    #[test]
    fn pep626_known_table() {
        // [0,6) +1, [6,8) no line, [8,8) +127 (empty), [8,262) +3, [262,270) -128 again, [270,272) -2.
        let table = [6, 1, 2, 0x80, 0, 127, 254, 3, 8, 0x80, 2, 0xfe];
        let cases = [
            (0, Some(11)),
            (5, Some(11)),
            (6, None),
            (7, None),
            (8, Some(141)),
        ];
        check(Pep626, &table, 10, &cases);
        let cases = [
            (261, Some(141)),
            (262, None),
            (270, Some(139)),
            (271, Some(139)),
        ];
        check(Pep626, &table, 10, &cases);
        // Past the end, empty tables, odd lengths and negative lines.
        check(Pep626, &table, 10, &[(272, None), (u32::MAX, None)]);
        check(Pep626, &[], 10, &[(0, None)]);
        check(Pep626, &table[..5], 10, &[(0, None)]);
        check(Pep626, &[2, 0x81], 100, &[(0, None)]);
    }

    /// A 3.11+ entry head byte: kind and length in code units.
    fn head(kind: u8, units: u8) -> u8 {
        0x80 | kind << 3 | (units - 1)
    }

    #[test]
    fn locations_known_table() {
        #[rustfmt::skip]
        let table = [
            head(0, 2), 0x12,                   // short form: [0,4) line 5
            head(11, 1), 3, 9,                  // one-line +1: [4,6) line 6
            head(NONE, 3),                      // [6,12) no line
            head(NO_COLUMNS, 1), 0x05,          // -2: [12,14) line 4
            head(LONG, 2), 0x58, 0x09, 0, 5, 7, // +300, end line +0, cols: [14,18) line 304
            head(12, 8), 0, 1,                  // one-line +2: [18,34) line 306
        ];
        let cases = [
            (0, Some(5)),
            (3, Some(5)),
            (4, Some(6)),
            (6, None),
            (11, None),
        ];
        check(Locations, &table, 5, &cases);
        let cases = [
            (12, Some(4)),
            (14, Some(304)),
            (17, Some(304)),
            (18, Some(306)),
        ];
        check(Locations, &table, 5, &cases);
        check(
            Locations,
            &table,
            5,
            &[(33, Some(306)), (34, None), (u32::MAX, None)],
        );
        check(Locations, &[], 5, &[(0, None)]);
        // Truncated inside the long entry: earlier entries still decode, later ones do not.
        let truncated = &table[..table.len() - 4];
        check(
            Locations,
            truncated,
            5,
            &[(12, Some(4)), (14, None), (18, None)],
        );
        // Not starting on an entry head; payloads of the wrong size; varints that never end or
        // run past their entry; a negative line.
        check(Locations, &[0x12, head(0, 1), 0], 5, &[(0, None)]);
        check(Locations, &[head(0, 1)], 5, &[(0, None)]);
        check(Locations, &[head(0, 1), 1, 2], 5, &[(0, None)]);
        check(
            Locations,
            &[head(NONE, 1), head(0, 1), 0],
            5,
            &[(2, Some(5))],
        );
        check(
            Locations,
            &[head(NONE, 1), 1, head(0, 1), 0],
            5,
            &[(2, None)],
        );
        check(Locations, &[head(10, 1), 1], 5, &[(0, None)]);
        let mut endless = vec![head(LONG, 1)];
        endless.extend([0x7f; 64]);
        check(Locations, &endless, 5, &[(0, None)]);
        check(Locations, &[head(NO_COLUMNS, 1), 0x40], 5, &[(0, None)]);
        check(Locations, &[head(NO_COLUMNS, 1), 0x0d], 5, &[(0, None)]);
    }

    #[test]
    fn hostile_input_terminates() {
        let mb = 1 << 20;
        let mut endless_varint = vec![head(LONG, 1)];
        endless_varint.resize(mb, 0x7f);
        let tables = [
            vec![0xff; mb],
            vec![0; mb],
            vec![0x7f; mb],
            vec![0x80; mb],
            endless_varint,
        ];
        let offsets = [0, 1, 2, 1000, 1 << 20, u32::MAX - 1, u32::MAX];
        for table in &tables {
            for format in [Lnotab, Pep626, Locations] {
                for offset in offsets {
                    let _ = line_for_offset(format, table, u32::MAX, offset);
                    let _ = line_for_offset(format, table, 0, offset);
                }
            }
        }
        // All-0xff: each pair lowers the line (→ None soon), each entry has no line.
        assert_eq!(line_for_offset(Lnotab, &tables[0], 10, 255 * 20), None);
        assert_eq!(line_for_offset(Locations, &tables[0], 10, 12345), None);
        // Pseudo-random tables hit every entry kind and malformed shape.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..64 {
            let table: Vec<u8> = (0..4096)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state.to_le_bytes()[0]
                })
                .collect();
            for format in [Lnotab, Pep626, Locations] {
                for offset in (0..40_000).step_by(97) {
                    let _ = line_for_offset(format, &table, 100, offset);
                }
            }
        }
    }

    /// Compiles a few functions (loops, multi-line expressions, try/except/finally, `with`,
    /// comprehensions, a lambda, async, a class, a 320-line loop body, a 150-term single line and
    /// 300-line gaps so both deltas overflow a byte) and prints, per code object, `V major minor`
    /// once, then `C firstlineno table-hex` and `P offset:line ...` (`-` = no line) as CPython's
    /// own `dis.findlinestarts` / `co_lines` / `co_positions` see them.
    const DUMP_SCRIPT: &str = r#"
import sys, dis
SRC = '''
def loops(n):
    total = 0
    for i in range(n):
        if i % 3 == 0:
            total += (i *
                      2 +
                      1)
        elif i % 5:
            continue
        else:
            while total > 100:
                total -= 7
    return total

def handler(x):
    try:
        y = 1 / x
    except ZeroDivisionError as e:
        y = None
    except (TypeError,
            ValueError):
        raise
    else:
        y += 1
    finally:
        x = 0
    with open(x) as f, open(y) as g:
        pass
    return y

def comps(xs):
    a = [x * 2 for x in xs if x]
    b = {x: [y for y in range(x)]
         for x in xs}
    c = (x for x in xs)
    f = lambda q, r=3: (q +
                        r)
    async def inner():
        async with f as z:
            await z
    class K:
        attr = 1
        def m(self):
            return self.attr
    return a, b, c, f, inner, K
'''
big = ["def big(a):", "    s = 0", "    for i in range(3):"]
big += ["        s += a[%d] * %d" % (i % 7, i) for i in range(320)]
big += ["    if a:", "        s = " + " + ".join("a[%d]" % i for i in range(150))]
big += [""] * 300 + ["    return (s +"] + [""] * 300 + ["            1)"]
co = compile(SRC + "\n".join(big) + "\n", "<icecore>", "exec")
v = sys.version_info[:2]
print("V", v[0], v[1])
def emit(co):
    if v <= (3, 9):
        starts = list(dis.findlinestarts(co))
        tab, pairs = co.co_lnotab, []
        for off in range(0, len(co.co_code), 2):
            pairs.append((off, [l for s, l in starts if s <= off][-1]))
    elif v == (3, 10):
        tab = co.co_linetable
        pairs = [(o, l) for s, e, l in co.co_lines() for o in range(s, e, 2)]
    else:
        tab = co.co_linetable
        pairs = [(2 * i, p[0]) for i, p in enumerate(co.co_positions())]
    print("C", co.co_firstlineno, tab.hex() or "-")
    print("P", " ".join("%d:%s" % (o, "-" if l is None else l) for o, l in pairs))
    for c in co.co_consts:
        if isinstance(c, type(co)):
            emit(c)
emit(co)
"#;

    fn pyenv_root() -> Option<std::path::PathBuf> {
        if let Some(root) = std::env::var_os("PYENV_ROOT") {
            return Some(root.into());
        }
        let home = std::path::PathBuf::from(std::env::var_os("HOME")?).join(".pyenv");
        if home.is_dir() {
            return Some(home);
        }
        let out = std::process::Command::new("pyenv")
            .arg("root")
            .output()
            .ok()?;
        let root = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !root.trim().is_empty()).then(|| root.trim().into())
    }

    fn hex(text: &str) -> Vec<u8> {
        let digits = if text == "-" { "" } else { text };
        let pair = |i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap();
        (0..digits.len()).step_by(2).map(pair).collect()
    }

    /// Runs the dump script with the interpreter `python` (a program and its
    /// first arguments, e.g. `chroot ROOT /usr/bin/python3.14`) and checks
    /// every offset; returns how many.
    fn check_interpreter(python: &[std::path::PathBuf]) -> usize {
        let shown = python
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ");
        let out = std::process::Command::new(&python[0])
            .args(&python[1..])
            .args(["-c", DUMP_SCRIPT])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {stderr}", shown);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let mut lines = stdout.lines();
        let version = lines.next().unwrap();
        let format = match version {
            "V 3 8" | "V 3 9" => Lnotab,
            "V 3 10" => Pep626,
            _ => Locations,
        };
        let (mut checked, mut code_objects) = (0, 0);
        while let Some(code) = lines.next() {
            let fields: Vec<&str> = code.split(' ').collect();
            let ["C", first, table] = fields[..] else {
                panic!("bad line {code:?}")
            };
            let (first, table) = (first.parse().unwrap(), hex(table));
            let positions = lines.next().unwrap().strip_prefix("P").unwrap();
            let mut end = 0;
            for pair in positions.split_whitespace() {
                let (offset, line) = pair.split_once(':').unwrap();
                let offset: u32 = offset.parse().unwrap();
                let want = (line != "-").then(|| line.parse().unwrap());
                let got = line_for_offset(format, &table, first, offset);
                assert_eq!(
                    got, want,
                    "offset {offset}, {version}, first {first}, {table:02x?}"
                );
                (checked, end) = (checked + 1, offset + 2);
            }
            if format != Lnotab {
                // These tables end with the code: nothing past them.
                assert_eq!(line_for_offset(format, &table, first, end), None);
            }
            code_objects += 1;
        }
        assert!(
            code_objects >= 10,
            "{}: only {code_objects} code objects",
            shown
        );
        println!(
            "{} ({version}): {checked} offsets in {code_objects} code objects",
            shown
        );
        checked
    }

    #[test]
    fn matches_real_interpreters() {
        let root = pyenv_root().unwrap_or_default();
        let versions = ["3.8.18", "3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0"];
        let mut pythons: Vec<_> = versions
            .iter()
            .map(|v| {
                let minor = v.rsplit_once('.').map_or(*v, |(minor, _)| minor);
                root.join("versions")
                    .join(v)
                    .join("bin")
                    .join(format!("python{minor}"))
            })
            .collect();
        pythons.push("/usr/bin/python3.11".into());
        let mut commands: Vec<Vec<std::path::PathBuf>> =
            pythons.into_iter().map(|p| vec![p]).collect();
        // Debian sid's 3.13-3.15, in their chroot (scripts/cpython-chroots.sh).
        let sid = crate::test_support::sid_root();
        for minor in 13..=15 {
            let python = format!("usr/bin/python3.{minor}");
            if sid.join(&python).is_file() {
                commands.push(vec![
                    "chroot".into(),
                    sid.clone(),
                    format!("/{python}").into(),
                ]);
            } else {
                crate::test_support::missing_prerequisite(&format!(
                    "Debian python3.{minor} in {} (scripts/cpython-chroots.sh)",
                    sid.display()
                ));
            }
        }
        let mut present = 0;
        for command in &commands {
            let program = &command[command.len() - 1];
            let on_host = command.len() == 1;
            if !on_host || program.is_file() {
                assert!(check_interpreter(command) > 1000);
                present += 1;
            } else {
                println!("{}: absent, skipped", program.display());
            }
        }
        assert!(
            present > 0,
            "no CPython interpreter found among {commands:?}"
        );
    }
}
