use super::*;

extern crate std;

use crate::memory::test_image::Image;

/// The embedded builtins, with the interpreter's trampoline in them.
const BLOB: u64 = 0x1a0_0000;
const TRAMPOLINE: u64 = BLOB + 0x1000;
/// JIT code, and a copy of the builtins an isolate remapped next to it.
const JIT: u64 = 0x7f00_0000_0000;
const COPY: u64 = 0x7f10_0000_0000;
/// C++ code of the embedder.
const NATIVE: u64 = 0x40_0000;
const SMI_BIAS: i32 = 63;

fn process() -> V8Process {
    let mut p = V8Process {
        bytecode_offset_bias: SMI_BIAS,
        fp_context_or_marker: -8,
        fp_function: -16,
        fp_bytecode_offset: -40,
        frame_entry: 1,
        frame_construct_entry: 2,
        function_shared: 24,
        ..V8Process::default()
    };
    p.code[0] = V8Range {
        low: BLOB,
        high: BLOB + 0x20_0000,
    };
    p.code[1] = V8Range {
        low: COPY,
        high: COPY + 0x20_0000,
    };
    p.code[2] = V8Range {
        low: JIT,
        high: JIT + 0x800_0000,
    };
    p.builtin_ranges = 2;
    p.interpreter = V8Range {
        low: TRAMPOLINE - BLOB,
        high: TRAMPOLINE - BLOB + 0x200,
    };
    p
}

fn smi(value: i64) -> u64 {
    (value as u64) << 32
}

/// The SharedFunctionInfo of the JSFunction at tagged `function`.
fn shared_of(function: u64) -> u64 {
    function + 0x100_0000
}

/// A JSFunction at tagged `function`, with its SharedFunctionInfo.
fn function(m: &mut Image, function: u64) {
    m.put(function - 1 + 24, shared_of(function));
}

/// A frame at `fp`: its caller's fp and return address, and its slots.
fn frame(m: &mut Image, fp: u64, caller_fp: u64, ret: u64, slots: &[(i64, u64)]) {
    m.put(fp, caller_fp);
    m.put(fp + 8, ret);
    for &(offset, value) in slots {
        m.put(fp.wrapping_add_signed(offset), value);
    }
}

/// Sampled in TurboFan code called by an interpreted function, called by
/// C++ through an entry frame, under a typed (stub) frame:
///
/// - optimized `leaf` (top, PC in JIT code), fp = F1
/// - interpreted `mid` (its PC: the return into the trampoline), fp = F2
/// - a stub frame (marker 18 << 1), fp = F3
/// - the entry frame, fp = F4, called from C++ at NATIVE + 0x10
#[test]
fn walks_optimized_interpreted_typed_and_entry_frames_to_native_code() {
    const F1: u64 = 0x7ffc_0000_1000;
    const F2: u64 = F1 + 0x100;
    const F3: u64 = F2 + 0x100;
    const F4: u64 = F3 + 0x100;
    const LEAF: u64 = 0x2000_0001;
    const MID: u64 = 0x2000_1001;
    const CONTEXT: u64 = 0x3000_0001;
    let mut m = Image::default();
    function(&mut m, LEAF);
    function(&mut m, MID);
    frame(
        &mut m,
        F1,
        F2,
        TRAMPOLINE + 0xd0,
        &[(-8, CONTEXT), (-16, LEAF)],
    );
    frame(
        &mut m,
        F2,
        F3,
        JIT + 0x500,
        &[
            (-8, CONTEXT),
            (-16, MID),
            (-40, smi(29 + i64::from(SMI_BIAS))),
        ],
    );
    frame(&mut m, F3, F4, BLOB + 0x8000, &[(-8, 18 << 1)]);
    frame(&mut m, F4, 0x7ffc_0000_9000, NATIVE + 0x10, &[(-8, 1 << 1)]);
    let p = process();
    let mut regs = Registers {
        ip: JIT + 0x40,
        sp: F1 - 0x30,
        bp: F1,
    };
    let mut steps = std::vec::Vec::new();
    let mut top = true;
    loop {
        let step = p.step(&mut regs, top, &mut m);
        top = false;
        steps.push(step);
        if matches!(step, V8Step::Entry | V8Step::Native | V8Step::ReadFailed) {
            break;
        }
    }
    assert_eq!(
        steps,
        [
            V8Step::Compiled {
                shared: shared_of(LEAF),
                function: LEAF,
                pc: JIT + 0x40
            },
            V8Step::Interpreted {
                shared: shared_of(MID),
                bytecode_offset: 29
            },
            // The return address into JIT code: the stub's caller.
            V8Step::Typed { frame_type: 18 },
            V8Step::Entry,
        ]
    );
    // Handed back at the C++ caller of the entry frame.
    assert_eq!(
        regs,
        Registers {
            ip: NATIVE + 0x10,
            sp: F4 + 16,
            bp: 0x7ffc_0000_9000
        }
    );
    assert_eq!(p.step(&mut regs, false, &mut m), V8Step::Native);
}

#[test]
fn what_is_not_a_v8_frame_is_refused_without_moving() {
    let p = process();
    let mut m = Image::default();
    let fp = 0x7ffc_0000_2000;
    // A JS-looking frame whose function slot holds a Smi.
    frame(
        &mut m,
        fp,
        fp + 0x100,
        JIT,
        &[(-8, 0x3000_0001), (-16, smi(5))],
    );
    let at = Registers {
        ip: JIT + 4,
        sp: fp - 8,
        bp: fp,
    };
    let mut regs = at;
    assert_eq!(p.step(&mut regs, true, &mut m), V8Step::ReadFailed);
    assert_eq!(regs, at);
    // A frame pointer below the stack pointer, or unaligned.
    for bp in [fp - 16, fp + 3] {
        let mut regs = Registers { bp, ..at };
        assert_eq!(p.step(&mut regs, true, &mut m), V8Step::ReadFailed);
    }
    // A function whose SharedFunctionInfo slot holds no heap object.
    frame(
        &mut m,
        fp,
        fp + 0x100,
        JIT,
        &[(-8, 0x3000_0001), (-16, 0x2000_0001)],
    );
    m.put(0x2000_0001 - 1 + 24, smi(7));
    let mut regs = at;
    assert_eq!(p.step(&mut regs, true, &mut m), V8Step::ReadFailed);
    assert_eq!(regs, at);
    // An interpreted frame whose offset slot is not a Smi.
    function(&mut m, 0x2000_0001);
    frame(
        &mut m,
        fp,
        fp + 0x100,
        JIT,
        &[(-8, 0x3000_0001), (-16, 0x2000_0001), (-40, 0x2000_0001)],
    );
    let mut regs = Registers {
        ip: TRAMPOLINE + 8,
        ..at
    };
    assert_eq!(p.step(&mut regs, false, &mut m), V8Step::ReadFailed);
    // Unreadable memory.
    let mut regs = Registers {
        bp: fp + 0x1000,
        ..at
    };
    assert_eq!(p.step(&mut regs, true, &mut m), V8Step::ReadFailed);
}

/// A bytecode handler runs on its interpreted frame (top PC in the
/// builtins, not in a trampoline): the frame is interpreted at the offset
/// its slot holds. A builtin with JavaScript linkage keeps no Smi there and
/// is reported by its PC; outside the builtins the slot is never read.
#[test]
fn frames_in_bytecode_handlers_are_interpreted_and_builtins_are_compiled() {
    let p = process();
    let fp = 0x7ffc_0000_3000;
    let caller = 0x7ffc_0000_3100;
    let handler = BLOB + 0x9_0000;
    let cases = [
        (
            handler,
            smi(12 + i64::from(SMI_BIAS)),
            V8Step::Interpreted {
                shared: shared_of(0x2000_0001),
                bytecode_offset: 12,
            },
        ),
        (
            handler,
            0x4000_0001,
            V8Step::Compiled {
                shared: shared_of(0x2000_0001),
                function: 0x2000_0001,
                pc: handler,
            },
        ),
        (
            JIT + 0x80,
            smi(12 + i64::from(SMI_BIAS)),
            V8Step::Compiled {
                shared: shared_of(0x2000_0001),
                function: 0x2000_0001,
                pc: JIT + 0x80,
            },
        ),
    ];
    // The trampoline in the copy: interpreted, with or without a Smi.
    let copied = COPY + (TRAMPOLINE - BLOB) + 8;
    let cases = cases.into_iter().chain([(
        copied,
        smi(3 + i64::from(SMI_BIAS)),
        V8Step::Interpreted {
            shared: shared_of(0x2000_0001),
            bytecode_offset: 3,
        },
    )]);
    for (pc, offset_slot, expected) in cases {
        let mut m = Image::default();
        function(&mut m, 0x2000_0001);
        frame(
            &mut m,
            fp,
            caller,
            TRAMPOLINE + 0x10,
            &[(-8, 0x3000_0001), (-16, 0x2000_0001), (-40, offset_slot)],
        );
        let mut regs = Registers {
            ip: pc,
            sp: fp - 0x40,
            bp: fp,
        };
        assert_eq!(p.step(&mut regs, true, &mut m), expected);
        assert_eq!(regs.ip, TRAMPOLINE + 0x10);
    }
}
