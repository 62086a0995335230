//! Kernel symbols from `/proc/kallsyms`.
//!
//! Only text symbols (`t`, `T`, `w`, `W`) are kept, sorted by address, with their
//! names in one arena. Module names (`\t[mod]`) are dropped, so nothing depends
//! on `/proc/modules`. When `kptr_restrict` hides addresses every address reads
//! as zero; that is reported as [`KallsymsError::Hidden`].

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};

/// Where the kernel lists its symbols.
pub const KALLSYMS_PATH: &str = "/proc/kallsyms";
/// Largest kallsyms text accepted, in bytes.
pub const MAX_KALLSYMS_BYTES: u64 = 256 << 20;
/// An address further than this past the nearest symbol is not attributed to it.
pub const MAX_SYMBOL_EXTENT: u64 = 1 << 20;

/// Why kernel symbols are unavailable.
#[derive(Debug, thiserror::Error)]
pub enum KallsymsError {
    /// `/proc/kallsyms` could not be read.
    #[error("reading {KALLSYMS_PATH}: {0}")]
    Io(#[source] io::Error),
    /// All addresses are zero: `kernel.kptr_restrict` or missing privileges hide them.
    #[error("kernel symbol addresses are hidden (kernel.kptr_restrict, or not root)")]
    Hidden,
    /// The text contains no text symbol at all.
    #[error("no kernel text symbols found")]
    Empty,
    /// A line is not `address type name [module]`.
    #[error("kallsyms line {line_number} is malformed: {line:?}")]
    Parse {
        /// 1-based line number.
        line_number: usize,
        /// The line, truncated to 200 bytes.
        line: String,
    },
    /// The text exceeds [`MAX_KALLSYMS_BYTES`].
    #[error("kallsyms exceeds {MAX_KALLSYMS_BYTES} bytes")]
    TooLarge,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    address: u64,
    name_start: u32,
    name_len: u32,
}

/// Sorted kernel text symbols.
#[derive(Debug, Default)]
pub struct KernelSymbols {
    entries: Vec<Entry>,
    names: String,
}

impl KernelSymbols {
    /// Reads and parses `/proc/kallsyms`, line by line: the text (8 MB on a
    /// distribution kernel) is never held whole.
    pub fn load() -> Result<Self, KallsymsError> {
        let file = File::open(KALLSYMS_PATH).map_err(KallsymsError::Io)?;
        Self::parse_from(BufReader::with_capacity(64 << 10, file))
    }

    /// Parses kallsyms text.
    pub fn parse(text: &str) -> Result<Self, KallsymsError> {
        Self::parse_from(text.as_bytes())
    }

    /// Parses kallsyms text read from `reader`.
    fn parse_from(reader: impl BufRead) -> Result<Self, KallsymsError> {
        let mut reader = reader.take(MAX_KALLSYMS_BYTES + 1);
        let mut entries = Vec::new();
        let mut names = String::new();
        let mut saw_symbol = false;
        let mut line = String::new();
        let mut read = 0u64;
        for index in 0.. {
            line.clear();
            let n = reader.read_line(&mut line).map_err(KallsymsError::Io)?;
            if n == 0 {
                break;
            }
            read += n as u64;
            if read > MAX_KALLSYMS_BYTES {
                return Err(KallsymsError::TooLarge);
            }
            if line.trim().is_empty() {
                continue;
            }
            let mut fields = line.split_ascii_whitespace();
            let (Some(address), Some(kind), Some(name)) =
                (fields.next(), fields.next(), fields.next())
            else {
                return Err(parse_error(index, line.trim_end()));
            };
            let Ok(address) = u64::from_str_radix(address, 16) else {
                return Err(parse_error(index, line.trim_end()));
            };
            saw_symbol = true;
            if !matches!(kind, "t" | "T" | "w" | "W") || address == 0 {
                continue;
            }
            let (Ok(name_start), Ok(name_len)) =
                (u32::try_from(names.len()), u32::try_from(name.len()))
            else {
                return Err(KallsymsError::TooLarge);
            };
            names.push_str(name);
            entries.push(Entry {
                address,
                name_start,
                name_len,
            });
        }
        if entries.is_empty() {
            return Err(if saw_symbol {
                KallsymsError::Hidden
            } else {
                KallsymsError::Empty
            });
        }
        // Stable: of symbols at one address the first listed wins.
        entries.sort_by_key(|e| e.address);
        entries.dedup_by_key(|e| e.address);
        entries.shrink_to_fit();
        names.shrink_to_fit();
        Ok(KernelSymbols { entries, names })
    }

    /// The name of the function containing `address`.
    pub fn lookup(&self, address: u64) -> Option<&str> {
        self.lookup_with_offset(address).map(|(name, _)| name)
    }

    /// The name of the function containing `address` and the offset into it.
    pub fn lookup_with_offset(&self, address: u64) -> Option<(&str, u64)> {
        let index = self
            .entries
            .partition_point(|e| e.address <= address)
            .checked_sub(1)?;
        let entry = self.entries.get(index)?;
        let offset = address - entry.address;
        (offset < MAX_SYMBOL_EXTENT).then(|| (self.name(entry), offset))
    }

    /// Lowest text symbol address.
    pub fn first_address(&self) -> Option<u64> {
        self.entries.first().map(|e| e.address)
    }

    /// Number of symbols kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no symbol was kept (never true for a successfully parsed table).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn name(&self, entry: &Entry) -> &str {
        let start = entry.name_start as usize;
        self.names
            .get(start..start + entry.name_len as usize)
            .unwrap_or("")
    }
}

fn parse_error(index: usize, line: &str) -> KallsymsError {
    let mut end = line.len().min(200);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    KallsymsError::Parse {
        line_number: index + 1,
        line: line[..end].to_owned(),
    }
}

/// The running kernel's GNU build ID from `/sys/kernel/notes`, when readable.
pub fn kernel_build_id() -> Option<String> {
    let mut notes = Vec::new();
    File::open("/sys/kernel/notes")
        .ok()?
        .take(1 << 16)
        .read_to_end(&mut notes)
        .ok()?;
    build_id_from_notes(&notes)
}

/// Finds the GNU build ID in a sequence of native-endian ELF notes.
fn build_id_from_notes(mut notes: &[u8]) -> Option<String> {
    fn word(bytes: &[u8], at: usize) -> Option<usize> {
        let raw: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
        usize::try_from(u32::from_ne_bytes(raw)).ok()
    }
    let align4 = |n: usize| n.checked_add(3).map(|n| n & !3);
    while notes.len() >= 12 {
        let (name_size, desc_size, kind) = (word(notes, 0)?, word(notes, 4)?, word(notes, 8)?);
        let desc_start = 12usize.checked_add(align4(name_size)?)?;
        let desc_end = desc_start.checked_add(desc_size)?;
        let name = notes.get(12..12usize.checked_add(name_size)?)?;
        let desc = notes.get(desc_start..desc_end)?;
        if name == b"GNU\0" && kind == object::elf::NT_GNU_BUILD_ID as usize && !desc.is_empty() {
            return Some(super::elf::hex(desc));
        }
        notes = notes.get(align4(desc_end)?..)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
ffffffff81000000 T _stext
ffffffff81000000 T _text
ffffffff81001000 T do_one_initcall
ffffffff81001200 t run_init_process
ffffffff81002000 D some_data
ffffffff81003000 W arch_weak_hook
ffffffff82000000 b bss_thing
ffffffffc0000000 t helper_in_module\t[nf_tables]
ffffffffc0001000 T exported_in_module\t[nf_tables]
";

    #[test]
    fn parses_and_looks_up() {
        let symbols = KernelSymbols::parse(SAMPLE).unwrap();
        assert_eq!(symbols.len(), 6);
        assert_eq!(symbols.lookup(0xffffffff81000010), Some("_stext"));
        assert_eq!(symbols.lookup(0xffffffff81001100), Some("do_one_initcall"));
        assert_eq!(
            symbols.lookup_with_offset(0xffffffff81001234),
            Some(("run_init_process", 0x34))
        );
        // Data symbols are not kept: the address falls to the preceding function.
        assert_eq!(symbols.lookup(0xffffffff81002100), Some("run_init_process"));
        assert_eq!(symbols.lookup(0xffffffff81003000), Some("arch_weak_hook"));
        assert_eq!(symbols.lookup(0xffffffffc0000008), Some("helper_in_module"));
        assert_eq!(
            symbols.lookup(0xffffffffc0001008),
            Some("exported_in_module")
        );
        assert_eq!(symbols.lookup(0xffffffff80000000), None);
        // Far past the last symbol of the kernel image, before the modules.
        assert_eq!(symbols.lookup(0xffffffffa0000000), None);
        assert_eq!(symbols.first_address(), Some(0xffffffff81000000));
    }

    #[test]
    fn hidden_addresses_are_detected() {
        let hidden = "0000000000000000 T _stext\n0000000000000000 t foo\n0000000000000000 D bar\n";
        let err = KernelSymbols::parse(hidden).unwrap_err();
        assert!(matches!(err, KallsymsError::Hidden), "{err}");
        assert!(err.to_string().contains("hidden"));
        assert!(matches!(
            KernelSymbols::parse("").unwrap_err(),
            KallsymsError::Empty
        ));
    }

    #[test]
    fn malformed_lines() {
        let err = KernelSymbols::parse("ffffffff81000000 T a\nnot-hex T b\n").unwrap_err();
        assert!(
            matches!(err, KallsymsError::Parse { line_number: 2, .. }),
            "{err}"
        );
        assert!(KernelSymbols::parse("ffffffff81000000 T\n").is_err());
    }

    #[test]
    fn loads_from_proc_when_allowed() {
        match KernelSymbols::load() {
            Ok(symbols) => {
                let stext = symbols.entries.iter().find(|e| symbols.name(e) == "_stext");
                if let Some(entry) = stext {
                    assert!(symbols.lookup(entry.address + 1).is_some());
                }
                assert!(symbols.len() > 1000);
            }
            Err(KallsymsError::Hidden | KallsymsError::Io(_)) => {}
            Err(other) => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn notes_build_id() {
        let mut notes = Vec::new();
        // An unrelated note first, then the build ID.
        for (name, kind, desc) in [
            (&b"Xen\0"[..], 5u32, &[1u8, 2, 3][..]),
            (b"GNU\0", 3, &[0xab, 0xcd, 0x01, 0x23]),
        ] {
            notes.extend_from_slice(&(name.len() as u32).to_ne_bytes());
            notes.extend_from_slice(&(desc.len() as u32).to_ne_bytes());
            notes.extend_from_slice(&kind.to_ne_bytes());
            notes.extend_from_slice(name);
            notes.extend_from_slice(desc);
            while !notes.len().is_multiple_of(4) {
                notes.push(0);
            }
        }
        assert_eq!(build_id_from_notes(&notes).as_deref(), Some("abcd0123"));
        assert_eq!(build_id_from_notes(&notes[..20]), None);
        assert_eq!(build_id_from_notes(&[0xff; 40]), None);
        let _ = kernel_build_id();
    }
}
