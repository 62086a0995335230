//! The frame-pointer step: `[rbp]` holds the caller's rbp, `[rbp + 8]` the
//! return address.

use super::{Registers, StepOutcome};
use crate::{MemoryReader, runtime::USER_ADDRESS_END};

/// Unwinds one frame through the frame-pointer chain.
///
/// The chain must move strictly towards the stack's base (higher addresses),
/// which also guarantees the walk terminates on corrupted stacks. On
/// [`StepOutcome::Caller`] `regs` holds the caller's registers; otherwise it
/// is unchanged.
#[inline(always)]
pub fn frame_pointer_step<M: MemoryReader>(regs: &mut Registers, memory: &mut M) -> StepOutcome {
    if regs.bp == 0 {
        return StepOutcome::EndOfStack;
    }
    if !regs.bp.is_multiple_of(8) || regs.bp < regs.sp {
        return StepOutcome::InvalidFrame;
    }
    let Some(caller_bp) = memory.read_u64(regs.bp) else {
        return StepOutcome::ReadFailed;
    };
    let Some(return_address) = memory.read_u64(regs.bp.wrapping_add(8)) else {
        return StepOutcome::ReadFailed;
    };
    if let Some(end) = bad_return_address(return_address) {
        return end;
    }
    if caller_bp != 0 && caller_bp <= regs.bp {
        return StepOutcome::InvalidFrame;
    }
    regs.ip = return_address;
    regs.sp = regs.bp + 16;
    regs.bp = caller_bp;
    StepOutcome::Caller
}

/// Why `return_address` cannot be a caller's: 0 ends the stack; at or above
/// [`USER_ADDRESS_END`] it is no user address (and would pass for a runtime's
/// tagged word in a sample). One compare covers both on the common path.
#[inline(always)]
pub(crate) fn bad_return_address(return_address: u64) -> Option<StepOutcome> {
    if return_address.wrapping_sub(1) < USER_ADDRESS_END - 1 {
        return None;
    }
    Some(if return_address == 0 {
        StepOutcome::EndOfStack
    } else {
        StepOutcome::InvalidFrame
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stack image: `words[i]` lives at `base + 8 * i`.
    struct Stack {
        base: u64,
        words: [u64; 16],
    }

    impl MemoryReader for Stack {
        fn read_u64(&mut self, address: u64) -> Option<u64> {
            let index = address.checked_sub(self.base)? / 8;
            self.words.get(usize::try_from(index).ok()?).copied()
        }
    }

    fn walk(stack: &mut Stack, mut regs: Registers) -> ([u64; 8], usize, StepOutcome) {
        let mut ips = [0u64; 8];
        let mut n = 0;
        loop {
            ips[n] = regs.ip;
            n += 1;
            match frame_pointer_step(&mut regs, stack) {
                StepOutcome::Caller => {}
                end => return (ips, n, end),
            }
        }
    }

    #[test]
    fn walks_a_chain_to_its_end() {
        let base = 0x7fff_0000;
        let mut words = [0u64; 16];
        // frame A at base+0: saved rbp -> frame B (base+32), return 0x401111
        words[0] = base + 32;
        words[1] = 0x40_1111;
        // frame B at base+32: saved rbp -> frame C (base+64), return 0x402222
        words[4] = base + 64;
        words[5] = 0x40_2222;
        // frame C: saved rbp 0 (outermost), return 0x403333
        words[8] = 0;
        words[9] = 0x40_3333;
        let mut stack = Stack { base, words };
        let regs = Registers {
            ip: 0x40_0000,
            sp: base - 16,
            bp: base,
        };
        let (ips, n, end) = walk(&mut stack, regs);
        assert_eq!(&ips[..n], &[0x40_0000, 0x40_1111, 0x40_2222, 0x40_3333]);
        assert_eq!(end, StepOutcome::EndOfStack);
    }

    #[test]
    fn a_return_address_outside_user_space_is_invalid() {
        assert_eq!(bad_return_address(0x40_1111), None);
        assert_eq!(bad_return_address(USER_ADDRESS_END - 1), None);
        assert_eq!(bad_return_address(0), Some(StepOutcome::EndOfStack));
        for wild in [USER_ADDRESS_END, u64::MAX, 0xffff_8000_0000_0000] {
            assert_eq!(bad_return_address(wild), Some(StepOutcome::InvalidFrame));
        }
        let base = 0x7fff_0000;
        let mut words = [0u64; 16];
        words[0] = base + 32;
        words[1] = USER_ADDRESS_END | 0x1234; // would read as a runtime's tag
        let mut stack = Stack { base, words };
        let regs = Registers {
            ip: 0x40_0000,
            sp: base - 16,
            bp: base,
        };
        let (_, n, end) = walk(&mut stack, regs);
        assert_eq!((n, end), (1, StepOutcome::InvalidFrame));
    }

    #[test]
    fn refuses_a_loop() {
        let base = 0x7fff_0000;
        let mut words = [0u64; 16];
        words[0] = base; // points at itself
        words[1] = 0x40_1111;
        let mut stack = Stack { base, words };
        let regs = Registers {
            ip: 0x40_0000,
            sp: base,
            bp: base,
        };
        let (_, n, end) = walk(&mut stack, regs);
        assert_eq!(n, 1);
        assert_eq!(end, StepOutcome::InvalidFrame);
    }

    #[test]
    fn unreadable_memory_stops_the_walk() {
        let mut stack = Stack {
            base: 0x1000,
            words: [0; 16],
        };
        let mut regs = Registers {
            ip: 1,
            sp: 0x9000_0000,
            bp: 0x9000_0000,
        };
        assert_eq!(
            frame_pointer_step(&mut regs, &mut stack),
            StepOutcome::ReadFailed
        );
    }

    #[test]
    fn misaligned_or_below_sp_is_invalid() {
        let mut stack = Stack {
            base: 0x1000,
            words: [0; 16],
        };
        let mut misaligned = Registers {
            ip: 1,
            sp: 0x1000,
            bp: 0x1003,
        };
        assert_eq!(
            frame_pointer_step(&mut misaligned, &mut stack),
            StepOutcome::InvalidFrame
        );
        let mut below = Registers {
            ip: 1,
            sp: 0x1010,
            bp: 0x1008,
        };
        assert_eq!(
            frame_pointer_step(&mut below, &mut stack),
            StepOutcome::InvalidFrame
        );
    }
}
