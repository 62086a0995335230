use super::*;

extern crate std;

use crate::memory::test_image::Image;

const FS_BASE: u64 = 0x7f00_0000_1000;
const DTV: u64 = 0x5000;
const BLOCK: u64 = 0x7f00_0000_0fe8;
const EC: u64 = 0x9000;
const STACK: u64 = 0x10_0000;
/// A 3.3-like frame size.
const CFP: u64 = 56;
const STACK_WORDS: u64 = 1024;
const END: u64 = STACK + STACK_WORDS * 8;

fn tls_process() -> RubyProcess {
    RubyProcess {
        main_ractor_pointer: 0,
        tls_module: 1,
        tls_offset: 16,
        running_ec: 0x180,
        control_frame_size: CFP as u16,
        ec_thread: 48,
        thread_pthread: 40,
        native_thread_pthread: 16,
        ec_kind: ec_kind::TLS_DTV,
        reserved: [0; 5],
    }
}

/// Writes a control frame at `cfp` with an `ep` at `ep` holding `flags`.
fn frame(m: &mut Image, cfp: u64, pc: u64, iseq: u64, ep: u64, flags: u64) {
    m.put(cfp, pc);
    m.put(cfp + 16, iseq);
    m.put(cfp + 32, ep);
    m.put(ep - 16, 0);
    m.put(ep - 8, 0);
    m.put(ep, flags);
}

/// An EC whose newest frame is `frames` frames above the dummy slot.
fn image(frames: u64) -> (Image, u64) {
    let mut m = Image::default();
    m.put(FS_BASE + 8, DTV);
    m.put(DTV + 16, BLOCK);
    m.put(BLOCK + 16, EC);
    m.put(EC, STACK);
    m.put(EC + 8, STACK_WORDS);
    let top = END - (frames + 1) * CFP;
    m.put(EC + 16, top);
    (m, top)
}

#[test]
fn finds_the_ec_through_tls_or_the_running_ec() {
    let (mut m, _) = image(1);
    let p = tls_process();
    assert_eq!(p.execution_context(FS_BASE, &mut m), Some(EC));
    // A thread whose TLS block is not there yet, or whose EC is NULL.
    assert_eq!(p.execution_context(FS_BASE + 0x100, &mut m), None);
    m.put(BLOCK + 16, 0);
    assert_eq!(p.execution_context(FS_BASE, &mut m), None);

    let running = RubyProcess {
        ec_kind: ec_kind::RUNNING_EC,
        main_ractor_pointer: 0x3000,
        ..p
    };
    m.put(0x3000, 0x4000);
    m.put(0x4000 + 0x180, EC);
    // The GVL holder's thread (`ec->thread_ptr`) and its native thread (`nt`).
    let thread = 0x6000;
    let native_thread = 0x7000;
    m.put(EC + 48, thread);
    m.put(thread + 40, native_thread);
    m.put(native_thread + 16, FS_BASE);
    assert_eq!(running.execution_context(FS_BASE, &mut m), Some(EC));
    // Another thread, waiting for the GVL, is not given the holder's context.
    assert_eq!(running.execution_context(FS_BASE + 0x4000, &mut m), None);
    assert_eq!(running.execution_context(0, &mut m), None);
    // 3.1: the pthread_t in the thread itself.
    let direct = RubyProcess {
        thread_pthread: 88,
        native_thread_pthread: PTHREAD_IN_THREAD,
        ..running
    };
    m.put(thread + 88, FS_BASE);
    assert_eq!(direct.execution_context(FS_BASE, &mut m), Some(EC));
    assert_eq!(direct.execution_context(FS_BASE + 0x4000, &mut m), None);
    // An unreadable thread, and no ractor.
    m.put(EC + 48, 0x66_0000);
    assert_eq!(running.execution_context(FS_BASE, &mut m), None);
    m.put(0x3000, 0);
    assert_eq!(running.execution_context(FS_BASE, &mut m), None);
}

#[test]
fn walks_ruby_and_c_frames_to_the_oldest_and_skips_internal_ones() {
    let (mut m, top) = image(4);
    let p = tls_process();
    let entry = 0x2_0000;
    // Newest first: a C function, an internal frame, a Ruby method, the
    // Ruby frame `rb_vm_exec` started at.
    frame(&mut m, top, 0, 0, 0x8_0000, 0x5555_0083);
    m.put(0x8_0000 - 16, entry);
    frame(&mut m, top + CFP, 0, 0, 0x8_0100, 0x7999_0081);
    frame(
        &mut m,
        top + 2 * CFP,
        0xc0de,
        0x3_0000,
        0x8_0200,
        0x1111_0003,
    );
    m.put(0x8_0200 - 16, 0x2_1000);
    frame(
        &mut m,
        top + 3 * CFP,
        0xc0df,
        0x3_1000,
        0x8_0300,
        0x4444_0021,
    );

    let ec = p.execution_context(FS_BASE, &mut m).unwrap();
    let mut frames = p.control_frames(ec, &mut m).unwrap();
    assert_eq!(
        frames,
        ControlFrames {
            next: top,
            last: END - 2 * CFP
        }
    );
    let mut steps = std::vec::Vec::new();
    while more(&frames) {
        steps.push(p.step(&mut frames, &mut m));
    }
    assert_eq!(
        steps,
        [
            RubyStep::Cfunc(TAGS.word(word::CFUNC, entry)),
            RubyStep::Skipped,
            RubyStep::Iseq {
                iseq_word: TAGS.word(word::ISEQ, 0x3_0000),
                pc_word: TAGS.word(word::PC, 0xc0de),
                method_word: TAGS.word(word::METHOD, 0x2_1000),
            },
            // A block's frame (not local): no method word.
            RubyStep::Iseq {
                iseq_word: TAGS.word(word::ENTRY_ISEQ, 0x3_1000),
                pc_word: TAGS.word(word::PC, 0xc0df),
                method_word: 0,
            },
        ]
    );
}

#[test]
fn special_constants_are_no_method_entries_and_unreadable_frames_fail() {
    let (mut m, top) = image(2);
    let p = tls_process();
    // ep[-2] is nil (a special constant): no method entry.
    frame(&mut m, top, 0, 0, 0x8_0000, 0x5555_0083);
    m.put(0x8_0000 - 16, 0x8);
    let mut frames = p.control_frames(EC, &mut m).unwrap();
    assert_eq!(
        p.step(&mut frames, &mut m),
        RubyStep::Cfunc(TAGS.word(word::CFUNC, 0))
    );
    // The next frame was never written.
    assert_eq!(p.step(&mut frames, &mut m), RubyStep::ReadFailed);
    // A method frame whose ep[-2] is a special constant has no method word.
    frame(&mut m, top, 0xc0de, 0x3_0000, 0x8_0000, 0x1111_0003);
    let mut frames = p.control_frames(EC, &mut m).unwrap();
    assert!(matches!(
        p.step(&mut frames, &mut m),
        RubyStep::Iseq { method_word: 0, .. }
    ));
}

#[test]
fn control_frames_outside_the_stack_or_off_a_boundary_are_refused() {
    let p = tls_process();
    for cfp in [STACK - CFP, END - CFP, END - 2 * CFP + 8, END] {
        let (mut m, _) = image(1);
        m.put(EC + 16, cfp);
        assert_eq!(p.control_frames(EC, &mut m), None, "cfp {cfp:#x}");
    }
    let (mut m, _) = image(1);
    m.put(EC + 8, 0);
    assert_eq!(p.control_frames(EC, &mut m), None, "empty stack");
    m.put(EC + 8, u64::MAX / 4);
    assert_eq!(p.control_frames(EC, &mut m), None, "absurd stack");
    let (mut m, top) = image(1);
    let frames = p.control_frames(EC, &mut m).unwrap();
    assert_eq!(frames.next, top);
    assert!(more(&frames));
}
