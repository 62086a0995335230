use super::*;

extern crate std;

use crate::memory::test_image::Image;

const LOW: u64 = 0x7f00_0000_0000;
const SEGMAP: u64 = 0x5000_0000;
const INTERP: u64 = LOW;
const INTERP_END: u64 = LOW + 0x1_0000;
const CALL_STUB_RETURN: u64 = LOW + 0x2_0010;
/// Where the test's nmethods keep their deoptimization handler (a pointer).
const DEOPT_HANDLER_FIELD: u64 = 0x80;
/// Where they keep `_orig_pc_offset` (an int, the low half of its word).
const ORIG_PC_OFFSET_FIELD: u64 = 0x130;

fn process() -> HotSpotProcess {
    HotSpotProcess {
        heaps: [
            CodeHeapRange {
                low: LOW,
                high: LOW + 0x10_0000,
                segmap: SEGMAP,
                log2_segment_size: 7,
                reserved: 0,
            },
            CodeHeapRange::default(),
            CodeHeapRange::default(),
        ],
        interpreter_low: INTERP,
        interpreter_high: INTERP_END,
        call_stub_return: CALL_STUB_RETURN,
        heap_block_size: 16,
        blob_frame_size: 28,
        method_slot: 3,
        bcp_slot: 8,
        code_begin_is_offset: 0,
        frame_complete_bytes: 4,
        blob_code_begin: 8,
        blob_frame_complete: 32,
        nmethod_deopt_handler: DEOPT_HANDLER_FIELD as u16,
        nmethod_orig_pc_offset: ORIG_PC_OFFSET_FIELD as u16,
        deopt_handler_is_offset: 0,
        reserved2: [0; 7],
    }
}

/// Marks segments `first..first + n` as one block in the segment map.
fn block(m: &mut Image, first: u64, n: u64) {
    for i in 0..n {
        let at = SEGMAP + first + i;
        let word = at & !7;
        let shift = (at & 7) * 8;
        let old = m.get(word).unwrap_or(0);
        let hop = i.min(254);
        m.put(word, (old & !(0xff << shift)) | (hop << shift));
    }
}

/// A blob at segment `first` with frame size `words`.
fn blob(m: &mut Image, first: u64, n: u64, words: i32) -> u64 {
    block(m, first, n);
    let blob = LOW + (first << 7) + 16;
    // `_frame_size` at 28: the high half of the word at 24.
    m.put(blob + 24, (words as u32 as u64) << 32);
    blob
}

#[test]
fn blobs_are_found_through_the_segment_map() {
    let p = process();
    let mut m = Image::default();
    let b = blob(&mut m, 0x400, 300, 6);
    for pc in [b, b + 0x80, b + 299 * 128 - 20] {
        assert_eq!(p.blob_at(pc, &mut m), Some(b), "{pc:#x}");
    }
    // Free segments and addresses outside the heaps have no blob.
    m.put(SEGMAP + 0x800, 0xff);
    assert_eq!(p.blob_at(LOW + (0x800 << 7), &mut m), None);
    assert_eq!(p.blob_at(LOW - 1, &mut m), None);
}

#[test]
fn compiled_then_interpreted_then_the_call_stub_then_native() {
    let p = process();
    let mut m = Image::default();
    let compiled = blob(&mut m, 0x400, 4, 4);
    let stack = 0x7ffd_0000_1000u64;
    // Compiled frame at the top: 4 words, its caller's fp and return
    // address in the last two.
    let mut regs = Registers {
        ip: compiled + 0x40,
        sp: stack,
        bp: 0,
    };
    let interp_fp = stack + 0x100;
    let interp_pc = INTERP + 0x500;
    m.put(stack + 16, interp_fp);
    m.put(stack + 24, interp_pc);
    // The interpreted frame: method at fp-24, bcp at fp-64, sender sp at
    // fp-8, then the call stub's frame.
    let stub_fp = stack + 0x300;
    m.put(interp_fp - 24, 0xaaaa_0000);
    m.put(interp_fp - 64, 0xbbbb_0004);
    m.put(interp_fp - 8, stack + 0x200);
    m.put(interp_fp, stub_fp);
    m.put(interp_fp + 8, CALL_STUB_RETURN);
    // The call stub: an rbp frame returning into libjvm.
    m.put(stub_fp, 0x7ffd_0000_2000);
    m.put(stub_fp + 8, 0x5555_1234);

    let step = p.step(&mut regs, true, &mut m);
    assert_eq!(
        step,
        HotSpotStep::Compiled {
            blob_word: HOTSPOT.tags.word(word::COMPILED, compiled),
            pc_word: HOTSPOT.tags.word(word::TOP_PC, compiled + 0x40),
            pending_deopt: false,
        }
    );
    assert_eq!(
        regs,
        Registers {
            ip: interp_pc,
            sp: stack + 32,
            bp: interp_fp
        }
    );
    assert_eq!(
        p.step(&mut regs, false, &mut m),
        HotSpotStep::Interpreted {
            method_word: HOTSPOT.tags.word(word::INTERPRETED, 0xaaaa_0000),
            bcp_word: HOTSPOT.tags.word(word::BCP, 0xbbbb_0004),
        }
    );
    assert_eq!(
        regs,
        Registers {
            ip: CALL_STUB_RETURN,
            sp: stack + 0x200,
            bp: stub_fp
        }
    );
    assert_eq!(p.step(&mut regs, false, &mut m), HotSpotStep::CallStub);
    assert_eq!(
        regs,
        Registers {
            ip: 0x5555_1234,
            sp: stub_fp + 16,
            bp: 0x7ffd_0000_2000
        }
    );
    let before = regs;
    assert_eq!(p.step(&mut regs, false, &mut m), HotSpotStep::Native);
    assert_eq!(regs, before, "native code is left to the native unwinder");
}

#[test]
fn stubs_unwind_through_rbp_or_their_return_address_and_holes_are_unknown() {
    let p = process();
    let mut m = Image::default();
    let stub = blob(&mut m, 0x500, 2, 0);
    let stack = 0x7ffd_0000_1000u64;
    // No frame: the return address is at sp.
    m.put(stack, 0x5555_0001);
    let mut regs = Registers {
        ip: stub + 8,
        sp: stack,
        bp: 0x10,
    };
    assert_eq!(
        p.step(&mut regs, true, &mut m),
        HotSpotStep::Stub(HOTSPOT.tags.word(word::STUB, stub))
    );
    assert_eq!(
        regs,
        Registers {
            ip: 0x5555_0001,
            sp: stack + 8,
            bp: 0x10
        }
    );
    // An rbp frame just above sp.
    m.put(stack + 0x40, 0x7ffd_0000_9000);
    m.put(stack + 0x48, 0x5555_0002);
    let mut regs = Registers {
        ip: stub + 8,
        sp: stack,
        bp: stack + 0x40,
    };
    assert!(matches!(
        p.step(&mut regs, true, &mut m),
        HotSpotStep::Stub(_)
    ));
    assert_eq!(
        regs,
        Registers {
            ip: 0x5555_0002,
            sp: stack + 0x50,
            bp: 0x7ffd_0000_9000
        }
    );
    // Code-cache memory in no blob.
    m.put(SEGMAP + 0x900, 0xff);
    let mut regs = Registers {
        ip: LOW + (0x900 << 7),
        sp: stack,
        bp: 0,
    };
    assert_eq!(p.step(&mut regs, true, &mut m), HotSpotStep::Unknown);
}

/// Bytes as the two little-endian words that hold them (zero-padded).
fn code(bytes: &[u8]) -> [u64; 2] {
    let mut padded = [0u8; 16];
    padded[..bytes.len()].copy_from_slice(bytes);
    let word = |i: usize| u64::from_le_bytes(padded[i * 8..i * 8 + 8].try_into().unwrap());
    [word(0), word(1)]
}

#[test]
fn epilogues_are_read_from_their_instructions() {
    use Unbuilt::*;
    // JDK 17: add rsp (frame built), pop rbp, cmp rsp,[r15+0x28], ja, ret.
    let jdk17 = [
        0x48, 0x83, 0xc4, 0x20, 0x5d, 0x49, 0x3b, 0x67, 0x28, 0x0f, 0x87, 1, 2, 3, 4, 0xc3,
    ];
    assert_eq!(epilogue_state(code(&jdk17[..])), None);
    assert_eq!(epilogue_state(code(&jdk17[4..])), Some(SavedFpAtSp));
    assert_eq!(epilogue_state(code(&jdk17[5..])), Some(ReturnAtSp));
    assert_eq!(epilogue_state(code(&jdk17[9..])), Some(ReturnAtSp));
    assert_eq!(epilogue_state(code(&jdk17[15..])), Some(ReturnAtSp));
    // OpenJDK 17 as read from a live C2 nmethod: the poll with a 32-bit
    // displacement (`cmp rsp, [r15 + 0x340]`).
    let live17 = [
        0x5d, 0x49, 0x3b, 0xa7, 0x40, 0x03, 0, 0, 0x0f, 0x87, 1, 0, 0, 0, 0xc3,
    ];
    assert_eq!(epilogue_state(code(&live17)), Some(SavedFpAtSp));
    assert_eq!(epilogue_state(code(&live17[1..])), Some(ReturnAtSp));
    assert_eq!(epilogue_state(code(&live17[8..])), Some(ReturnAtSp));
    let jdk11_far = [0x4d, 0x8b, 0x97, 0x08, 0x01, 0, 0, 0x41, 0x85, 0x02, 0xc3];
    assert_eq!(epilogue_state(code(&jdk11_far)), Some(ReturnAtSp));
    // JDK 11: mov r10,[r15+0x70]; test [r10],eax; ret.
    let jdk11 = [0x4d, 0x8b, 0x57, 0x70, 0x41, 0x85, 0x02, 0xc3];
    assert_eq!(epilogue_state(code(&jdk11)), Some(ReturnAtSp));
    assert_eq!(epilogue_state(code(&jdk11[4..])), Some(ReturnAtSp));
    // JDK 8: test [rip+disp32],eax; ret.
    let jdk8 = [0x85, 0x05, 1, 2, 3, 4, 0xc3];
    assert_eq!(epilogue_state(code(&jdk8)), Some(ReturnAtSp));
    // A poll that is not followed by ret is a loop's safepoint poll: the
    // frame is built.
    let loop_poll = [0x4d, 0x8b, 0x57, 0x70, 0x41, 0x85, 0x02, 0xeb, 0xf0];
    assert_eq!(epilogue_state(code(&loop_poll)), None);
    assert_eq!(epilogue_state(code(&[0x90, 0xc3])), None);
}

#[test]
fn a_sampled_frame_in_its_prologue_or_epilogue_unwinds_from_sp() {
    let p = process();
    let mut m = Image::default();
    let compiled = blob(&mut m, 0x400, 4, 6);
    let code_begin = compiled + 0x40;
    m.put(compiled + 8, code_begin);
    // _frame_complete_offset 0x10: the low half of the word at 32.
    m.put(compiled + 32, 0x10);
    let stack = 0x7ffd_0000_1000u64;
    let caller_fp = 0x7ffd_0000_8000u64;
    // Compiled code returns into Java code: here, the interpreter.
    let ret = INTERP + 0x777;
    let frame = |m: &mut Image, pc: u64, at_sp: &[u64]| {
        for (i, &w) in at_sp.iter().enumerate() {
            m.put(stack + 8 * i as u64, w);
        }
        let mut regs = Registers {
            ip: pc,
            sp: stack,
            bp: caller_fp,
        };
        let step = p.step(&mut regs, true, m);
        assert!(matches!(step, HotSpotStep::Compiled { .. }), "{step:?}");
        regs
    };
    // Instructions at the prologue's PCs that are not `mov [rsp + N], rbp`.
    for pc in [code_begin + 5, code_begin + 6] {
        m.put(pc, 0x9090_9090_9090_9090);
        m.put(pc + 8, 0x9090_9090_9090_9090);
    }
    // Before `push rbp`: the return address is at sp.
    assert_eq!(
        frame(&mut m, code_begin + 5, &[ret]),
        Registers {
            ip: ret,
            sp: stack + 8,
            bp: caller_fp
        }
    );
    // After it: the caller's fp at sp.
    assert_eq!(
        frame(&mut m, code_begin + 6, &[caller_fp, ret]),
        Registers {
            ip: ret,
            sp: stack + 16,
            bp: caller_fp
        }
    );
    // Still before frame-complete, at JDK 21's nmethod entry barrier: the
    // frame is built, sp holds a spill slot rather than a return address.
    assert_eq!(
        frame(&mut m, code_begin + 6, &[0x1234, 7, 7, 7, caller_fp, ret]),
        Registers {
            ip: ret,
            sp: stack + 48,
            bp: caller_fp
        }
    );
    // A prologue without stack bang: `sub rsp, 0x20` done, then
    // `mov [rsp + 0x20], rbp` not yet: the frame size holds, rbp is the caller's.
    let store = code_begin + 7;
    m.put(
        store,
        u64::from_le_bytes([0x48, 0x89, 0x6c, 0x24, 0x20, 0x90, 0x90, 0x90]),
    );
    m.put(store + 8, 0x9090_9090_9090_9090);
    assert_eq!(
        frame(&mut m, store, &[7, 7, 7, 7, 0xdead, ret]),
        Registers {
            ip: ret,
            sp: stack + 48,
            bp: caller_fp
        }
    );
    // In the epilogue, at `pop rbp` (rbp holds anything by then).
    let pop = code_begin + 0x30;
    m.put(
        pop,
        u64::from_le_bytes([0x5d, 0x49, 0x3b, 0x67, 0x28, 0x0f, 0x87, 1]),
    );
    m.put(pop + 8, u64::from_le_bytes([2, 3, 4, 0xc3, 0, 0, 0, 0]));
    assert_eq!(
        frame(&mut m, pop, &[caller_fp, ret]),
        Registers {
            ip: ret,
            sp: stack + 16,
            bp: caller_fp
        }
    );
    // In the body, the frame size holds: 6 words, fp and return last.
    let body = code_begin + 0x20;
    m.put(body, 0x9090_9090_9090_9090);
    m.put(body + 8, 0x9090_9090_9090_9090);
    assert_eq!(
        frame(&mut m, body, &[7, 7, 7, 7, caller_fp, ret]),
        Registers {
            ip: ret,
            sp: stack + 48,
            bp: caller_fp
        }
    );
}

/// A caller frame pending deoptimization returns into its nmethod's
/// deoptimization handler; it is reported at the call site saved in the
/// frame, and unwound by its frame size all the same.
#[test]
fn a_frame_pending_deoptimization_is_reported_at_its_saved_call_site() {
    let p = process();
    let mut m = Image::default();
    let callee = blob(&mut m, 0x400, 4, 2);
    let caller = blob(&mut m, 0x500, 8, 6);
    let handler = caller + 0x300;
    let call_site = caller + 0x123;
    m.put(caller + DEOPT_HANDLER_FIELD, handler);
    // The saved PC sits 16 bytes above the caller's sp.
    m.put(caller + ORIG_PC_OFFSET_FIELD, 16);
    let stack = 0x7ffd_0000_1000u64;
    let caller_sp = stack + 16;
    m.put(stack, 0x1111); // the callee's saved fp
    m.put(stack + 8, handler); // its return address, patched
    m.put(caller_sp + 16, call_site);
    let outer_fp = 0x7ffd_0000_3000u64;
    m.put(caller_sp + 32, outer_fp);
    m.put(caller_sp + 40, 0x5555_0000);
    let mut regs = Registers {
        ip: callee + 0x10,
        sp: stack,
        bp: 0,
    };
    assert!(matches!(
        p.step(&mut regs, true, &mut m),
        HotSpotStep::Compiled {
            pending_deopt: false,
            ..
        }
    ));
    assert_eq!(regs.ip, handler);
    assert_eq!(
        p.step(&mut regs, false, &mut m),
        HotSpotStep::Compiled {
            blob_word: HOTSPOT.tags.word(word::COMPILED, caller),
            pc_word: HOTSPOT.tags.word(word::PC, call_site),
            pending_deopt: true,
        }
    );
    assert_eq!(
        regs,
        Registers {
            ip: 0x5555_0000,
            sp: caller_sp + 48,
            bp: outer_fp
        }
    );

    // Another return address into the same nmethod is its own PC.
    let mut regs = Registers {
        ip: caller + 0x40,
        sp: caller_sp,
        bp: 0,
    };
    assert!(matches!(
        p.step(&mut regs, false, &mut m),
        HotSpotStep::Compiled { pc_word, pending_deopt: false, .. }
            if pc_word == HOTSPOT.tags.word(word::PC, caller + 0x40)
    ));

    // A saved-PC offset outside the frame is not believed.
    m.put(caller + ORIG_PC_OFFSET_FIELD, 48);
    assert_eq!(
        p.deopt_original_pc(caller, handler, caller_sp, 6, &mut m),
        None
    );
    // An int offset from the nmethod (JDK 8, 23+), negative for none.
    let by_offset = HotSpotProcess {
        deopt_handler_is_offset: 1,
        ..p
    };
    m.put(caller + ORIG_PC_OFFSET_FIELD, 16);
    m.put(caller + DEOPT_HANDLER_FIELD, 0x300);
    assert_eq!(
        by_offset.deopt_original_pc(caller, handler, caller_sp, 6, &mut m),
        Some(call_site)
    );
    m.put(caller + DEOPT_HANDLER_FIELD, u64::from(-8i32 as u32));
    assert_eq!(
        by_offset.deopt_original_pc(caller, caller - 8, caller_sp, 6, &mut m),
        None
    );
    // A JVM that does not say where the handler is.
    let unknown = HotSpotProcess {
        nmethod_deopt_handler: 0,
        ..p
    };
    assert_eq!(
        unknown.deopt_original_pc(caller, handler, caller_sp, 6, &mut m),
        None
    );
}
