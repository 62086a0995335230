//! The Perl context-stack walk that runs in BPF, and the per-process data
//! it needs.
//!
//! A Perl thread's interpreter (`PerlInterpreter`, `my_perl`) is found
//! through the thread's TLS variable `PL_current_context` (threaded builds,
//! as every Debian Perl is), else through the global `PL_curinterp`. The
//! interpreter's `curstackinfo` is the newest stack info; each holds an
//! array of contexts (`PERL_CONTEXT`, `si_cxstack[0..=si_cxix]`) and links
//! to the stack info it was pushed over (`si_prev`: a sort block, a tied
//! variable's method, a signal handler). The walk reads the contexts from
//! the newest, stack info after stack info, and reports per sub call its
//! CV and the COP (statement) its frame is at: `PL_curcop` for the newest,
//! the previous frame's `blk_oldcop` (the call site) for each older one.
//! The main program has no context of its own: it ends the walk, at the
//! COP the oldest sub was called from.
//!
//! Which fields sit where is per-version data user space fills in
//! ([`PerlProcess`]), so this code has no version branches; the context
//! type bits ([`cx`]) are the same in every supported version (5.36 to
//! 5.44, `scripts/perl-probe`).

use crate::{
    Counter, MemoryReader, ProgramIndex,
    memory::tls_block,
    runtime::{BpfRuntime, TagRange},
};

/// Perl's BPF half.
pub const PERL: BpfRuntime = BpfRuntime {
    name: "perl",
    program: ProgramIndex::Perl,
    program_name: "unwind_perl",
    tags: TagRange { first: 0x60 },
    counters: &[
        Counter::PerlFrames,
        Counter::PerlNoInterpreter,
        Counter::PerlReadFailed,
        Counter::PerlStackTruncated,
        Counter::PerlProcessMissing,
    ],
};

/// Perl's word tags (16 values from `0x60`).
pub const TAGS: TagRange = PERL.tags;

/// Perl processes BPF holds data for at once.
pub const PERL_PROCESSES_MAX: u32 = 4096;

/// Perl's local word tags. A frame is a [`SUB`], [`MULTICALL_SUB`],
/// [`EVAL`] or [`MAIN`] word followed by a [`COP`] word.
pub mod word {
    /// A sub's frame: its CV's address.
    pub const SUB: u8 = 0;
    /// A sub's frame that XS code runs again and again without a call
    /// (`MULTICALL`: `List::Util::first`, `sort SUBNAME`): each run is a
    /// run loop of its own, so this frame is the outermost of one.
    pub const MULTICALL_SUB: u8 = 1;
    /// An `eval` frame: its context's type byte (string eval, `eval {}` or
    /// `require`, see [`super::cx`]).
    pub const EVAL: u8 = 2;
    /// The main program's frame, the oldest.
    pub const MAIN: u8 = 3;
    /// The word after a frame word: the COP (statement) the frame is at,
    /// with [`super::CALLERS_STATEMENT`] set on the newest frame's when it
    /// is the statement its caller called it from.
    pub const COP: u8 = 4;
    /// The walk moved to an older stack info: the frames before this word
    /// ran in a run loop of their own.
    pub const STACK_SWITCH: u8 = 5;
    /// The process has no entry in BPF's map (user space could not
    /// describe it yet): the only word of the run, so user space tries again.
    pub const NOT_DESCRIBED: u8 = 6;
}

/// Set in the newest frame's [`word::COP`] payload when `PL_curcop` is the
/// statement its caller called it from: either the frame was entered and
/// has run no statement of its own yet (the call pushed its context, its
/// first statement has not set `PL_curcop`), or it is a recursive call at
/// the very statement that made it. User space tells them apart (the
/// caller's sub is the same in the second case).
pub const CALLERS_STATEMENT: u64 = 1 << 48;

/// Context type bits (`cop.h`), the same in 5.36 to 5.44.
pub mod cx {
    /// Selects the type.
    pub const TYPE_MASK: u8 = 0xf;
    /// `CXt_SUB`.
    pub const SUB: u8 = 9;
    /// `CXt_FORMAT`.
    pub const FORMAT: u8 = 10;
    /// `CXt_EVAL`.
    pub const EVAL: u8 = 11;
    /// `CXp_MULTICALL` (a sub's context).
    pub const MULTICALL: u8 = 0x10;
    /// `CXp_SUB_RE_FAKE` (a sub's context): a regex code block's, which
    /// `caller` skips.
    pub const SUB_RE_FAKE: u8 = 0x80;
    /// `CXp_REAL` (an eval's context): a string `eval`.
    pub const EVAL_STRING: u8 = 0x20;
    /// `CXp_EVALBLOCK` (an eval's context): `eval {}` (or `try {}`).
    pub const EVAL_BLOCK: u8 = 0x40;
    /// `CXp_TRY` (an eval's context): a `try {}` block, which `caller` skips.
    pub const TRY: u8 = 0x80;
}

/// How BPF finds the sampled thread's interpreter (values of
/// [`PerlProcess::context_kind`]).
pub mod context_kind {
    /// `*(fs_base + context_at)`: `PL_current_context` in the static TLS
    /// block of the executable (`/usr/bin/perl`), `context_at` negative.
    pub const STATIC_TLS: u8 = 0;
    /// `*(tls_block(tls_module) + context_at)`: `PL_current_context` in a
    /// library's TLS block (`libperl.so`), through the thread's DTV.
    pub const DTV: u8 = 1;
    /// `*context_at`: the global `PL_curinterp`, the first interpreter's
    /// (a build without a TLS context).
    pub const GLOBAL: u8 = 2;
}

/// Contexts read per sample at most (frames and skipped blocks alike).
pub const MAX_PERL_CONTEXTS: u16 = 512;

/// Perl frames reported per sample at most.
pub const MAX_PERL_FRAMES: u16 = 256;

/// A stack info with more contexts than this is taken as corrupt.
const MAX_CONTEXT_INDEX: u64 = 1 << 20;

/// Bytes of a context read at once: every field the walk needs lies in
/// its first 80 (user space checks the offsets).
pub const CONTEXT_READ_BYTES: u16 = 80;
const CONTEXT_WORDS: usize = CONTEXT_READ_BYTES as usize / 8;

/// What BPF needs to walk one Perl process's contexts.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerlProcess {
    /// Where the interpreter pointer is, per [`Self::context_kind`]: an
    /// offset from the FS base (two's complement), from the module's TLS
    /// block, or an address.
    pub context_at: u64,
    /// With [`context_kind::DTV`]: the TLS module ID of the file defining
    /// `PL_current_context`.
    pub tls_module: u32,
    /// `PerlInterpreter.Icurcop`.
    pub interp_curcop: u16,
    /// `PerlInterpreter.Icurstackinfo`.
    pub interp_curstackinfo: u16,
    /// `PERL_SI.si_cxstack`.
    pub si_cxstack: u16,
    /// `PERL_SI.si_prev`.
    pub si_prev: u16,
    /// `PERL_SI.si_cxix` (an `I32`).
    pub si_cxix: u16,
    /// `sizeof(PERL_CONTEXT)`.
    pub context_size: u16,
    /// `PERL_CONTEXT.blk_oldcop`; a multiple of 8 below [`CONTEXT_READ_BYTES`].
    pub cx_oldcop: u16,
    /// `PERL_CONTEXT.blk_sub.cv`; a multiple of 8 below [`CONTEXT_READ_BYTES`].
    pub cx_sub_cv: u16,
    /// `PERL_SI.si_cxsubix` (an `I32`): the newest sub, format or eval
    /// context whose push is complete.
    pub si_cxsubix: u16,
    /// One of [`context_kind`].
    pub context_kind: u8,
    /// Zero.
    pub reserved: u8,
}

const _: () = assert!(core::mem::size_of::<PerlProcess>() == 32);

/// Perl's state between tail calls (and between steps on the host).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerlWalkState {
    /// The stack info being walked; 0 when the walk is over.
    pub stackinfo: u64,
    /// Its context array.
    pub contexts: u64,
    /// The COP the next frame is at.
    pub cop: u64,
    /// The next context to read, counting down; -1 when the stack info is done.
    pub index: i32,
    /// Frames reported (counted once, when the walk ends).
    pub frames: u16,
    /// Contexts read.
    pub contexts_read: u16,
    /// 1 once the interpreter was looked up.
    pub started: u8,
    /// 1 once a frame was reported.
    pub reported: u8,
    /// Zero.
    pub reserved: [u8; 2],
    /// The stack info's `si_cxsubix`: a sub, format or eval context above
    /// it is being pushed or popped.
    pub complete_below: i32,
}

const _: () = assert!(core::mem::size_of::<PerlWalkState>() == 40);

impl PerlWalkState {
    /// The state before a sample's walk.
    #[inline(always)]
    pub fn reset(&mut self) {
        self.stackinfo = 0;
        self.contexts = 0;
        self.cop = 0;
        self.index = -1;
        self.frames = 0;
        self.contexts_read = 0;
        self.started = 0;
        self.reported = 0;
        self.complete_below = -1;
    }
}

/// What one walk step produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerlStep {
    /// A frame: its tagged frame word and the tagged COP word after it.
    Frame {
        /// A [`word::SUB`], [`word::MULTICALL_SUB`], [`word::EVAL`] or
        /// [`word::MAIN`] word.
        frame_word: u64,
        /// The [`word::COP`] word.
        cop_word: u64,
    },
    /// A [`word::STACK_SWITCH`] word: the walk went on in an older stack info.
    StackSwitch(u64),
    /// A context that is no frame (a loop, a block, a sort block, `try`).
    Skipped,
    /// The walk is over (after the [`word::MAIN`] frame).
    Done,
    /// Memory the step needed could not be read, or made no sense.
    ReadFailed,
}

impl PerlProcess {
    /// The sampled thread's interpreter; `None` when it has none (a thread
    /// Perl did not start) or memory could not be read. `fs_base` is the thread's.
    #[inline(always)]
    pub fn interpreter<M: MemoryReader>(&self, fs_base: u64, memory: &mut M) -> Option<u64> {
        let at = match self.context_kind {
            context_kind::STATIC_TLS => fs_base.wrapping_add(self.context_at),
            context_kind::DTV => {
                tls_block(fs_base, self.tls_module, memory)?.wrapping_add(self.context_at)
            }
            _ => self.context_at,
        };
        let interpreter = memory.read_u64(at)?;
        (interpreter != 0).then_some(interpreter)
    }

    /// Starts the walk of `interpreter`'s contexts in `state`; false when
    /// it has no stack info or its fields cannot be read.
    #[inline(always)]
    pub fn start<M: MemoryReader>(
        &self,
        interpreter: u64,
        state: &mut PerlWalkState,
        memory: &mut M,
    ) -> bool {
        let Some(cop) = memory.read_u64(interpreter.wrapping_add(u64::from(self.interp_curcop)))
        else {
            return false;
        };
        let Some(stackinfo) =
            memory.read_u64(interpreter.wrapping_add(u64::from(self.interp_curstackinfo)))
        else {
            return false;
        };
        state.cop = cop;
        self.enter(stackinfo, state, memory)
    }

    /// Makes `stackinfo` the one walked, from its newest context.
    #[inline(always)]
    fn enter<M: MemoryReader>(
        &self,
        stackinfo: u64,
        state: &mut PerlWalkState,
        memory: &mut M,
    ) -> bool {
        if stackinfo == 0 {
            return false;
        }
        let Some(contexts) = memory.read_u64(stackinfo.wrapping_add(u64::from(self.si_cxstack)))
        else {
            return false;
        };
        let Some(index) = memory.read_u64(stackinfo.wrapping_add(u64::from(self.si_cxix))) else {
            return false;
        };
        let Some(complete_below) =
            memory.read_u64(stackinfo.wrapping_add(u64::from(self.si_cxsubix)))
        else {
            return false;
        };
        // `si_cxix` is an I32 in the low half; -1 is an empty stack info.
        let index = index as u32 as i32;
        if index < -1 || index as i64 >= MAX_CONTEXT_INDEX as i64 || (contexts == 0 && index >= 0) {
            return false;
        }
        state.stackinfo = stackinfo;
        state.contexts = contexts;
        state.index = index;
        state.complete_below = complete_below as u32 as i32;
        true
    }

    /// Reads the next context (or moves to the older stack info, or ends
    /// the walk with the main program's frame).
    #[inline(always)]
    pub fn step<M: MemoryReader>(&self, state: &mut PerlWalkState, memory: &mut M) -> PerlStep {
        if state.stackinfo == 0 {
            return PerlStep::Done;
        }
        if state.index < 0 {
            let Some(older) =
                memory.read_u64(state.stackinfo.wrapping_add(u64::from(self.si_prev)))
            else {
                state.stackinfo = 0;
                return PerlStep::ReadFailed;
            };
            if older == 0 {
                // The main program: at the statement the oldest frame was
                // called from (or the one running, without any frame).
                state.stackinfo = 0;
                return PerlStep::Frame {
                    frame_word: TAGS.word(word::MAIN, 0),
                    cop_word: TAGS.word(word::COP, state.cop),
                };
            }
            if !self.enter(older, state, memory) {
                state.stackinfo = 0;
                return PerlStep::ReadFailed;
            }
            return PerlStep::StackSwitch(TAGS.word(word::STACK_SWITCH, 0));
        }
        let index = state.index;
        let at = state
            .contexts
            .wrapping_add((index as u64).wrapping_mul(u64::from(self.context_size)));
        state.index -= 1;
        state.contexts_read = state.contexts_read.saturating_add(1);
        let Some(words) = memory.read_words::<CONTEXT_WORDS>(at) else {
            state.stackinfo = 0;
            return PerlStep::ReadFailed;
        };
        let type_byte = words[0] as u8;
        // `cx_pushblock` counts a context in before it writes its fields,
        // and `cx_pushsub`/`cx_pusheval` record it in `si_cxsubix` only
        // once its CV is in place; popping clears the CV and restores
        // `si_cxsubix` before the caller's statement is back in
        // `PL_curcop`. A sub or eval context above `si_cxsubix` is in one
        // of those windows: its type, CV and call site may still be the
        // previous occupant's (CI run 10: a sample taken while `summed` was
        // being pushed named the sub under it at `summed`'s old call site),
        // so it is no frame, and `PL_curcop` stays the statement running.
        let kind = type_byte & cx::TYPE_MASK;
        if matches!(kind, cx::SUB | cx::FORMAT | cx::EVAL) && index > state.complete_below {
            return PerlStep::Skipped;
        }
        let field = |offset: u16| words.get(usize::from(offset / 8)).copied();
        let (frame_word, older_cop) = match kind {
            cx::SUB | cx::FORMAT if type_byte & cx::SUB_RE_FAKE == 0 => {
                let (Some(cv), Some(older_cop)) = (field(self.cx_sub_cv), field(self.cx_oldcop))
                else {
                    state.stackinfo = 0;
                    return PerlStep::ReadFailed;
                };
                let tag = if type_byte & cx::MULTICALL != 0 {
                    word::MULTICALL_SUB
                } else {
                    word::SUB
                };
                (TAGS.word(tag, cv), older_cop)
            }
            cx::EVAL if type_byte & cx::TRY == 0 => {
                let Some(older_cop) = field(self.cx_oldcop) else {
                    state.stackinfo = 0;
                    return PerlStep::ReadFailed;
                };
                (TAGS.word(word::EVAL, u64::from(type_byte)), older_cop)
            }
            _ => return PerlStep::Skipped,
        };
        let callers = state.reported == 0 && older_cop == state.cop;
        let flag = if callers { CALLERS_STATEMENT } else { 0 };
        let cop_word = TAGS.word(word::COP, state.cop | flag);
        state.reported = 1;
        state.cop = older_cop;
        PerlStep::Frame {
            frame_word,
            cop_word,
        }
    }
}

#[cfg(test)]
mod tests;
