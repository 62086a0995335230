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
//! Per JavaScript frame the walk reports the JSFunction and either the
//! bytecode offset (interpreted) or the PC (compiled code, which user
//! space maps to a position through the code object).

use crate::{MemoryReader, Registers};

/// Address ranges described per process (unused ones are empty).
pub const MAX_V8_RANGES: usize = 4;

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
    /// Where V8 runs code: the embedded builtins (in the binary's text and
    /// any remapped copy of them) and the JIT code range.
    pub code: [V8Range; MAX_V8_RANGES],
    /// The interpreter's trampolines (`InterpreterEntryTrampoline`,
    /// `InterpreterEnterAtBytecode`, `InterpreterEnterAtNextBytecode`),
    /// wherever their code runs from: a frame whose PC is here is
    /// interpreted.
    pub interpreter: [V8Range; MAX_V8_RANGES],
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
    /// Zero.
    pub reserved: [u8; 7],
}

const _: () = assert!(core::mem::size_of::<V8Process>() == 144);

/// What one step found. The registers move to the caller on every outcome
/// but [`V8Step::Native`] and [`V8Step::ReadFailed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V8Step {
    /// An interpreted frame: its JSFunction (tagged) and bytecode offset.
    Interpreted {
        /// The JSFunction, as tagged in the frame.
        function: u64,
        /// The offset of the bytecode running, from the first bytecode.
        bytecode_offset: u32,
    },
    /// A frame of compiled JavaScript (Sparkplug, Maglev, TurboFan, or a
    /// builtin with JavaScript linkage): its JSFunction and PC.
    Compiled {
        /// The JSFunction, as tagged in the frame.
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
        self.interpreter.iter().any(|r| r.contains(pc))
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
            if self.in_interpreter(lookup) {
                let Some(offset) = memory.read_u64(slot(self.fp_bytecode_offset)) else {
                    return V8Step::ReadFailed;
                };
                // A Smi: the value in the upper half.
                let biased = (offset as i64) >> 32;
                let bytecode_offset = biased - i64::from(self.bytecode_offset_bias);
                if offset & 1 != 0 || !(0..=i64::from(u32::MAX)).contains(&bytecode_offset) {
                    return V8Step::ReadFailed;
                }
                V8Step::Interpreted {
                    function,
                    bytecode_offset: bytecode_offset as u32,
                }
            } else {
                V8Step::Compiled { function, pc }
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
