use super::*;

extern crate std;
use std::vec::Vec;

use crate::memory::test_image::Image;

const FS_BASE: u64 = 0x7f00_0000_1000;
const DTV: u64 = 0x5000;
const BLOCK: u64 = 0x7f00_0000_0f00;
const INTERP: u64 = 0x9000;
const MAIN_SI: u64 = 0xa000;
const SORT_SI: u64 = 0xa100;
const MAIN_CXS: u64 = 0xb000;
const SORT_CXS: u64 = 0xc000;
const CX: u64 = 104;

/// 5.36's layout (`scripts/perl-probe/layouts.md`).
fn process(kind: u8, context_at: u64) -> PerlProcess {
    PerlProcess {
        context_at,
        tls_module: 1,
        interp_curcop: 208,
        interp_curstackinfo: 224,
        si_cxstack: 8,
        si_prev: 16,
        si_cxix: 32,
        context_size: CX as u16,
        cx_oldcop: 16,
        cx_sub_cv: 72,
        si_cxsubix: 40,
        context_kind: kind,
        reserved: 0,
    }
}

/// Writes a context of `type_byte` at index `index` of `contexts`.
fn context(m: &mut Image, contexts: u64, index: u64, type_byte: u8, old_cop: u64, cv: u64) {
    let at = contexts + index * CX;
    for word in 0..13 {
        m.put(at + word * 8, 0);
    }
    m.put(at, u64::from(type_byte));
    m.put(at + 16, old_cop);
    m.put(at + 72, cv);
}

/// A stack info whose contexts up to `newest` are all pushed completely.
fn stackinfo(m: &mut Image, si: u64, contexts: u64, newest: i32, prev: u64) {
    m.put(si + 8, contexts);
    m.put(si + 16, prev);
    // si_cxix and si_cxmax share a word, si_cxsubix and si_type the next.
    m.put(si + 32, u64::from(newest as u32) | (64 << 32));
    set_complete_below(m, si, newest);
}

fn set_complete_below(m: &mut Image, si: u64, index: i32) {
    m.put(si + 40, u64::from(index as u32) | (1 << 32));
}

/// A main stack info: a block, `A` called at 0xc1, a loop, `B` called at
/// 0xc2, an `eval {}` at 0xc3, and a `try {}`; the running statement 0xc4.
fn image() -> Image {
    let mut m = Image::default();
    m.put(INTERP + 208, 0xc4);
    m.put(INTERP + 224, MAIN_SI);
    stackinfo(&mut m, MAIN_SI, MAIN_CXS, 5, 0);
    context(&mut m, MAIN_CXS, 0, 2, 0, 0);
    context(&mut m, MAIN_CXS, 1, 0x29, 0xc1, 0xa0);
    context(&mut m, MAIN_CXS, 2, 0x57, 0, 0);
    context(&mut m, MAIN_CXS, 3, 0x29, 0xc2, 0xb0);
    context(&mut m, MAIN_CXS, 4, 0x4b, 0xc3, 0);
    context(&mut m, MAIN_CXS, 5, 0xcb, 0xc9, 0);
    m
}

fn walk(p: &PerlProcess, m: &mut Image) -> Vec<u64> {
    let mut state = PerlWalkState::default();
    state.reset();
    assert!(p.start(INTERP, &mut state, m));
    let mut words = Vec::new();
    for _ in 0..MAX_PERL_CONTEXTS {
        match p.step(&mut state, m) {
            PerlStep::Frame {
                frame_word,
                cop_word,
            } => words.extend([frame_word, cop_word]),
            PerlStep::StackSwitch(w) => words.push(w),
            PerlStep::Skipped => {}
            PerlStep::Done => return words,
            PerlStep::ReadFailed => {
                words.push(u64::MAX);
                return words;
            }
        }
    }
    panic!("the walk did not end");
}

fn w(tag: u8, payload: u64) -> u64 {
    TAGS.word(tag, payload)
}

#[test]
fn finds_the_interpreter_through_static_tls_the_dtv_or_the_global() {
    let mut m = Image::default();
    m.put(FS_BASE - 8, INTERP);
    let p = process(context_kind::STATIC_TLS, (-8i64) as u64);
    assert_eq!(p.interpreter(FS_BASE, &mut m), Some(INTERP));
    m.put(FS_BASE + 8, DTV);
    m.put(DTV + 16, BLOCK);
    m.put(BLOCK + 0x20, INTERP);
    let p = process(context_kind::DTV, 0x20);
    assert_eq!(p.interpreter(FS_BASE, &mut m), Some(INTERP));
    m.put(0x6000, INTERP);
    let p = process(context_kind::GLOBAL, 0x6000);
    assert_eq!(p.interpreter(FS_BASE, &mut m), Some(INTERP));
    // A thread without an interpreter, or one whose TLS block is not there.
    m.put(0x6000, 0);
    assert_eq!(p.interpreter(FS_BASE, &mut m), None);
    let p = process(context_kind::DTV, 0x20);
    assert_eq!(p.interpreter(FS_BASE + 0x100, &mut m), None);
}

#[test]
fn reports_subs_and_evals_at_their_statements_then_main() {
    let mut m = image();
    let p = process(context_kind::GLOBAL, 0);
    assert_eq!(
        walk(&p, &mut m),
        [
            // The `try {}` is skipped; the eval runs the current statement.
            w(word::EVAL, 0x4b),
            w(word::COP, 0xc4),
            w(word::SUB, 0xb0),
            w(word::COP, 0xc3),
            w(word::SUB, 0xa0),
            w(word::COP, 0xc2),
            w(word::MAIN, 0),
            w(word::COP, 0xc1),
        ]
    );
}

#[test]
fn older_stack_infos_follow_a_switch_word() {
    let mut m = image();
    // A `sort SUBNAME` comparator on a stack info of its own, over the
    // eval's: a MULTICALL sub, then a regex code block `caller` skips.
    m.put(INTERP + 224, SORT_SI);
    stackinfo(&mut m, SORT_SI, SORT_CXS, 1, MAIN_SI);
    context(&mut m, SORT_CXS, 0, 0x19, 0xc5, 0xd0);
    context(&mut m, SORT_CXS, 1, 0x89, 0xc6, 0xe0);
    let p = process(context_kind::GLOBAL, 0);
    let words = walk(&p, &mut m);
    assert_eq!(
        words[..4],
        [
            w(word::MULTICALL_SUB, 0xd0),
            w(word::COP, 0xc4),
            w(word::STACK_SWITCH, 0),
            w(word::EVAL, 0x4b),
        ]
    );
    // The frames of the main stack info go on from the comparator's call site.
    assert_eq!(words[4], w(word::COP, 0xc5));
    assert_eq!(words.last(), Some(&w(word::COP, 0xc1)));
}

#[test]
fn a_context_being_pushed_or_popped_is_no_frame() {
    let p = process(context_kind::GLOBAL, 0);
    let expected = walk(&p, &mut image());
    // A sub's context counted in (`si_cxix`) but not yet recorded in
    // `si_cxsubix`: its type, CV and call site are a previous call's, here
    // a sub `C` called from 0xc7; or an eval's in the same state.
    for (type_byte, cv) in [(0x29, 0xd0), (0x09, 0), (0x2b, 0)] {
        let mut m = image();
        stackinfo(&mut m, MAIN_SI, MAIN_CXS, 6, 0);
        set_complete_below(&mut m, MAIN_SI, 4);
        context(&mut m, MAIN_CXS, 6, type_byte, 0xc7, cv);
        assert_eq!(walk(&p, &mut m), expected, "type {type_byte:#x}");
    }
    // Below the newest complete one, every context counts as before.
    let mut m = image();
    set_complete_below(&mut m, MAIN_SI, 3);
    let words = walk(&p, &mut m);
    assert_eq!(words[..2], [w(word::SUB, 0xb0), w(word::COP, 0xc4)]);
}

#[test]
fn a_newest_frame_at_its_callers_statement_is_flagged() {
    let mut m = image();
    // `B` was just called from 0xc2 and has run no statement: `PL_curcop`
    // is still the caller's (the eval and try are gone).
    stackinfo(&mut m, MAIN_SI, MAIN_CXS, 3, 0);
    m.put(INTERP + 208, 0xc2);
    let p = process(context_kind::GLOBAL, 0);
    let words = walk(&p, &mut m);
    assert_eq!(
        words[..4],
        [
            w(word::SUB, 0xb0),
            w(word::COP, 0xc2 | CALLERS_STATEMENT),
            w(word::SUB, 0xa0),
            w(word::COP, 0xc2)
        ]
    );
}

#[test]
fn an_empty_program_is_main_at_the_running_statement() {
    let mut m = Image::default();
    m.put(INTERP + 208, 0xc4);
    m.put(INTERP + 224, MAIN_SI);
    stackinfo(&mut m, MAIN_SI, MAIN_CXS, -1, 0);
    let p = process(context_kind::GLOBAL, 0);
    assert_eq!(walk(&p, &mut m), [w(word::MAIN, 0), w(word::COP, 0xc4)]);
}

#[test]
fn hostile_memory_ends_the_walk() {
    let p = process(context_kind::GLOBAL, 0);
    // A context index out of all proportion, or below -1.
    for newest in [1 << 21, -2] {
        let mut m = image();
        stackinfo(&mut m, MAIN_SI, MAIN_CXS, newest, 0);
        let mut state = PerlWalkState::default();
        assert!(!p.start(INTERP, &mut state, &mut m));
    }
    // No stack info at all.
    let mut m = image();
    m.put(INTERP + 224, 0);
    assert!(!p.start(INTERP, &mut PerlWalkState::default(), &mut m));
    // Contexts that cannot be read.
    let mut m = image();
    stackinfo(&mut m, MAIN_SI, 0xdead_0000, 3, 0);
    assert_eq!(walk(&p, &mut m), [u64::MAX]);
    // A stack info pointing at itself never ends the walk by itself: BPF
    // bounds the contexts it reads (MAX_PERL_CONTEXTS).
    let mut m = image();
    stackinfo(&mut m, MAIN_SI, MAIN_CXS, 0, MAIN_SI);
    let mut state = PerlWalkState::default();
    assert!(p.start(INTERP, &mut state, &mut m));
    for _ in 0..100 {
        assert_ne!(p.step(&mut state, &mut m), PerlStep::Done);
    }
}
