//! The V8 unwinder program. Dispatched by handover (see
//! `icecore_unwinders::runtime`): the native unwinder stops at the first
//! frame whose PC is in V8's builtins or JIT code and tail-calls this
//! program with that frame's registers. It walks V8's frames (walk in
//! `icecore_unwinders::v8`) up the frame-pointer chain, appending a
//! JavaScript frame's function and bytecode offset or PC (`v8::word`), until an entry
//! frame (C++ called JavaScript) or native code, and hands the registers
//! back there, so addons, libuv and Node's C++ stay in place.

use crate::chain::Chain;
use icecore_unwinders::{
    Counter, ProgramIndex, WindowedReader,
    runtime::resume,
    sample::flags,
    v8::{V8, V8Step, word},
};

use super::{HandoverEnd, append_word, append_words, handover_end, handover_start, has_room};
use crate::{
    maps::{V8_PROCESSES, count, count_n},
    native::UserMemory,
};

/// V8 frames walked per program run; tail calls continue.
const FRAMES_PER_PROGRAM: usize = 24;

pub fn unwind<C: Chain>(ctx: &C) -> u32 {
    let Some((scratch, process)) = handover_start(
        ctx,
        ProgramIndex::V8,
        &V8_PROCESSES,
        Counter::V8ProcessMissing,
    ) else {
        return 0;
    };
    let mut memory = WindowedReader::new(&mut scratch.stack, UserMemory);
    let mut end = HandoverEnd::MORE;
    for _ in 0..FRAMES_PER_PROGRAM {
        if !has_room(&scratch.record, 3) {
            count(Counter::V8StackTruncated);
            scratch.record.header.flags |= flags::USER_TRUNCATED;
            end = HandoverEnd::END;
            break;
        }
        // The sampled frame's PC is the instruction running, not a return address.
        let top = scratch.record.header.user_words == 0;
        match process.step(&mut scratch.state.registers, top, &mut memory) {
            V8Step::Interpreted {
                shared,
                bytecode_offset,
            } => {
                scratch.state.runtimes.v8.frames += 1;
                append_words(
                    &mut scratch.record,
                    V8.tags.word(word::SHARED, shared),
                    V8.tags
                        .word(word::BYTECODE_OFFSET, u64::from(bytecode_offset)),
                );
            }
            V8Step::Compiled {
                shared,
                function,
                pc,
            } => {
                scratch.state.runtimes.v8.frames += 1;
                let pc_tag = if top { word::TOP_PC } else { word::PC };
                append_words(
                    &mut scratch.record,
                    V8.tags.word(word::SHARED, shared),
                    V8.tags.word(word::FUNCTION, function),
                );
                append_word(&mut scratch.record, V8.tags.word(pc_tag, pc));
            }
            // Stubs, exits and V8's internal frames are not the program's.
            V8Step::Typed { .. } => {}
            V8Step::Entry | V8Step::Native => {
                end = HandoverEnd::hand_back(resume::FRESH);
                break;
            }
            V8Step::ReadFailed => {
                // Declined: the native unwinder records the frame's PC and
                // follows its frame pointer as it would any code's.
                count(Counter::V8ReadFailed);
                end = HandoverEnd::hand_back(resume::NATIVE);
                break;
            }
        }
    }
    // Counted once per run rather than per frame: one map update.
    let walked = core::mem::take(&mut scratch.state.runtimes.v8.frames);
    if walked != 0 {
        count_n(Counter::V8Frames, u64::from(walked));
    }
    handover_end(
        ctx,
        scratch,
        ProgramIndex::V8,
        end,
        Counter::V8StackTruncated,
    );
    0
}
