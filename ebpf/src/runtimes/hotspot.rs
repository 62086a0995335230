//! The HotSpot unwinder program. Dispatched by handover (see
//! `icecore_unwinders::runtime`): the native unwinder stops at the first
//! frame whose PC is in the JIT's code cache and tail-calls this program
//! with that frame's registers. It walks Java frames (walk in
//! `icecore_unwinders::hotspot`) until the PC leaves the code cache (the
//! call stub's caller, or native code a JNI method called) and hands the
//! registers back, so the native frames around Java code stay in place.

use crate::chain::Chain;
use icecore_unwinders::{
    Counter, ProgramIndex, WindowedReader, hotspot::HotSpotStep, runtime::resume, sample::flags,
};

use super::{append_word, append_words, hand_back, has_room, scratch};
use crate::{
    maps::{HOTSPOT_PROCESSES, continue_in, count, count_n},
    native::UserMemory,
};

/// Java frames walked per program run; tail calls continue.
const FRAMES_PER_PROGRAM: usize = 24;

// Written out rather than built on `handover_start`/`handover_end` (as
// V8's is): with them, LLVM reloads an undefined Option payload from a
// stack slot never written, which the 5.10 verifier refuses.
pub fn unwind<C: Chain>(ctx: &C) -> u32 {
    let Some(scratch) = scratch::<C>(ProgramIndex::HotSpot) else {
        return 0;
    };
    if scratch.state.native_done != 0 {
        // Only handovers run this program; nothing is left to walk.
        crate::emit::emit(scratch);
        return 0;
    }
    let pid = scratch.record.header.pid;
    // SAFETY: only read; user space replaces entries whole.
    let Some(process) = (unsafe { HOTSPOT_PROCESSES.get(pid) }) else {
        count(Counter::HotSpotProcessMissing);
        hand_back(ctx, scratch, resume::NATIVE);
        return 0;
    };
    let mut memory = WindowedReader::new(&mut scratch.stack, UserMemory);
    let mut ended = false;
    let mut native = false;
    for _ in 0..FRAMES_PER_PROGRAM {
        if !has_room(&scratch.record, 2) {
            count(Counter::HotSpotStackTruncated);
            scratch.record.header.flags |= flags::USER_TRUNCATED;
            ended = true;
            break;
        }
        // The sampled frame's PC is the instruction running, not a return address.
        let top = scratch.record.header.user_words == 0;
        let step = process.step(&mut scratch.state.registers, top, &mut memory);
        let walk = &mut scratch.state.runtimes.hotspot;
        match step {
            HotSpotStep::Compiled {
                blob_word,
                pc_word,
                pending_deopt,
            } => {
                walk.frames += 1;
                if pending_deopt {
                    count(Counter::HotSpotDeoptPending);
                }
                append_words(&mut scratch.record, blob_word, pc_word);
            }
            HotSpotStep::Interpreted {
                method_word,
                bcp_word,
            } => {
                walk.frames += 1;
                append_words(&mut scratch.record, method_word, bcp_word);
            }
            HotSpotStep::Stub(stub_word) => {
                walk.frames += 1;
                append_word(&mut scratch.record, stub_word);
            }
            HotSpotStep::CallStub | HotSpotStep::Native => {
                native = true;
                break;
            }
            HotSpotStep::Unknown => {
                count(Counter::HotSpotUnknownCode);
                scratch.record.header.flags |= flags::USER_INCOMPLETE;
                ended = true;
                break;
            }
            HotSpotStep::ReadFailed => {
                count(Counter::HotSpotReadFailed);
                scratch.record.header.flags |= flags::USER_INCOMPLETE;
                ended = true;
                break;
            }
        }
    }
    // Counted once per run rather than per frame: one map update.
    let walked = core::mem::take(&mut scratch.state.runtimes.hotspot.frames);
    if walked != 0 {
        count_n(Counter::HotSpotFrames, u64::from(walked));
    }
    if native {
        hand_back(ctx, scratch, resume::FRESH);
        return 0;
    }
    if !ended {
        if continue_in(ctx, &mut scratch.state, ProgramIndex::HotSpot) {
            return 0;
        }
        count(Counter::HotSpotStackTruncated);
        scratch.record.header.flags |= flags::USER_TRUNCATED;
    }
    if scratch.record.header.user_words == 0 {
        // Not even the sampled frame was read: the native unwinder records
        // its PC, so that the sample keeps a frame.
        hand_back(ctx, scratch, resume::NATIVE);
        return 0;
    }
    // The stack ends in Java code: the sample goes out as it is.
    scratch.state.native_done = 1;
    crate::emit::emit(scratch);
    0
}
