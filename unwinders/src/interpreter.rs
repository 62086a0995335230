//! How interpreter unwinders plug in, on the BPF side.
//!
//! Every interpreter (CPython now; Ruby, PHP, Perl, JVM, V8 and .NET next)
//! follows the same five rules, so the native unwinder never needs to know
//! which runtimes exist:
//!
//! 1. **A program slot.** Add a [`ProgramIndex`](crate::ProgramIndex) variant
//!    and a `#[perf_event]` program in `ebpf/src/<runtime>.rs`, registered in
//!    `ProgramIndex::ALL`.
//! 2. **Per-process data of its own.** A pid-keyed map (for CPython,
//!    `PYTHON_PROCESSES` of [`PythonProcess`](crate::python::PythonProcess))
//!    written by the runtime's user-space plugin
//!    (`receiver/src/interpreters/<runtime>/`), which also deletes the entry
//!    when the process exits.
//! 3. **Dispatch without a lookup.** The plugin's process gets
//!    [`ProcessMappingTable::interpreter`](crate::native::ProcessMappingTable)
//!    set to its slot. When the native walk ends, the native unwinder
//!    tail-calls that slot; processes without an interpreter pay nothing.
//! 4. **Tagged words after the native frames.** The program walks the
//!    sampled thread's interpreter frames and appends, per frame, what user
//!    space needs to symbolize it, as words whose top byte is a
//!    [`WordTag`]. Their count goes in `SampleHeader::interpreter_words`.
//!    Then it emits the sample (or tail-calls itself to continue, counting
//!    the call in `UnwindState::tail_calls`).
//! 5. **Splicing in user space.** The plugin knows which native frames are
//!    its interpreter loop; it replaces each with the interpreter frames that
//!    loop invocation ran, so native code called from interpreted code (a C
//!    extension) appears under its caller.

/// Bits of a tagged word below the tag: user-space addresses on x86-64 use 47.
pub const TAG_SHIFT: u32 = 56;
/// The payload bits of a tagged word.
pub const PAYLOAD_MASK: u64 = (1 << TAG_SHIFT) - 1;

/// The kind of an interpreter word (its top byte).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordTag {
    /// A CPython frame: the code object's address; the next word is the
    /// frame's raw instruction position (see the CPython plugin).
    PythonFrame = 1,
    /// A CPython frame that was the first one its `_PyEval_EvalFrameDefault`
    /// call evaluated: the outermost of that call's frames.
    PythonEntryFrame = 2,
    /// The boundary between two `_PyEval_EvalFrameDefault` calls, where the
    /// interpreter links a C-stack shim frame (3.12+); carries no payload.
    PythonCallBoundary = 3,
}

impl WordTag {
    /// The tag of `word`, if it is a known one.
    #[inline(always)]
    pub fn of(word: u64) -> Option<WordTag> {
        match word >> TAG_SHIFT {
            1 => Some(WordTag::PythonFrame),
            2 => Some(WordTag::PythonEntryFrame),
            3 => Some(WordTag::PythonCallBoundary),
            _ => None,
        }
    }

    /// `payload` tagged with this tag.
    #[inline(always)]
    pub fn tag(self, payload: u64) -> u64 {
        ((self as u64) << TAG_SHIFT) | (payload & PAYLOAD_MASK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_keep_user_addresses() {
        let code = 0x7f12_3456_7890u64;
        for tag in [
            WordTag::PythonFrame,
            WordTag::PythonEntryFrame,
            WordTag::PythonCallBoundary,
        ] {
            let word = tag.tag(code);
            assert_eq!(WordTag::of(word), Some(tag));
            assert_eq!(word & PAYLOAD_MASK, code);
        }
        assert_eq!(WordTag::of(code), None, "a plain address has no tag");
    }
}
