//! Finding CRuby in a process: which mapped file is the interpreter
//! (`libruby-3.X.so` or a static `ruby`), its version (`ruby_version`), its
//! struct layout, and where the running thread's execution context is.
//!
//! The execution context is `ruby_current_ec`, a TLS variable. From 3.3 on
//! Debian's stripped libruby no longer exports it (nor `ruby_current_vm_ptr`),
//! so its TLS slot is found the way libruby itself finds it: the exported
//! `rb_thread_current` starts by loading the address of its GOT pair (module
//! ID, offset in the module's TLS block) for `__tls_get_addr`. The pair's
//! values are read from the process (the dynamic loader writes the module
//! ID), and BPF follows the thread's DTV with them.

use std::{ops::Range, path::Path};

use object::{Object, ObjectSymbol};

use super::{
    code_facts::{Functions, callers_of, global_symbols, instruction_loop},
    layouts::{RubyLayout, SUPPORTED, layout},
};
use crate::runtimes::services::{
    ElfFileError, LoadSegments, ProbeFailure, RuntimeFile, bytes_at, eh_frame_functions, open_elf,
    parse_elf,
};
use icecore_unwinders::ruby::{RubyProcess, ec_kind};

/// `data16 lea disp32(%rip), %rdi`: the first instruction of a
/// general-dynamic TLS access (followed by `call __tls_get_addr`).
const TLS_GD_LEA: [u8; 4] = [0x66, 0x48, 0x8d, 0x3d];
/// Bytes of `rb_thread_current` searched for it (a stack adjustment may
/// come first).
const PROLOGUE_BYTES: u64 = 16;

/// Why a file is not a usable CRuby.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// The file could not be read as ELF.
    #[error(transparent)]
    File(#[from] ElfFileError),
    /// The file does not define `ruby_version` (not CRuby's interpreter).
    #[error("{0} defines no ruby_version")]
    NotRuby(String),
    /// `ruby_version` does not read as `X.Y.Z`.
    #[error("{path}: ruby_version reads {found:?}")]
    BadVersion {
        /// The file.
        path: String,
        /// What it holds.
        found: String,
    },
    /// A version icecore has no layout for.
    #[error("{path}: CRuby {major}.{minor} is not supported ({SUPPORTED} are)")]
    Unsupported {
        /// The file.
        path: String,
        /// Major version.
        major: u8,
        /// Minor version.
        minor: u8,
    },
    /// Neither the TLS slot of `ruby_current_ec` nor the main ractor could
    /// be found.
    #[error("{0}: neither ruby_current_ec's TLS slot nor ruby_single_main_ractor found")]
    NoExecutionContext(String),
    /// The VM's instruction loop, or the function each VM invocation runs
    /// it under, could not be found from the file's code and unwind data.
    #[error("{0}: vm_exec not found (no instruction table, or nothing calls its loop)")]
    NoVmExec(String),
}

/// What one CRuby file offers, in ELF virtual addresses (add the load bias).
#[derive(Debug, Clone)]
pub struct RubyBinary {
    /// The version's struct layout.
    pub layout: RubyLayout,
    /// The version, as `ruby_version` says it (`3.1.2`).
    pub version: String,
    /// The GOT pair of `ruby_current_ec`'s TLS slot.
    pub tls_got_pair: Option<u64>,
    /// `ruby_single_main_ractor`, where exported.
    pub main_ractor_pointer: Option<u64>,
    /// `vm_exec` (its parts): one frame per VM invocation, where that
    /// invocation's Ruby frames go among the native ones.
    pub vm_exec: Vec<Range<u64>>,
    /// `ruby_global_symbols` (names of IDs), where found.
    pub global_symbols: Option<u64>,
    /// Where the file's segments load.
    segments: LoadSegments,
}

/// Whether a file name is CRuby's: `libruby.so…`, `libruby-3.3.so.3.3.8`,
/// or a `ruby` executable (static builds).
pub fn is_ruby_name(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("libruby") && name.contains(".so")
        || name == "ruby"
        || name
            .strip_prefix("ruby")
            .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// Reads what icecore needs of a CRuby file.
pub fn inspect(path: &Path) -> Result<RubyBinary, DetectError> {
    let shown = || path.display().to_string();
    let cache = open_elf(path)?;
    let elf = parse_elf(path, &cache)?;
    let mut version_at = None;
    let mut thread_current = None;
    let mut main_ractor_pointer = None;
    for symbol in elf.dynamic_symbols().chain(elf.symbols()) {
        if symbol.is_undefined() {
            continue;
        }
        match symbol.name() {
            Ok("ruby_version") => version_at = Some((symbol.address(), symbol.size())),
            Ok("rb_thread_current") => thread_current = Some(symbol.address()),
            Ok("ruby_single_main_ractor") => main_ractor_pointer = Some(symbol.address()),
            _ => {}
        }
    }
    let (at, size) = version_at.ok_or_else(|| DetectError::NotRuby(shown()))?;
    let bytes = bytes_at(&elf, at, size.clamp(1, 32)).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes)
        .trim_end_matches('\0')
        .to_owned();
    let mut parts = text.split('.').map(str::parse::<u8>);
    let (major, minor) = match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor),
        _ => {
            return Err(DetectError::BadVersion {
                path: shown(),
                found: text,
            });
        }
    };
    let layout = layout((major, minor)).ok_or_else(|| DetectError::Unsupported {
        path: shown(),
        major,
        minor,
    })?;
    let tls_got_pair = thread_current.and_then(|at| {
        let code = bytes_at(&elf, at, PROLOGUE_BYTES + 8)?;
        tls_got_pair(at, &code)
    });
    if tls_got_pair.is_none() && main_ractor_pointer.is_none() {
        return Err(DetectError::NoExecutionContext(shown()));
    }
    let functions = Functions::new(eh_frame_functions(&elf));
    let vm_exec = instruction_loop(&elf, &functions)
        .map(|core| callers_of(&elf, &functions, core.start))
        .unwrap_or_default();
    if vm_exec.is_empty() {
        return Err(DetectError::NoVmExec(shown()));
    }
    let global_symbols = global_symbols(&elf, &functions);
    let segments = LoadSegments::of(&elf);
    Ok(RubyBinary {
        layout,
        version: text,
        tls_got_pair,
        main_ractor_pointer,
        vm_exec,
        global_symbols,
        segments,
    })
}

/// The GOT pair a general-dynamic TLS access at the start of `code` (at
/// virtual address `at`) loads.
fn tls_got_pair(at: u64, code: &[u8]) -> Option<u64> {
    let start = code
        .windows(TLS_GD_LEA.len())
        .take(PROLOGUE_BYTES as usize)
        .position(|w| w == TLS_GD_LEA)?;
    let disp = code.get(start + 4..start + 8)?;
    let disp = i32::from_le_bytes(disp.try_into().ok()?);
    let next = at.checked_add(start as u64 + 8)?;
    next.checked_add_signed(i64::from(disp))
}

impl RuntimeFile for RubyBinary {
    fn load_bias(&self, mapping_start: u64, file_offset: u64) -> Option<u64> {
        self.segments.load_bias(mapping_start, file_offset)
    }
}

impl ProbeFailure for DetectError {
    fn is_refusal(&self) -> bool {
        // A `ruby` launcher that links libruby is no refusal.
        !matches!(self, DetectError::NotRuby(_) | DetectError::File(_))
    }
}

impl RubyBinary {
    /// What BPF needs for the process that loaded this file at `bias`,
    /// reading the TLS pair the loader filled in; `None` when the process
    /// cannot be read or offers neither way to its execution context.
    pub fn bpf_process(
        &self,
        bias: u64,
        read_u64: impl Fn(u64) -> Option<u64>,
    ) -> Option<RubyProcess> {
        let base = RubyProcess {
            main_ractor_pointer: 0,
            tls_module: 0,
            tls_offset: 0,
            running_ec: self.layout.ractor_running_ec,
            control_frame_size: self.layout.control_frame_size,
            ec_thread: self.layout.ec_thread_ptr,
            thread_pthread: self.layout.thread_pthread,
            native_thread_pthread: self.layout.native_thread_pthread,
            ec_kind: ec_kind::RUNNING_EC,
            reserved: [0; 5],
        };
        if let Some(pair) = self.tls_got_pair {
            let pair = bias.wrapping_add(pair);
            let module = read_u64(pair)?;
            let offset = read_u64(pair.wrapping_add(8))?;
            // Module IDs are small; an offset lies inside a small block.
            if let (Ok(module @ 1..=4096), Ok(offset @ 0..=0xffff)) =
                (u32::try_from(module), u32::try_from(offset))
            {
                return Some(RubyProcess {
                    tls_module: module,
                    tls_offset: offset,
                    ec_kind: ec_kind::TLS_DTV,
                    ..base
                });
            }
        }
        let pointer = self.main_ractor_pointer?;
        Some(RubyProcess {
            main_ractor_pointer: bias.wrapping_add(pointer),
            ..base
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ruby_files_are_told_by_name() {
        for yes in [
            "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1.2",
            "/opt/ruby/lib/libruby.so.3.4",
            "/usr/bin/ruby",
            "/usr/bin/ruby3.3",
        ] {
            assert!(is_ruby_name(yes), "{yes}");
        }
        for no in ["/usr/bin/rubyx", "/usr/lib/libc.so.6", "/usr/bin/irb"] {
            assert!(!is_ruby_name(no), "{no}");
        }
    }

    #[test]
    fn the_tls_pair_is_read_from_the_lea_before_tls_get_addr() {
        // 3.1.2's `rb_thread_current`: `sub $8,%rsp`, then the lea at +4.
        let code = [
            0x48, 0x83, 0xec, 0x08, 0x66, 0x48, 0x8d, 0x3d, 0xac, 0xe2, 0x19, 0x00, 0x66, 0x66,
            0x48, 0xe8,
        ];
        assert_eq!(tls_got_pair(0x210790, &code), Some(0x3aea48));
        // 3.3.8's: the lea first.
        let code = [0x66, 0x48, 0x8d, 0x3d, 0x38, 0x4d, 0x22, 0x00, 0x66, 0x66];
        assert_eq!(tls_got_pair(0x23ad78, &code), Some(0x45fab8));
        assert_eq!(tls_got_pair(0x1000, &[0x90; 24]), None);
        assert_eq!(tls_got_pair(0x1000, &[0x66, 0x48, 0x8d, 0x3d, 1]), None);
    }
}
