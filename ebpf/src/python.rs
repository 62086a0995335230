//! The CPython unwinder program: runs after the native walk of a process the
//! CPython plugin described, and appends the sampled thread's Python frames
//! (see `icecore_unwinders::python` for the walk, and
//! `icecore_unwinders::interpreter` for the convention).

use aya_ebpf::programs::PerfEventContext;
use icecore_unwinders::{
    Counter, ProgramIndex, WindowedReader,
    python::PythonStep,
    sample::{INTERPRETER_WALK_START, MAX_FRAMES, flags},
};

use crate::{
    maps::{PYTHON_PROCESSES, SCRATCH, continue_in, count},
    native::UserMemory,
};

/// Python frames walked per program run; tail calls continue.
const FRAMES_PER_PROGRAM: usize = 32;

/// Bytes a read copies at once: a frame's fields (at most 112 bytes into a
/// 3.8 frame object) or a thread state's `next` and `thread_id` (128 bytes
/// apart in 3.12), where a 1 KiB copy would mostly be waste.
const READ_BLOCK_BYTES: u32 = 192;

pub fn unwind(ctx: &PerfEventContext) -> u32 {
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        count(Counter::ScratchUnavailable);
        return 0;
    };
    // SAFETY: per-CPU value owned by this CPU's tail-call chain.
    let scratch = unsafe { &mut *scratch };
    let pid = scratch.record.header.pid;
    // SAFETY: only read; user space replaces entries whole.
    let Some(process) = (unsafe { PYTHON_PROCESSES.get(&pid) }) else {
        count(Counter::PythonProcessMissing);
        crate::emit::emit(scratch);
        return 0;
    };
    // The window still holds the native stack; it refills where Python's
    // frames and thread states live.
    let mut memory = WindowedReader::with_block(&mut scratch.stack, UserMemory, READ_BLOCK_BYTES);
    if scratch.state.interpreter_frame == INTERPRETER_WALK_START {
        let frame = crate::task::fs_base()
            .and_then(|thread| process.thread_state(thread, &mut memory))
            .and_then(|tstate| process.current_frame(tstate, &mut memory));
        match frame {
            Some(frame) => scratch.state.interpreter_frame = frame,
            None => {
                count(Counter::PythonNoThreadState);
                scratch.state.interpreter_frame = 0;
            }
        }
    }
    for _ in 0..FRAMES_PER_PROGRAM {
        let mut frame = scratch.state.interpreter_frame;
        if frame == 0 {
            break;
        }
        let header = &scratch.record.header;
        let index = (header.kernel_frames + header.user_frames + header.interpreter_words) as usize;
        if index + 2 > MAX_FRAMES {
            count(Counter::PythonStackTruncated);
            scratch.record.header.flags |= flags::INTERPRETER_TRUNCATED;
            scratch.state.interpreter_frame = 0;
            break;
        }
        if process.frames_on_stack != 0 {
            memory.prefetch_below(frame, u64::from(process.frame_span));
        }
        let (first, second, used) = match process.step(&mut frame, &mut memory) {
            PythonStep::Frame { code_word, instr } => {
                scratch.state.python_frames += 1;
                (code_word, instr, 2)
            }
            PythonStep::Boundary(word) => (word, 0, 1),
            PythonStep::ReadFailed => {
                count(Counter::PythonReadFailed);
                scratch.record.header.flags |= flags::INTERPRETER_INCOMPLETE;
                scratch.state.interpreter_frame = 0;
                break;
            }
        };
        if let Some(slot) = scratch.record.frames.get_mut(index) {
            *slot = first;
        }
        if used == 2
            && let Some(slot) = scratch.record.frames.get_mut(index + 1)
        {
            *slot = second;
        }
        scratch.record.header.interpreter_words += used;
        scratch.state.interpreter_frame = frame;
    }
    if scratch.state.interpreter_frame != 0 {
        if continue_in(ctx, &mut scratch.state, ProgramIndex::Python) {
            return 0;
        }
        count(Counter::PythonStackTruncated);
        scratch.record.header.flags |= flags::INTERPRETER_TRUNCATED;
    }
    crate::emit::emit(scratch);
    0
}
