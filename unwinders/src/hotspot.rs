//! The HotSpot frame walk that runs in BPF, and the per-process data it
//! needs. Dispatched by handover: the native unwinder stops at the first
//! frame whose PC is in the JIT's code cache and hands over its registers.
//! Each step unwinds one frame, without frame pointers in compiled code:
//!
//! - an interpreted frame (the PC is in the interpreter) keeps its `Method*`
//!   and bytecode pointer in slots below its frame pointer, and its
//!   caller's stack pointer in `fp[-1]`;
//! - a compiled frame's size is its code blob's `_frame_size`, found from
//!   the PC through the code heap's segment map (one byte per segment,
//!   counting back to the blob's first segment);
//! - the call stub (the JVM's way in from C++) is an `rbp` frame whose
//!   caller is native code again: the walk hands back there.
//!
//! Per compiled frame it reports the blob and the PC (user space finds
//! every method inlined at that PC); per interpreted frame the `Method*`
//! and the bytecode pointer. Offsets come from the JVM's own tables, read by
//! user space ([`HotSpotProcess`]).

use crate::{
    Counter, MemoryReader, ProgramIndex, Registers,
    runtime::{BpfRuntime, TagRange},
};

/// HotSpot's BPF half.
pub const HOTSPOT: BpfRuntime = BpfRuntime {
    name: "hotspot",
    program: ProgramIndex::HotSpot,
    program_name: "unwind_hotspot",
    tags: TagRange { first: 0x30 },
    counters: &[
        Counter::HotSpotFrames,
        Counter::HotSpotUnknownCode,
        Counter::HotSpotReadFailed,
        Counter::HotSpotStackTruncated,
        Counter::HotSpotProcessMissing,
    ],
};

/// HotSpot's local word tags.
pub mod word {
    /// A compiled frame: its code blob; a [`PC`] word follows.
    pub const COMPILED: u8 = 0;
    /// The PC of a compiled frame (a return address but for the top frame).
    pub const PC: u8 = 1;
    /// The PC of the sampled compiled frame (the top of the stack).
    pub const TOP_PC: u8 = 2;
    /// An interpreted frame: its `Method*`; a [`BCP`] word follows.
    pub const INTERPRETED: u8 = 3;
    /// An interpreted frame's bytecode pointer.
    pub const BCP: u8 = 4;
    /// A stub's or adapter's frame: its code blob.
    pub const STUB: u8 = 5;
}

/// HotSpot processes BPF holds data for at once.
pub const HOTSPOT_PROCESSES_MAX: u32 = 1024;
/// Code heaps described to BPF (HotSpot has 1 to 3).
pub const MAX_CODE_HEAPS: usize = 3;
/// Segment-map hops followed per frame at most (a blob of 254 segments,
/// 32 KiB at 128-byte segments, takes one).
pub const MAX_SEGMAP_HOPS: usize = 8;
/// Largest frame believed, in words.
const MAX_FRAME_WORDS: u64 = 1 << 16;
/// A stub frame found through `rbp` is believed only this close to `sp`.
const MAX_STUB_FRAME_BYTES: u64 = 1 << 16;
/// A segment-map byte marking a free segment.
const FREE_SEGMENT: u64 = 0xff;

/// One code heap: its committed code and its segment map.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodeHeapRange {
    /// First address of code.
    pub low: u64,
    /// One past the last.
    pub high: u64,
    /// The segment map.
    pub segmap: u64,
    /// Bytes per segment, as a shift.
    pub log2_segment_size: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<CodeHeapRange>() == 32);

/// What BPF needs to walk one JVM's frames.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HotSpotProcess {
    /// The code heaps (unused ones are all zero).
    pub heaps: [CodeHeapRange; MAX_CODE_HEAPS],
    /// The interpreter's code: first address.
    pub interpreter_low: u64,
    /// One past its last address.
    pub interpreter_high: u64,
    /// `StubRoutines::_call_stub_return_address`: a Java frame whose return
    /// address this is was called from C++ through the call stub.
    pub call_stub_return: u64,
    /// `sizeof(HeapBlock)`: a blob starts this far into its block.
    pub heap_block_size: u16,
    /// `CodeBlob::_frame_size` (int, words).
    pub blob_frame_size: u16,
    /// The interpreter frame's `Method*` slot below `fp`, in words (3).
    pub method_slot: u8,
    /// The interpreter frame's bytecode-pointer slot below `fp` (7 in JDK 8, 8 after).
    pub bcp_slot: u8,
    /// Zero.
    pub reserved: [u8; 2],
}

const _: () = assert!(core::mem::size_of::<HotSpotProcess>() == 128);

/// HotSpot's state area between tail calls.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HotSpotWalkState {
    /// Frames walked (counted once, when the walk hands back).
    pub frames: u16,
    /// Zero.
    pub reserved: [u8; 6],
}

const _: () = assert!(core::mem::size_of::<HotSpotWalkState>() == 8);

impl HotSpotWalkState {
    /// The state before a sample's walk.
    #[inline(always)]
    pub fn reset(&mut self) {
        self.frames = 0;
    }
}

/// What one step produced. The registers move to the caller on every
/// outcome but [`HotSpotStep::Native`] and the failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HotSpotStep {
    /// A compiled frame: a [`word::COMPILED`] word and a PC word.
    Compiled {
        /// The tagged blob address.
        blob_word: u64,
        /// The tagged PC.
        pc_word: u64,
    },
    /// An interpreted frame: a [`word::INTERPRETED`] and a [`word::BCP`] word.
    Interpreted {
        /// The tagged `Method*`.
        method_word: u64,
        /// The tagged bytecode pointer.
        bcp_word: u64,
    },
    /// A stub's frame: a [`word::STUB`] word.
    Stub(u64),
    /// The call stub's frame, unwound: its caller is native code.
    CallStub,
    /// The PC is not in the code cache: native code, at these registers.
    Native,
    /// The PC is in the code cache but in no blob.
    Unknown,
    /// Memory the step needed could not be read.
    ReadFailed,
}

impl HotSpotProcess {
    /// The heap holding `pc`.
    #[inline(always)]
    fn heap_of(&self, pc: u64) -> Option<&CodeHeapRange> {
        self.heaps.iter().find(|h| h.low <= pc && pc < h.high)
    }

    /// Whether `pc` is in the code cache.
    #[inline(always)]
    pub fn in_code_cache(&self, pc: u64) -> bool {
        self.heap_of(pc).is_some()
    }

    /// The code blob holding `pc` (its address), through the segment map.
    #[inline(always)]
    pub fn blob_at<M: MemoryReader>(&self, pc: u64, memory: &mut M) -> Option<u64> {
        let heap = self.heap_of(pc)?;
        let shift = heap.log2_segment_size & 31;
        let mut segment = (pc - heap.low) >> shift;
        for _ in 0..MAX_SEGMAP_HOPS {
            let at = heap.segmap.wrapping_add(segment);
            let word = memory.read_u64(at & !7)?;
            let hop = (word >> ((at & 7) * 8)) & 0xff;
            if hop == 0 {
                return Some(
                    heap.low
                        .wrapping_add(segment << shift)
                        .wrapping_add(u64::from(self.heap_block_size)),
                );
            }
            if hop == FREE_SEGMENT || hop > segment {
                return None;
            }
            segment -= hop;
        }
        None
    }

    /// Unwinds the frame at `regs` (`top`: the sampled frame, whose PC is
    /// not a return address), moving `regs` to its caller.
    #[inline(always)]
    pub fn step<M: MemoryReader>(
        &self,
        regs: &mut Registers,
        top: bool,
        memory: &mut M,
    ) -> HotSpotStep {
        let pc = regs.ip;
        // A return address points after its call; the call is what runs.
        let lookup = if top { pc } else { pc.wrapping_sub(1) };
        if !self.in_code_cache(lookup) {
            return HotSpotStep::Native;
        }
        let (sp, fp) = (regs.sp, regs.bp);
        if self.interpreter_low <= lookup && lookup < self.interpreter_high {
            let slot = |n: u8| fp.wrapping_sub(8 * u64::from(n));
            let Some(method) = memory.read_u64(slot(self.method_slot)) else {
                return HotSpotStep::ReadFailed;
            };
            let Some(bcp) = memory.read_u64(slot(self.bcp_slot)) else {
                return HotSpotStep::ReadFailed;
            };
            // fp[-1] is the caller's (unextended) sp, fp[0] its fp, fp[1] the return.
            let (Some(sender_sp), Some(saved_fp), Some(ret)) = (
                memory.read_u64(fp.wrapping_sub(8)),
                memory.read_u64(fp),
                memory.read_u64(fp.wrapping_add(8)),
            ) else {
                return HotSpotStep::ReadFailed;
            };
            regs.ip = ret;
            regs.sp = sender_sp;
            regs.bp = saved_fp;
            return HotSpotStep::Interpreted {
                method_word: HOTSPOT.tags.word(word::INTERPRETED, method),
                bcp_word: HOTSPOT.tags.word(word::BCP, bcp),
            };
        }
        if !top && pc == self.call_stub_return {
            // This frame was entered from C++ through the call stub, an rbp
            // frame: its caller is `JavaCalls::call_helper`.
            return self.rbp_frame(regs, memory, HotSpotStep::CallStub);
        }
        let Some(blob) = self.blob_at(lookup, memory) else {
            return HotSpotStep::Unknown;
        };
        let Some(frame_size) =
            memory.read_u64(blob.wrapping_add(u64::from(self.blob_frame_size)) & !7)
        else {
            return HotSpotStep::ReadFailed;
        };
        // The int at `blob_frame_size` within its aligned word.
        let frame_size = (frame_size >> ((u64::from(self.blob_frame_size) & 4) * 8)) as u32 as i32;
        if frame_size > 0 && (frame_size as u64) < MAX_FRAME_WORDS {
            let sender_sp = sp.wrapping_add(8 * frame_size as u64);
            let (Some(saved_fp), Some(ret)) = (
                memory.read_u64(sender_sp.wrapping_sub(16)),
                memory.read_u64(sender_sp.wrapping_sub(8)),
            ) else {
                return HotSpotStep::ReadFailed;
            };
            regs.ip = ret;
            regs.sp = sender_sp;
            regs.bp = saved_fp;
            let tag = if top { word::TOP_PC } else { word::PC };
            return HotSpotStep::Compiled {
                blob_word: HOTSPOT.tags.word(word::COMPILED, blob),
                pc_word: HOTSPOT.tags.word(tag, pc),
            };
        }
        // A stub: an rbp frame when rbp points just above sp, else none
        // (its return address is at sp).
        let stub = HotSpotStep::Stub(HOTSPOT.tags.word(word::STUB, blob));
        if fp > sp && fp - sp < MAX_STUB_FRAME_BYTES {
            return self.rbp_frame(regs, memory, stub);
        }
        let Some(ret) = memory.read_u64(sp) else {
            return HotSpotStep::ReadFailed;
        };
        regs.ip = ret;
        regs.sp = sp.wrapping_add(8);
        stub
    }

    /// Unwinds an `rbp` frame, reporting `outcome`.
    #[inline(always)]
    fn rbp_frame<M: MemoryReader>(
        &self,
        regs: &mut Registers,
        memory: &mut M,
        outcome: HotSpotStep,
    ) -> HotSpotStep {
        let fp = regs.bp;
        let (Some(saved_fp), Some(ret)) =
            (memory.read_u64(fp), memory.read_u64(fp.wrapping_add(8)))
        else {
            return HotSpotStep::ReadFailed;
        };
        regs.ip = ret;
        regs.sp = fp.wrapping_add(16);
        regs.bp = saved_fp;
        outcome
    }
}

#[cfg(test)]
mod tests;
