//! The PHP unwinder program. Dispatched as a deferred runtime (see
//! `icecore_unwinders::runtime`): the native walk records each `execute_ex`
//! frame and, when it ends, runs this program, which appends the sampled
//! thread's PHP frames (walk in `icecore_unwinders::php`): per frame its
//! function and `opline`. Opcache's JIT code, which runs on `execute_ex`'s
//! own stack frame, is handed over during the native walk: the program
//! declares it a PC in `execute_ex`'s body and hands it back, so that it is
//! recorded and stepped as that frame.

use icecore_unwinders::{
    Counter, ProgramIndex, WindowedReader,
    php::{MAX_PHP_FRAMES, PhpProcess, PhpStep, TAGS, word},
    runtime::resume,
    sample::flags,
};

use super::{append_word, append_words, finish, hand_back, has_room, scratch};
use crate::{
    chain::Chain,
    maps::{PHP_PROCESSES, continue_in, count, count_n},
    native::UserMemory,
};

/// Frames walked per program run; tail calls continue.
const FRAMES_PER_PROGRAM: usize = 32;

/// Bytes a window read copies at once: a frame is 80 bytes plus its
/// arguments and locals, and callers lie below their callees on the VM
/// stack, so one copy often serves several frames.
const READ_BLOCK_BYTES: u32 = 512;

pub fn unwind<C: Chain>(ctx: &C) -> u32 {
    let Some(scratch) = scratch::<C>(ProgramIndex::Php) else {
        return 0;
    };
    let pid = scratch.record.header.pid;
    // SAFETY: only read; user space replaces entries whole.
    let process = unsafe { PHP_PROCESSES.get(pid) };
    if scratch.state.native_done == 0 {
        // Handed JIT code: it runs on `execute_ex`'s frame, so the frame is
        // unwound as `execute_ex`'s body (and later replaced by the frames
        // of that invocation); without a body PC, as native code.
        match process {
            Some(process) if process.vm_body_pc != 0 => {
                scratch.state.registers.ip = process.vm_body_pc;
                hand_back(ctx, scratch, resume::FRESH);
            }
            found => {
                if found.is_none() {
                    count(Counter::PhpProcessMissing);
                }
                hand_back(ctx, scratch, resume::NATIVE);
            }
        }
        return 0;
    }
    let Some(process) = process else {
        count(Counter::PhpProcessMissing);
        // Tells user space, which describes the process when it sees this.
        if has_room(&scratch.record, 1) {
            append_word(&mut scratch.record, TAGS.word(word::NOT_DESCRIBED, 0));
        }
        finish(ctx, scratch);
        return 0;
    };
    if scratch.state.runtimes.php.started == 0 {
        scratch.state.runtimes.php.started = 1;
        start(ctx, scratch, process);
    }
    let mut memory = WindowedReader::with_block(&mut scratch.stack, UserMemory, READ_BLOCK_BYTES);
    for _ in 0..FRAMES_PER_PROGRAM {
        let walk = &scratch.state.runtimes.php;
        let ex = walk.next;
        if ex == 0 {
            break;
        }
        if walk.frames >= MAX_PHP_FRAMES || !has_room(&scratch.record, 2) {
            count(Counter::PhpStackTruncated);
            scratch.record.header.flags |= flags::INTERPRETER_TRUNCATED;
            scratch.state.runtimes.php.next = 0;
            break;
        }
        let mut next = 0;
        let step = process.step(ex, &mut next, &mut memory);
        let walk = &mut scratch.state.runtimes.php;
        walk.next = next;
        match step {
            PhpStep::Frame {
                function_word,
                opline_word,
            } => {
                walk.frames += 1;
                append_words(&mut scratch.record, function_word, opline_word);
            }
            PhpStep::Skipped => {}
            PhpStep::ReadFailed => {
                count(Counter::PhpReadFailed);
                scratch.record.header.flags |= flags::INTERPRETER_INCOMPLETE;
                walk.next = 0;
                break;
            }
        }
    }
    if scratch.state.runtimes.php.next != 0 {
        if continue_in(ctx, &mut scratch.state, ProgramIndex::Php) {
            return 0;
        }
        count(Counter::PhpStackTruncated);
        scratch.record.header.flags |= flags::INTERPRETER_TRUNCATED;
    }
    // Counted once per sample rather than per frame: one map update.
    let walked = core::mem::take(&mut scratch.state.runtimes.php.frames);
    if walked != 0 {
        count_n(Counter::PhpFrames, u64::from(walked));
    }
    finish(ctx, scratch);
    0
}

/// Finds the sampled thread's newest frame and, when the interrupted
/// registers are that frame's (`r14`), appends the running `opline` (`r15`).
#[inline(always)]
fn start<C: Chain>(ctx: &C, scratch: &mut icecore_unwinders::UnwindScratch, process: &PhpProcess) {
    // NTS builds need no FS base (a ZTS lookup from 0 fails and is counted).
    let thread = crate::task::fs_base().unwrap_or(0);
    let newest = process.current_execute_data(thread, &mut UserMemory);
    let Some(newest) = newest else {
        count(Counter::PhpNoExecuteData);
        scratch.state.runtimes.php.next = 0;
        return;
    };
    scratch.state.runtimes.php.next = newest;
    if let Some(regs) = ctx.user_frame_registers()
        && regs.r14 == newest
        && has_room(&scratch.record, 1)
    {
        append_word(&mut scratch.record, TAGS.word(word::LEAF_OPLINE, regs.r15));
    }
}
