//! The CRuby (MRI) control-frame walk that runs in BPF, and the per-process
//! data it needs.
//!
//! BPF finds the sampled thread's execution context (EC) through the
//! thread's TLS (`ruby_current_ec`, reached through the DTV from the task's
//! FS base, so every thread gets its own stack), or, where user space found
//! no TLS slot, through the main ractor's `running_ec` (the thread holding
//! the GVL, whose context no other thread takes). From the EC it walks the control frames from the newest
//! (`ec->cfp`) towards the VM stack's end, one frame per step. Per Ruby
//! frame it reports the iseq's address and the frame's `pc`; per C-function
//! frame the callable method entry; user space reads names, paths and line
//! tables. Which fields sit where is per-version data user space fills in
//! ([`RubyProcess`]), so this code has no version branches.

use crate::{
    Counter, MemoryReader, ProgramIndex,
    memory::tls_block,
    runtime::{BpfRuntime, TagRange},
};

/// CRuby's BPF half.
pub const CRUBY: BpfRuntime = BpfRuntime {
    name: "cruby",
    program: ProgramIndex::Ruby,
    program_name: "unwind_ruby",
    tags: TagRange { first: 0x20 },
    counters: &[
        Counter::RubyFrames,
        Counter::RubyNoExecutionContext,
        Counter::RubyReadFailed,
        Counter::RubyStackTruncated,
        Counter::RubyProcessMissing,
    ],
};

/// CRuby's word tags (16 values from `0x20`).
pub const TAGS: TagRange = CRUBY.tags;

/// CRuby's local word tags (see [`crate::runtime::TagRange`]).
pub mod word {
    /// A Ruby frame: the iseq's address; the next word is a [`PC`] word.
    pub const ISEQ: u8 = 0;
    /// A Ruby frame that `rb_vm_exec` entered (`VM_FRAME_FLAG_FINISH`):
    /// the outermost frame of one VM invocation, so the place where the
    /// invocation's native `vm_exec_core` frame stands.
    pub const ENTRY_ISEQ: u8 = 1;
    /// The word after an iseq word: the frame's `pc` (the next instruction).
    pub const PC: u8 = 2;
    /// A C-function frame: its `ep[-2]`, the callable method entry (0 when
    /// it is a special constant; user space checks that it is one).
    pub const CFUNC: u8 = 3;
    /// The word after a method's (local) frame's [`PC`] word: its `ep[-2]`,
    /// the method entry or, outside methods, a cref; user space tells them
    /// apart and learns the method's class from it.
    pub const METHOD: u8 = 4;
    /// The process has no entry in BPF's map (user space could not describe
    /// it yet): the only word of the run, so user space tries again.
    pub const NOT_DESCRIBED: u8 = 5;
}

/// How BPF finds the sampled thread's execution context (values of
/// [`RubyProcess::ec_kind`]).
pub mod ec_kind {
    /// Through the thread's TLS: `*(*(*(fs_base + 8) + 16 * tls_module) + tls_offset)`.
    pub const TLS_DTV: u8 = 0;
    /// Through `*(*main_ractor_pointer + running_ec)`: the GVL holder's,
    /// taken only by the thread it belongs to (its `pthread_t`, the address
    /// of glibc's thread descriptor, is the thread's FS base).
    pub const RUNNING_EC: u8 = 1;
}

/// [`RubyProcess::native_thread_pthread`] when the word at
/// [`RubyProcess::thread_pthread`] is the `pthread_t` itself (3.1).
pub const PTHREAD_IN_THREAD: u16 = u16::MAX;

/// `ep[0]` flag bits and values, the same in 3.1 to 3.4 (`vm_core.h`).
pub mod frame_flags {
    /// Selects the frame's magic.
    pub const MAGIC_MASK: u64 = 0x7fff_0001;
    /// A C function's frame.
    pub const MAGIC_CFUNC: u64 = 0x5555_0001;
    /// The frame `rb_vm_exec` started at.
    pub const FINISH: u64 = 0x20;
    /// A frame that is not a Ruby (iseq) frame.
    pub const CFRAME: u64 = 0x80;
    /// The frame's environment is its method's own (not a block's).
    pub const LOCAL: u64 = 0x2;
}

/// CRuby's state area between tail calls.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RubyWalkState {
    /// The next control frame to walk; 0 when the walk is over.
    pub next: u64,
    /// The oldest control frame to walk (inclusive).
    pub last: u64,
    /// Frames walked (counted once, when the walk ends).
    pub frames: u16,
    /// 1 once the sampled thread's execution context was looked up.
    pub started: u8,
    /// Zero.
    pub reserved: [u8; 5],
}

const _: () = assert!(core::mem::size_of::<RubyWalkState>() == 24);

impl RubyWalkState {
    /// The state before a sample's walk.
    #[inline(always)]
    pub fn reset(&mut self) {
        self.next = 0;
        self.last = 0;
        self.frames = 0;
        self.started = 0;
    }
}

/// Control frames walked per sample at most.
pub const MAX_RUBY_FRAMES: u16 = 256;

/// CRuby processes BPF holds data for at once.
pub const RUBY_PROCESSES_MAX: u32 = 4096;

/// What BPF needs to walk one CRuby process's control frames.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RubyProcess {
    /// With [`ec_kind::RUNNING_EC`]: the address of a pointer to the main
    /// ractor (`ruby_single_main_ractor`), or 0.
    pub main_ractor_pointer: u64,
    /// With [`ec_kind::TLS_DTV`]: libruby's TLS module ID (its DTV index).
    pub tls_module: u32,
    /// With [`ec_kind::TLS_DTV`]: `ruby_current_ec`'s offset in libruby's TLS block.
    pub tls_offset: u32,
    /// `rb_ractor_t.threads.running_ec`.
    pub running_ec: u16,
    /// `sizeof(rb_control_frame_t)`: 64 (3.1, 3.2) or 56 (3.3+).
    pub control_frame_size: u16,
    /// With [`ec_kind::RUNNING_EC`]: `rb_execution_context_t.thread_ptr`.
    pub ec_thread: u16,
    /// With [`ec_kind::RUNNING_EC`]: `rb_thread_t.thread_id` (3.1) or
    /// `rb_thread_t.nt` (3.2+).
    pub thread_pthread: u16,
    /// With [`ec_kind::RUNNING_EC`]: `rb_native_thread.thread_id`, or
    /// [`PTHREAD_IN_THREAD`].
    pub native_thread_pthread: u16,
    /// One of [`ec_kind`].
    pub ec_kind: u8,
    /// Zero.
    pub reserved: [u8; 5],
}

const _: () = assert!(core::mem::size_of::<RubyProcess>() == 32);

/// Offsets that are the same in every supported version (3.1 to 3.4).
mod fixed {
    /// `rb_execution_context_t.vm_stack`.
    pub const EC_VM_STACK: u64 = 0;
    /// `rb_execution_context_t.vm_stack_size` (in VALUE words).
    pub const EC_VM_STACK_SIZE: u64 = 8;
    /// `rb_execution_context_t.cfp`.
    pub const EC_CFP: u64 = 16;
    /// `rb_control_frame_t.pc`.
    pub const CFP_PC: u64 = 0;
    /// `rb_control_frame_t.iseq`.
    pub const CFP_ISEQ: u64 = 16;
    /// `rb_control_frame_t.ep`.
    pub const CFP_EP: u64 = 32;
    /// `ep[-2]`: the method entry or cref (`VM_ENV_DATA_INDEX_ME_CREF`).
    pub const EP_ME_CREF: u64 = 16;
    /// Largest VM stack accepted, in words (the default is 131072).
    pub const MAX_VM_STACK_WORDS: u64 = 1 << 24;
}

/// The control frames of one execution context still to walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlFrames {
    /// The next frame to read.
    pub next: u64,
    /// The oldest frame to read (inclusive): the VM stack's last slot is a
    /// dummy frame and is left out.
    pub last: u64,
}

/// What one walk step produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RubyStep {
    /// A Ruby frame: an [`word::ISEQ`] or [`word::ENTRY_ISEQ`] word, a
    /// [`word::PC`] word and, for a method's own frame, a [`word::METHOD`] word.
    Iseq {
        /// The tagged iseq address.
        iseq_word: u64,
        /// The tagged `pc`.
        pc_word: u64,
        /// The tagged `ep[-2]` of a method's own frame; 0 for a block's.
        method_word: u64,
    },
    /// A C function's frame: a [`word::CFUNC`] word.
    Cfunc(u64),
    /// A frame that shows nothing (an internal or not yet started frame).
    Skipped,
    /// Memory the step needed could not be read.
    ReadFailed,
}

impl RubyProcess {
    /// The sampled thread's execution context; `None` when it runs no Ruby
    /// (no EC), does not hold the GVL (with [`ec_kind::RUNNING_EC`]), or
    /// memory could not be read. `fs_base` is the thread's.
    #[inline(always)]
    pub fn execution_context<M: MemoryReader>(&self, fs_base: u64, memory: &mut M) -> Option<u64> {
        if self.ec_kind == ec_kind::TLS_DTV {
            let block = tls_block(fs_base, self.tls_module, memory)?;
            let ec = memory.read_u64(block.wrapping_add(u64::from(self.tls_offset)))?;
            return (ec != 0).then_some(ec);
        }
        if self.main_ractor_pointer == 0 {
            return None;
        }
        let ractor = memory.read_u64(self.main_ractor_pointer)?;
        if ractor == 0 {
            return None;
        }
        let ec = memory.read_u64(ractor.wrapping_add(u64::from(self.running_ec)))?;
        if ec == 0 {
            return None;
        }
        // The GVL holder's context is another thread's unless its thread
        // is this one: without this, a thread waiting for the GVL would be
        // given the holder's Ruby stack.
        let thread = memory.read_u64(ec.wrapping_add(u64::from(self.ec_thread)))?;
        let mut pthread = memory.read_u64(thread.wrapping_add(u64::from(self.thread_pthread)))?;
        if self.native_thread_pthread != PTHREAD_IN_THREAD {
            pthread =
                memory.read_u64(pthread.wrapping_add(u64::from(self.native_thread_pthread)))?;
        }
        (fs_base != 0 && pthread == fs_base).then_some(ec)
    }

    /// The frames of `ec`, checked: `ec->cfp` inside the VM stack, on a
    /// frame boundary counted from the stack's end.
    #[inline(always)]
    pub fn control_frames<M: MemoryReader>(
        &self,
        ec: u64,
        memory: &mut M,
    ) -> Option<ControlFrames> {
        let stack = memory.read_u64(ec.wrapping_add(fixed::EC_VM_STACK))?;
        let words = memory.read_u64(ec.wrapping_add(fixed::EC_VM_STACK_SIZE))?;
        let cfp = memory.read_u64(ec.wrapping_add(fixed::EC_CFP))?;
        let size = u64::from(self.control_frame_size);
        if words == 0 || words > fixed::MAX_VM_STACK_WORDS || size == 0 {
            return None;
        }
        let end = stack.checked_add(words * 8)?;
        // The last slot is the dummy frame `Init_VM` or the thread's start
        // pushed; the one before it is the oldest real frame.
        let last = end.checked_sub(2 * size)?;
        if cfp < stack || cfp > last || (end - cfp) % size != 0 {
            return None;
        }
        Some(ControlFrames { next: cfp, last })
    }

    /// Reads the frame at `frames.next` and moves to its caller.
    #[inline(always)]
    pub fn step<M: MemoryReader>(&self, frames: &mut ControlFrames, memory: &mut M) -> RubyStep {
        let cfp = frames.next;
        frames.next = cfp.wrapping_add(u64::from(self.control_frame_size));
        // Fields in ascending order, so a windowed reader copies the frame once.
        let Some(pc) = memory.read_u64(cfp.wrapping_add(fixed::CFP_PC)) else {
            return RubyStep::ReadFailed;
        };
        let Some(iseq) = memory.read_u64(cfp.wrapping_add(fixed::CFP_ISEQ)) else {
            return RubyStep::ReadFailed;
        };
        let Some(ep) = memory.read_u64(cfp.wrapping_add(fixed::CFP_EP)) else {
            return RubyStep::ReadFailed;
        };
        // `ep[-2]..=ep[0]` in one read that leaves the window on the
        // control frames, the next of which follows this one.
        let Some([me_cref, _, flags]) = memory.read_words::<3>(ep.wrapping_sub(fixed::EP_ME_CREF))
        else {
            return RubyStep::ReadFailed;
        };
        // Special constants (nil is 8, small integers are odd) are no
        // objects; user space checks the rest (it reads the entry anyway).
        let me_cref = if me_cref & 7 != 0 || me_cref < 0x1000 {
            0
        } else {
            me_cref
        };
        if flags & frame_flags::MAGIC_MASK == frame_flags::MAGIC_CFUNC {
            return RubyStep::Cfunc(TAGS.word(word::CFUNC, me_cref));
        }
        // Internal frames (IFUNC, DUMMY), and iseq frames that have not
        // started (Ruby's own backtraces skip `pc == 0` too).
        if flags & frame_flags::CFRAME != 0 || iseq == 0 || pc == 0 {
            return RubyStep::Skipped;
        }
        let tag = if flags & frame_flags::FINISH != 0 {
            word::ENTRY_ISEQ
        } else {
            word::ISEQ
        };
        let method_word = if flags & frame_flags::LOCAL != 0 && me_cref != 0 {
            TAGS.word(word::METHOD, me_cref)
        } else {
            0
        };
        RubyStep::Iseq {
            iseq_word: TAGS.word(tag, iseq),
            pc_word: TAGS.word(word::PC, pc),
            method_word,
        }
    }
}

/// Whether there is room to walk another frame.
#[inline(always)]
pub fn more(frames: &ControlFrames) -> bool {
    frames.next <= frames.last
}

#[cfg(test)]
mod tests;
