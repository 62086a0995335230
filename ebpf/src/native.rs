//! The native user-stack unwinder program: DWARF CFI where an unwind table
//! covers the PC, frame pointers elsewhere (JIT code, files without tables,
//! processes user space has not described yet).

use aya_ebpf::{helpers::bpf_probe_read_user, programs::PerfEventContext};
use icecore_unwinders::{
    Counter, MAX_TAIL_CALLS, MemoryReader, ProgramIndex, Registers, StepOutcome,
    native::{ProcessMappingTable, dwarf_step, frame_pointer_step, search_rows},
    sample::{MAX_FRAMES, MAX_USER_FRAMES, flags},
};

use crate::maps::{PROCESS_MAPPINGS, PROGRAMS, SCRATCH, UNWIND_TABLES, count};

/// Frames walked per program run. Each frame may search a table (up to 24
/// steps), so this is what the verifier's budget allows; tail calls continue.
const FRAMES_PER_PROGRAM: usize = 12;
const _: () = assert!(FRAMES_PER_PROGRAM * (MAX_TAIL_CALLS as usize + 1) >= 300);

/// The sampled process's memory, read with `bpf_probe_read_user`.
struct UserMemory;

impl MemoryReader for UserMemory {
    #[inline(always)]
    fn read_u64(&mut self, address: u64) -> Option<u64> {
        // SAFETY: the helper checks the address; a fault returns an error.
        unsafe { bpf_probe_read_user(address as *const u64) }.ok()
    }
}

/// One step from `regs`; `is_caller` when `regs.ip` is a return address.
#[inline(always)]
fn step(
    regs: &Registers,
    is_caller: bool,
    mappings: Option<&ProcessMappingTable>,
    memory: &mut UserMemory,
) -> StepOutcome {
    // A return address points after the call; the call is what covers it.
    let pc = if is_caller {
        regs.ip.wrapping_sub(1)
    } else {
        regs.ip
    };
    if let Some(entry) = mappings.and_then(|m| m.find(pc))
        && entry.table_rows != 0
        && let Ok(vaddr) = u32::try_from(pc.wrapping_sub(entry.bias))
        // SAFETY: the inner map is only read.
        && let Some(table) = unsafe { UNWIND_TABLES.get(&entry.file_id) }
        && let Some(index) = search_rows(entry.table_rows, vaddr, |i| table.get(i).map(|r| r.pc))
        && let Some(row) = table.get(index)
    {
        count(Counter::DwarfFrames);
        return dwarf_step(regs, *row, memory);
    }
    count(Counter::FramePointerFrames);
    frame_pointer_step(regs, memory)
}

pub fn unwind(ctx: &PerfEventContext) -> u32 {
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        count(Counter::ScratchUnavailable);
        return 0;
    };
    // SAFETY: per-CPU value owned by this CPU's tail-call chain.
    let scratch = unsafe { &mut *scratch };
    let pid = scratch.record.header.pid;
    // SAFETY: only read; user space replaces a process's inner map whole.
    let mappings = unsafe { PROCESS_MAPPINGS.get_value(&pid, &0) };
    if mappings.is_none() && scratch.state.tail_calls == 0 {
        count(Counter::UnknownProcess);
    }
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
        match step(&scratch.state.registers, user > 0, mappings, &mut memory) {
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
