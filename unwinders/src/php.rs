//! The PHP (Zend engine) frame walk that runs in BPF, and the per-process
//! data it needs.
//!
//! Every PHP call, user function or internal (C) function, has a
//! `zend_execute_data` on the engine's VM stack, linked to its caller's by
//! `prev_execute_data`; the newest is `EG(current_execute_data)`. In NTS
//! builds (Debian's `php`, `php-fpm`) `EG` is the plain global
//! `executor_globals`; in ZTS builds it sits at `executor_globals_offset`
//! in the thread's TSRM block, which the static TLS variable
//! `_tsrm_ls_cache` points to (at a fixed offset from the thread pointer,
//! the FS base). The walk follows the chain from the newest frame and reports
//! per frame its `zend_function` and its `opline` (the instruction it runs
//! or, for a caller, the call it made): user space tells user functions from
//! internal ones, and finds names, files and lines, from the function.
//!
//! User code calling user code stays in one `execute_ex` invocation; C
//! calling PHP (`zend_call_function`, the script's start, a generator's
//! resumption) starts another, and marks the frame it starts with
//! `ZEND_CALL_TOP`. Such frames get a [`word::ENTRY_FUNCTION`] word, so user
//! space can put each invocation's frames in the place of its `execute_ex`
//! frame.
//!
//! The engine keeps the running frame's `opline` in a register (`r15` in
//! the GCC builds of the hybrid VM, `execute_data` in `r14`) and stores it
//! to the frame only before calls and on exceptions, so the newest frame's
//! saved `opline` may be stale. When the sample interrupted PHP with `r14`
//! equal to the newest frame, `r15` is reported too ([`word::LEAF_OPLINE`]);
//! user space uses it where it lies inside that frame's function.
//!
//! Which fields sit where is per-version data user space fills in
//! ([`PhpProcess`]), so this code has no version branches.

use crate::{
    Counter, MemoryReader, ProgramIndex,
    runtime::{BpfRuntime, TagRange},
};

/// PHP's BPF half.
pub const PHP: BpfRuntime = BpfRuntime {
    name: "php",
    program: ProgramIndex::Php,
    program_name: "unwind_php",
    tags: TagRange { first: 0x50 },
    counters: &[
        Counter::PhpFrames,
        Counter::PhpNoExecuteData,
        Counter::PhpReadFailed,
        Counter::PhpStackTruncated,
        Counter::PhpProcessMissing,
    ],
};

/// PHP's word tags (16 values from `0x50`).
pub const TAGS: TagRange = PHP.tags;

/// PHP's local word tags. A frame is a [`FUNCTION`] or [`ENTRY_FUNCTION`]
/// word followed by an [`OPLINE`] word.
pub mod word {
    /// A frame: its `zend_function` address.
    pub const FUNCTION: u8 = 0;
    /// A frame C code called (`ZEND_CALL_TOP`): the outermost frame of one
    /// `execute_ex` invocation when the function is user code.
    pub const ENTRY_FUNCTION: u8 = 1;
    /// The word after a function word: the frame's saved `opline`.
    pub const OPLINE: u8 = 2;
    /// Before the first frame: the running `opline` register at the sample,
    /// when the frame register held the newest frame.
    pub const LEAF_OPLINE: u8 = 3;
    /// The process has no entry in BPF's map (user space could not describe
    /// it yet): the only word of the run, so user space tries again.
    pub const NOT_DESCRIBED: u8 = 4;
}

/// How BPF finds the engine's globals (values of [`PhpProcess::globals_kind`]).
pub mod globals_kind {
    /// NTS: `executor_globals` is at [`super::PhpProcess::executor_globals`].
    pub const GLOBAL: u8 = 0;
    /// ZTS: `*(fs_base + tls_offset) + executor_globals` (`_tsrm_ls_cache`,
    /// then `executor_globals_offset`).
    pub const TSRM: u8 = 1;
}

/// PHP's state area between tail calls.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhpWalkState {
    /// The next `zend_execute_data` to walk; 0 when the walk is over.
    pub next: u64,
    /// Frames walked (counted once, when the walk ends).
    pub frames: u16,
    /// 1 once the newest frame was looked up.
    pub started: u8,
    /// Zero.
    pub reserved: [u8; 5],
}

const _: () = assert!(core::mem::size_of::<PhpWalkState>() == 16);

impl PhpWalkState {
    /// The state before a sample's walk.
    #[inline(always)]
    pub fn reset(&mut self) {
        self.next = 0;
        self.frames = 0;
        self.started = 0;
    }
}

/// Frames walked per sample at most.
pub const MAX_PHP_FRAMES: u16 = 256;

/// PHP processes BPF holds data for at once.
pub const PHP_PROCESSES_MAX: u32 = 4096;

/// What BPF needs to walk one PHP process's frames.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhpProcess {
    /// [`globals_kind::GLOBAL`]: the address of `executor_globals`;
    /// [`globals_kind::TSRM`]: `executor_globals_offset` (its value).
    pub executor_globals: u64,
    /// A PC inside `execute_ex`'s body, where its frame is whole: JIT code
    /// runs on `execute_ex`'s frame, so a JIT frame is unwound as this PC.
    /// 0 when the process has no JIT.
    pub vm_body_pc: u64,
    /// [`globals_kind::TSRM`]: `_tsrm_ls_cache`'s offset from the thread
    /// pointer (negative: static TLS lies below it).
    pub tls_offset: i64,
    /// The `ZEND_CALL_TOP` bit of a frame's call info.
    pub call_top: u32,
    /// `zend_executor_globals.current_execute_data`.
    pub current_execute_data: u16,
    /// `zend_execute_data.opline`.
    pub ex_opline: u16,
    /// `zend_execute_data.func`.
    pub ex_func: u16,
    /// `zend_execute_data.This.u1.type_info`, whose high bits are the call info.
    pub ex_call_info: u16,
    /// `zend_execute_data.prev_execute_data`.
    pub ex_prev: u16,
    /// One of [`globals_kind`].
    pub globals_kind: u8,
    /// Zero.
    pub reserved: u8,
}

const _: () = assert!(core::mem::size_of::<PhpProcess>() == 40);

/// Offsets past which a `zend_execute_data` field is not believed: the
/// struct is 80 bytes in every supported version.
const MAX_FIELD_OFFSET: u16 = 120;

/// What one walk step produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhpStep {
    /// A frame: a function word and an [`word::OPLINE`] word.
    Frame {
        /// The tagged function address ([`word::FUNCTION`] or [`word::ENTRY_FUNCTION`]).
        function_word: u64,
        /// The tagged saved `opline`.
        opline_word: u64,
    },
    /// A frame without a function (the engine's dummy frames).
    Skipped,
    /// The frame could not be read.
    ReadFailed,
}

impl PhpProcess {
    /// The address of the sampled thread's `executor_globals`; `None` when
    /// the thread has no TSRM block yet or it cannot be read.
    #[inline(always)]
    pub fn globals<M: MemoryReader>(&self, fs_base: u64, memory: &mut M) -> Option<u64> {
        if self.globals_kind == globals_kind::GLOBAL {
            return (self.executor_globals != 0).then_some(self.executor_globals);
        }
        if fs_base == 0 {
            return None;
        }
        let tsrm = memory.read_u64(fs_base.wrapping_add(self.tls_offset as u64))?;
        (tsrm != 0).then(|| tsrm.wrapping_add(self.executor_globals))
    }

    /// The sampled thread's newest frame (`EG(current_execute_data)`);
    /// `None` when it runs no PHP or memory could not be read.
    #[inline(always)]
    pub fn current_execute_data<M: MemoryReader>(
        &self,
        fs_base: u64,
        memory: &mut M,
    ) -> Option<u64> {
        let globals = self.globals(fs_base, memory)?;
        let ex = memory.read_u64(globals.wrapping_add(u64::from(self.current_execute_data)))?;
        (ex != 0).then_some(ex)
    }

    /// Reads the frame at `ex`; `next` becomes its caller's (0 at the end).
    #[inline(always)]
    pub fn step<M: MemoryReader>(&self, ex: u64, next: &mut u64, memory: &mut M) -> PhpStep {
        *next = 0;
        if ex & 7 != 0
            || self.ex_prev > MAX_FIELD_OFFSET
            || self.ex_func > MAX_FIELD_OFFSET
            || self.ex_call_info > MAX_FIELD_OFFSET
            || self.ex_opline > MAX_FIELD_OFFSET
        {
            return PhpStep::ReadFailed;
        }
        // Fields in ascending order (opline, func, This, prev), so that a
        // windowed reader copies the frame once.
        let Some(opline) = memory.read_u64(ex.wrapping_add(u64::from(self.ex_opline))) else {
            return PhpStep::ReadFailed;
        };
        let Some(function) = memory.read_u64(ex.wrapping_add(u64::from(self.ex_func))) else {
            return PhpStep::ReadFailed;
        };
        let Some(info) = memory.read_u64(ex.wrapping_add(u64::from(self.ex_call_info) & !7)) else {
            return PhpStep::ReadFailed;
        };
        let Some(prev) = memory.read_u64(ex.wrapping_add(u64::from(self.ex_prev))) else {
            return PhpStep::ReadFailed;
        };
        // The chain runs from newer to older frames, and older frames lie
        // lower on the VM stack unless the stack grew a new page: a frame
        // that links to itself would loop until the frame limit.
        *next = if prev == ex { 0 } else { prev };
        if function == 0 || function & 7 != 0 {
            return PhpStep::Skipped;
        }
        // The call info is the upper half of `This.u1.type_info`'s word
        // when that field sits at a 4-byte offset past a word boundary.
        let info = info >> ((u64::from(self.ex_call_info) & 4) * 8);
        let tag = if info & u64::from(self.call_top) != 0 {
            word::ENTRY_FUNCTION
        } else {
            word::FUNCTION
        };
        PhpStep::Frame {
            function_word: TAGS.word(tag, function),
            opline_word: TAGS.word(word::OPLINE, opline),
        }
    }
}

#[cfg(test)]
mod tests;
