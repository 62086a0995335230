//! The CPython unwinder program. Dispatched as a deferred runtime (see
//! `icecore_unwinders::runtime`): the native walk records each
//! `_PyEval_EvalFrameDefault` frame and, when it ends, runs this program,
//! which appends the sampled thread's Python frames (walk in
//! `icecore_unwinders::python`).

use crate::chain::Chain;
use icecore_unwinders::{Counter, ProgramIndex, WindowedReader, python::PythonStep, sample::flags};

use super::{append_word, append_words, finish, has_room, run_after_native_walk, scratch};
use crate::{
    maps::{PYTHON_PROCESSES, continue_in, count, count_n},
    native::UserMemory,
};

/// Python frames walked per program run; tail calls continue.
const FRAMES_PER_PROGRAM: usize = 32;

/// Bytes a read copies at once: a frame's fields (at most 112 bytes into a
/// 3.8 frame object) or a thread state's `next` and `thread_id` (128 bytes
/// apart in 3.12), where a 1 KiB copy would mostly be waste.
const READ_BLOCK_BYTES: u32 = 192;

pub fn unwind<C: Chain>(ctx: &C) -> u32 {
    let Some(scratch) = scratch::<C>(ProgramIndex::Python) else {
        return 0;
    };
    if run_after_native_walk(ctx, scratch, ProgramIndex::Python) {
        return 0;
    }
    let pid = scratch.record.header.pid;
    // SAFETY: only read; user space replaces entries whole.
    let Some(process) = (unsafe { PYTHON_PROCESSES.get(pid) }) else {
        count(Counter::PythonProcessMissing);
        finish(ctx, scratch);
        return 0;
    };
    // The window still holds the native stack; it refills where Python's
    // frames and thread states live.
    let mut memory = WindowedReader::with_block(&mut scratch.stack, UserMemory, READ_BLOCK_BYTES);
    let walk = &mut scratch.state.runtimes.python;
    if walk.started == 0 {
        walk.started = 1;
        let frame = crate::task::fs_base()
            .and_then(|thread| process.thread_state(thread, &mut memory))
            .and_then(|tstate| process.current_frame(tstate, &mut memory));
        walk.frame = frame.unwrap_or_else(|| {
            count(Counter::PythonNoThreadState);
            0
        });
    }
    for _ in 0..FRAMES_PER_PROGRAM {
        let mut frame = scratch.state.runtimes.python.frame;
        if frame == 0 {
            break;
        }
        if !has_room(&scratch.record, 2) {
            count(Counter::PythonStackTruncated);
            scratch.record.header.flags |= flags::INTERPRETER_TRUNCATED;
            scratch.state.runtimes.python.frame = 0;
            break;
        }
        if process.frames_on_stack != 0 {
            memory.prefetch_below(frame, u64::from(process.frame_span));
        }
        let step = process.step(&mut frame, &mut memory);
        let walk = &mut scratch.state.runtimes.python;
        walk.frame = frame;
        match step {
            PythonStep::Frame { code_word, instr } => {
                walk.frames += 1;
                append_words(&mut scratch.record, code_word, instr);
            }
            PythonStep::Boundary(boundary) => {
                append_word(&mut scratch.record, boundary);
            }
            PythonStep::ReadFailed => {
                count(Counter::PythonReadFailed);
                scratch.record.header.flags |= flags::INTERPRETER_INCOMPLETE;
                walk.frame = 0;
                break;
            }
        }
    }
    let walk = &mut scratch.state.runtimes.python;
    if walk.frame != 0 {
        if continue_in(ctx, &mut scratch.state, ProgramIndex::Python) {
            return 0;
        }
        count(Counter::PythonStackTruncated);
        scratch.record.header.flags |= flags::INTERPRETER_TRUNCATED;
    }
    // Counted once per run rather than per frame: one map update.
    let walked = core::mem::take(&mut scratch.state.runtimes.python.frames);
    if walked != 0 {
        count_n(Counter::PythonFrames, u64::from(walked));
    }
    finish(ctx, scratch);
    0
}
