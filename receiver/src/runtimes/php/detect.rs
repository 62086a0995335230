//! Finding the PHP engine in a process: which mapped file is it (`php`,
//! `php-fpm`, `php-cgi`, `libphp.so`), its version (the `X-Powered-By`
//! header it sends, in its read-only data), whether it is thread-safe (the
//! `API…,NTS`/`API…,TS` build ID), where `executor_globals` is, and where
//! `execute_ex`, the VM loop whose frames PHP's frames replace, is.

use std::{ops::Range, path::Path};

use object::{Object, ObjectSection, ObjectSymbol};

use super::layouts::{PhpLayout, SUPPORTED, layout};
use crate::runtimes::services::{
    ElfFileError, LoadSegments, ProbeFailure, RuntimeFile, open_elf, parse_elf, widest_unwind_row,
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
    /// A thread-safe (ZTS) build: its globals are per thread, found through
    /// TSRM, which icecore does not read yet.
    #[error("{0}: a thread-safe (ZTS) build, not supported yet (NTS builds are)")]
    ThreadSafe(String),
    /// An NTS build that does not export `executor_globals`.
    #[error("{0}: executor_globals not found")]
    NoGlobals(String),
}

/// What one PHP file offers, in ELF virtual addresses (add the load bias).
#[derive(Debug, Clone)]
pub struct PhpBinary {
    /// The version's struct layout.
    pub layout: PhpLayout,
    /// The version, as the file says it (`8.2.36`).
    pub version: String,
    /// `executor_globals`.
    pub executor_globals: u64,
    /// `execute_ex`: one frame per VM invocation, where that invocation's
    /// PHP frames go among the native ones.
    pub execute_ex: Range<u64>,
    /// A PC in `execute_ex`'s body, as which JIT code is unwound.
    pub vm_body_pc: u64,
    /// Where the file's segments load.
    segments: LoadSegments,
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
    for symbol in elf.dynamic_symbols().chain(elf.symbols()) {
        if symbol.is_undefined() {
            continue;
        }
        match symbol.name() {
            Ok("execute_ex") => {
                execute_ex = Some(symbol.address()..symbol.address() + symbol.size().max(1));
            }
            Ok("executor_globals") => globals = Some(symbol.address()),
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
    if thread_safe {
        return Err(DetectError::ThreadSafe(shown()));
    }
    let executor_globals = globals.ok_or_else(|| DetectError::NoGlobals(shown()))?;
    // A PC strictly inside the body's row, so that as a return address
    // (looked up one byte lower) it stays in the row.
    let vm_body_pc = widest_unwind_row(&elf, execute_ex.start)
        .filter(|body| body.end - body.start >= 2)
        .map_or(0, |body| body.start + 1);
    Ok(PhpBinary {
        layout,
        version,
        executor_globals,
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
    fn every_php_on_the_machine_is_described() {
        let found = super::super::tests::interpreters();
        for php in &found {
            let binary = inspect(&php.binary).unwrap_or_else(|e| panic!("{}: {e}", php.label));
            assert_eq!(binary.version, php.version, "{}", php.label);
            assert!(binary.vm_body_pc > binary.execute_ex.start, "{}", php.label);
            assert!(binary.vm_body_pc < binary.execute_ex.end, "{}", php.label);
            println!(
                "{}: {} execute_ex {:#x?} body pc {:#x}",
                php.label, binary.version, binary.execute_ex, binary.vm_body_pc
            );
        }
    }
}
