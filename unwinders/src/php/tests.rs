use super::*;

extern crate std;
use std::vec::Vec;

use crate::memory::test_image::Image;

const EG: u64 = 0x60_0000;
const CURRENT: u16 = 488;
const TOP: u32 = 1 << 17;

fn nts() -> PhpProcess {
    PhpProcess {
        executor_globals: EG,
        vm_body_pc: 0,
        tls_offset: 0,
        call_top: TOP,
        current_execute_data: CURRENT,
        ex_opline: 0,
        ex_func: 24,
        ex_call_info: 40,
        ex_prev: 48,
        globals_kind: globals_kind::GLOBAL,
        reserved: 0,
    }
}

/// Writes a frame at `ex`.
fn frame(m: &mut Image, ex: u64, opline: u64, func: u64, info: u32, prev: u64) {
    m.put(ex, opline);
    m.put(ex + 24, func);
    // `This.u1.type_info` and, above it, `This.u2.num_args`.
    m.put(ex + 40, u64::from(info) | (3 << 32));
    m.put(ex + 48, prev);
}

/// Walks from `EG.current_execute_data` as BPF does.
fn walk(p: &PhpProcess, m: &mut Image) -> Vec<PhpStep> {
    let mut out = Vec::new();
    let Some(mut ex) = p.current_execute_data(0, m) else {
        return out;
    };
    for _ in 0..MAX_PHP_FRAMES {
        let mut next = 0;
        out.push(p.step(ex, &mut next, m));
        if next == 0 {
            break;
        }
        ex = next;
    }
    out
}

fn at(tag: u8, payload: u64) -> u64 {
    TAGS.word(tag, payload)
}

#[test]
fn walks_the_chain_and_marks_frames_c_code_called() {
    let mut m = Image::default();
    // leaf ← mid (called by user code) ← {main} (the script: TOP).
    m.put(EG + u64::from(CURRENT), 0x1100);
    frame(&mut m, 0x1100, 0xa000, 0x5000, 0x0200_0000, 0x1080);
    frame(&mut m, 0x1080, 0xb000, 0x5100, 0, 0x1000);
    // A dummy frame (no function) between them is skipped.
    frame(&mut m, 0x1000, 0, 0, 0, 0x0f00);
    frame(&mut m, 0x0f00, 0xc000, 0x5200, TOP | 0x10000, 0);
    let steps = walk(&nts(), &mut m);
    assert_eq!(
        steps,
        [
            PhpStep::Frame {
                function_word: at(word::FUNCTION, 0x5000),
                opline_word: at(word::OPLINE, 0xa000)
            },
            PhpStep::Frame {
                function_word: at(word::FUNCTION, 0x5100),
                opline_word: at(word::OPLINE, 0xb000)
            },
            PhpStep::Skipped,
            PhpStep::Frame {
                function_word: at(word::ENTRY_FUNCTION, 0x5200),
                opline_word: at(word::OPLINE, 0xc000)
            },
        ]
    );
}

#[test]
fn no_frame_no_walk_and_bad_frames_end_it() {
    let mut m = Image::default();
    let p = nts();
    // Outside PHP code: no current frame.
    m.put(EG + u64::from(CURRENT), 0);
    assert_eq!(p.current_execute_data(0, &mut m), None);
    // An unreadable frame, a misaligned one, and one linking to itself.
    let mut next = 1;
    assert_eq!(p.step(0x9000, &mut next, &mut m), PhpStep::ReadFailed);
    assert_eq!(next, 0);
    assert_eq!(p.step(0x9004, &mut next, &mut m), PhpStep::ReadFailed);
    frame(&mut m, 0x2000, 0xa000, 0x5000, 0, 0x2000);
    assert!(matches!(
        p.step(0x2000, &mut next, &mut m),
        PhpStep::Frame { .. }
    ));
    assert_eq!(next, 0);
    // Offsets past any real layout are refused rather than followed.
    let hostile = PhpProcess { ex_prev: 4096, ..p };
    assert_eq!(hostile.step(0x2000, &mut next, &mut m), PhpStep::ReadFailed);
}

#[test]
fn zts_globals_come_from_the_tsrm_block_of_the_thread() {
    const FS_BASE: u64 = 0x7f00_0000_1000;
    const TSRM: u64 = 0x80_0000;
    let mut m = Image::default();
    m.put(FS_BASE - 0x18, TSRM);
    let p = PhpProcess {
        executor_globals: 0x2c0,
        tls_offset: -0x18,
        globals_kind: globals_kind::TSRM,
        ..nts()
    };
    assert_eq!(p.globals(FS_BASE, &mut m), Some(TSRM + 0x2c0));
    m.put(TSRM + 0x2c0 + u64::from(CURRENT), 0x1100);
    assert_eq!(p.current_execute_data(FS_BASE, &mut m), Some(0x1100));
    // No FS base known; a thread that has not set up its TSRM block yet.
    assert_eq!(p.globals(0, &mut m), None);
    m.put(FS_BASE - 0x18, 0);
    assert_eq!(p.globals(FS_BASE, &mut m), None);
}

#[test]
fn call_info_in_the_upper_half_of_a_word_is_found() {
    let mut m = Image::default();
    // A layout whose type_info sits at offset 44 (never the case in 8.x,
    // but the walk takes offsets as data).
    m.put(0x1000, 0xa000);
    m.put(0x1000 + 24, 0x5000);
    m.put(0x1000 + 40, u64::from(TOP) << 32);
    m.put(0x1000 + 48, 0);
    let p = PhpProcess {
        ex_call_info: 44,
        ..nts()
    };
    let mut next = 0;
    assert_eq!(
        p.step(0x1000, &mut next, &mut m),
        PhpStep::Frame {
            function_word: at(word::ENTRY_FUNCTION, 0x5000),
            opline_word: at(word::OPLINE, 0xa000)
        }
    );
}
