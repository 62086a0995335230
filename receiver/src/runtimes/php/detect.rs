//! Finding the PHP engine in a process: which mapped file is it (`php`,
//! `php-fpm`, `php-cgi`, `libphp.so`), its version (the `X-Powered-By`
//! header it sends, in its read-only data), whether it is thread-safe (the
//! `API…,NTS`/`API…,TS` build ID), where `executor_globals` is (NTS) or how
//! a thread finds its own (ZTS), and where `execute_ex`, the VM loop whose
//! frames PHP's frames replace, is.
//!
//! A ZTS build keeps each thread's globals in its TSRM block, found through
//! the static TLS variable `_tsrm_ls_cache`, at `executor_globals_offset`.
//! Stripped builds keep no symbol for the TLS variable, but export
//! `tsrm_get_ls_cache_tcb_offset` (for the JIT), whose code is the
//! variable's offset from the thread pointer: `mov $offset, %rax` in an
//! executable, a load of the offset from the GOT in `libphp.so`.

use std::{ops::Range, path::Path};

use object::{Object, ObjectSection, ObjectSymbol};

use super::layouts::{PhpLayout, SUPPORTED, layout};
use crate::runtimes::services::{
    ElfFileError, LoadSegments, ProbeFailure, RuntimeFile, bytes_at, cold_parts, open_elf,
    parse_elf, widest_unwind_row,
};

/// What precedes the version in the engine's read-only data.
const VERSION_MARKER: &[u8] = b"X-Powered-By: PHP/";

/// Why a file is not a usable PHP engine.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// The file could not be read as ELF.
    #[error(transparent)]
    File(#[from] ElfFileError),
    /// The file defines no `execute_ex` (not PHP's engine).
    #[error("{0} defines no execute_ex")]
    NotPhp(String),
    /// The version could not be found in the file.
    #[error("{0}: no PHP version found (no X-Powered-By string)")]
    NoVersion(String),
    /// A version icecore has no layout for.
    #[error("{path}: PHP {major}.{minor} is not supported ({SUPPORTED} are)")]
    Unsupported {
        /// The file.
        path: String,
        /// Major version.
        major: u8,
        /// Minor version.
        minor: u8,
    },
    /// An NTS build that does not export `executor_globals`, or a ZTS build
    /// whose `executor_globals_offset` or TLS offset could not be found.
    #[error("{0}: the engine's globals cannot be found ({1})")]
    NoGlobals(String, &'static str),
}

/// What one PHP file offers, in ELF virtual addresses (add the load bias).
#[derive(Debug, Clone)]
pub struct PhpBinary {
    /// The version's struct layout.
    pub layout: PhpLayout,
    /// The version, as the file says it (`8.2.36`).
    pub version: String,
    /// Where the engine's globals are.
    pub globals: Globals,
    /// `execute_ex`: one frame per VM invocation, where that invocation's
    /// PHP frames go among the native ones.
    pub execute_ex: Range<u64>,
    /// The cold parts GCC split out of `execute_ex` (its error paths),
    /// whose frames are `execute_ex`'s too.
    pub execute_ex_cold: Vec<Range<u64>>,
    /// A PC in `execute_ex`'s body, as which JIT code is unwound.
    pub vm_body_pc: u64,
    /// Where the file's segments load.
    segments: LoadSegments,
}

/// Where a build keeps `executor_globals`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Globals {
    /// NTS: the global's address.
    Global(u64),
    /// ZTS: the address of `executor_globals_offset` (set at startup), and
    /// where `_tsrm_ls_cache` is from the thread pointer.
    Tsrm {
        /// `executor_globals_offset`.
        offset_variable: u64,
        /// `_tsrm_ls_cache`'s offset.
        tls: TlsOffset,
    },
}

/// `_tsrm_ls_cache`'s offset from the thread pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsOffset {
    /// Fixed at link time (the executable's own TLS).
    Constant(i64),
    /// In this GOT slot, which the dynamic loader fills (`libphp.so`).
    GotSlot(u64),
}

/// The TLS offset `tsrm_get_ls_cache_tcb_offset`'s code (at `at`) returns.
fn tls_offset(at: u64, code: &[u8]) -> Option<TlsOffset> {
    let imm = i32::from_le_bytes(code.get(3..7)?.try_into().ok()?);
    match code.get(..3)? {
        // mov $imm32, %rax (sign-extended)
        [0x48, 0xc7, 0xc0] => Some(TlsOffset::Constant(i64::from(imm))),
        // mov disp32(%rip), %rax
        [0x48, 0x8b, 0x05] => Some(TlsOffset::GotSlot(
            at.checked_add(7)?.checked_add_signed(i64::from(imm))?,
        )),
        _ => None,
    }
}

/// Whether a file name may be PHP's engine: `php`, `php8.2`, `php-fpm8.2`,
/// `php-cgi`, `libphp.so`, `libphp8.so`, `libphp-8.4.so`.
pub fn is_php_name(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    let versioned = |rest: &str| rest.chars().all(|c| c.is_ascii_digit() || c == '.');
    if let Some(rest) = name.strip_prefix("libphp") {
        return rest.contains(".so");
    }
    let Some(rest) = name.strip_prefix("php") else {
        return false;
    };
    let rest = rest
        .strip_prefix("-fpm")
        .or_else(|| rest.strip_prefix("-cgi"))
        .unwrap_or(rest);
    versioned(rest)
}

/// Reads what icecore needs of a PHP file.
pub fn inspect(path: &Path) -> Result<PhpBinary, DetectError> {
    let shown = || path.display().to_string();
    let cache = open_elf(path)?;
    let elf = parse_elf(path, &cache)?;
    let mut execute_ex = None;
    let mut globals = None;
    let mut offset_variable = None;
    let mut tcb_offset = None;
    for symbol in elf.dynamic_symbols().chain(elf.symbols()) {
        if symbol.is_undefined() {
            continue;
        }
        match symbol.name() {
            Ok("execute_ex") => {
                execute_ex = Some(symbol.address()..symbol.address() + symbol.size().max(1));
            }
            Ok("executor_globals") => globals = Some(symbol.address()),
            Ok("executor_globals_offset") => offset_variable = Some(symbol.address()),
            Ok("tsrm_get_ls_cache_tcb_offset") => tcb_offset = Some(symbol.address()),
            _ => {}
        }
    }
    let execute_ex = execute_ex.ok_or_else(|| DetectError::NotPhp(shown()))?;
    let (version, thread_safe) = version(&elf).ok_or_else(|| DetectError::NoVersion(shown()))?;
    let mut parts = version.split('.').map(str::parse::<u8>);
    let (major, minor) = match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor),
        _ => return Err(DetectError::NoVersion(shown())),
    };
    let layout = layout((major, minor)).ok_or_else(|| DetectError::Unsupported {
        path: shown(),
        major,
        minor,
    })?;
    let globals = if thread_safe {
        let offset_variable = offset_variable
            .ok_or_else(|| DetectError::NoGlobals(shown(), "no executor_globals_offset"))?;
        let tls = tcb_offset
            .and_then(|at| tls_offset(at, &bytes_at(&elf, at, 8)?))
            .ok_or_else(|| {
                DetectError::NoGlobals(shown(), "no tsrm_get_ls_cache_tcb_offset to read")
            })?;
        Globals::Tsrm {
            offset_variable,
            tls,
        }
    } else {
        Globals::Global(
            globals.ok_or_else(|| DetectError::NoGlobals(shown(), "no executor_globals"))?,
        )
    };
    // A PC strictly inside the body's row, so that as a return address
    // (looked up one byte lower) it stays in the row.
    let vm_body_pc = widest_unwind_row(&elf, execute_ex.start)
        .filter(|body| body.end - body.start >= 2)
        .map_or(0, |body| body.start + 1);
    let execute_ex_cold = bytes_at(&elf, execute_ex.start, execute_ex.end - execute_ex.start)
        .map(|code| cold_parts(&elf, execute_ex.clone(), &code))
        .unwrap_or_default();
    Ok(PhpBinary {
        layout,
        version,
        globals,
        execute_ex_cold,
        execute_ex,
        vm_body_pc,
        segments: LoadSegments::of(&elf),
    })
}

/// The version (`8.2.36`) and whether the build is thread-safe, from the
/// file's read-only data.
fn version<'a, R: object::ReadRef<'a>>(elf: &object::File<'a, R>) -> Option<(String, bool)> {
    let rodata = elf.section_by_name(".rodata")?.data().ok()?;
    let at = find(rodata, VERSION_MARKER)? + VERSION_MARKER.len();
    let digits = &rodata[at..];
    let end = digits
        .iter()
        .position(|&b| !(b.is_ascii_digit() || b == b'.'))
        .unwrap_or(digits.len().min(16));
    let version = std::str::from_utf8(&digits[..end])
        .ok()?
        .trim_end_matches('.');
    // The module build ID: `API20220829,NTS` or `API20220829,TS`.
    let thread_safe = find(rodata, b",TS\0").is_some() && find(rodata, b",NTS\0").is_none();
    (!version.is_empty()).then(|| (version.to_owned(), thread_safe))
}

/// The first position of `needle` in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl RuntimeFile for PhpBinary {
    fn load_bias(&self, mapping_start: u64, file_offset: u64) -> Option<u64> {
        self.segments.load_bias(mapping_start, file_offset)
    }
}

impl ProbeFailure for DetectError {
    fn is_refusal(&self) -> bool {
        // A `php` launcher or tool that is not the engine is no refusal.
        !matches!(self, DetectError::NotPhp(_) | DetectError::File(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn php_files_are_told_by_name() {
        for yes in [
            "/usr/bin/php8.2",
            "/usr/bin/php",
            "/usr/sbin/php-fpm8.4",
            "/usr/bin/php-cgi",
            "/usr/lib/apache2/modules/libphp8.2.so",
            "/usr/lib/libphp.so",
        ] {
            assert!(is_php_name(yes), "{yes}");
        }
        for no in [
            "/usr/bin/phpize",
            "/usr/bin/php-config8.2",
            "/usr/lib/libc.so.6",
        ] {
            assert!(!is_php_name(no), "{no}");
        }
    }

    #[test]
    fn the_tls_offset_is_read_from_the_functions_code() {
        // An executable's (the linker relaxed the GOT load to a constant).
        let code = [0x48, 0xc7, 0xc0, 0xe8, 0xff, 0xff, 0xff, 0xc3];
        assert_eq!(
            tls_offset(0x3c6a10, &code),
            Some(TlsOffset::Constant(-0x18))
        );
        // A shared library's: the offset is in the GOT.
        let code = [0x48, 0x8b, 0x05, 0x10, 0x00, 0x01, 0x00, 0xc3];
        assert_eq!(tls_offset(0x1000, &code), Some(TlsOffset::GotSlot(0x11017)));
        assert_eq!(tls_offset(0x1000, &[0x90; 8]), None);
        assert_eq!(tls_offset(0x1000, &[0x48, 0xc7]), None);
    }

    #[test]
    fn every_php_on_the_machine_is_described() {
        let found = super::super::tests::interpreters();
        for php in &found {
            let binary = inspect(&php.binary).unwrap_or_else(|e| panic!("{}: {e}", php.label));
            assert_eq!(binary.version, php.version, "{}", php.label);
            assert!(binary.vm_body_pc > binary.execute_ex.start, "{}", php.label);
            assert!(binary.vm_body_pc < binary.execute_ex.end, "{}", php.label);
            println!(
                "{}: {} execute_ex {:#x?} (cold parts {:#x?}) body pc {:#x}",
                php.label,
                binary.version,
                binary.execute_ex,
                binary.execute_ex_cold,
                binary.vm_body_pc
            );
            // GCC splits execute_ex's error paths out in every build here.
            assert_eq!(binary.execute_ex_cold.len(), 1, "{}", php.label);
            let cold = &binary.execute_ex_cold[0];
            assert!(cold.end <= binary.execute_ex.start || cold.start >= binary.execute_ex.end);
        }
    }
}
