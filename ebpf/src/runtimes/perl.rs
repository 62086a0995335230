//! The Perl unwinder program. Dispatched as a deferred runtime (see
//! `icecore_unwinders::runtime`): the native walk records each run loop's
//! frame (`Perl_runops_standard`) and, when it ends, runs this program,
//! which appends the sampled thread's Perl frames (walk in
//! `icecore_unwinders::perl`): per sub call its CV and the COP its frame is
//! at, per `eval` its kind, and last the main program's frame.

use icecore_unwinders::{
    Counter, ProgramIndex,
    perl::{MAX_PERL_CONTEXTS, MAX_PERL_FRAMES, PerlStep, PerlWalkState, TAGS, word},
    sample::flags,
};

use super::{append_word, append_words, finish, has_room, run_after_native_walk, scratch};
use crate::{
    chain::Chain,
    maps::{PERL_PROCESSES, continue_in, count, count_n},
    native::UserMemory,
};

/// Contexts read per program run; tail calls continue.
const CONTEXTS_PER_PROGRAM: usize = 32;

pub fn unwind<C: Chain>(ctx: &C) -> u32 {
    let Some(scratch) = scratch::<C>(ProgramIndex::Perl) else {
        return 0;
    };
    if run_after_native_walk(ctx, scratch, ProgramIndex::Perl) {
        return 0;
    }
    let pid = scratch.record.header.pid;
    // SAFETY: only read; user space replaces entries whole.
    let Some(process) = (unsafe { PERL_PROCESSES.get(pid) }) else {
        count(Counter::PerlProcessMissing);
        // Tells user space, which describes the process when it sees this.
        if has_room(&scratch.record, 1) {
            append_word(&mut scratch.record, TAGS.word(word::NOT_DESCRIBED, 0));
        }
        finish(ctx, scratch);
        return 0;
    };
    let walk: &mut PerlWalkState = &mut scratch.state.runtimes.perl;
    if walk.started == 0 {
        walk.started = 1;
        let started = crate::task::fs_base()
            .and_then(|thread| process.interpreter(thread, &mut UserMemory))
            .is_some_and(|interpreter| process.start(interpreter, walk, &mut UserMemory));
        if !started {
            count(Counter::PerlNoInterpreter);
            walk.stackinfo = 0;
        }
    }
    for _ in 0..CONTEXTS_PER_PROGRAM {
        let walk = &mut scratch.state.runtimes.perl;
        if walk.stackinfo == 0 {
            break;
        }
        if walk.frames >= MAX_PERL_FRAMES
            || walk.contexts_read >= MAX_PERL_CONTEXTS
            || !has_room(&scratch.record, 2)
        {
            count(Counter::PerlStackTruncated);
            scratch.record.header.flags |= flags::INTERPRETER_TRUNCATED;
            scratch.state.runtimes.perl.stackinfo = 0;
            break;
        }
        let step = process.step(walk, &mut UserMemory);
        match step {
            PerlStep::Frame {
                frame_word,
                cop_word,
            } => {
                scratch.state.runtimes.perl.frames += 1;
                append_words(&mut scratch.record, frame_word, cop_word);
            }
            PerlStep::StackSwitch(switch_word) => {
                append_word(&mut scratch.record, switch_word);
            }
            PerlStep::Skipped | PerlStep::Done => {}
            PerlStep::ReadFailed => {
                count(Counter::PerlReadFailed);
                scratch.record.header.flags |= flags::INTERPRETER_INCOMPLETE;
                break;
            }
        }
    }
    if scratch.state.runtimes.perl.stackinfo != 0 {
        if continue_in(ctx, &mut scratch.state, ProgramIndex::Perl) {
            return 0;
        }
        count(Counter::PerlStackTruncated);
        scratch.record.header.flags |= flags::INTERPRETER_TRUNCATED;
    }
    // Counted once per sample rather than per frame: one map update.
    let walked = core::mem::take(&mut scratch.state.runtimes.perl.frames);
    if walked != 0 {
        count_n(Counter::PerlFrames, u64::from(walked));
    }
    finish(ctx, scratch);
    0
}
