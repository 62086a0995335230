//! CPython 3.8–3.15: the user-space half of the CPython unwinder.
//!
//! - [`detect`]: which mapped file is CPython, its version and symbols.
//! - [`layouts`]: per-version struct offsets, as data (3.8–3.12);
//!   [`debug_offsets`]: 3.13+ offsets read from the interpreter's own
//!   `_Py_DebugOffsets`.
//! - [`code`] and [`line_table`]: code objects and their line tables.
//!
//! BPF (`ebpf/src/python.rs`, walk in `icecore_unwinders::python`) reports
//! each frame as a code object's address and a raw instruction position;
//! this plugin reads the code object once per process, through
//! `/proc/PID/mem`, and turns the position into a line.

pub mod code;
pub mod debug_offsets;
pub mod detect;
pub mod layouts;
pub mod line_table;
#[cfg(test)]
mod walk_tests;

use std::{collections::HashMap, sync::Arc, time::Duration};

use icecore_otlp::model::{Frame, FrameKind, Line};
use icecore_unwinders::{
    Dispatch,
    native::EarlyEndThreads,
    python::{CPYTHON, NO_OFFSET, PythonProcess, entry_kind, word},
    runtime::PAYLOAD_MASK,
};
use lru::LruCache;
use tracing::{debug, info, warn};

use self::{
    code::{CodeInfo, read_code},
    detect::{DebugSearch, PythonBinary, inspect_with, version_from_name},
    layouts::{EntryMarker, InstrEncoding, PythonLayout},
};
use super::{
    Attachment, RuntimeCode, RuntimeDescriptor, RuntimePlugin, RuntimeStats,
    memory::LazyMemory,
    object_cache::{ObjectCache, lru},
    registry::CPYTHON_RUNTIME,
    services::{FileProbes, ProcessMap, remove_where},
};
use crate::{process_maps::ProcessMappings, symbolize::debug_file};

/// The tag bits of a `_PyStackRef` (`Py_TAG_BITS`, 3.14+).
const STACK_REF_TAG_BITS: u64 = 3;
/// CPython files inspected and remembered (per device and inode).
const BINARY_CACHE: usize = 256;
/// Code objects remembered, over all processes.
const CODE_CACHE: usize = 16_384;
/// Distinct (code object, line) frames remembered, over all processes.
const FRAME_CACHE: usize = 32_768;
/// A code object still sampled is read again after this long: CPython may
/// free a code object and place another at its address (code made by
/// `exec`, for example), and the cache is keyed by address.
const REREAD_AFTER: Duration = Duration::from_secs(60);

/// One CPython process.
struct PythonInstance {
    binary: Arc<PythonBinary>,
    bias: u64,
    memory: LazyMemory,
}

/// The CPython plugin.
pub struct PythonPlugin {
    map: Box<dyn ProcessMap<PythonProcess>>,
    binaries: FileProbes<PythonBinary>,
    processes: HashMap<u32, PythonInstance>,
    codes: ObjectCache<CodeInfo>,
    frames: LruCache<(u32, u64, u32), Arc<Frame>>,
    stats: RuntimeStats,
}

impl PythonPlugin {
    /// A plugin writing its per-process data to `map`.
    pub fn new(map: Box<dyn ProcessMap<PythonProcess>>) -> Self {
        PythonPlugin {
            map,
            binaries: FileProbes::new(BINARY_CACHE),
            processes: HashMap::new(),
            codes: ObjectCache::new(CODE_CACHE, REREAD_AFTER),
            frames: lru(FRAME_CACHE),
            stats: RuntimeStats::default(),
        }
    }

    /// The CPython file among `pid`'s mappings, with its load bias.
    fn find_binary(
        &mut self,
        pid: u32,
        mappings: &ProcessMappings,
    ) -> Option<(Arc<PythonBinary>, u64)> {
        for mapping in mappings.executable() {
            let Some(name_version) = version_from_name(&mapping.path) else {
                continue;
            };
            let debug = DebugSearch {
                roots: debug_file::roots(pid),
                binary_path: mapping.path.to_string(),
            };
            let stats = &mut self.stats;
            // Runs once per file (on each path of it until one works): a
            // refused CPython is said once, and counted once.
            let mut refused = false;
            let binary = self.binaries.get_or_probe(pid, mapping, |path| {
                inspect_with(path, name_version, &debug).inspect_err(|e| {
                    if e.is_refused_cpython() && !refused {
                        refused = true;
                        stats.attach_failures += 1;
                        warn!(pid, file = %mapping.path, "CPython not profiled: {e}");
                    }
                })
            });
            if let Some(binary) = binary
                && let Some(bias) = binary.load_bias(mapping.start, mapping.file_offset)
            {
                return Some((binary, bias));
            }
        }
        None
    }

    /// The code object at `code`, read once and cached. `fresh` (at drain
    /// time, while the process runs) re-reads an entry older than
    /// [`REREAD_AFTER`], and drops the frames made from it if it changed.
    fn code_info(&mut self, pid: u32, code: u64, fresh: bool) -> Option<Arc<CodeInfo>> {
        if let Some(known) = self.codes.cached(pid, code, fresh) {
            return known;
        }
        let info = self.read_code_object(pid, code);
        if self.codes.store(pid, code, info.clone()) {
            remove_where(&mut self.frames, |k| k.0 == pid && k.1 == code);
        }
        info
    }

    fn read_code_object(&mut self, pid: u32, code: u64) -> Option<Arc<CodeInfo>> {
        let instance = self.processes.get_mut(&pid)?;
        let memory = instance.memory.get()?;
        let code_type = instance
            .binary
            .code_type
            .map(|t| t.wrapping_add(instance.bias));
        read_code(memory, &instance.binary.layout, code, code_type)
            .map_err(|e| debug!(pid, "python code object: {e}"))
            .ok()
            .map(Arc::new)
    }

    fn frame(&mut self, pid: u32, code: u64, instr: u64) -> Arc<Frame> {
        self.stats.frames += 1;
        let Some(layout) = self.processes.get(&pid).map(|p| p.binary.layout) else {
            return unknown(code);
        };
        let Some(info) = self.code_info(pid, code, false) else {
            self.stats.frame_errors += 1;
            return unknown(code);
        };
        let line = code::line_of(&layout, &info, code, instr);
        self.frames
            .get_or_insert((pid, code, line), || {
                Arc::new(Frame {
                    kind: FrameKind::CPython,
                    address: 0,
                    mapping: None,
                    lines: vec![Line {
                        function_name: info.name.clone(),
                        system_name: info.name.clone(),
                        filename: Some(info.filename.clone()),
                        line,
                        column: 0,
                    }],
                })
            })
            .clone()
    }
}

/// A frame whose code object could not be read: kept, so the stack keeps
/// its shape, with the code object's address.
fn unknown(code: u64) -> Arc<Frame> {
    Arc::new(Frame {
        kind: FrameKind::CPython,
        address: code,
        mapping: None,
        lines: Vec::new(),
    })
}

/// What BPF needs of a process running `layout`, with `_PyRuntime` at `runtime`.
pub fn bpf_process(layout: &PythonLayout, runtime: u64) -> PythonProcess {
    let (entry_kind, entry_offset, cstack_owner) = match layout.entry {
        EntryMarker::EveryFrame => (entry_kind::EVERY_FRAME, NO_OFFSET, 0),
        EntryMarker::IsEntry(offset) => (entry_kind::IS_ENTRY, offset, 0),
        EntryMarker::CStackShim { owner, cstack } => (entry_kind::CSTACK_SHIM, owner, cstack),
    };
    PythonProcess {
        interpreters_head: runtime + u64::from(layout.runtime_interpreters_head),
        interp_threads_head: layout.interp_threads_head,
        tstate_next: layout.tstate_next,
        tstate_thread_id: layout.tstate_thread_id,
        tstate_frame: layout.tstate_frame,
        cframe_current_frame: layout.cframe_current_frame.unwrap_or(NO_OFFSET),
        frame_code: layout.frame_code,
        frame_previous: layout.frame_previous,
        frame_instr: layout.frame_instr,
        entry_offset,
        entry_kind,
        cstack_owner,
        instr_is_int: u8::from(matches!(
            layout.instr,
            InstrEncoding::LastiBytes | InstrEncoding::LastiCodeUnits
        )),
        frames_on_stack: u8::from(!matches!(layout.entry, EntryMarker::EveryFrame)),
        frame_span: frame_span(layout),
        reserved: 0,
    }
}

/// Bytes from a frame's start to the end of the last field the walk reads.
fn frame_span(layout: &PythonLayout) -> u8 {
    let entry = match layout.entry {
        EntryMarker::EveryFrame => 0,
        EntryMarker::IsEntry(offset) | EntryMarker::CStackShim { owner: offset, .. } => offset & !7,
    };
    let last = [
        layout.frame_code,
        layout.frame_previous,
        layout.frame_instr,
        entry,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    u8::try_from(last + 8).unwrap_or(u8::MAX)
}

/// Splits one sample's tagged words into loop invocations, innermost first:
/// each a list of (code object, raw instruction position), innermost first.
pub fn invocations(words: &[u64]) -> Vec<Vec<(u64, u64)>> {
    let mut groups = Vec::new();
    let mut current = Vec::new();
    let mut i = 0;
    while let Some(&word) = words.get(i) {
        match CPYTHON.tags.local_tag(word) {
            Some(tag @ (word::FRAME | word::ENTRY_FRAME)) => {
                let instr = words
                    .get(i + 1)
                    .filter(|&&w| CPYTHON.tags.local_tag(w) == Some(word::INSTR))
                    .map_or(0, |w| w & PAYLOAD_MASK);
                // 3.14+ `f_executable` is a `_PyStackRef`: its low bits are
                // tags (1 for immortal objects). Objects are 8-aligned, and
                // earlier versions' pointers have these bits clear.
                current.push((word & PAYLOAD_MASK & !STACK_REF_TAG_BITS, instr));
                i += 2;
                if tag == word::ENTRY_FRAME {
                    groups.push(std::mem::take(&mut current));
                }
            }
            Some(word::CALL_BOUNDARY) => {
                if !current.is_empty() {
                    groups.push(std::mem::take(&mut current));
                }
                i += 1;
            }
            // Not a word this plugin writes: the rest cannot be trusted.
            _ => break,
        }
    }
    if !current.is_empty() {
        groups.push(current);
    }
    groups
}

/// The eval loop's code in the process, handed to the CPython program once
/// the native walk ends (see `icecore_unwinders::runtime`).
fn attachment(instance: &PythonInstance) -> Attachment {
    Attachment {
        code: instance
            .binary
            .eval_loop
            .iter()
            .map(|range| RuntimeCode {
                start: range.start.wrapping_add(instance.bias),
                end: range.end.wrapping_add(instance.bias),
                dispatch: Dispatch::Deferred,
            })
            .collect(),
        walk_after_early_end: Some(EarlyEndThreads::Every),
        names_anonymous_code: false,
    }
}

impl RuntimePlugin for PythonPlugin {
    fn descriptor(&self) -> &'static RuntimeDescriptor {
        &CPYTHON_RUNTIME
    }

    fn attach(&mut self, pid: u32, mappings: &ProcessMappings) -> Option<Attachment> {
        if let Some(instance) = self.processes.get(&pid) {
            return Some(attachment(instance));
        }
        let (binary, bias) = self.find_binary(pid, mappings)?;
        let process = bpf_process(&binary.layout, binary.runtime.wrapping_add(bias));
        if let Err(e) = self.map.insert(pid, &process) {
            self.stats.attach_failures += 1;
            debug!(pid, "cannot describe a CPython process to BPF: {e}");
            return None;
        }
        info!(
            pid,
            version = format!("{}.{}", binary.layout.major, binary.layout.minor),
            "CPython process"
        );
        let instance = PythonInstance {
            binary,
            bias,
            memory: LazyMemory::new(pid),
        };
        let claimed = attachment(&instance);
        self.processes.insert(pid, instance);
        Some(claimed)
    }

    fn detach(&mut self, pid: u32) {
        if self.processes.remove(&pid).is_none() {
            return;
        }
        self.map.remove(pid);
        self.codes.forget_process(pid);
        remove_where(&mut self.frames, |k| k.0 == pid);
    }

    fn observe(&mut self, pid: u32, words: &[u64]) {
        for group in invocations(words) {
            for (code, _) in group {
                self.code_info(pid, code, true);
            }
        }
    }

    fn frames(&mut self, pid: u32, words: &[u64]) -> Vec<Vec<Arc<Frame>>> {
        invocations(words)
            .into_iter()
            .map(|group| {
                group
                    .into_iter()
                    .map(|(code, instr)| self.frame(pid, code, instr))
                    .collect()
            })
            .collect()
    }

    fn stats(&self) -> RuntimeStats {
        RuntimeStats {
            processes: self.processes.len(),
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invocations_follow_entry_marks_and_boundaries() {
        let f = |c| CPYTHON.tags.word(word::FRAME, c);
        let e = |c| CPYTHON.tags.word(word::ENTRY_FRAME, c);
        let b = CPYTHON.tags.word(word::CALL_BOUNDARY, 0);
        let i = |n| CPYTHON.tags.word(word::INSTR, n);
        // 3.14+: `f_executable` is a tagged `_PyStackRef`; the tag is not
        // part of the address.
        assert_eq!(
            invocations(&[f(0x101), i(10), b, f(0x200), i(20), b]),
            vec![vec![(0x100, 10)], vec![(0x200, 20)]]
        );
        // 3.15 ends every thread's chain with a base frame (a shim): the
        // empty call after it is no invocation.
        assert_eq!(
            invocations(&[f(0x100), i(10), b, b]),
            vec![vec![(0x100, 10)]]
        );
        // 3.12+: shims separate calls.
        assert_eq!(
            invocations(&[f(0x100), i(10), f(0x200), i(20), b, f(0x300), i(30), b]),
            vec![vec![(0x100, 10), (0x200, 20)], vec![(0x300, 30)]]
        );
        // 3.11 and ≤ 3.10: the outermost frame of a call is marked.
        assert_eq!(
            invocations(&[f(0x100), i(10), e(0x200), i(20), e(0x300), i(30)]),
            vec![vec![(0x100, 10), (0x200, 20)], vec![(0x300, 30)]]
        );
        // A cut-off walk keeps what it has; junk ends the parse.
        assert_eq!(
            invocations(&[f(0x100), i(10), f(0x200)]),
            vec![vec![(0x100, 10), (0x200, 0)]]
        );
        assert_eq!(
            invocations(&[e(0x100), i(10), 0x7fff_0000, e(0x200), i(1)]),
            vec![vec![(0x100, 10)]]
        );
        assert!(invocations(&[]).is_empty());
    }
}
