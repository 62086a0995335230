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
//!   caller is native code again: the walk hands back there;
//! - a compiled frame pending deoptimization returns into its nmethod's
//!   deoptimization handler; its real return address is saved in the frame.
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
        Counter::HotSpotDeoptPending,
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
    /// 1 when `blob_code_begin` is an int offset from the blob (JDK 8,
    /// 23+), 0 when it is a pointer field (JDK 9–22).
    pub code_begin_is_offset: u8,
    /// The width of `CodeBlob::_frame_complete_offset`: 4 (int), or 2
    /// (int16_t, JDK 23+).
    pub frame_complete_bytes: u8,
    /// `CodeBlob::_code_begin` (pointer) or `CodeBlob::_code_offset` (int).
    pub blob_code_begin: u16,
    /// `CodeBlob::_frame_complete_offset` (bytes from the code's start):
    /// before it, a compiled method's frame is not built yet.
    pub blob_frame_complete: u16,
    /// Where an nmethod keeps its deoptimization handler:
    /// `_deoptimize_offset` (JDK 8), `_deopt_handler_begin` (9–22),
    /// `_deopt_handler_offset` (23–25) or `_deopt_handler_entry_offset`
    /// (26+). 0 when the JVM does not say.
    pub nmethod_deopt_handler: u16,
    /// `nmethod::_orig_pc_offset` (int): where a frame pending
    /// deoptimization keeps its real return address, in bytes from its sp.
    pub nmethod_orig_pc_offset: u16,
    /// 1 when `nmethod_deopt_handler` is an int offset from the nmethod
    /// (JDK 8, 23+), 0 when it is a pointer.
    pub deopt_handler_is_offset: u8,
    /// Zero.
    pub reserved2: [u8; 7],
}

const _: () = assert!(core::mem::size_of::<HotSpotProcess>() == 144);

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
        /// The frame is pending deoptimization: its return address was
        /// the nmethod's deoptimization handler, and the PC reported is
        /// the one HotSpot saved in the frame.
        pending_deopt: bool,
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
        let frame_size = int_in_word(frame_size, u64::from(self.blob_frame_size));
        if frame_size > 0 && (frame_size as u64) < MAX_FRAME_WORDS {
            // A return address is the deoptimization handler's while the
            // frame waits to be deoptimized; the call site is saved in it.
            let original_pc = if top {
                None
            } else {
                self.deopt_original_pc(blob, pc, sp, frame_size as u64, memory)
            };
            let compiled = HotSpotStep::Compiled {
                blob_word: HOTSPOT.tags.word(word::COMPILED, blob),
                pc_word: HOTSPOT.tags.word(
                    if top { word::TOP_PC } else { word::PC },
                    original_pc.unwrap_or(pc),
                ),
                pending_deopt: original_pc.is_some(),
            };
            // Only the sampled frame can be caught building or tearing
            // down its frame: every caller is stopped at a call.
            let unbuilt = if top {
                self.unbuilt_frame(blob, regs, memory)
            } else {
                None
            };
            let sender_sp = match unbuilt {
                Some(Unbuilt::ReturnAtSp) => {
                    let Some(ret) = memory.read_u64(sp) else {
                        return HotSpotStep::ReadFailed;
                    };
                    regs.ip = ret;
                    regs.sp = sp.wrapping_add(8);
                    return compiled;
                }
                // The caller's fp at sp, the return address above it.
                Some(Unbuilt::SavedFpAtSp) => sp.wrapping_add(16),
                Some(Unbuilt::FpNotSaved) => {
                    let sender_sp = sp.wrapping_add(8 * frame_size as u64);
                    let Some(ret) = memory.read_u64(sender_sp.wrapping_sub(8)) else {
                        return HotSpotStep::ReadFailed;
                    };
                    regs.ip = ret;
                    regs.sp = sender_sp;
                    return compiled;
                }
                None => sp.wrapping_add(8 * frame_size as u64),
            };
            let (Some(saved_fp), Some(ret)) = (
                memory.read_u64(sender_sp.wrapping_sub(16)),
                memory.read_u64(sender_sp.wrapping_sub(8)),
            ) else {
                return HotSpotStep::ReadFailed;
            };
            regs.ip = ret;
            regs.sp = sender_sp;
            regs.bp = saved_fp;
            return compiled;
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

    /// Whether the sampled compiled frame at `regs` is not (or no longer)
    /// the frame its blob's frame size describes: in the prologue, before
    /// `_frame_complete_offset` (which either banged the stack, then
    /// `push rbp; sub rsp, N`, or did `sub rsp, N; mov [rsp + N], rbp`),
    /// or in the epilogue, after `add rsp` (see [`epilogue_state`]). `None` when it is built, or when what tells is
    /// unreadable (the frame size is the better guess then).
    #[inline(always)]
    pub fn unbuilt_frame<M: MemoryReader>(
        &self,
        blob: u64,
        regs: &Registers,
        memory: &mut M,
    ) -> Option<Unbuilt> {
        let field = |offset: u16| blob.wrapping_add(u64::from(offset));
        let begin_field = field(self.blob_code_begin);
        let code_begin = if self.code_begin_is_offset != 0 {
            let offset = int_in_word(memory.read_u64(begin_field & !7)?, begin_field);
            blob.wrapping_add(offset as i64 as u64)
        } else {
            memory.read_u64(begin_field)?
        };
        let complete_field = field(self.blob_frame_complete);
        let complete_word = memory.read_u64(complete_field & !7)?;
        let complete = if self.frame_complete_bytes == 2 {
            (complete_word >> ((complete_field & 6) * 8)) as u16 as i16 as i32
        } else {
            int_in_word(complete_word, complete_field)
        };
        let pc = regs.ip;
        let code = memory.read_words::<2>(pc)?;
        if complete > 0 && pc >= code_begin && pc - code_begin < complete as u64 {
            if prologue_stores_fp(code) {
                return Some(Unbuilt::FpNotSaved);
            }
            // `push rbp` stores the caller's fp, which rbp still holds
            // (compiled code does not keep a frame pointer of its own).
            let at_sp = memory.read_u64(regs.sp)?;
            if at_sp == regs.bp {
                return Some(Unbuilt::SavedFpAtSp);
            }
            // Before it, sp holds the return address, into the code cache:
            // compiled Java code is called from Java code, an adapter or
            // the call stub. Otherwise the frame is built already (JDK 21+
            // check their nmethod entry barrier before the frame counts as
            // complete).
            return self
                .in_code_cache(at_sp.wrapping_sub(1))
                .then_some(Unbuilt::ReturnAtSp);
        }
        epilogue_state(code)
    }

    /// The return address a compiled frame pending deoptimization had:
    /// HotSpot replaced it, `pc`, with the nmethod's deoptimization handler
    /// and saved it in the frame, `_orig_pc_offset` bytes above `sp` (the
    /// frame's `frame_words` long). `None` when `pc` is not that handler
    /// (the common case, for one read), or when what tells is unreadable.
    #[inline(always)]
    pub fn deopt_original_pc<M: MemoryReader>(
        &self,
        nmethod: u64,
        pc: u64,
        sp: u64,
        frame_words: u64,
        memory: &mut M,
    ) -> Option<u64> {
        if self.nmethod_deopt_handler == 0 || self.nmethod_orig_pc_offset == 0 {
            return None;
        }
        let field = nmethod.wrapping_add(u64::from(self.nmethod_deopt_handler));
        let handler = if self.deopt_handler_is_offset != 0 {
            // Negative: no handler of the nmethod's own.
            let offset = u64::try_from(int_in_word(memory.read_u64(field & !7)?, field)).ok()?;
            nmethod.wrapping_add(offset)
        } else {
            memory.read_u64(field)?
        };
        if handler != pc {
            return None;
        }
        let field = nmethod.wrapping_add(u64::from(self.nmethod_orig_pc_offset));
        let offset = u64::try_from(int_in_word(memory.read_u64(field & !7)?, field)).ok()?;
        // The slot lies inside the frame.
        if offset >= frame_words * 8 {
            return None;
        }
        memory.read_u64(sp.wrapping_add(offset))
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

/// The int at byte `at`'s offset within `word`, the aligned word holding it.
#[inline(always)]
fn int_in_word(word: u64, at: u64) -> i32 {
    (word >> ((at & 4) * 8)) as u32 as i32
}

/// Where a compiled frame caught mid-prologue or mid-epilogue keeps its
/// caller's registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unbuilt {
    /// The return address is at `sp`; `rbp` is the caller's.
    ReturnAtSp,
    /// The caller's `rbp` is at `sp`, the return address above it.
    SavedFpAtSp,
    /// The frame is allocated (`sub rsp, N`) but the caller's `rbp`, which
    /// `rbp` still holds, is not stored in it yet.
    FpNotSaved,
}

/// Prefix of `mov [rsp + disp8], rbp`, with which a prologue that does not
/// bang the stack saves the caller's fp after `sub rsp, N`.
const STORE_FP: [u8; 4] = [0x48, 0x89, 0x6c, 0x24];
/// The same with a 32-bit displacement.
const STORE_FP_32: [u8; 4] = [0x48, 0x89, 0xac, 0x24];
/// Prefix of `cmp rsp, [r15 + disp8]`, the thread-local return poll (JDK 16+).
const POLL_CMP: [u8; 3] = [0x49, 0x3b, 0x67];
/// The same with a 32-bit displacement.
const POLL_CMP_32: [u8; 3] = [0x49, 0x3b, 0xa7];
/// Prefix of `ja rel32`, which follows it.
const POLL_JA: [u8; 2] = [0x0f, 0x87];
/// Prefix of `mov r10, [r15 + disp8]`, loading the polling page (JDK 10–15).
const POLL_LOAD: [u8; 3] = [0x4d, 0x8b, 0x57];
/// The same with a 32-bit displacement.
const POLL_LOAD_32: [u8; 3] = [0x4d, 0x8b, 0x97];
/// `test [r10], eax`, touching it.
const POLL_TEST: [u8; 3] = [0x41, 0x85, 0x02];
/// Prefix of `test [rip + disp32], eax`, the global polling page (JDK 8–9).
const POLL_GLOBAL: [u8; 2] = [0x85, 0x05];
const POP_RBP: u8 = 0x5d;
const RET: u8 = 0xc3;

/// Reads a compiled method's epilogue from the instruction at the sampled
/// PC (`code`: 16 bytes from it, as two little-endian words). HotSpot's
/// x86-64 compilers end a method with `add rsp, N; pop rbp`, then the
/// return poll (`cmp rsp, [r15 + …]; ja …`, or JDK 10–15's `mov r10,
/// [r15 + …]; test [r10], eax`, or JDK 8's `test [rip + …], eax`), then
/// `ret`: at `pop rbp` the caller's fp is at `sp`; past it, only poll
/// instructions lead to the `ret`, and the return address is at `sp`. Any
/// other instruction runs inside the built frame.
#[inline(always)]
pub fn epilogue_state(code: [u64; 2]) -> Option<Unbuilt> {
    match byte_at(code, 0) {
        Some(POP_RBP) => return Some(Unbuilt::SavedFpAtSp),
        Some(RET) => return Some(Unbuilt::ReturnAtSp),
        _ => {}
    }
    // At most three poll instructions (cmp, ja; or mov, test) before the ret.
    let mut at = 0u64;
    for _ in 0..3 {
        let length = if starts_with(code, at, &POLL_CMP) || starts_with(code, at, &POLL_LOAD) {
            4
        } else if starts_with(code, at, &POLL_CMP_32) || starts_with(code, at, &POLL_LOAD_32) {
            7
        } else if starts_with(code, at, &POLL_TEST) {
            3
        } else if starts_with(code, at, &POLL_JA) || starts_with(code, at, &POLL_GLOBAL) {
            6
        } else {
            return None;
        };
        at += length;
        if byte_at(code, at) == Some(RET) {
            return Some(Unbuilt::ReturnAtSp);
        }
    }
    None
}

/// Whether the instruction at the sampled PC (`code`, as for
/// [`epilogue_state`]) is the prologue's `mov [rsp + N], rbp`.
#[inline(always)]
pub fn prologue_stores_fp(code: [u64; 2]) -> bool {
    starts_with(code, 0, &STORE_FP) || starts_with(code, 0, &STORE_FP_32)
}

/// Byte `at` of `code` (little-endian words), computed on values rather
/// than indexed: the BPF verifier refuses the pointer arithmetic an
/// indexed stack array compiles to.
#[inline(always)]
fn byte_at(code: [u64; 2], at: u64) -> Option<u8> {
    let [low, high] = code;
    match at {
        0..8 => Some((low >> (at * 8)) as u8),
        8..16 => Some((high >> ((at - 8) * 8)) as u8),
        _ => None,
    }
}

/// Whether the bytes of `code` from `at` start with `pattern`.
#[inline(always)]
fn starts_with<const N: usize>(code: [u64; 2], at: u64, pattern: &[u8; N]) -> bool {
    let mut i = 0;
    while i < N {
        if byte_at(code, at + i as u64) != Some(pattern[i]) {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests;
