use super::*;

extern crate std;

use crate::memory::test_image::Image;

const LOW: u64 = 0x7f00_0000_0000;
const SEGMAP: u64 = 0x5000_0000;
const INTERP: u64 = LOW;
const INTERP_END: u64 = LOW + 0x1_0000;
const CALL_STUB_RETURN: u64 = LOW + 0x2_0010;

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
        reserved: [0; 2],
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
