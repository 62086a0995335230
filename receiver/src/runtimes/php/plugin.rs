//! The PHP plugin: describes each PHP process to BPF, and turns its words
//! into frames (`Shop::total` at `shop.php:12`, `hash`, `<main>`), each
//! `execute_ex` invocation's frames in the place of its `execute_ex` frame.

use std::{sync::Arc, time::Duration};

use icecore_otlp::model::{Frame, FrameKind, Line};
use icecore_unwinders::{
    Dispatch,
    native::EarlyEndThreads,
    php::{PhpProcess, TAGS, globals_kind, word},
    runtime::PAYLOAD_MASK,
};
use lru::LruCache;
use tracing::info;

use super::{
    detect::{Globals, PhpBinary, TlsOffset, inspect, is_php_name},
    objects::{FunctionInfo, FunctionKind, Objects},
};
use crate::{
    process_maps::ProcessMappings,
    runtimes::{
        Attachment, RuntimeCode, RuntimeDescriptor, RuntimePlugin, RuntimeStats,
        interpreters::{Interpreter, Interpreters},
        object_cache::{ObjectCache, lru},
        registry::PHP_RUNTIME,
        services::{ProcessMap, remove_where},
    },
    symbolize::Symbolizer,
};

/// PHP files inspected and remembered (per device and inode).
const BINARY_CACHE: usize = 256;
/// Functions remembered, over all processes.
const FUNCTION_CACHE: usize = 32_768;
/// Distinct frames (function, line) remembered, over all processes.
const FRAME_CACHE: usize = 65_536;
/// A function still sampled is checked again after this long: without
/// opcache, php-fpm frees every function at the end of a request, and the
/// next request's functions may take their addresses. The check reads the
/// function's name, class, opcodes and file pointers (one small read each)
/// and reads the function anew only when they changed.
const RECHECK_AFTER: Duration = Duration::from_secs(1);
/// Largest `executor_globals_offset` believed: the offset of the globals in
/// a thread's TSRM block, which holds a few kilobytes of globals.
const MAX_GLOBALS_OFFSET: u64 = 1 << 20;

/// One frame as BPF reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameWords {
    /// Its `zend_function`.
    pub function: u64,
    /// Its saved `opline` (the running one for the newest frame, when BPF
    /// had it).
    pub opline: u64,
    /// Whether C code called it (`ZEND_CALL_TOP`).
    pub entry: bool,
}

/// One sample's PHP words: its frames, newest first, and whether BPF said
/// the process is not described.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SampleWords {
    /// The frames.
    pub frames: Vec<FrameWords>,
    /// The running `opline` register, if BPF reported it.
    pub leaf_opline: Option<u64>,
    /// BPF had no entry for the process.
    pub not_described: bool,
}

/// Parses a run of PHP words.
pub fn parse(words: &[u64]) -> SampleWords {
    let mut out = SampleWords::default();
    let mut i = 0;
    let payload = |w: u64| w & PAYLOAD_MASK;
    while let Some(&w) = words.get(i) {
        match TAGS.local_tag(w) {
            Some(tag @ (word::FUNCTION | word::ENTRY_FUNCTION)) => {
                let opline = words
                    .get(i + 1)
                    .filter(|&&w| TAGS.local_tag(w) == Some(word::OPLINE))
                    .map(|&w| payload(w));
                i += 1 + usize::from(opline.is_some());
                out.frames.push(FrameWords {
                    function: payload(w),
                    opline: opline.unwrap_or(0),
                    entry: tag == word::ENTRY_FUNCTION,
                });
            }
            Some(word::LEAF_OPLINE) if out.frames.is_empty() => {
                out.leaf_opline = Some(payload(w));
                i += 1;
            }
            Some(word::NOT_DESCRIBED) => {
                out.not_described = true;
                i += 1;
            }
            // Not a word this plugin reads here: the rest cannot be trusted.
            _ => break,
        }
    }
    out
}

/// One PHP process; beside it, opcache's JIT code (shared anonymous
/// executable memory).
type PhpInstance = Interpreter<PhpBinary, Vec<RuntimeCode>>;

/// The code of a PHP process its program unwinds: `execute_ex` and the JIT code.
fn attachment(process: &PhpInstance) -> Attachment {
    let mut code: Vec<RuntimeCode> = std::iter::once(&process.binary.execute_ex)
        .chain(&process.binary.execute_ex_cold)
        .map(|range| RuntimeCode {
            start: range.start.wrapping_add(process.bias),
            end: range.end.wrapping_add(process.bias),
            dispatch: Dispatch::Deferred,
        })
        .collect();
    code.extend(&process.extra);
    // An NTS build's executor globals are the process's: on a thread other
    // than the main one (a timer thread of an extension) they hold the
    // main thread's PHP stack, not the sampled thread's.
    let threads = match process.binary.globals {
        Globals::Global(_) => EarlyEndThreads::Main,
        Globals::Tsrm { .. } => EarlyEndThreads::Every,
    };
    Attachment {
        code,
        walk_after_early_end: Some(threads),
        names_anonymous_code: false,
    }
}

/// What BPF needs of a PHP process; `None` while a ZTS process has not set
/// up its globals' offset yet, or its memory cannot be read.
fn bpf_process(process: &mut PhpInstance) -> Option<PhpProcess> {
    let bias = process.bias;
    let (globals_kind, executor_globals, tls_offset) = match process.binary.globals {
        Globals::Global(at) => (globals_kind::GLOBAL, at.wrapping_add(bias), 0),
        Globals::Tsrm {
            offset_variable,
            tls,
        } => {
            let memory = process.memory.get()?;
            // Set when the engine starts; the TSRM block is small.
            let offset = memory
                .read_u64(offset_variable.wrapping_add(bias))
                .ok()
                .filter(|&o| o != 0 && o < MAX_GLOBALS_OFFSET)?;
            let tls = match tls {
                TlsOffset::Constant(offset) => offset,
                TlsOffset::GotSlot(slot) => memory.read_u64(slot.wrapping_add(bias)).ok()? as i64,
            };
            (globals_kind::TSRM, offset, tls)
        }
    };
    let l = &process.binary.layout;
    Some(PhpProcess {
        executor_globals,
        vm_body_pc: match process.binary.vm_body_pc {
            0 => 0,
            pc => pc.wrapping_add(bias),
        },
        tls_offset,
        call_top: l.call_top,
        current_execute_data: l.eg_current_execute_data,
        ex_opline: l.ex_opline,
        ex_func: l.ex_func,
        ex_call_info: l.ex_call_info,
        ex_prev: l.ex_prev,
        globals_kind,
        reserved: 0,
    })
}

/// JIT code of a PHP process: its executable anonymous mappings (opcache
/// maps its JIT buffer as shared anonymous memory; the engine makes no
/// other executable memory).
fn jit_code(mappings: &ProcessMappings) -> Vec<RuntimeCode> {
    mappings
        .anonymous_code()
        .iter()
        .map(|c| RuntimeCode {
            start: c.start,
            end: c.end,
            dispatch: Dispatch::Handover,
        })
        .collect()
}

/// The PHP plugin.
pub struct PhpPlugin {
    map: Box<dyn ProcessMap<PhpProcess>>,
    processes: Interpreters<PhpBinary, Vec<RuntimeCode>>,
    functions: ObjectCache<FunctionInfo>,
    /// (pid, function, line) → frame.
    frames: LruCache<(u32, u64, u32), Arc<Frame>>,
    stats: RuntimeStats,
}

impl PhpPlugin {
    /// A plugin writing its per-process data to `map`.
    pub fn new(map: Box<dyn ProcessMap<PhpProcess>>) -> Self {
        PhpPlugin {
            map,
            processes: Interpreters::new(BINARY_CACHE),
            functions: ObjectCache::new(FUNCTION_CACHE, RECHECK_AFTER),
            frames: lru(FRAME_CACHE),
            stats: RuntimeStats::default(),
        }
    }

    /// Tells BPF where `pid`'s globals are.
    fn describe(&mut self, pid: u32) {
        let written = self
            .processes
            .describe(pid, &mut *self.map, &mut self.stats, bpf_process);
        if written && let Some(process) = self.processes.get(pid) {
            info!(pid, version = %process.binary.version, jit = !process.extra.is_empty(), "PHP process");
        }
    }

    /// The function at `function`, read once and cached. `fresh` (at drain
    /// time, while the process runs) checks an entry older than
    /// [`RECHECK_AFTER`] against the process, and drops the frames made
    /// from it if it changed.
    fn function(&mut self, pid: u32, function: u64, fresh: bool) -> Option<Arc<FunctionInfo>> {
        if let Some(cached) = self.functions.cached(pid, function, fresh) {
            return cached;
        }
        // Not read yet, or old: the same function still there keeps its
        // entry (and the frames made from it).
        let known = self.functions.cached(pid, function, false).flatten();
        if let Some(known) = &known {
            let same = self
                .objects(pid, |objects| objects.fingerprint(function))
                .flatten()
                .is_some_and(|(_, fingerprint)| fingerprint == known.fingerprint);
            if same {
                self.functions.store(pid, function, Some(known.clone()));
                return Some(known.clone());
            }
        }
        let info = self
            .objects(pid, |objects| objects.function(function))
            .flatten()
            .map(Arc::new);
        if self.functions.store(pid, function, info.clone()) {
            remove_where(&mut self.frames, |k| k.0 == pid && k.1 == function);
        }
        // A failed read keeps what was read before (the process is exiting).
        info.or(known)
    }

    /// Runs `read` on the process's objects.
    fn objects<T>(&mut self, pid: u32, read: impl FnOnce(&Objects<'_>) -> T) -> Option<T> {
        let instance = self.processes.get_mut(pid)?;
        let binary = instance.binary.clone();
        let memory = instance.memory.get()?;
        Some(read(&Objects::new(memory, &binary.layout)))
    }

    /// The frame of `words`, with the opline to take its line from.
    fn frame(&mut self, pid: u32, info: Option<&FunctionInfo>, words: FrameWords) -> Arc<Frame> {
        let Some(info) = info else {
            self.stats.frame_errors += 1;
            return Symbolizer::unknown_frame(FrameKind::Php, words.function);
        };
        let op_size = self
            .processes
            .get(pid)
            .map_or(0, |p| u64::from(p.binary.layout.op_size));
        let line = match info.kind {
            FunctionKind::Internal => 0,
            FunctionKind::User | FunctionKind::Eval => info
                .line_at(words.opline, op_size)
                .unwrap_or(info.line_start),
        };
        let key = (pid, words.function, line);
        if let Some(frame) = self.frames.get(&key) {
            return frame.clone();
        }
        let frame = php_frame(info, line);
        self.frames.put(key, frame.clone());
        frame
    }

    /// The frames of one sample's words, grouped by `execute_ex`
    /// invocation: a group ends with a user function C code called.
    fn groups(&mut self, pid: u32, words: &[u64], fresh: bool) -> Vec<Vec<Arc<Frame>>> {
        let mut sample = parse(words);
        if let (Some(leaf), Some(first)) = (sample.leaf_opline, sample.frames.first_mut()) {
            // The running opline, where it is one of the newest frame's.
            let info = self.function(pid, first.function, fresh);
            let op_size = self
                .processes
                .get(pid)
                .map_or(0, |p| u64::from(p.binary.layout.op_size));
            if info.is_some_and(|i| i.line_at(leaf, op_size).is_some()) {
                first.opline = leaf;
            }
        }
        let mut groups = Vec::new();
        let mut current = Vec::new();
        for words in sample.frames {
            let info = self.function(pid, words.function, fresh);
            let user = info
                .as_ref()
                .is_some_and(|i| i.kind != FunctionKind::Internal);
            current.push(self.frame(pid, info.as_deref(), words));
            if words.entry && user {
                groups.push(std::mem::take(&mut current));
            }
        }
        if !current.is_empty() {
            groups.push(current);
        }
        groups
    }
}

/// A PHP frame, named as PHP names the function in its backtraces.
fn php_frame(info: &FunctionInfo, line: u32) -> Arc<Frame> {
    let function = match (&info.name, info.kind) {
        (Some(name), _) => name.as_str(),
        (None, FunctionKind::Eval) => "<eval>",
        (None, _) => "<main>",
    };
    let name = match &info.class {
        Some(class) => format!("{class}::{function}"),
        None => function.to_owned(),
    };
    let name: Arc<str> = Arc::from(name);
    Arc::new(Frame {
        kind: FrameKind::Php,
        address: 0,
        mapping: None,
        lines: vec![Line {
            function_name: name.clone(),
            system_name: name,
            filename: info.file.as_deref().map(Arc::from),
            line,
            column: 0,
        }],
    })
}

impl RuntimePlugin for PhpPlugin {
    fn descriptor(&self) -> &'static RuntimeDescriptor {
        &PHP_RUNTIME
    }

    fn attach(&mut self, pid: u32, mappings: &ProcessMappings) -> Option<Attachment> {
        let process = self.processes.claim(
            pid,
            mappings,
            ("PHP", &mut self.stats),
            is_php_name,
            inspect,
            Vec::new,
        )?;
        // Opcache maps its JIT buffer at startup; a later look finds it.
        process.extra = jit_code(mappings);
        let claimed = attachment(process);
        self.describe(pid);
        Some(claimed)
    }

    fn detach(&mut self, pid: u32) {
        if !self.processes.remove(pid) {
            return;
        }
        self.map.remove(pid);
        self.functions.forget_process(pid);
        remove_where(&mut self.frames, |k| k.0 == pid);
    }

    fn observe(&mut self, pid: u32, words: &[u64]) {
        if parse(words).not_described && self.processes.retry_due(pid) {
            self.describe(pid);
        }
        self.groups(pid, words, true);
    }

    fn frames(&mut self, pid: u32, words: &[u64]) -> Vec<Vec<Arc<Frame>>> {
        let groups = self.groups(pid, words, false);
        self.stats.frames += groups.iter().map(|g| g.len() as u64).sum::<u64>();
        groups
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
    fn words_parse_into_frames_with_the_running_opline() {
        let function = |n| TAGS.word(word::FUNCTION, n);
        let entry = |n| TAGS.word(word::ENTRY_FUNCTION, n);
        let opline = |n| TAGS.word(word::OPLINE, n);
        let words = [
            TAGS.word(word::LEAF_OPLINE, 0x77),
            function(0x100),
            opline(0x10),
            entry(0x200),
            opline(0x20),
        ];
        let parsed = parse(&words);
        assert_eq!(parsed.leaf_opline, Some(0x77));
        assert_eq!(
            parsed.frames,
            [
                FrameWords {
                    function: 0x100,
                    opline: 0x10,
                    entry: false
                },
                FrameWords {
                    function: 0x200,
                    opline: 0x20,
                    entry: true
                }
            ]
        );
        // Junk ends the parse; a leaf opline after a frame is junk.
        let parsed = parse(&[function(0x100), 0x7fff_0000, entry(0x200)]);
        assert_eq!(parsed.frames.len(), 1);
        let parsed = parse(&[function(0x100), TAGS.word(word::LEAF_OPLINE, 1)]);
        assert_eq!((parsed.frames.len(), parsed.leaf_opline), (1, None));
        assert!(parse(&[TAGS.word(word::NOT_DESCRIBED, 0)]).not_described);
    }
}
