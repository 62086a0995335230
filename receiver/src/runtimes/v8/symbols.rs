//! JavaScript frames named and placed: what each SharedFunctionInfo names
//! (its `--cpu-prof` name, script and position tables), each script's line
//! ends, and each compiled function's code, read from the process while it
//! runs and cached for the frames built when the batch is cut.
//!
//! A SharedFunctionInfo is cached by address with a fingerprint (its name
//! and script words): V8 allocates them in old space, where compaction may
//! move one and place another at its address; a sampled one whose
//! fingerprint changed is read again. Code is indexed by its instruction
//! range and checked against the frame's function, so a range V8 freed and
//! reused for another function's code is read again too.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use icecore_otlp::model::{Frame, FrameKind, Line};
use lru::LruCache;

use super::code::{CodeRange, CodeTier, Inlining, baseline_bytecode_offset};
use super::names::V8Objects;
use super::positions::{ScriptLines, entry_at, position_in_table};
use crate::runtimes::object_cache::{ObjectCache, lru};

/// SharedFunctionInfos remembered, over every process.
const FUNCTION_CACHE: usize = 65_536;
/// Scripts (with their line ends) remembered.
const SCRIPT_CACHE: usize = 2_048;
/// Compiled code objects remembered per process.
const CODE_PER_PROCESS: usize = 16_384;
/// A sampled function's fingerprint is compared with the process's at most
/// this often.
const IDENTITY_CHECK: Duration = Duration::from_millis(200);
/// Anything still sampled is read again after this long.
const REREAD_AFTER: Duration = Duration::from_secs(30);
/// `--cpu-prof`'s name for a function with no name, own or inferred.
const ANONYMOUS: &str = "(anonymous)";

/// What a SharedFunctionInfo names.
#[derive(Debug, PartialEq, Eq)]
pub struct V8Function {
    /// As `--cpu-prof` names it.
    pub name: Arc<str>,
    /// Its tagged Script, if it has one.
    pub script: Option<u64>,
    /// Its bytecode's source-position table (interpreted and baseline
    /// frames), if it has bytecode.
    pub bytecode_positions: Option<Vec<u8>>,
    /// The words it was recognized by: name-or-scope-info and script.
    fingerprint: [u64; 2],
}

/// A compiled function's code, as read while it ran.
#[derive(Debug)]
pub struct CompiledCode {
    /// Its instructions.
    pub range: CodeRange,
    /// The function compiled (the outermost, for optimized code).
    pub shared: u64,
    /// Its position table: source positions (optimized) or bytecode
    /// offsets (baseline).
    pub positions: Vec<u8>,
    /// Baseline code: the bytecodes its offset table walks.
    pub bytecodes: Vec<u8>,
    /// Optimized code: the functions it inlined.
    pub inlining: Inlining,
    read_at: Instant,
}

/// The symbol caches of every V8 process.
pub struct V8Symbols {
    functions: ObjectCache<V8Function>,
    checked: LruCache<(u32, u64), Instant>,
    scripts: ObjectCache<ScriptLines>,
    codes: HashMap<u32, BTreeMap<u64, Arc<CompiledCode>>>,
    /// Frames whose function or code could not be read.
    pub errors: u64,
}

impl Default for V8Symbols {
    fn default() -> Self {
        V8Symbols {
            functions: ObjectCache::new(FUNCTION_CACHE, REREAD_AFTER),
            checked: lru(FUNCTION_CACHE),
            scripts: ObjectCache::new(SCRIPT_CACHE, REREAD_AFTER),
            codes: HashMap::new(),
            errors: 0,
        }
    }
}

/// One JavaScript frame's words, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsFrame {
    /// Interpreted, at a bytecode offset.
    Interpreted {
        /// The tagged SharedFunctionInfo.
        shared: u64,
        /// The bytecode offset.
        offset: u64,
    },
    /// Compiled, at a PC.
    Compiled {
        /// The tagged SharedFunctionInfo.
        shared: u64,
        /// The tagged JSFunction.
        function: u64,
        /// The PC.
        pc: u64,
        /// Whether the PC is the instruction running (the sampled frame)
        /// rather than a return address.
        top: bool,
    },
}

impl V8Symbols {
    /// Reads what `frame` will need, while the process surely runs
    /// (`objects` reads it; `sizes` are its V8's bytecode sizes and
    /// `dispatch_table` its JS dispatch table, if any).
    pub fn observe(
        &mut self,
        pid: u32,
        frame: JsFrame,
        objects: &V8Objects,
        sizes: &[u8],
        dispatch_table: Option<u64>,
    ) {
        let shared = match frame {
            JsFrame::Interpreted { shared, .. } | JsFrame::Compiled { shared, .. } => shared,
        };
        let function = self.function(pid, shared, Some(objects));
        if let Some(script) = function.as_ref().and_then(|f| f.script) {
            self.script(pid, script, Some(objects));
        }
        if let JsFrame::Compiled {
            shared,
            function,
            pc,
            ..
        } = frame
        {
            self.observe_code(pid, shared, function, pc, objects, sizes, dispatch_table);
        }
    }

    /// The frame of `frame` from what was read (`objects`: read what is
    /// missing, when the process still runs; `sizes`: its V8's bytecode
    /// sizes).
    pub fn frame(
        &mut self,
        pid: u32,
        frame: JsFrame,
        objects: Option<&V8Objects>,
        sizes: &[u8],
    ) -> Arc<Frame> {
        match frame {
            JsFrame::Interpreted { shared, offset } => {
                self.bytecode_frame(pid, shared, Some(offset), 0, objects)
            }
            JsFrame::Compiled {
                shared, pc, top, ..
            } => {
                let code = self.code_at(pid, pc).filter(|c| c.shared == shared);
                let Some(code) = code else {
                    return self.bytecode_frame(pid, shared, None, pc, objects);
                };
                let pc_offset = pc - code.range.start;
                match code.range.tier {
                    CodeTier::Baseline => {
                        let bytecode = baseline_bytecode_offset(
                            &code.positions,
                            &code.bytecodes,
                            sizes,
                            pc_offset,
                        );
                        let bytecode = bytecode.and_then(|b| u64::try_from(b).ok());
                        self.bytecode_frame(pid, shared, bytecode, pc, objects)
                    }
                    CodeTier::Optimized => {
                        // A return address is one past its call: V8 looks
                        // up the call's own position.
                        let offset = pc_offset.saturating_sub(u64::from(!top));
                        let Some(position) = entry_at(&code.positions, offset) else {
                            return self.positioned_frame(pid, shared, None, pc, objects);
                        };
                        let lines: Vec<Line> = code
                            .inlining
                            .stack(shared, position)
                            .into_iter()
                            .filter_map(|(function, at)| {
                                self.line(pid, function, Some(at), objects)
                            })
                            .collect();
                        if lines.is_empty() {
                            self.errors += 1;
                            return crate::symbolize::Symbolizer::unknown_frame(
                                FrameKind::V8Js,
                                shared,
                            );
                        }
                        js_frame(pc, lines)
                    }
                    CodeTier::Other => self.bytecode_frame(pid, shared, None, pc, objects),
                }
            }
        }
    }

    /// Forgets everything of `pid`.
    pub fn forget_process(&mut self, pid: u32) {
        self.functions.forget_process(pid);
        self.scripts.forget_process(pid);
        crate::runtimes::services::remove_where(&mut self.checked, |k| k.0 == pid);
        self.codes.remove(&pid);
    }

    /// A frame of `shared` at `bytecode_offset` of its bytecode.
    fn bytecode_frame(
        &mut self,
        pid: u32,
        shared: u64,
        bytecode_offset: Option<u64>,
        address: u64,
        objects: Option<&V8Objects>,
    ) -> Arc<Frame> {
        let function = self.function(pid, shared, objects);
        let position = function.as_ref().zip(bytecode_offset).and_then(|(f, at)| {
            f.bytecode_positions
                .as_deref()
                .and_then(|table| position_in_table(table, at))
        });
        self.positioned_frame(pid, shared, position, address, objects)
    }

    /// A frame of `shared` at script offset `position`.
    fn positioned_frame(
        &mut self,
        pid: u32,
        shared: u64,
        position: Option<u64>,
        address: u64,
        objects: Option<&V8Objects>,
    ) -> Arc<Frame> {
        match self.line(pid, shared, position, objects) {
            Some(line) => js_frame(address, vec![line]),
            None => {
                self.errors += 1;
                crate::symbolize::Symbolizer::unknown_frame(FrameKind::V8Js, shared)
            }
        }
    }

    /// The line of `shared` at script offset `position`.
    fn line(
        &mut self,
        pid: u32,
        shared: u64,
        position: Option<u64>,
        objects: Option<&V8Objects>,
    ) -> Option<Line> {
        let function = self.function(pid, shared, objects)?;
        let script = function.script.and_then(|s| self.script(pid, s, objects));
        let (line, column) = script
            .as_ref()
            .zip(position)
            .and_then(|(s, p)| s.line_and_column(p))
            .unwrap_or((0, 0));
        let filename = script
            .as_ref()
            .filter(|s| !s.name.is_empty())
            .map(|s| Arc::from(s.name.as_str()));
        Some(Line {
            function_name: function.name.clone(),
            system_name: function.name.clone(),
            filename,
            line,
            column,
        })
    }

    /// The function at `shared`, read if unknown or (with `objects`) if
    /// its fingerprint changed.
    fn function(
        &mut self,
        pid: u32,
        shared: u64,
        objects: Option<&V8Objects>,
    ) -> Option<Arc<V8Function>> {
        let fresh = objects.is_some();
        if let Some(known) = self.functions.cached(pid, shared, fresh)
            && !(fresh && self.replaced(pid, shared, known.as_deref(), objects))
        {
            return known;
        }
        let objects = objects?;
        let read = read_function(objects, shared).map(Arc::new);
        self.functions.store(pid, shared, read.clone());
        self.checked.put((pid, shared), Instant::now());
        read
    }

    /// Whether the function known at `shared` was replaced by another (its
    /// fingerprint differs), checked at most every [`IDENTITY_CHECK`].
    fn replaced(
        &mut self,
        pid: u32,
        shared: u64,
        known: Option<&V8Function>,
        objects: Option<&V8Objects>,
    ) -> bool {
        let (Some(known), Some(objects)) = (known, objects) else {
            return false;
        };
        if self
            .checked
            .get(&(pid, shared))
            .is_some_and(|at| at.elapsed() < IDENTITY_CHECK)
        {
            return false;
        }
        self.checked.put((pid, shared), Instant::now());
        // Unreadable: the process is going; keep what was read.
        fingerprint(objects, shared).is_some_and(|now| now != known.fingerprint)
    }

    fn script(
        &mut self,
        pid: u32,
        script: u64,
        objects: Option<&V8Objects>,
    ) -> Option<Arc<ScriptLines>> {
        if let Some(known) = self.scripts.cached(pid, script, objects.is_some()) {
            return known;
        }
        let read = objects?.script_lines(script).map(Arc::new);
        self.scripts.store(pid, script, read.clone());
        read
    }

    /// The code known to hold `pc`.
    fn code_at(&self, pid: u32, pc: u64) -> Option<Arc<CompiledCode>> {
        let (_, code) = self.codes.get(&pid)?.range(..=pc).next_back()?;
        code.range.contains(pc).then(|| code.clone())
    }

    /// Reads the code a compiled frame runs unless known: the function's
    /// current code, or its baseline code (a frame still running the code
    /// its function has since left).
    #[allow(clippy::too_many_arguments)]
    fn observe_code(
        &mut self,
        pid: u32,
        shared: u64,
        function: u64,
        pc: u64,
        objects: &V8Objects,
        sizes: &[u8],
        dispatch_table: Option<u64>,
    ) {
        if self
            .code_at(pid, pc)
            .is_some_and(|c| c.shared == shared && c.read_at.elapsed() < REREAD_AFTER)
        {
            return;
        }
        let candidates = [
            objects.code_of(function, dispatch_table),
            objects
                .field(shared, objects.layout.sfi_function_data)
                .filter(|&d| objects.instance_type(d) == Some(objects.layout.code_type)),
        ];
        let Some(range) = candidates
            .into_iter()
            .flatten()
            .filter_map(|code| objects.code_range(code))
            .find(|r| r.contains(pc))
            .or_else(|| objects.code_containing(pc))
        else {
            return;
        };
        let positions = objects.code_positions(range.code).unwrap_or_default();
        let inlining = match range.tier {
            CodeTier::Optimized => objects.inlining(range.code).unwrap_or_default(),
            _ => Inlining::default(),
        };
        // The inlined functions are named now, while the process runs.
        for &inlined in &inlining.functions {
            if let Some(script) = self
                .function(pid, inlined, Some(objects))
                .and_then(|f| f.script)
            {
                self.script(pid, script, Some(objects));
            }
        }
        let bytecodes = match range.tier {
            CodeTier::Baseline if !sizes.is_empty() => objects
                .field(range.code, objects.layout.source.code_bytecode)
                .and_then(|b| objects.bytecode_in(b))
                .and_then(|b| objects.bytecodes(b))
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        let code = Arc::new(CompiledCode {
            range,
            shared,
            positions,
            bytecodes,
            inlining,
            read_at: Instant::now(),
        });
        let index = self.codes.entry(pid).or_default();
        // Whatever the new code overlaps was freed.
        let stale: Vec<u64> = index
            .range(..range.end)
            .filter(|(_, c)| c.range.end > range.start)
            .map(|(&start, _)| start)
            .collect();
        for start in stale {
            index.remove(&start);
        }
        if index.len() >= CODE_PER_PROCESS {
            // Bounded: the oldest reads go first.
            let mut by_age: Vec<(Instant, u64)> =
                index.iter().map(|(&s, c)| (c.read_at, s)).collect();
            by_age.sort_unstable();
            for (_, start) in by_age.into_iter().take(CODE_PER_PROCESS / 4) {
                index.remove(&start);
            }
        }
        index.insert(range.start, code);
    }
}

/// A JavaScript frame at `address` (the PC of compiled code, else 0) with
/// `lines`, innermost first.
fn js_frame(address: u64, lines: Vec<Line>) -> Arc<Frame> {
    Arc::new(Frame {
        kind: FrameKind::V8Js,
        address,
        mapping: None,
        lines,
    })
}

/// The words a SharedFunctionInfo is recognized by.
fn fingerprint(objects: &V8Objects, shared: u64) -> Option<[u64; 2]> {
    let l = objects.layout;
    Some([
        objects.field(shared, l.sfi_name_or_scope_info)?,
        objects.field(shared, l.sfi_script)?,
    ])
}

/// Reads what `shared` names; `None` when it is no SharedFunctionInfo.
fn read_function(objects: &V8Objects, shared: u64) -> Option<V8Function> {
    if objects.instance_type(shared)? != objects.layout.shared_function_info_type {
        return None;
    }
    let name = objects.function_name(shared)?;
    let name: Arc<str> = if name.is_empty() {
        Arc::from(ANONYMOUS)
    } else {
        Arc::from(name)
    };
    let bytecode_positions = objects
        .bytecode_of(shared)
        .and_then(|b| objects.bytecode_position_table(b));
    Some(V8Function {
        name,
        script: objects.script_of(shared),
        bytecode_positions,
        fingerprint: fingerprint(objects, shared)?,
    })
}
