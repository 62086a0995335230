//! The native user-stack unwinder program: frame pointers for now.

use aya_ebpf::{helpers::bpf_probe_read_user, programs::PerfEventContext};
use icecore_unwinders::{
    Counter, MAX_TAIL_CALLS, MemoryReader, ProgramIndex, StepOutcome,
    native::frame_pointer_step,
    sample::{MAX_FRAMES, MAX_USER_FRAMES, flags},
};

use crate::maps::{PROGRAMS, SCRATCH, count};

/// Frames walked per program run; with `MAX_TAIL_CALLS` this covers `MAX_USER_FRAMES`.
const FRAMES_PER_PROGRAM: usize = 18;
const _: () = assert!(FRAMES_PER_PROGRAM * (MAX_TAIL_CALLS as usize) >= MAX_USER_FRAMES);

/// The sampled process's memory, read with `bpf_probe_read_user`.
struct UserMemory;

impl MemoryReader for UserMemory {
    #[inline(always)]
    fn read_u64(&mut self, address: u64) -> Option<u64> {
        // SAFETY: the helper checks the address; a fault returns an error.
        unsafe { bpf_probe_read_user(address as *const u64) }.ok()
    }
}

pub fn unwind(ctx: &PerfEventContext) -> u32 {
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        count(Counter::ScratchUnavailable);
        return 0;
    };
    // SAFETY: per-CPU value owned by this CPU's tail-call chain.
    let scratch = unsafe { &mut *scratch };
    let mut memory = UserMemory;
    let mut finished = false;
    for _ in 0..FRAMES_PER_PROGRAM {
        let user = scratch.record.header.user_frames as usize;
        let index = scratch.record.header.kernel_frames as usize + user;
        if user >= MAX_USER_FRAMES || index >= MAX_FRAMES {
            count(Counter::UserStackTruncated);
            scratch.record.header.flags |= flags::USER_TRUNCATED;
            finished = true;
            break;
        }
        let Some(slot) = scratch.record.frames.get_mut(index) else {
            finished = true;
            break;
        };
        *slot = scratch.state.registers.ip;
        scratch.record.header.user_frames += 1;
        match frame_pointer_step(&scratch.state.registers, &mut memory) {
            StepOutcome::Caller(caller) => scratch.state.registers = caller,
            StepOutcome::EndOfStack => {
                finished = true;
                break;
            }
            StepOutcome::ReadFailed => {
                count(Counter::UserReadFailed);
                scratch.record.header.flags |= flags::USER_INCOMPLETE;
                finished = true;
                break;
            }
            StepOutcome::InvalidFrame => {
                count(Counter::UserFrameInvalid);
                scratch.record.header.flags |= flags::USER_INCOMPLETE;
                finished = true;
                break;
            }
        }
    }
    if !finished {
        if scratch.state.tail_calls < MAX_TAIL_CALLS {
            scratch.state.tail_calls += 1;
            // SAFETY: same program type in every slot.
            unsafe { PROGRAMS.tail_call(ctx, ProgramIndex::NativeUnwinder as u32) };
            count(Counter::TailCallFailed);
            return 0;
        }
        count(Counter::UserStackTruncated);
        scratch.record.header.flags |= flags::USER_TRUNCATED;
    }
    // SAFETY: same program type in every slot.
    unsafe { PROGRAMS.tail_call(ctx, ProgramIndex::Emit as u32) };
    count(Counter::TailCallFailed);
    0
}
