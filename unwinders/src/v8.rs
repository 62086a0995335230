//! The V8 frame walk, `no_std` so that BPF and host tests run the same
//! code. V8 keeps frame pointers in every frame it builds (interpreted,
//! Sparkplug, Maglev, TurboFan, builtins), so each step is one frame of the
//! `rbp` chain; what the frame is comes from the frame itself:
//!
//! - the slot below the saved `rbp` holds a JavaScript frame's context (a
//!   tagged pointer: odd) or a typed frame's marker (`type << 1`: even);
//! - a JavaScript frame keeps its JSFunction in the next slot down; it is
//!   interpreted when its PC (for a frame below the top, the return address
//!   its callee saved) is in the interpreter's trampolines, and then its
//!   bytecode offset is a Smi two slots further down;
//! - an `ENTRY` or `CONSTRUCT_ENTRY` frame is C++ calling into JavaScript:
//!   its caller is native code again, and the walk hands back there.
//!
//! Per JavaScript frame the walk reports the function's SharedFunctionInfo
//! and either the bytecode offset (interpreted) or the JSFunction and the
//! PC (compiled code, which user space maps to positions, inlined
//! functions included, through the function's code).

use crate::{
    Counter, MemoryReader, ProgramIndex, Registers,
    runtime::{BpfRuntime, TagRange},
};

/// V8's BPF half.
pub const V8: BpfRuntime = BpfRuntime {
    name: "v8",
    program: ProgramIndex::V8,
    program_name: "unwind_v8",
    tags: TagRange { first: 0x40 },
    counters: &[
        Counter::V8Frames,
        Counter::V8ReadFailed,
        Counter::V8StackTruncated,
        Counter::V8ProcessMissing,
    ],
};

/// V8's local word tags. An interpreted frame is a [`SHARED`] word and a
/// [`BYTECODE_OFFSET`] word; a compiled one a [`SHARED`], a [`FUNCTION`] and
/// a [`PC`] or [`TOP_PC`] word.
pub mod word {
    /// A JavaScript frame's SharedFunctionInfo (tagged pointer).
    pub const SHARED: u8 = 0;
    /// An interpreted frame's bytecode offset.
    pub const BYTECODE_OFFSET: u8 = 1;
    /// A compiled frame's JSFunction (tagged pointer).
    pub const FUNCTION: u8 = 2;
    /// A compiled frame's return address into its code.
    pub const PC: u8 = 3;
    /// The sampled compiled frame's PC (the instruction running).
    pub const TOP_PC: u8 = 4;
}

/// V8 processes BPF holds data for at once.
pub const V8_PROCESSES_MAX: u32 = 1024;
/// Code ranges described per process (unused ones are empty): the
/// binary's builtins and, per isolate (the main thread's and each worker
/// thread's), a JIT code range and a copy of the builtins in it.
pub const MAX_V8_RANGES: usize = 16;

/// One address range, `[low, high)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct V8Range {
    /// First address.
    pub low: u64,
    /// One past the last.
    pub high: u64,
}

const _: () = assert!(core::mem::size_of::<V8Range>() == 16);

impl V8Range {
    #[inline(always)]
    fn contains(&self, address: u64) -> bool {
        self.low <= address && address < self.high
    }
}

/// What the walk needs of one V8 process (from `v8dbg_*` constants and
/// the process's mappings).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct V8Process {
    /// Where V8 runs code: first the embedded builtins (in the binary's
    /// text and each remapped copy of them, each range starting at the
    /// builtins' first byte), then the JIT code ranges.
    pub code: [V8Range; MAX_V8_RANGES],
    /// The interpreter's trampolines (`InterpreterEntryTrampoline`,
    /// `InterpreterEnterAtBytecode`, `InterpreterEnterAtNextBytecode`), in
    /// bytes from the builtins' start: a frame whose PC is there, in any
    /// copy of the builtins, is interpreted.
    pub interpreter: V8Range,
    /// What an interpreted frame's bytecode-offset Smi adds to the offset.
    pub bytecode_offset_bias: i32,
    /// The context-or-marker slot, from `fp` (-8).
    pub fp_context_or_marker: i8,
    /// The JSFunction slot (-16).
    pub fp_function: i8,
    /// The bytecode-offset slot (-40).
    pub fp_bytecode_offset: i8,
    /// `StackFrame::ENTRY`.
    pub frame_entry: u8,
    /// `StackFrame::CONSTRUCT_ENTRY`.
    pub frame_construct_entry: u8,
    /// How many of [`Self::code`]'s ranges, first, are builtins.
    pub builtin_ranges: u8,
    /// `JSFunction::shared`, in bytes from the untagged function.
    pub function_shared: u8,
    /// Zero.
    pub reserved: [u8; 5],
}

const _: () = assert!(core::mem::size_of::<V8Process>() == 288);

/// V8's state area between tail calls.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct V8WalkState {
    /// Frames walked (counted once per program run).
    pub frames: u16,
    /// Zero.
    pub reserved: [u8; 6],
}

const _: () = assert!(core::mem::size_of::<V8WalkState>() == 8);

impl V8WalkState {
    /// The state before a sample's walk.
    #[inline(always)]
    pub fn reset(&mut self) {
        self.frames = 0;
    }
}

/// What one step found. The registers move to the caller on every outcome
/// but [`V8Step::Native`] and [`V8Step::ReadFailed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V8Step {
    /// An interpreted frame: its function and bytecode offset.
    Interpreted {
        /// The function's SharedFunctionInfo (tagged).
        shared: u64,
        /// The offset of the bytecode running, from the first bytecode.
        bytecode_offset: u32,
    },
    /// A frame of compiled JavaScript (Sparkplug, Maglev, TurboFan, or a
    /// builtin with JavaScript linkage): its JSFunction and PC.
    Compiled {
        /// The function's SharedFunctionInfo (tagged).
        shared: u64,
        /// The JSFunction, as tagged in the frame (its code is the
        /// frame's, unless the function was optimized or deoptimized
        /// since the frame was built).
        function: u64,
        /// The PC (a return address but for the top frame).
        pc: u64,
    },
    /// A typed frame (stub, exit, internal, construct…), unwound.
    Typed {
        /// Its `StackFrame::Type`.
        frame_type: u8,
    },
    /// An entry frame, unwound: its caller is C++.
    Entry,
    /// The PC is not V8's code: native code, at these registers.
    Native,
    /// Memory the step needed could not be read, or the frame is not one
    /// V8 builds (`rbp` not a frame pointer here).
    ReadFailed,
}

/// Largest V8 frame believed, in bytes (a frame pointer farther from the
/// stack pointer is not this frame's).
const MAX_FRAME_BYTES: u64 = 1 << 20;

impl V8Process {
    /// Whether `pc` is in V8's code.
    #[inline(always)]
    pub fn in_code(&self, pc: u64) -> bool {
        self.code.iter().any(|r| r.contains(pc))
    }

    #[inline(always)]
    fn in_interpreter(&self, pc: u64) -> bool {
        self.code.iter().enumerate().any(|(i, r)| {
            i < usize::from(self.builtin_ranges)
                && r.contains(pc)
                && self.interpreter.contains(pc - r.low)
        })
    }

    #[inline(always)]
    fn in_builtins(&self, pc: u64) -> bool {
        self.code
            .iter()
            .enumerate()
            .any(|(i, r)| i < usize::from(self.builtin_ranges) && r.contains(pc))
    }

    /// The bytecode offset an interpreted frame's slot `word` holds: a Smi
    /// (the value in the upper half) of the offset plus the bias.
    #[inline(always)]
    fn bytecode_offset(&self, word: u64) -> Option<u32> {
        let offset = ((word as i64) >> 32) - i64::from(self.bytecode_offset_bias);
        if word as u32 != 0 || !(0..=i64::from(u32::MAX)).contains(&offset) {
            return None;
        }
        Some(offset as u32)
    }

    /// Unwinds the frame at `regs` (`top`: the sampled frame, whose PC is
    /// the instruction running rather than a return address).
    #[inline(always)]
    pub fn step<M: MemoryReader>(&self, regs: &mut Registers, top: bool, memory: &mut M) -> V8Step {
        let pc = regs.ip;
        let lookup = if top { pc } else { pc.wrapping_sub(1) };
        if !self.in_code(lookup) {
            return V8Step::Native;
        }
        let fp = regs.bp;
        if fp < regs.sp || fp - regs.sp > MAX_FRAME_BYTES || fp & 7 != 0 {
            return V8Step::ReadFailed;
        }
        let slot = |offset: i8| fp.wrapping_add_signed(i64::from(offset));
        let (Some(marker), Some(saved_fp), Some(ret)) = (
            memory.read_u64(slot(self.fp_context_or_marker)),
            memory.read_u64(fp),
            memory.read_u64(fp.wrapping_add(8)),
        ) else {
            return V8Step::ReadFailed;
        };
        let found = if marker & 1 == 0 {
            // `type << 1` pushed as a small immediate.
            let frame_type = (marker >> 1) as u8;
            if marker >> 1 > 0xff {
                return V8Step::ReadFailed;
            }
            if frame_type == self.frame_entry || frame_type == self.frame_construct_entry {
                V8Step::Entry
            } else {
                V8Step::Typed { frame_type }
            }
        } else {
            let Some(function) = memory.read_u64(slot(self.fp_function)) else {
                return V8Step::ReadFailed;
            };
            if function & 3 != 1 {
                return V8Step::ReadFailed;
            }
            // The SharedFunctionInfo rather than the function alone: a
            // young function moves at every scavenge, and its address may
            // hold another object by the time user space reads it, while
            // SharedFunctionInfos are allocated old and rarely move. One
            // read of the heap, outside the stack window.
            // Near the top of the address space the sum would overflow
            // (found by fuzz/ `runtime_walk`): no object lies there.
            let Some(field) = (function - 1).checked_add(u64::from(self.function_shared)) else {
                return V8Step::ReadFailed;
            };
            let Some([shared]) = memory.read_words::<1>(field) else {
                return V8Step::ReadFailed;
            };
            if shared & 3 != 1 {
                return V8Step::ReadFailed;
            }
            // In the trampolines, the frame is interpreted. Elsewhere in the
            // builtins it is interpreted too when a bytecode handler runs on
            // it (they build no frame of their own): its offset slot then
            // holds a Smi. A builtin with JavaScript linkage has no such
            // slot, and the frame is reported with its PC.
            let interpreter = self.in_interpreter(lookup);
            let offset = if interpreter || self.in_builtins(lookup) {
                match memory.read_u64(slot(self.fp_bytecode_offset)) {
                    Some(word) => self.bytecode_offset(word),
                    None if interpreter => return V8Step::ReadFailed,
                    None => None,
                }
            } else {
                None
            };
            match offset {
                Some(bytecode_offset) => V8Step::Interpreted {
                    shared,
                    bytecode_offset,
                },
                None if interpreter => return V8Step::ReadFailed,
                None => V8Step::Compiled {
                    shared,
                    function,
                    pc,
                },
            }
        };
        // Every V8 frame: the caller's fp at fp, the return address above;
        // the callee pops its arguments, so the caller's sp is right above.
        regs.ip = ret;
        regs.bp = saved_fp;
        regs.sp = fp.wrapping_add(16);
        found
    }
}

#[cfg(test)]
mod tests;
