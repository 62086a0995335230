//! The native user-stack unwinder program: DWARF CFI where an unwind table
//! covers the PC, frame pointers elsewhere (JIT code, files without tables).
//! Samples of processes user space has not described yet (while it
//! describes processes), and samples that reach a file whose table is still
//! being built, are dropped and counted: walked with frame pointers they
//! would look complete and not be.

use core::ffi::c_void;

use crate::chain::Chain;
use aya_ebpf::helpers::{
    bpf_probe_read_user, generated::bpf_probe_read_user as probe_read_user_block,
};
use icecore_unwinders::{
    BlockReader, Counter, Dispatch, MAX_TAIL_CALLS, MemoryReader, ProgramIndex, Registers,
    StepOutcome, WindowedReader,
    memory::{STACK_WINDOW_BYTES, STACK_WINDOW_WORDS},
    native::{
        MappingEntry, ProcessMappingTable, ProcessSlotCache, ProcessSlotEntry, RowCache,
        dwarf_step, find_row, frame_pointer_step, mappings::PROCESS_TABLES_PER_PAGE,
    },
    runtime::{USER_ADDRESS_END, after_native_walk, resume, unknown_process},
    sample::{MAX_FRAMES, MAX_USER_FRAMES, flags},
};

use crate::maps::{
    PROCESS_MAPPINGS, PROCESS_SLOTS, UNKNOWN_PROCESS_POLICY, UNWIND_TABLES, continue_in, count,
};

/// Frames walked per program run; tail calls continue. Each frame costs the
/// verifier about 4,400 instructions (the searches have fixed probe counts),
/// so 24 frames verify in about 146,000, well inside the 1M budget.
const FRAMES_PER_PROGRAM: usize = 24;
const _: () = assert!(FRAMES_PER_PROGRAM * (MAX_TAIL_CALLS as usize + 1) >= 300);

/// The sampled process's memory, read with `bpf_probe_read_user`.
pub struct UserMemory;

impl MemoryReader for UserMemory {
    #[inline(always)]
    fn read_u64(&mut self, address: u64) -> Option<u64> {
        // SAFETY: the helper checks the address; a fault returns an error.
        unsafe { bpf_probe_read_user(address as *const u64) }.ok()
    }

    #[inline(always)]
    fn read_words<const N: usize>(&mut self, address: u64) -> Option<[u64; N]> {
        // SAFETY: as above, for `N` words at once.
        unsafe { bpf_probe_read_user(address as *const [u64; N]) }.ok()
    }
}

impl BlockReader for UserMemory {
    #[inline(always)]
    fn read_block(&mut self, address: u64, dst: &mut [u64; STACK_WINDOW_WORDS], len: u32) -> bool {
        // Restated for the verifier, which must see the size bounded by the
        // buffer; the volatile load keeps LLVM from folding the check into
        // the caller's (on a register the verifier does not connect to `len`).
        // SAFETY: a load from a local.
        let len = unsafe { core::ptr::read_volatile(&len) };
        let len = if len as usize > STACK_WINDOW_BYTES {
            STACK_WINDOW_BYTES as u32
        } else {
            len
        };
        // SAFETY: `dst` holds STACK_WINDOW_BYTES and `len` is at most that; the
        // helper checks the user address and fails on a fault.
        unsafe {
            probe_read_user_block(dst.as_mut_ptr().cast(), len, address as *const c_void) == 0
        }
    }
}

/// One step from `regs`, whose code is at `pc` in `entry` (if a mapping
/// covers it). The flag tells whether an unwind table (rather than frame
/// pointers) was used.
#[inline(always)]
fn step(
    regs: &mut Registers,
    pc: u64,
    entry: Option<&MappingEntry>,
    zero: u32,
    rows: &mut RowCache,
    memory: &mut WindowedReader<'_, UserMemory>,
) -> (StepOutcome, bool) {
    if let Some(entry) = entry
        && entry.table_rows != 0
        && let Ok(vaddr) = u32::try_from(pc.wrapping_sub(entry.bias))
    {
        let index = RowCache::index(entry.file_id, vaddr);
        let mut cached = rows.holds(index, entry.file_id, vaddr);
        if !cached
            && let Some(table) = UNWIND_TABLES.get(entry.table_slot)
            && let Some(row) = find_row(entry.table_rows, vaddr, zero, |i| table.get(i))
        {
            rows.insert(index, entry.file_id, vaddr, row);
            cached = true;
        }
        if cached {
            return (dwarf_step(regs, rows.row_at(index), memory), true);
        }
    }
    (frame_pointer_step(regs, memory), false)
}

/// The zero `find_row` starts from: `reserved`, loaded from the map so that
/// it is no constant to the verifier, and loaded afresh for each search. A
/// zero kept in a register across frames would carry the bounds one search
/// taught the verifier into the next frame, where a path that hit the row
/// cache lacks them, and the two could no longer be pruned against each other.
#[inline(always)]
fn zero(mappings: &ProcessMappingTable) -> u32 {
    // SAFETY: a load of a plain integer in the map value.
    unsafe { core::ptr::read_volatile(&mappings.reserved) }
}

/// The mapping table of `pid` and its `seq`: through this CPU's slot cache
/// when it remembers the pid and the slot still holds that pid's table,
/// through the `PROCESS_SLOTS` hash otherwise. `None` while user space
/// writes the table.
#[inline(always)]
fn process_mappings(
    cache: &mut ProcessSlotCache,
    pid: u32,
) -> Option<(&'static ProcessMappingTable, u32)> {
    let cached = cache.entry_mut(pid);
    let table = if cached.pid == pid
        && let Some(table) = table_at(cached.slot)
        && table.pid == pid
    {
        table
    } else {
        // SAFETY: a plain value read.
        let slot = *unsafe { PROCESS_SLOTS.get(pid) }?;
        let table = table_at(slot)?;
        if table.pid != pid {
            return None;
        }
        *cached = ProcessSlotEntry { pid, slot };
        table
    };
    let seq = table_seq(table);
    (!ProcessMappingTable::being_written(seq)).then_some((table, seq))
}

/// The table's sequence lock, loaded afresh.
#[inline(always)]
fn table_seq(table: &ProcessMappingTable) -> u32 {
    // SAFETY: a load of a plain integer in the map value, which user space
    // writes concurrently (hence volatile).
    unsafe { core::ptr::read_volatile(&table.seq) }
}

/// Whether samples of processes without a mapping table are dropped: only
/// while user space describes processes (with DWARF unwinding off, every
/// process is walked with frame pointers).
#[inline(always)]
fn drops_unknown_processes() -> bool {
    UNKNOWN_PROCESS_POLICY
        .get(0)
        .is_some_and(|policy| *policy == unknown_process::DROP)
}

#[inline(always)]
fn table_at(slot: u32) -> Option<&'static ProcessMappingTable> {
    let page = slot / PROCESS_TABLES_PER_PAGE as u32;
    let index = slot % PROCESS_TABLES_PER_PAGE as u32;
    PROCESS_MAPPINGS.get_value(page, &index)
}

/// The native walk. `RESUMABLE` builds [`ProgramIndex::NativeResumed`],
/// which first honours the `resume` a runtime handed back with; without it
/// (`NativeUnwinder`, every sample's first program) the resume logic folds
/// away, and a frame costs what it cost before runtimes could hand back.
#[inline(always)]
pub fn unwind<C: Chain, const RESUMABLE: bool>(ctx: &C) -> u32 {
    let Some(scratch) = C::scratch_space().get_ptr_mut(0) else {
        count(Counter::ScratchUnavailable);
        return 0;
    };
    // SAFETY: per-CPU value owned by this CPU's tail-call chain.
    let scratch = unsafe { &mut *scratch };
    let pid = scratch.record.header.pid;
    let found = process_mappings(&mut scratch.processes, pid);
    if let Some((_, seq)) = found {
        if scratch.state.tail_calls == 0 {
            scratch.state.table_seq = seq as u16;
        } else if scratch.state.table_seq != seq as u16 {
            count(Counter::ProcessTableChanged);
            return 0;
        }
    }
    let mappings = found.map(|(table, _)| table);
    if mappings.is_none() && drops_unknown_processes() {
        // Without the process's mappings the walk could only follow frame
        // pointers, and a stack cut short would pass for a complete one.
        count(Counter::UnknownProcess);
        let ktime_ns = scratch.record.header.ktime_ns;
        crate::lifecycle::report_unknown(pid, ktime_ns, &mut scratch.state.unknown_reported);
        return 0;
    }
    let mut memory = WindowedReader::new(&mut scratch.stack, UserMemory);
    let mut finished = false;
    let mut complete = false;
    // A runtime program that takes over at the current frame.
    let mut handover = 0u32;
    let mut table_pending = false;
    for _ in 0..FRAMES_PER_PROGRAM {
        let ip = scratch.state.registers.ip;
        // Only the first frame of a resumed run is one a runtime handed back.
        let resume = if RESUMABLE {
            scratch.state.resume
        } else {
            resume::FRESH
        };
        if resume != resume::FRESH {
            scratch.state.resume = resume::FRESH;
            // Words at or above this are runtimes' tags: a wild address a
            // runtime hands back must not pass for one. (The native steps
            // check the return addresses they find, and the first ip is the
            // kernel's, so frames that were not handed back skip this.)
            if ip >= USER_ADDRESS_END {
                count(Counter::UserFrameInvalid);
                scratch.record.header.flags |= flags::USER_INCOMPLETE;
                finished = true;
                break;
            }
        }
        // After the first frame the registers are a caller's: its ip is a
        // return address, which points after the call that covers it.
        let is_caller = scratch.record.header.user_words != 0;
        let pc = if is_caller { ip.wrapping_sub(1) } else { ip };
        let entry = mappings.and_then(|m| m.find_from(pc, zero(m)));
        // Native code (almost every frame) pays one compare here.
        if let Some(entry) = entry
            && entry.dispatch != Dispatch::Native as u8
            && resume == resume::FRESH
        {
            if entry.dispatch == Dispatch::Handover as u8 {
                handover = u32::from(entry.program);
                break;
            }
            if entry.dispatch == Dispatch::Deferred as u8 {
                scratch.state.deferred_program = entry.program;
            }
            if entry.dispatch == Dispatch::TablePending as u8 {
                table_pending = true;
                break;
            }
        }
        if resume != resume::STEP_ONLY {
            let index =
                (scratch.record.header.kernel_frames + scratch.record.header.user_words) as usize;
            if scratch.record.header.user_words as usize >= MAX_USER_FRAMES || index >= MAX_FRAMES {
                count(Counter::UserStackTruncated);
                scratch.record.header.flags |= flags::USER_TRUNCATED;
                finished = true;
                break;
            }
            let Some(slot) = scratch.record.frames.get_mut(index) else {
                finished = true;
                break;
            };
            *slot = ip;
            scratch.record.header.user_words += 1;
        }
        let zero = mappings.map_or(0, zero);
        let (outcome, used_table) = step(
            &mut scratch.state.registers,
            pc,
            entry,
            zero,
            &mut scratch.rows,
            &mut memory,
        );
        if used_table {
            scratch.state.dwarf_frames += 1;
        } else {
            scratch.state.frame_pointer_frames += 1;
        }
        match outcome {
            StepOutcome::Caller => {}
            StepOutcome::EndOfStack => {
                finished = true;
                complete = true;
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
    if table_pending {
        // Frame pointers would stop short of the file's callers; the file's
        // table exists within milliseconds.
        count(Counter::UnwindTablePending);
        return 0;
    }
    // Entries read while user space rewrote the table may be torn.
    if let Some(table) = mappings
        && table_seq(table) as u16 != scratch.state.table_seq
    {
        count(Counter::ProcessTableChanged);
        return 0;
    }
    if handover != 0 {
        if crate::runtimes::hand_to(ctx, scratch, handover) {
            // No program in the slot: this frame is native code after all.
            scratch.state.resume = resume::NATIVE;
            if continue_in(ctx, &mut scratch.state, ProgramIndex::NativeResumed) {
                return 0;
            }
        }
        count(Counter::UserStackTruncated);
        scratch.record.header.flags |= flags::USER_TRUNCATED;
    } else if !finished {
        if continue_in(ctx, &mut scratch.state, ProgramIndex::NativeUnwinder) {
            return 0;
        }
        count(Counter::UserStackTruncated);
        scratch.record.header.flags |= flags::USER_TRUNCATED;
    }
    // A deferred runtime the walk passed (or the process's own, when the
    // walk ended before reaching its frames) walks its frames and emits.
    scratch.state.native_done = 1;
    let program = after_native_walk(
        scratch.state.deferred_program,
        mappings.map_or(0, |m| m.early_end_program(scratch.record.header.tid)),
        complete,
    );
    if program != 0 && !crate::runtimes::hand_to(ctx, scratch, program) {
        // Out of tail calls: the sample goes out with its native frames.
        scratch.record.header.flags |= flags::INTERPRETER_TRUNCATED;
    }
    // Emitting here rather than in `emit_sample` saves a tail call.
    crate::emit::emit(scratch);
    0
}

/// [`ProgramIndex::NativeUnwinder`]'s program.
#[inline(always)]
pub fn unwind_fresh<C: Chain>(ctx: &C) -> u32 {
    unwind::<C, false>(ctx)
}

/// [`ProgramIndex::NativeResumed`]'s program.
#[inline(always)]
pub fn unwind_resumed<C: Chain>(ctx: &C) -> u32 {
    unwind::<C, true>(ctx)
}
