//! Finding Perl in a process: which mapped file is the interpreter
//! (`/usr/bin/perl`, which Debian links statically, or `libperl.so` in a
//! program embedding Perl), its version (`PL_revision`, `PL_version`,
//! `PL_subversion`, bytes in its read-only data), how a thread finds its
//! interpreter, and where the run loops are whose frames Perl's frames
//! replace (`Perl_runops_standard`, `Perl_runops_debug`).
//!
//! Threaded builds keep each thread's interpreter in the TLS variable
//! `PL_current_context`. The executable's TLS block is module 1 of every
//! thread's DTV; a library's module ID is known only at run time, from the
//! GOT pair its general-dynamic accesses load (the `R_X86_64_DTPMOD64`
//! relocation of the symbol). Without either, the global `PL_curinterp`
//! (the first interpreter) is used.

use std::{ops::Range, path::Path};

use icecore_unwinders::{
    native::EarlyEndThreads,
    perl::{PerlProcess, context_kind},
};
use object::{Object, ObjectSymbol, RelocationFlags, RelocationTarget, SymbolKind};

use super::layouts::{PerlLayout, SUPPORTED, layout};
use crate::runtimes::services::{
    ElfFileError, LoadSegments, ProbeFailure, RuntimeFile, bytes_at, open_elf, parse_elf,
};

/// `R_X86_64_DTPMOD64`: the GOT word of a TLS variable's module ID.
const R_X86_64_DTPMOD64: u32 = 16;
/// The run loops, one frame per run of Perl code.
const RUN_LOOPS: [&str; 2] = ["Perl_runops_standard", "Perl_runops_debug"];

/// Why a file is not a usable Perl.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// The file could not be read as ELF.
    #[error(transparent)]
    File(#[from] ElfFileError),
    /// The file defines no `Perl_runops_standard` (not Perl's interpreter).
    #[error("{0} defines no Perl_runops_standard")]
    NotPerl(String),
    /// The version bytes could not be read.
    #[error("{0}: no Perl version found (no PL_version)")]
    NoVersion(String),
    /// A version icecore has no layout for.
    #[error("{path}: Perl 5.{minor} is not supported ({SUPPORTED} are)")]
    Unsupported {
        /// The file.
        path: String,
        /// Minor version.
        minor: u8,
    },
    /// Neither `PL_current_context` nor `PL_curinterp` is exported.
    #[error("{0}: exports neither PL_current_context nor PL_curinterp")]
    NoInterpreter(String),
}

/// How a thread's interpreter is found, in ELF virtual addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpreter {
    /// `PL_current_context` at this offset in the executable's TLS block.
    ExecutableTls(u64),
    /// `PL_current_context` in a library's TLS block: the GOT pair (module
    /// ID, offset) the dynamic loader fills.
    LibraryTls(u64),
    /// The global `PL_curinterp` (the first interpreter).
    Global(u64),
}

/// What one Perl file offers, in ELF virtual addresses (add the load bias).
#[derive(Debug, Clone)]
pub struct PerlBinary {
    /// The version's struct layout.
    pub layout: PerlLayout,
    /// The version (`5.36.0`).
    pub version: String,
    /// How a thread's interpreter is found.
    pub interpreter: Interpreter,
    /// The run loops: one frame per run of Perl code, where that run's Perl
    /// frames go among the native ones.
    pub run_loops: Vec<Range<u64>>,
    /// `PL_curinterp`, where exported.
    pub curinterp: Option<u64>,
    segments: LoadSegments,
}

/// Whether a file name may be Perl's: `perl`, `perl5.36.0`, `libperl.so.5.36`.
pub fn is_perl_name(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    if let Some(rest) = name.strip_prefix("libperl") {
        return rest.starts_with(".so");
    }
    name.strip_prefix("perl")
        .is_some_and(|rest| rest.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// Reads what icecore needs of a Perl file.
pub fn inspect(path: &Path) -> Result<PerlBinary, DetectError> {
    let shown = || path.display().to_string();
    let cache = open_elf(path)?;
    let elf = parse_elf(path, &cache)?;
    let mut run_loops = Vec::new();
    let mut has_standard_loop = false;
    let mut current_context = None;
    let mut curinterp = None;
    let mut version_at = [None; 3];
    for symbol in elf.dynamic_symbols() {
        if symbol.is_undefined() {
            continue;
        }
        let Ok(name) = symbol.name() else {
            continue;
        };
        match name {
            _ if RUN_LOOPS.contains(&name) => {
                has_standard_loop |= name == RUN_LOOPS[0];
                run_loops.push(symbol.address()..symbol.address() + symbol.size().max(1));
            }
            "PL_current_context" if symbol.kind() == SymbolKind::Tls => {
                current_context = Some((symbol.index(), symbol.address()));
            }
            "PL_curinterp" => curinterp = Some(symbol.address()),
            "PL_revision" => version_at[0] = Some(symbol.address()),
            "PL_version" => version_at[1] = Some(symbol.address()),
            "PL_subversion" => version_at[2] = Some(symbol.address()),
            _ => {}
        }
    }
    if !has_standard_loop {
        return Err(DetectError::NotPerl(shown()));
    }
    run_loops.sort_unstable_by_key(|r| r.start);
    let byte = |at: Option<u64>| bytes_at(&elf, at?, 1).and_then(|b| b.first().copied());
    let (Some(revision), Some(minor), Some(patch)) = (
        byte(version_at[0]),
        byte(version_at[1]),
        byte(version_at[2]),
    ) else {
        return Err(DetectError::NoVersion(shown()));
    };
    if revision != 5 {
        return Err(DetectError::NoVersion(shown()));
    }
    let layout = layout((5, minor)).ok_or_else(|| DetectError::Unsupported {
        path: shown(),
        minor,
    })?;
    let library = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("libperl"))
        || elf.kind() == object::ObjectKind::Dynamic && elf.entry() == 0;
    let interpreter = match current_context {
        Some((_, offset)) if !library => Interpreter::ExecutableTls(offset),
        Some((index, _)) => match module_got_slot(&elf, index) {
            Some(slot) => Interpreter::LibraryTls(slot),
            None => {
                Interpreter::Global(curinterp.ok_or_else(|| DetectError::NoInterpreter(shown()))?)
            }
        },
        None => Interpreter::Global(curinterp.ok_or_else(|| DetectError::NoInterpreter(shown()))?),
    };
    Ok(PerlBinary {
        layout,
        version: format!("5.{minor}.{patch}"),
        interpreter,
        run_loops,
        curinterp,
        segments: LoadSegments::of(&elf),
    })
}

/// The GOT slot of the module ID of the TLS symbol at `index` (of the
/// dynamic symbol table).
fn module_got_slot<'a, R: object::ReadRef<'a>>(
    elf: &object::File<'a, R>,
    index: object::SymbolIndex,
) -> Option<u64> {
    elf.dynamic_relocations()?.find_map(|(at, relocation)| {
        let type_matches = matches!(
            relocation.flags(),
            RelocationFlags::Elf { r_type } if r_type == R_X86_64_DTPMOD64
        );
        (type_matches && relocation.target() == RelocationTarget::Symbol(index)).then_some(at)
    })
}

impl PerlBinary {
    /// The threads whose samples may take Perl frames when their native
    /// walk ends early: a process-wide interpreter (no thread-local one)
    /// is the main thread's; any other thread would be given its stack.
    pub fn early_end_threads(&self) -> EarlyEndThreads {
        match self.interpreter {
            Interpreter::Global(_) => EarlyEndThreads::Main,
            Interpreter::ExecutableTls(_) | Interpreter::LibraryTls(_) => EarlyEndThreads::Every,
        }
    }

    /// What BPF needs to find a thread's interpreter in a process that
    /// maps this file at `bias`; `read_u64` reads the process (a library's
    /// GOT pair). `None` when the pair is not filled in.
    pub fn bpf_process(
        &self,
        bias: u64,
        read_u64: impl Fn(u64) -> Option<u64>,
    ) -> Option<PerlProcess> {
        let base = self.layout.bpf_process();
        Some(match self.interpreter {
            Interpreter::ExecutableTls(offset) => PerlProcess {
                context_kind: context_kind::DTV,
                tls_module: 1,
                context_at: offset,
                ..base
            },
            Interpreter::LibraryTls(slot) => {
                let slot = bias.wrapping_add(slot);
                let module = u32::try_from(read_u64(slot)?).ok()?;
                let offset = read_u64(slot.wrapping_add(8))?;
                // Module IDs are small; the variable lies in a small block.
                if !(1..=4096).contains(&module) || offset > 0xffff {
                    return None;
                }
                PerlProcess {
                    context_kind: context_kind::DTV,
                    tls_module: module,
                    context_at: offset,
                    ..base
                }
            }
            Interpreter::Global(at) => PerlProcess {
                context_kind: context_kind::GLOBAL,
                context_at: bias.wrapping_add(at),
                ..base
            },
        })
    }
}

impl RuntimeFile for PerlBinary {
    fn load_bias(&self, mapping_start: u64, file_offset: u64) -> Option<u64> {
        self.segments.load_bias(mapping_start, file_offset)
    }
}

impl ProbeFailure for DetectError {
    fn is_refusal(&self) -> bool {
        // A `perl`-named tool that is not the interpreter is no refusal.
        !matches!(self, DetectError::NotPerl(_) | DetectError::File(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perl_files_are_told_by_name() {
        for yes in [
            "/usr/bin/perl",
            "/usr/bin/perl5.36.0",
            "/usr/lib/x86_64-linux-gnu/libperl.so.5.36.0",
            "/opt/perl/lib/CORE/libperl.so",
        ] {
            assert!(is_perl_name(yes), "{yes}");
        }
        for no in ["/usr/bin/perldoc", "/usr/bin/perl-x", "/usr/lib/libc.so.6"] {
            assert!(!is_perl_name(no), "{no}");
        }
    }

    #[test]
    fn debians_perl_and_libperl_are_read() {
        let perl = inspect(Path::new("/usr/bin/perl")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(perl.layout.version, (5, 36));
        assert!(perl.version.starts_with("5.36."), "{}", perl.version);
        // Debian links the interpreter into the executable: its TLS.
        assert!(
            matches!(perl.interpreter, Interpreter::ExecutableTls(_)),
            "{:?}",
            perl.interpreter
        );
        assert_eq!(perl.run_loops.len(), 2, "{:x?}", perl.run_loops);
        let lib = Path::new("/usr/lib/x86_64-linux-gnu/libperl.so.5.36");
        if lib.exists() {
            let lib = inspect(lib).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                matches!(lib.interpreter, Interpreter::LibraryTls(_)),
                "{:?}",
                lib.interpreter
            );
        }
    }

    #[test]
    fn a_file_without_the_run_loop_is_not_perl() {
        let e = inspect(Path::new("/usr/bin/env")).unwrap_err();
        assert!(matches!(e, DetectError::NotPerl(_)), "{e}");
        assert!(!e.is_refusal());
    }
}
