//! The CPython frame walk that runs in BPF, and the per-process data it needs.
//!
//! BPF only follows pointers: from `_PyRuntime` to the sampled thread's
//! `PyThreadState` (matched by `thread_id`, the thread's `pthread_self()`,
//! which on x86-64 is its FS base; every version has it, unlike
//! `native_thread_id`, so every thread of a multi-threaded program gets its
//! own stack), to its current frame, then
//! from frame to caller. Per frame it reports the code object's address and
//! the raw instruction position; user space reads names and line tables.
//! Which fields sit where is per-version data that user space fills in
//! ([`PythonProcess`]), so this code has no version branches.

use crate::{
    Counter, MemoryReader, ProgramIndex,
    runtime::{BpfRuntime, TagRange},
};

/// CPython's BPF half.
pub const CPYTHON: BpfRuntime = BpfRuntime {
    name: "cpython",
    program: ProgramIndex::Python,
    program_name: "unwind_python",
    tags: TagRange { first: 0x10 },
    counters: &[
        Counter::PythonFrames,
        Counter::PythonNoThreadState,
        Counter::PythonReadFailed,
        Counter::PythonStackTruncated,
        Counter::PythonProcessMissing,
    ],
};

/// CPython's local word tags (see [`crate::runtime::TagRange`]).
pub mod word {
    /// A frame: the code object's address; the next word is the frame's
    /// raw instruction position.
    pub const FRAME: u8 = 0;
    /// A frame that was the first one its `_PyEval_EvalFrameDefault` call
    /// evaluated: the outermost of that call's frames.
    pub const ENTRY_FRAME: u8 = 1;
    /// The boundary between two `_PyEval_EvalFrameDefault` calls, where the
    /// interpreter links a C-stack shim frame (3.12+); carries no payload.
    pub const CALL_BOUNDARY: u8 = 2;
    /// The word after a frame's: its raw instruction position (tagged like
    /// every runtime word, so that an untagged word is always a native frame).
    pub const INSTR: u8 = 3;
}

/// CPython's state area between tail calls.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PythonWalkState {
    /// The next frame to walk; 0 when the walk is over.
    pub frame: u64,
    /// Frames walked (counted once, when the walk ends).
    pub frames: u16,
    /// 1 once the sampled thread's current frame was looked up.
    pub started: u8,
    /// Zero.
    pub reserved: [u8; 5],
}

const _: () = assert!(core::mem::size_of::<PythonWalkState>() == 16);

impl PythonWalkState {
    /// The state before a sample's walk.
    #[inline(always)]
    pub fn reset(&mut self) {
        self.frame = 0;
        self.frames = 0;
        self.started = 0;
    }
}

/// An offset that the version does not have.
pub const NO_OFFSET: u16 = u16::MAX;

/// CPython processes BPF holds data for at once.
pub const PYTHON_PROCESSES_MAX: u32 = 4096;

/// Threads of one interpreter searched for the sampled one, at most.
pub const MAX_PYTHON_THREADS: usize = 64;

/// How the version marks the outermost frame of a `_PyEval_EvalFrameDefault`
/// call (values of [`PythonProcess::entry_kind`]).
pub mod entry_kind {
    /// ≤ 3.10: each frame has its own call.
    pub const EVERY_FRAME: u8 = 0;
    /// 3.11: a bool `is_entry` at `entry_offset`.
    pub const IS_ENTRY: u8 = 1;
    /// 3.12+: a shim frame whose `owner` byte (at `entry_offset`) equals
    /// `cstack_owner` separates calls.
    pub const CSTACK_SHIM: u8 = 2;
}

/// What BPF needs to walk one CPython process's frames.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PythonProcess {
    /// Address of `_PyRuntime.interpreters.head` in the process.
    pub interpreters_head: u64,
    /// `PyInterpreterState` → first `PyThreadState`.
    pub interp_threads_head: u16,
    /// `PyThreadState.next`.
    pub tstate_next: u16,
    /// `PyThreadState.thread_id` (the thread's `pthread_self()`).
    pub tstate_thread_id: u16,
    /// `PyThreadState` → current frame (or `_PyCFrame`, see `cframe_current_frame`).
    pub tstate_frame: u16,
    /// `_PyCFrame.current_frame` (3.11, 3.12); [`NO_OFFSET`] otherwise.
    pub cframe_current_frame: u16,
    /// Frame → code object.
    pub frame_code: u16,
    /// Frame → calling frame.
    pub frame_previous: u16,
    /// Frame → instruction position (an int or a pointer, see `instr_is_int`).
    pub frame_instr: u16,
    /// Offset of the `is_entry` or `owner` byte; [`NO_OFFSET`] for `EVERY_FRAME`.
    pub entry_offset: u16,
    /// One of [`entry_kind`].
    pub entry_kind: u8,
    /// The `owner` value of a C-stack shim frame (`FRAME_OWNED_BY_CSTACK`).
    pub cstack_owner: u8,
    /// 1 when the instruction position is a 32-bit int (`f_lasti`), 0 for a pointer.
    pub instr_is_int: u8,
    /// 1 when frames live on the interpreter's own stack, each caller just
    /// below its callee (3.11+), so that one copy can serve several frames.
    pub frames_on_stack: u8,
    /// Bytes from a frame's start to the end of the last field the walk reads.
    pub frame_span: u8,
    /// Zero.
    pub reserved: u8,
}

const _: () = assert!(core::mem::size_of::<PythonProcess>() == 32);

/// What one walk step produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PythonStep {
    /// A frame: a tagged code-object word and the raw instruction position.
    Frame {
        /// A [`word::FRAME`] or [`word::ENTRY_FRAME`] word with the code object's address.
        code_word: u64,
        /// A [`word::INSTR`] word with `f_lasti`, `prev_instr` or
        /// `instr_ptr`, as the version stores it.
        instr: u64,
    },
    /// A C-stack shim frame: a [`word::CALL_BOUNDARY`] word.
    Boundary(u64),
    /// Memory the step needed could not be read.
    ReadFailed,
}

impl PythonProcess {
    /// The sampled thread's `PyThreadState`, found by its `pthread_self()`
    /// (`thread`) in the main interpreter's thread list (at most
    /// [`MAX_PYTHON_THREADS`] entries).
    #[inline(always)]
    pub fn thread_state<M: MemoryReader>(&self, thread: u64, memory: &mut M) -> Option<u64> {
        let interp = memory.read_u64(self.interpreters_head)?;
        if interp == 0 {
            return None;
        }
        let mut tstate =
            memory.read_u64(interp.wrapping_add(u64::from(self.interp_threads_head)))?;
        for _ in 0..MAX_PYTHON_THREADS {
            if tstate == 0 {
                return None;
            }
            // `next` first: it precedes `thread_id` in every version, so a
            // windowed reader serves both from one copy.
            let next = memory.read_u64(tstate.wrapping_add(u64::from(self.tstate_next)))?;
            let id = memory.read_u64(tstate.wrapping_add(u64::from(self.tstate_thread_id)))?;
            if id == thread {
                return Some(tstate);
            }
            tstate = next;
        }
        None
    }

    /// The frame `tstate` is executing; 0 when it runs no Python code.
    #[inline(always)]
    pub fn current_frame<M: MemoryReader>(&self, tstate: u64, memory: &mut M) -> Option<u64> {
        let frame = memory.read_u64(tstate.wrapping_add(u64::from(self.tstate_frame)))?;
        if self.cframe_current_frame == NO_OFFSET || frame == 0 {
            return Some(frame);
        }
        memory.read_u64(frame.wrapping_add(u64::from(self.cframe_current_frame)))
    }

    /// Reads the frame at `*frame` and moves `*frame` to its caller (0 at
    /// the outermost frame).
    #[inline(always)]
    pub fn step<M: MemoryReader>(&self, frame: &mut u64, memory: &mut M) -> PythonStep {
        let at = *frame;
        let field = |offset: u16| at.wrapping_add(u64::from(offset));
        // Fields in ascending offset order (code or previous first, then the
        // instruction, then the entry marker, in every version), so that a
        // windowed reader copies the frame once and serves the rest from it.
        let pair = if self.frame_code < self.frame_previous {
            memory
                .read_u64(field(self.frame_code))
                .zip(memory.read_u64(field(self.frame_previous)))
        } else {
            memory
                .read_u64(field(self.frame_previous))
                .zip(memory.read_u64(field(self.frame_code)))
                .map(|(previous, code)| (code, previous))
        };
        let Some((code, previous)) = pair else {
            return PythonStep::ReadFailed;
        };
        let Some(instr) = memory.read_u64(field(self.frame_instr)) else {
            return PythonStep::ReadFailed;
        };
        let mut tag = word::ENTRY_FRAME;
        if self.entry_kind != entry_kind::EVERY_FRAME {
            // The marker is a byte; its aligned word keeps windowed reads
            // in the window (an unaligned read is a helper call of its own).
            let Some(marker_word) = memory.read_u64(field(self.entry_offset & !7)) else {
                return PythonStep::ReadFailed;
            };
            let marker = (marker_word >> ((self.entry_offset & 7) * 8)) as u8;
            if self.entry_kind == entry_kind::CSTACK_SHIM && marker == self.cstack_owner {
                *frame = previous;
                return PythonStep::Boundary(CPYTHON.tags.word(word::CALL_BOUNDARY, 0));
            }
            if self.entry_kind == entry_kind::CSTACK_SHIM || marker == 0 {
                tag = word::FRAME;
            }
        }
        let instr = if self.instr_is_int != 0 {
            instr & 0xffff_ffff
        } else {
            instr
        };
        *frame = previous;
        PythonStep::Frame {
            code_word: CPYTHON.tags.word(tag, code),
            instr: CPYTHON.tags.word(word::INSTR, instr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::memory::test_image::Image;

    /// 3.12-like offsets: cframe indirection, pointer positions, shims.
    fn process() -> PythonProcess {
        PythonProcess {
            interpreters_head: 0x1000,
            interp_threads_head: 0x10,
            tstate_next: 0x8,
            tstate_thread_id: 0x20,
            tstate_frame: 0x30,
            cframe_current_frame: 0x8,
            frame_code: 0x0,
            frame_previous: 0x8,
            frame_instr: 0x38,
            entry_offset: 0x46,
            entry_kind: entry_kind::CSTACK_SHIM,
            cstack_owner: 3,
            instr_is_int: 0,
            frames_on_stack: 1,
            frame_span: 72,
            reserved: 0,
        }
    }

    #[test]
    fn finds_the_sampled_thread_and_walks_across_a_shim() {
        let p = process();
        let mut m = Image::default();
        m.put(0x1000, 0x2000); // interpreters.head
        m.put(0x2010, 0x3000); // threads.head: another thread
        m.put(0x3020, 0x7f00_0011);
        m.put(0x3008, 0x4000); // next: the thread sampled
        m.put(0x4020, 0x7f00_0012);
        m.put(0x4008, 0);
        m.put(0x4030, 0x5000); // cframe
        m.put(0x5008, 0x6000); // current_frame: A
        // A → shim → B → end
        m.put(0x6000, 0xc0dea);
        m.put(0x6008, 0x7000);
        m.put(0x6038, 0xc0dea + 0x60);
        m.put(0x7000, 0x7a4d); // the shim's code: the interpreter's trampoline
        m.put(0x7008, 0x8000);
        m.put(0x7038, 0);
        m.put(0x8000, 0xc0deb);
        m.put(0x8008, 0);
        m.put(0x8038, 0xc0deb + 0x80);

        assert_eq!(p.thread_state(0x7f00_0013, &mut m), None);
        let tstate = p.thread_state(0x7f00_0012, &mut m).unwrap();
        assert_eq!(tstate, 0x4000);
        let mut frame = p.current_frame(tstate, &mut m).unwrap();
        assert_eq!(frame, 0x6000);
        // The owner byte at 0x46 is byte 6 of the aligned word at 0x40.
        let mut m2 = m;
        m2.put(0x7040, 3 << 48);
        m2.put(0x6040, 0xffff); // other fields' bytes around the owner
        m2.put(0x8040, 0);
        assert_eq!(
            p.step(&mut frame, &mut m2),
            PythonStep::Frame {
                code_word: CPYTHON.tags.word(word::FRAME, 0xc0dea),
                instr: CPYTHON.tags.word(word::INSTR, 0xc0dea + 0x60)
            }
        );
        assert_eq!(
            p.step(&mut frame, &mut m2),
            PythonStep::Boundary(CPYTHON.tags.word(word::CALL_BOUNDARY, 0))
        );
        assert!(matches!(
            p.step(&mut frame, &mut m2),
            PythonStep::Frame { .. }
        ));
        assert_eq!(frame, 0);
        let mut bad = 0xdead_0000;
        assert_eq!(p.step(&mut bad, &mut m2), PythonStep::ReadFailed);
    }

    #[test]
    fn old_versions_mark_every_frame_and_truncate_int_positions() {
        let p = PythonProcess {
            cframe_current_frame: NO_OFFSET,
            entry_offset: NO_OFFSET,
            entry_kind: entry_kind::EVERY_FRAME,
            instr_is_int: 1,
            ..process()
        };
        let mut m = Image::default();
        m.put(0x9000, 0xc0de);
        m.put(0x9008, 0);
        m.put(0x9038, 0xffff_ffff_0000_0042); // int f_lasti = 0x42, junk above
        let mut frame = 0x9000;
        assert_eq!(
            p.step(&mut frame, &mut m),
            PythonStep::Frame {
                code_word: CPYTHON.tags.word(word::ENTRY_FRAME, 0xc0de),
                instr: CPYTHON.tags.word(word::INSTR, 0x42)
            }
        );
    }
}
