//! Go's own symbol table, `.gopclntab`: function names, files and lines of Go
//! binaries, stripped ones included (`-ldflags=-s` drops `.symtab` and DWARF but
//! never the pclntab, which the Go runtime itself needs).
//!
//! Formats of Go 1.16/1.17 (magic `0xfffffffa`), 1.18/1.19 (`0xfffffff0`) and
//! 1.20+ (`0xfffffff1`) are read; older ones are refused. Every read is bounds
//! checked and every loop bounded, so a corrupt table yields errors or wrong
//! names, never a panic. Inlined calls (Go 1.18+) are expanded through the
//! function's inline tree, found via the runtime's `moduledata` in `.noptrdata`;
//! when that cannot be found, the function itself is reported with the position
//! of the innermost inlined code.

use super::dwarf::MAX_INLINE_DEPTH;
use super::elf::ElfSymbols;
use super::sections::{SectionError, SectionFile};

/// Largest inline-tree region (Go's `go:func.*`) read, in bytes.
const MAX_FUNCDATA_BYTES: u64 = 256 << 20;
/// Longest function or file name read.
const MAX_NAME_LEN: usize = 64 << 10;
/// `_PCDATA_InlTreeIndex` and `_FUNCDATA_InlTree`.
const PCDATA_INL_TREE_INDEX: u32 = 2;
const FUNCDATA_INL_TREE: u32 = 3;

/// Why a pclntab could not be used.
#[derive(Debug, thiserror::Error)]
pub enum GoError {
    /// The section could not be read or exceeded the budget.
    #[error(transparent)]
    Section(#[from] SectionError),
    /// The magic number is not one of a supported Go version.
    #[error("unsupported pclntab magic {magic:#x} (Go 1.16 or newer is needed)")]
    Unsupported {
        /// The first four bytes.
        magic: u32,
    },
    /// The table is inconsistent.
    #[error("malformed pclntab: {0}")]
    Malformed(&'static str),
}

/// The pclntab layout generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// Go 1.16 and 1.17: absolute entry PCs.
    V116,
    /// Go 1.18 and 1.19: entries relative to the text start.
    V118,
    /// Go 1.20 and newer: like 1.18 with a start line in each function.
    V120,
}

/// One function of an inline chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoFrame {
    /// Full Go name (`main.work`, `net/http.(*conn).serve`).
    pub name: String,
    /// Source file.
    pub file: Option<String>,
    /// 1-based line; 0 when unknown.
    pub line: u32,
}

/// The bytes of the runtime's `go:func.*` symbol, where inline trees live.
#[derive(Debug)]
struct FuncData {
    data: Vec<u8>,
}

/// A parsed pclntab.
#[derive(Debug)]
pub struct GoTable {
    data: Vec<u8>,
    version: Version,
    big_endian: bool,
    ptr_size: usize,
    quantum: u32,
    nfunc: usize,
    text_start: u64,
    funcnametab: usize,
    cutab: usize,
    filetab: usize,
    pctab: usize,
    functab: usize,
    funcdata: Option<FuncData>,
}

impl GoTable {
    /// Reads the pclntab of a file whose symbols (and section hints) are known.
    pub fn load(file: &mut SectionFile, symbols: &ElfSymbols) -> Result<Self, GoError> {
        let hints = symbols.debug_hints();
        let range = hints.gopclntab.ok_or(GoError::Malformed("no .gopclntab"))?;
        let data = file.read_at(range.file_offset, range.size)?;
        let text = hints.text.map_or(0, |t| t.vaddr);
        let mut table = Self::parse(data, text)?;
        if table.version != Version::V116
            && let Some(noptrdata) = hints.noptrdata
            && let Ok(module) = file.read_at(noptrdata.file_offset, noptrdata.size.min(16 << 20))
            && let Some(gofunc) = table.find_gofunc(&module, range.vaddr)
        {
            table.funcdata = load_funcdata(file, symbols, gofunc, range.vaddr);
        }
        Ok(table)
    }

    /// Parses a pclntab; `text` is the `.text` address, used when the header's
    /// text start is 0 (left for a dynamic relocation).
    pub fn parse(data: Vec<u8>, text: u64) -> Result<Self, GoError> {
        let magic_bytes: [u8; 4] = data
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .ok_or(GoError::Malformed("truncated header"))?;
        let supported = |m| matches!(m, 0xffff_fffa | 0xffff_fff0 | 0xffff_fff1);
        let (little, big) = (
            u32::from_le_bytes(magic_bytes),
            u32::from_be_bytes(magic_bytes),
        );
        let (magic, big_endian) = if supported(little) || !supported(big) {
            (little, false)
        } else {
            (big, true)
        };
        let version = match magic {
            0xffff_fffa => Version::V116,
            0xffff_fff0 => Version::V118,
            0xffff_fff1 => Version::V120,
            magic => return Err(GoError::Unsupported { magic }),
        };
        let (pad, quantum, ptr_size) = match data.get(4..8) {
            Some(&[a, b, q, p]) => ((a, b), q, p),
            _ => return Err(GoError::Malformed("truncated header")),
        };
        if pad != (0, 0) || !matches!(quantum, 1 | 2 | 4) || !matches!(ptr_size, 4 | 8) {
            return Err(GoError::Malformed("bad header"));
        }
        let mut table = GoTable {
            data,
            version,
            big_endian,
            ptr_size: usize::from(ptr_size),
            quantum: u32::from(quantum),
            nfunc: 0,
            text_start: 0,
            funcnametab: 0,
            cutab: 0,
            filetab: 0,
            pctab: 0,
            functab: 0,
            funcdata: None,
        };
        let word = |t: &GoTable, i: usize| t.uintptr(8 + i * t.ptr_size);
        let field = |t: &GoTable, i: usize| {
            word(t, i)
                .and_then(|v| usize::try_from(v).ok())
                .filter(|&v| v <= t.data.len())
                .ok_or(GoError::Malformed("header offset out of range"))
        };
        let first = if version == Version::V116 { 2 } else { 3 };
        table.nfunc = word(&table, 0)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or(GoError::Malformed("truncated header"))?;
        if version != Version::V116 {
            table.text_start = word(&table, 2).ok_or(GoError::Malformed("truncated header"))?;
            if table.text_start == 0 {
                table.text_start = text;
            }
        }
        table.funcnametab = field(&table, first)?;
        table.cutab = field(&table, first + 1)?;
        table.filetab = field(&table, first + 2)?;
        table.pctab = field(&table, first + 3)?;
        table.functab = field(&table, first + 4)?;
        let functab_len = table
            .nfunc
            .checked_add(1)
            .and_then(|n| n.checked_mul(table.functab_entry_size()))
            .ok_or(GoError::Malformed("function count"))?;
        if table.functab.saturating_add(functab_len) > table.data.len() || table.nfunc == 0 {
            return Err(GoError::Malformed("function table out of range"));
        }
        Ok(table)
    }

    /// Bytes held.
    pub fn heap_size(&self) -> usize {
        self.data.capacity() + self.funcdata.as_ref().map_or(0, |f| f.data.capacity())
    }

    /// Whether inline trees can be read.
    pub fn has_inline_trees(&self) -> bool {
        self.funcdata.is_some()
    }

    /// The inline chain at link-time address `pc`, innermost first; empty when no
    /// function covers it.
    pub fn frames(&self, pc: u64) -> Vec<GoFrame> {
        let Some(func) = self.find_func(pc) else {
            return Vec::new();
        };
        let Some(entry) = self.func_entry(func) else {
            return Vec::new();
        };
        let mut frames = Vec::new();
        let mut pc = pc;
        if let Some((pcdata, tree)) = self.inline_tables(func) {
            let mut index = self.pcvalue(pcdata, entry, pc);
            while let Some(ix) = index.and_then(|i| usize::try_from(i).ok()) {
                if frames.len() >= MAX_INLINE_DEPTH {
                    break;
                }
                let Some((name_off, parent_pc)) = self.inlined_call(tree, ix) else {
                    break;
                };
                let (file, line) = self.position(func, entry, pc);
                frames.push(GoFrame {
                    name: self.func_name(name_off).unwrap_or_default(),
                    file,
                    line,
                });
                pc = entry.wrapping_add(parent_pc);
                index = self.pcvalue(pcdata, entry, pc);
            }
        }
        let (file, line) = self.position(func, entry, pc);
        let name_off = self.u32_at(func + self.ptr_offset(4));
        frames.push(GoFrame {
            name: name_off.and_then(|o| self.func_name(o)).unwrap_or_default(),
            file,
            line,
        });
        frames
    }

    /// Offset of the `_func` whose range holds `pc`.
    fn find_func(&self, pc: u64) -> Option<usize> {
        let entry_pc = |i: usize| self.functab_pc(i);
        if pc < entry_pc(0)? || pc >= entry_pc(self.nfunc)? {
            return None;
        }
        // Largest i with entry(i) <= pc; entries are sorted in a valid table, and
        // a corrupt one only gives a wrong function.
        let (mut low, mut high) = (0, self.nfunc);
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            if entry_pc(mid)? <= pc {
                low = mid;
            } else {
                high = mid;
            }
        }
        let size = self.functab_entry_size();
        let at = self.functab + low * size + size / 2;
        let funcoff = match self.version {
            Version::V116 => usize::try_from(self.uintptr(at)?).ok()?,
            _ => usize::try_from(self.u32_at(at)?).ok()?,
        };
        let func = self.functab.checked_add(funcoff)?;
        (func < self.data.len()).then_some(func)
    }

    fn functab_entry_size(&self) -> usize {
        match self.version {
            Version::V116 => 2 * self.ptr_size,
            _ => 8,
        }
    }

    fn functab_pc(&self, i: usize) -> Option<u64> {
        let at = self
            .functab
            .checked_add(i.checked_mul(self.functab_entry_size())?)?;
        match self.version {
            Version::V116 => self.uintptr(at),
            _ => Some(self.text_start.wrapping_add(u64::from(self.u32_at(at)?))),
        }
    }

    /// The entry PC of a `_func`.
    fn func_entry(&self, func: usize) -> Option<u64> {
        match self.version {
            Version::V116 => self.uintptr(func),
            _ => Some(self.text_start.wrapping_add(u64::from(self.u32_at(func)?))),
        }
    }

    /// Offset of the `_func` field that follows the entry and is `n` bytes after
    /// the name offset's place in Go 1.18+ (where the entry is 4 bytes).
    fn ptr_offset(&self, n: usize) -> usize {
        match self.version {
            Version::V116 => self.ptr_size + (n - 4),
            _ => n,
        }
    }

    fn fixed_func_size(&self) -> usize {
        match self.version {
            Version::V116 => self.ptr_size + 36,
            Version::V118 => 40,
            Version::V120 => 44,
        }
    }

    /// File and line at `pc` of the function at `func`.
    fn position(&self, func: usize, entry: u64, pc: u64) -> (Option<String>, u32) {
        let pcfile = self.u32_at(func + self.ptr_offset(20));
        let pcln = self.u32_at(func + self.ptr_offset(24));
        let cu = self.u32_at(func + self.ptr_offset(32));
        let file = (|| {
            let index = u32::try_from(self.pcvalue(pcfile?, entry, pc)?).ok()?;
            let slot = (cu?.checked_add(index)? as usize).checked_mul(4)?;
            let offset = self.u32_at(self.cutab.checked_add(slot)?)?;
            if offset == u32::MAX {
                return None;
            }
            self.string_at(self.filetab.checked_add(offset as usize)?)
        })();
        let line = pcln
            .and_then(|t| self.pcvalue(t, entry, pc))
            .and_then(|l| u32::try_from(l).ok())
            .unwrap_or(0);
        (file, line)
    }

    /// The `pcdata[InlTreeIndex]` table and the inline tree's offset in the
    /// funcdata region, when the function has inlined calls.
    fn inline_tables(&self, func: usize) -> Option<(u32, usize)> {
        self.funcdata.as_ref()?;
        let npcdata = self.u32_at(func + self.ptr_offset(28))?;
        let nfuncdata = *self.data.get(func + self.fixed_func_size() - 1)?;
        if npcdata <= PCDATA_INL_TREE_INDEX || u32::from(nfuncdata) <= FUNCDATA_INL_TREE {
            return None;
        }
        let pcdata_at = func + self.fixed_func_size();
        let pcdata = self.u32_at(pcdata_at + 4 * PCDATA_INL_TREE_INDEX as usize)?;
        let funcdata_at = pcdata_at + 4 * npcdata as usize;
        let tree = self.u32_at(funcdata_at + 4 * FUNCDATA_INL_TREE as usize)?;
        (pcdata != 0 && tree != u32::MAX).then_some((pcdata, tree as usize))
    }

    /// The name offset and parent PC (from the entry) of inline tree entry `ix`.
    fn inlined_call(&self, tree: usize, ix: usize) -> Option<(u32, u64)> {
        let funcdata = &self.funcdata.as_ref()?.data;
        let (size, name_at, parent_at) = match self.version {
            Version::V120 => (16, 4, 8),
            _ => (20, 12, 16),
        };
        let at = tree.checked_add(ix.checked_mul(size)?)?;
        let name = read_u32(funcdata, at.checked_add(name_at)?, self.big_endian)?;
        let parent = read_u32(funcdata, at.checked_add(parent_at)?, self.big_endian)?;
        Some((name, u64::from(parent)))
    }

    fn func_name(&self, name_off: u32) -> Option<String> {
        self.string_at(self.funcnametab.checked_add(name_off as usize)?)
    }

    /// The value of pc-value table `table` at `target`, starting from `entry`.
    fn pcvalue(&self, table: u32, entry: u64, target: u64) -> Option<i64> {
        if table == 0 {
            return None;
        }
        let mut at = self.pctab.checked_add(table as usize)?;
        let (mut value, mut pc) = (-1i64, entry);
        let mut first = true;
        // Each step reads at least one byte, so the table bounds the loop.
        while at < self.data.len() {
            let value_delta = self.uvarint(&mut at)?;
            if value_delta == 0 && !first {
                return None;
            }
            first = false;
            let delta = if value_delta & 1 != 0 {
                !(value_delta >> 1) as i64
            } else {
                (value_delta >> 1) as i64
            };
            value = value.wrapping_add(delta);
            let pc_delta = self.uvarint(&mut at)?;
            pc = pc.wrapping_add(pc_delta.wrapping_mul(u64::from(self.quantum)));
            if target < pc {
                return Some(value);
            }
        }
        None
    }

    fn uvarint(&self, at: &mut usize) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.data.get(*at)?;
            *at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn string_at(&self, at: usize) -> Option<String> {
        let rest = self.data.get(at..)?;
        let rest = rest.get(..rest.len().min(MAX_NAME_LEN))?;
        let len = rest.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(rest.get(..len)?).into_owned())
    }

    fn u32_at(&self, at: usize) -> Option<u32> {
        read_u32(&self.data, at, self.big_endian)
    }

    fn uintptr(&self, at: usize) -> Option<u64> {
        read_uintptr(&self.data, at, self.ptr_size, self.big_endian)
    }

    /// The address of `go:func.*` from the runtime's first `moduledata`, found in
    /// `.noptrdata` as the word pointing at the pclntab, checked against the
    /// slices that follow it.
    fn find_gofunc(&self, module: &[u8], pclntab_vaddr: u64) -> Option<u64> {
        let p = self.ptr_size;
        let word = |at: usize| read_uintptr(module, at, p, self.big_endian);
        let gofunc_word = if self.version == Version::V120 {
            40
        } else {
            38
        };
        (0..module.len()).step_by(p).find_map(|at| {
            if word(at)? != pclntab_vaddr {
                return None;
            }
            let names = word(at + p)?;
            let text = word(at + 22 * p)?;
            let expected_names = pclntab_vaddr.checked_add(self.funcnametab as u64)?;
            (names == expected_names && text == self.text_start)
                .then(|| word(at + gofunc_word * p))
                .flatten()
                .filter(|&g| g != 0)
        })
    }
}

/// Reads the `go:func.*` region: from `gofunc` to the end of its file-backed
/// segment, or to the pclntab when that follows it in the same segment.
fn load_funcdata(
    file: &mut SectionFile,
    symbols: &ElfSymbols,
    gofunc: u64,
    pclntab_vaddr: u64,
) -> Option<FuncData> {
    let offset = symbols.vaddr_to_file_offset(gofunc)?;
    let segment = symbols
        .segments()
        .iter()
        .find(|s| s.vaddr <= gofunc && gofunc - s.vaddr < s.file_size)?;
    let mut end = segment.vaddr.checked_add(segment.file_size)?;
    if pclntab_vaddr > gofunc && pclntab_vaddr < end {
        end = pclntab_vaddr;
    }
    let size = (end - gofunc).min(MAX_FUNCDATA_BYTES);
    let data = file.read_at(offset, size).ok()?;
    Some(FuncData { data })
}

fn read_u32(data: &[u8], at: usize, big_endian: bool) -> Option<u32> {
    let bytes: [u8; 4] = data.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(if big_endian {
        u32::from_be_bytes(bytes)
    } else {
        u32::from_le_bytes(bytes)
    })
}

fn read_uintptr(data: &[u8], at: usize, ptr_size: usize, big_endian: bool) -> Option<u64> {
    if ptr_size == 4 {
        return read_u32(data, at, big_endian).map(u64::from);
    }
    let bytes: [u8; 8] = data.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(if big_endian {
        u64::from_be_bytes(bytes)
    } else {
        u64::from_le_bytes(bytes)
    })
}
