//! What every runtime program shares: its prologue, appending tagged words,
//! and how it ends (see `icecore_unwinders::runtime` for the convention).
//! A runtime's program lives in its own file here and is registered in
//! `main.rs` with one `#[perf_event]` function.

pub mod hotspot;
pub mod perl;
pub mod php;
pub mod python;
pub mod ruby;
pub mod v8;

use aya_ebpf::maps::HashMap;

use crate::chain::Chain;
use icecore_unwinders::{
    Counter, ProgramIndex, SampleRecord, UnwindScratch,
    runtime::resume,
    sample::{MAX_FRAMES, flags},
};

use crate::maps::{continue_in, count};

/// The program slot whose program must fail verification, for tests of a
/// runtime the kernel rejects; `u32::MAX` for none. Set at load time.
#[unsafe(no_mangle)]
static REJECTED_PROGRAM: u32 = u32::MAX;

/// The scratch space of the sample being built: a runtime program's prologue.
#[inline(always)]
pub fn scratch<C: Chain>(program: ProgramIndex) -> Option<&'static mut UnwindScratch> {
    // SAFETY: a plain load of a load-time constant.
    let rejected = unsafe { core::ptr::read_volatile(&REJECTED_PROGRAM) };
    if rejected == program as u32 {
        // The constant is known to the verifier: for every other program it
        // prunes this branch, for the rejected one it refuses the read of a
        // scalar as a pointer, and the program does not load.
        // SAFETY: never runs; the verifier rejects the program first.
        let _ = unsafe { core::ptr::read_volatile(u64::from(rejected) as *const u64) };
    }
    let Some(scratch) = C::scratch_space().get_ptr_mut(0) else {
        count(Counter::ScratchUnavailable);
        return None;
    };
    // SAFETY: per-CPU value owned by this CPU's tail-call chain.
    Some(unsafe { &mut *scratch })
}

/// A deferred runtime's second step: handed a frame during the native walk
/// (a frame of its loop the walk reached by a handover entry), it declines
/// the frame (native code), notes itself to run when the walk ends, and
/// returns true once the native unwinder runs on; false when the native walk
/// is over (also when it had to be cut here) and the program walks its stack.
/// One walk of the whole interpreter stack keeps the per-frame loop minimal.
#[inline(always)]
pub fn run_after_native_walk<C: Chain>(
    ctx: &C,
    scratch: &mut UnwindScratch,
    program: ProgramIndex,
) -> bool {
    if scratch.state.native_done != 0 {
        return false;
    }
    scratch.state.deferred_program = program as u8;
    scratch.state.resume = resume::NATIVE;
    if continue_in(ctx, &mut scratch.state, ProgramIndex::NativeResumed) {
        return true;
    }
    count(Counter::UserStackTruncated);
    scratch.record.header.flags |= flags::USER_TRUNCATED;
    scratch.state.native_done = 1;
    false
}

/// Where the record's next word goes. Summed as 64-bit values: a 32-bit sum
/// is zero-extended once per use, and the verifier cannot tell that the
/// copy a bounds check tested is the one an access then uses.
#[inline(always)]
fn word_index(record: &SampleRecord) -> usize {
    record.header.kernel_frames as usize + record.header.user_words as usize
}

/// Room for `n` more words in the record.
#[inline(always)]
pub fn has_room(record: &SampleRecord, n: usize) -> bool {
    word_index(record) + n <= MAX_FRAMES
}

/// Appends a tagged word to the user words; false when the record is full.
#[inline(always)]
pub fn append_word(record: &mut SampleRecord, word: u64) -> bool {
    let index = word_index(record);
    let Some(slot) = record.frames.get_mut(index) else {
        return false;
    };
    *slot = word;
    record.header.user_words += 1;
    true
}

/// Appends two words (a frame's pair), with one index computation: the
/// caller checked [`has_room`] for both.
#[inline(always)]
pub fn append_words(record: &mut SampleRecord, first: u64, second: u64) {
    let index = word_index(record);
    if let Some(slot) = record.frames.get_mut(index) {
        *slot = first;
    }
    if let Some(slot) = record.frames.get_mut(index + 1) {
        *slot = second;
    }
    record.header.user_words += 2;
}

/// Ends a runtime program's part of the sample: after the native walk the
/// sample is emitted; during it the native unwinder resumes, stepping the
/// frame the runtime's words stand for (`resume::STEP_ONLY`).
#[inline(always)]
pub fn finish<C: Chain>(ctx: &C, scratch: &mut UnwindScratch) {
    if scratch.state.native_done == 0 {
        scratch.state.resume = resume::STEP_ONLY;
        if continue_in(ctx, &mut scratch.state, ProgramIndex::NativeResumed) {
            return;
        }
        count(Counter::UserStackTruncated);
        scratch.record.header.flags |= flags::USER_TRUNCATED;
    }
    crate::emit::emit(scratch);
}

/// A handover runtime's prologue: the scratch space and the process's
/// entry in `processes`, or `None` when there is nothing to walk (the
/// sample was emitted, or the frame handed back as native code, counted
/// as `missing`, when user space has not described the process).
#[inline(always)]
#[allow(
    clippy::mut_from_ref,
    reason = "the scratch space is this CPU's map value, not borrowed from `processes`"
)]
pub fn handover_start<C: Chain, T>(
    ctx: &C,
    program: ProgramIndex,
    processes: &'static HashMap<u32, T>,
    missing: Counter,
) -> Option<(&'static mut UnwindScratch, &'static T)> {
    let scratch = scratch::<C>(program)?;
    if scratch.state.native_done != 0 {
        // Only handovers run these programs; nothing is left to walk.
        crate::emit::emit(scratch);
        return None;
    }
    let pid = scratch.record.header.pid;
    // SAFETY: only read; user space replaces entries whole.
    let Some(process) = (unsafe { processes.get(pid) }) else {
        count(missing);
        hand_back(ctx, scratch, resume::NATIVE);
        return None;
    };
    Some((scratch, process))
}

/// How one run of a handover runtime's walk ended: a whole word, as the
/// 5.10 verifier refuses an 8-byte reload of a value spilled in parts (an
/// enum with a byte payload is stored as two).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HandoverEnd(u64);

impl HandoverEnd {
    /// The run walked its share of frames: another tail call goes on.
    pub const MORE: HandoverEnd = HandoverEnd(u64::MAX);
    /// The walk cannot go on (unreadable, unknown code, a full record):
    /// the sample goes out as it is.
    pub const END: HandoverEnd = HandoverEnd(u64::MAX - 1);

    /// The registers are at native code again (`resume::FRESH`), or the
    /// runtime declined the frame (`resume::NATIVE`).
    #[inline(always)]
    pub const fn hand_back(how: u8) -> HandoverEnd {
        HandoverEnd(how as u64)
    }
}

/// Ends a run of a handover runtime's walk (`truncated`: its counter of
/// walks cut short). A sample whose sampled frame itself could not be
/// walked is handed to the native unwinder rather than sent without a
/// frame.
#[inline(always)]
pub fn handover_end<C: Chain>(
    ctx: &C,
    scratch: &mut UnwindScratch,
    program: ProgramIndex,
    end: HandoverEnd,
    truncated: Counter,
) {
    if end == HandoverEnd::MORE {
        if continue_in(ctx, &mut scratch.state, program) {
            return;
        }
        count(truncated);
        scratch.record.header.flags |= flags::USER_TRUNCATED;
    } else if end != HandoverEnd::END {
        hand_back(ctx, scratch, end.0 as u8);
        return;
    } else if scratch.record.header.user_words == 0 {
        hand_back(ctx, scratch, resume::NATIVE);
        return;
    }
    scratch.state.native_done = 1;
    crate::emit::emit(scratch);
}

/// Hands the registers back to the native unwinder from a handover
/// runtime: `how` is `resume::FRESH` at native code the runtime's frames
/// were called from, or `resume::NATIVE` when the frame was declined.
#[inline(always)]
pub fn hand_back<C: Chain>(ctx: &C, scratch: &mut UnwindScratch, how: u8) {
    scratch.state.resume = how;
    if continue_in(ctx, &mut scratch.state, ProgramIndex::NativeResumed) {
        return;
    }
    count(Counter::UserStackTruncated);
    scratch.record.header.flags |= flags::USER_TRUNCATED;
    scratch.state.native_done = 1;
    crate::emit::emit(scratch);
}

/// Hands the sample to the runtime program in `program` (a slot a mapping
/// named). Returns only when the program did not run: out of tail calls
/// (false), or its slot is empty (true, counted), in which case the caller
/// carries on without it.
#[inline(always)]
pub fn hand_to<C: Chain>(ctx: &C, scratch: &mut UnwindScratch, program: u32) -> bool {
    let state = &mut scratch.state;
    if u32::from(state.tail_calls) >= icecore_unwinders::MAX_TAIL_CALLS {
        return false;
    }
    state.tail_calls += 1;
    // SAFETY: every filled slot holds a perf-event program.
    unsafe { C::programs().tail_call(ctx, program) };
    // The slot is empty: the runtime's program did not load.
    state.tail_calls -= 1;
    count(Counter::RuntimeProgramMissing);
    true
}
