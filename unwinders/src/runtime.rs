//! How runtime unwinders (CPython, CRuby, HotSpot, V8, PHP and Perl now;
//! .NET next) plug into the native unwinder, on the BPF side.
//!
//! # Dispatch by program counter
//!
//! Each entry of a process's [`ProcessMappingTable`](crate::native::ProcessMappingTable)
//! is an address range (a file mapping, part of one, or an anonymous
//! executable mapping such as a JIT code cache) and may name the runtime
//! program that unwinds code in it ([`MappingEntry::program`](crate::native::MappingEntry))
//! and how ([`Dispatch`]). The native unwinder looks the entry up for every
//! frame anyway (for its unwind table), so dispatch costs one byte compare
//! per frame:
//!
//! - [`Dispatch::Handover`] (JIT code, whose frames only make sense from
//!   the registers of that very frame): the native unwinder stops *before*
//!   recording the frame and tail-calls the runtime's program with the
//!   frame's registers in [`UnwindState::registers`](crate::UnwindState).
//!   The program appends its frames as tagged words and hands back by
//!   setting the registers of the next frame and [`UnwindState::resume`](crate::UnwindState)
//!   (a [`resume`] value), then tail-calling the native unwinder.
//! - [`Dispatch::Deferred`] (interpreter loops, whose frames are found from
//!   the interpreter's own state rather than from registers): the native
//!   unwinder records the loop's frame as usual and notes the program; once
//!   the native walk ends, it tail-calls the program once, which appends
//!   the frames of every loop invocation the walk passed. User space puts
//!   each invocation's frames in the place of its loop frame (it wrote the
//!   ranges, so it knows which frames are loops). A handover per invocation
//!   would cost two tail calls each, and a deep Python ≤ 3.10 stack (one
//!   loop invocation per Python call) would exhaust the 33 a sample may use.
//!
//! A process's table also names one deferred program to run when the native
//! walk ends early (a C extension without unwind information), so that an
//! interpreter's frames are not lost with the native frames that lead to
//! them ([`ProcessMappingTable::deferred_program`](crate::native::ProcessMappingTable)).
//!
//! # Tagged words
//!
//! Runtime frames travel in the record's user words, interleaved with the
//! native frames' addresses in walk order. A word whose top byte is not
//! zero is a runtime's (user addresses use 47 bits); each runtime owns
//! 16 tag values ([`TagRange`]) and defines what its words mean.
//!
//! # Adding a runtime
//!
//! See `receiver/src/runtimes/README.md`: the BPF half is a `BpfRuntime`
//! descriptor (program slot, tag range, counters), a state area in
//! [`RuntimeStates`], and a program in `ebpf/src/runtimes/<runtime>.rs`
//! built from the helpers of `ebpf/src/runtimes/mod.rs`.

use crate::{Counter, ProgramIndex};

/// Bits of a tagged word below the tag: user-space addresses on x86-64 use 47.
pub const TAG_SHIFT: u32 = 56;
/// The payload bits of a tagged word.
pub const PAYLOAD_MASK: u64 = (1 << TAG_SHIFT) - 1;
/// Native frame addresses are below this; anything else in a user word is a tag.
pub const USER_ADDRESS_END: u64 = 1 << 47;

/// The tag of `word`: 0 for a native frame's address.
#[inline(always)]
pub const fn tag_of(word: u64) -> u8 {
    (word >> TAG_SHIFT) as u8
}

/// The 16 tag values of one runtime: `first..first + 16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagRange {
    /// The first tag; a multiple of 16, never 0.
    pub first: u8,
}

impl TagRange {
    /// `payload` tagged with the runtime's `local` tag (0..16).
    #[inline(always)]
    pub const fn word(self, local: u8, payload: u64) -> u64 {
        (((self.first | (local & 15)) as u64) << TAG_SHIFT) | (payload & PAYLOAD_MASK)
    }

    /// The runtime's local tag of `word`, if `word` is one of its words.
    #[inline(always)]
    pub const fn local_tag(self, word: u64) -> Option<u8> {
        let tag = tag_of(word);
        if tag & 0xf0 == self.first {
            Some(tag & 15)
        } else {
            None
        }
    }
}

/// How the native unwinder hands code of a mapping entry to its runtime
/// (values of `MappingEntry::dispatch`).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatch {
    /// Native code: the native unwinder steps it.
    Native = 0,
    /// The runtime's program takes over at this frame's registers.
    Handover = 1,
    /// The frame is recorded; the runtime's program runs after the native walk.
    Deferred = 2,
    /// Native code whose file's unwind table is still being built: the
    /// sample is dropped and counted rather than unwound with frame
    /// pointers, which would cut it short. Set by the native half only.
    TablePending = 3,
}

/// Values of the `UNKNOWN_PROCESS_POLICY` map: what the native unwinder
/// does with a sample of a process it has no mapping table for.
pub mod unknown_process {
    /// Walk it with frame pointers (user space describes no processes:
    /// DWARF unwinding is off).
    pub const WALK_FRAME_POINTERS: u32 = 0;
    /// Drop it, count it and tell user space, which describes the process.
    pub const DROP: u32 = 1;
}

/// Values of [`UnwindState::resume`](crate::UnwindState): what the native
/// unwinder does with the registers it finds when a runtime hands back. A
/// runtime hands back to [`ProgramIndex::NativeResumed`], the only build of
/// the native unwinder that reads this.
pub mod resume {
    /// A frame like any other: record it, dispatch it, step it.
    pub const FRESH: u8 = 0;
    /// The runtime's words stand for this frame: step it without recording
    /// or dispatching it.
    pub const STEP_ONLY: u8 = 1;
    /// The runtime declined the frame: record and step it as native code.
    pub const NATIVE: u8 = 2;
}

/// The BPF half of one runtime, the single source of truth the user-space
/// registry builds on.
#[derive(Debug, Clone, Copy)]
pub struct BpfRuntime {
    /// Stable name, also the user-space plugin's and the config switch's.
    pub name: &'static str,
    /// The runtime's slot in the program array.
    pub program: ProgramIndex,
    /// Name of its `#[perf_event]` program in the BPF object.
    pub program_name: &'static str,
    /// The tags of its words.
    pub tags: TagRange,
    /// Counters of its failure modes and work, for logs and metrics.
    pub counters: &'static [Counter],
}

/// Every runtime with a BPF program, in program-slot order.
pub const BPF_RUNTIMES: [BpfRuntime; 6] = [
    crate::python::CPYTHON,
    crate::ruby::CRUBY,
    crate::hotspot::HOTSPOT,
    crate::v8::V8,
    crate::php::PHP,
    crate::perl::PERL,
];

/// Per-runtime state areas in the unwind state, kept between the tail calls
/// of one sample and reset when a sample starts. One field per runtime.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuntimeStates {
    /// CPython's walk.
    pub python: crate::python::PythonWalkState,
    /// CRuby's walk.
    pub ruby: crate::ruby::RubyWalkState,
    /// HotSpot's walk.
    pub hotspot: crate::hotspot::HotSpotWalkState,
    /// V8's walk.
    pub v8: crate::v8::V8WalkState,
    /// PHP's walk.
    pub php: crate::php::PhpWalkState,
    /// Perl's walk.
    pub perl: crate::perl::PerlWalkState,
}

const _: () = assert!(core::mem::size_of::<RuntimeStates>() == 112);

impl RuntimeStates {
    /// Readies every runtime's state for a new sample. Field by field: a
    /// struct assignment becomes a `memset` call whose register spills the
    /// 5.10 verifier rejects.
    #[inline(always)]
    pub fn reset(&mut self) {
        self.python.reset();
        self.ruby.reset();
        self.hotspot.reset();
        self.v8.reset();
        self.php.reset();
        self.perl.reset();
    }
}

/// The runtime program to run after the native walk: `deferred` (noted when
/// the walk passed a deferred entry), or the process's own when the walk
/// ended early; 0 for none.
#[inline(always)]
pub const fn after_native_walk(deferred: u8, process_program: u32, walk_complete: bool) -> u32 {
    if deferred != 0 {
        deferred as u32
    } else if walk_complete {
        0
    } else {
        process_program
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_keep_user_addresses() {
        let code = 0x7f12_3456_7890u64;
        let range = TagRange { first: 0x10 };
        for local in 0..16 {
            let word = range.word(local, code);
            assert_eq!(range.local_tag(word), Some(local));
            assert_eq!(word & PAYLOAD_MASK, code);
            assert_eq!(TagRange { first: 0x20 }.local_tag(word), None);
        }
        assert_eq!(range.local_tag(code), None, "a plain address has no tag");
        assert_eq!(tag_of(code), 0);
    }

    #[test]
    fn runtimes_have_distinct_slots_and_tags() {
        for (i, a) in BPF_RUNTIMES.iter().enumerate() {
            assert!(a.tags.first != 0 && a.tags.first % 16 == 0, "{}", a.name);
            for b in &BPF_RUNTIMES[i + 1..] {
                assert_ne!(a.tags, b.tags);
                assert_ne!(a.program, b.program);
                assert_ne!(a.name, b.name);
            }
        }
    }

    #[test]
    fn the_process_program_runs_only_after_an_early_end() {
        assert_eq!(after_native_walk(2, 3, true), 2);
        assert_eq!(after_native_walk(0, 3, true), 0);
        assert_eq!(after_native_walk(0, 3, false), 3);
    }
}
