//! The CRuby unwinder program. Dispatched as a deferred runtime (see
//! `icecore_unwinders::runtime`): the native walk records each `vm_exec`
//! frame and, when it ends, runs this program, which appends the sampled
//! thread's control frames (walk in `icecore_unwinders::ruby`): per Ruby
//! frame its iseq, `pc` and, for a method's own frame, its method entry;
//! per C-function frame its method entry.

use crate::chain::Chain;
use icecore_unwinders::{
    Counter, ProgramIndex, WindowedReader,
    ruby::{ControlFrames, MAX_RUBY_FRAMES, RubyStep, TAGS, more, word},
    sample::flags,
};

use super::{append_word, append_words, finish, has_room, run_after_native_walk, scratch};
use crate::{
    maps::{RUBY_PROCESSES, continue_in, count, count_n},
    native::UserMemory,
};

/// Control frames walked per program run; tail calls continue.
const FRAMES_PER_PROGRAM: usize = 32;

/// Bytes a window read copies at once: the control frames are consecutive
/// on the VM stack (56 or 64 bytes each), so one copy serves about 16 of
/// them; each frame's `ep[-2]..=ep[0]` is one read of its own beside it.
const READ_BLOCK_BYTES: u32 = 1024;

pub fn unwind<C: Chain>(ctx: &C) -> u32 {
    let Some(scratch) = scratch::<C>(ProgramIndex::Ruby) else {
        return 0;
    };
    if run_after_native_walk(ctx, scratch, ProgramIndex::Ruby) {
        return 0;
    }
    let pid = scratch.record.header.pid;
    // SAFETY: only read; user space replaces entries whole.
    let Some(process) = (unsafe { RUBY_PROCESSES.get(pid) }) else {
        count(Counter::RubyProcessMissing);
        // Tells user space, which describes the process when it sees this.
        if has_room(&scratch.record, 1) {
            append_word(&mut scratch.record, TAGS.word(word::NOT_DESCRIBED, 0));
        }
        finish(ctx, scratch);
        return 0;
    };
    let walk = &mut scratch.state.runtimes.ruby;
    if walk.started == 0 {
        walk.started = 1;
        // Single words in different places: read one by one.
        let frames = crate::task::fs_base()
            .and_then(|thread| process.execution_context(thread, &mut UserMemory))
            .and_then(|ec| process.control_frames(ec, &mut UserMemory));
        let walk = &mut scratch.state.runtimes.ruby;
        match frames {
            Some(frames) => {
                walk.next = frames.next;
                walk.last = frames.last;
            }
            None => {
                count(Counter::RubyNoExecutionContext);
                walk.next = 0;
            }
        }
    }
    let mut memory = WindowedReader::with_block(&mut scratch.stack, UserMemory, READ_BLOCK_BYTES);
    for _ in 0..FRAMES_PER_PROGRAM {
        let walk = &scratch.state.runtimes.ruby;
        let mut frames = ControlFrames {
            next: walk.next,
            last: walk.last,
        };
        if frames.next == 0 || !more(&frames) {
            scratch.state.runtimes.ruby.next = 0;
            break;
        }
        if walk.frames >= MAX_RUBY_FRAMES || !has_room(&scratch.record, 3) {
            count(Counter::RubyStackTruncated);
            scratch.record.header.flags |= flags::INTERPRETER_TRUNCATED;
            scratch.state.runtimes.ruby.next = 0;
            break;
        }
        let step = process.step(&mut frames, &mut memory);
        let walk = &mut scratch.state.runtimes.ruby;
        walk.next = frames.next;
        match step {
            RubyStep::Iseq {
                iseq_word,
                pc_word,
                method_word,
            } => {
                walk.frames += 1;
                append_words(&mut scratch.record, iseq_word, pc_word);
                if method_word != 0 {
                    append_word(&mut scratch.record, method_word);
                }
            }
            RubyStep::Cfunc(cfunc_word) => {
                walk.frames += 1;
                append_word(&mut scratch.record, cfunc_word);
            }
            RubyStep::Skipped => {}
            RubyStep::ReadFailed => {
                count(Counter::RubyReadFailed);
                scratch.record.header.flags |= flags::INTERPRETER_INCOMPLETE;
                walk.next = 0;
                break;
            }
        }
    }
    if scratch.state.runtimes.ruby.next != 0 {
        if continue_in(ctx, &mut scratch.state, ProgramIndex::Ruby) {
            return 0;
        }
        count(Counter::RubyStackTruncated);
        scratch.record.header.flags |= flags::INTERPRETER_TRUNCATED;
    }
    // Counted once per sample rather than per frame: one map update.
    let walked = core::mem::take(&mut scratch.state.runtimes.ruby.frames);
    if walked != 0 {
        count_n(Counter::RubyFrames, u64::from(walked));
    }
    finish(ctx, scratch);
    0
}
