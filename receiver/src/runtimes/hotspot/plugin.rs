//! The HotSpot plugin: describes each JVM to BPF once its code cache exists
//! (retrying while it starts), claims the code heaps for the HotSpot program
//! (handover), and turns its words into frames: every method inlined at a
//! compiled frame's PC, innermost first, as `package.Class.method` with its
//! file and line; interpreted methods at their bytecode's line.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use icecore_otlp::model::{Frame, FrameKind, Line};
use icecore_unwinders::{
    Dispatch,
    hotspot::{CodeHeapRange, HOTSPOT, HotSpotProcess, MAX_CODE_HEAPS, word},
    runtime::PAYLOAD_MASK,
};
use lru::LruCache;
use tracing::{debug, info, warn};

use super::{
    code_cache::{Blob, CodeCache, NMethod},
    detect::{JvmBinary, inspect, is_jvm_name, major_version},
    layout::{HotSpotLayout, Location},
    names::{JavaMethod, Methods},
};
use crate::{
    process_maps::ProcessMappings,
    runtimes::{
        Attachment, RuntimeCode, RuntimeDescriptor, RuntimePlugin, RuntimeStats,
        memory::{LazyMemory, ProcessMemory},
        object_cache::{ObjectCache, lru},
        registry::HOTSPOT_RUNTIME,
        services::{FileProbes, ProcessMap, remove_where},
    },
    symbolize::Symbolizer,
};

/// libjvm files inspected and remembered.
const BINARY_CACHE: usize = 64;
/// Code blobs (with their nmethod's debug information) remembered.
const BLOB_CACHE: usize = 32_768;
/// Methods remembered.
const METHOD_CACHE: usize = 65_536;
/// A blob or method still sampled is read again after this long: the JVM
/// frees nmethods (and unloads classes) and places new ones at their
/// addresses; a changed compile ID or name then replaces the old one.
const REREAD_AFTER: Duration = Duration::from_secs(10);
/// How often a cached nmethod's compile ID is compared with the JVM's, at
/// most, while it is sampled.
const IDENTITY_CHECK: Duration = Duration::from_millis(200);
/// A JVM whose code cache does not exist yet is tried again this often.
const DESCRIBE_RETRY: Duration = Duration::from_millis(250);
/// And given up on after this long.
const DESCRIBE_GIVE_UP: Duration = Duration::from_secs(120);
/// The interpreter frame's `Method*` slot (words below `fp`), every version.
const METHOD_SLOT: u8 = 3;

/// A code blob as the plugin knows it.
#[derive(PartialEq)]
struct BlobInfo {
    blob: Blob,
    /// The nmethod's debug information (compiled Java code only).
    nmethod: Option<NMethod>,
    /// The native method a native wrapper calls.
    native_method: Option<u64>,
}

/// A JVM that could be described.
struct Described {
    layout: HotSpotLayout,
    heaps: Vec<CodeHeapRange>,
}

/// One JVM.
struct JvmInstance {
    binary: Arc<JvmBinary>,
    bias: u64,
    memory: LazyMemory,
    described: Option<Described>,
    first_try: Instant,
    tried_at: Instant,
}

impl JvmInstance {
    fn attachment(&self) -> Attachment {
        let code = self.described.as_ref().map_or_else(Vec::new, |d| {
            d.heaps
                .iter()
                .map(|h| RuntimeCode {
                    start: h.low,
                    end: h.high,
                    dispatch: Dispatch::Handover,
                })
                .collect()
        });
        Attachment {
            code,
            walk_after_early_end: None,
            names_anonymous_code: false,
        }
    }
}

/// The HotSpot plugin.
pub struct HotSpotPlugin {
    map: Box<dyn ProcessMap<HotSpotProcess>>,
    binaries: FileProbes<JvmBinary>,
    processes: HashMap<u32, JvmInstance>,
    blobs: ObjectCache<BlobInfo>,
    /// When each cached nmethod's compile ID was last compared with the
    /// JVM's.
    checked: LruCache<(u32, u64), Instant>,
    methods: ObjectCache<JavaMethod>,
    stats: RuntimeStats,
}

impl HotSpotPlugin {
    /// A plugin writing its per-process data to `map`.
    pub fn new(map: Box<dyn ProcessMap<HotSpotProcess>>) -> Self {
        HotSpotPlugin {
            map,
            binaries: FileProbes::new(BINARY_CACHE),
            processes: HashMap::new(),
            blobs: ObjectCache::new(BLOB_CACHE, REREAD_AFTER),
            checked: lru(BLOB_CACHE),
            methods: ObjectCache::new(METHOD_CACHE, REREAD_AFTER),
            stats: RuntimeStats::default(),
        }
    }

    /// Reads the JVM's tables and code heaps and tells BPF; leaves the JVM
    /// pending while its code cache does not exist yet.
    fn describe(&mut self, pid: u32) {
        let Some(instance) = self.processes.get_mut(&pid) else {
            return;
        };
        instance.tried_at = Instant::now();
        let (binary, bias) = (instance.binary.clone(), instance.bias);
        let Some(memory) = instance.memory.get() else {
            return;
        };
        let described = match read_jvm(&binary, bias, memory) {
            Ok(found) => found,
            Err(e) => {
                debug!(pid, "HotSpot not ready: {e}");
                if instance.first_try.elapsed() > DESCRIBE_GIVE_UP {
                    warn!(pid, "HotSpot not profiled: {e}");
                    self.stats.attach_failures += 1;
                    self.processes.remove(&pid);
                }
                return;
            }
        };
        let (layout, process) = described;
        if let Err(e) = self.map.insert(pid, &process) {
            self.stats.attach_failures += 1;
            debug!(pid, "cannot describe a JVM to BPF: {e}");
            return;
        }
        info!(
            pid,
            jdk = layout.major,
            heaps = process.heaps.iter().filter(|h| h.high != 0).count(),
            "HotSpot JVM"
        );
        instance.described = Some(Described {
            layout,
            heaps: process
                .heaps
                .iter()
                .copied()
                .filter(|h| h.high != 0)
                .collect(),
        });
    }

    fn layout(&self, pid: u32) -> Option<HotSpotLayout> {
        self.processes
            .get(&pid)?
            .described
            .as_ref()
            .map(|d| d.layout)
    }

    /// The blob at `blob` (an address BPF reported), read once (`fresh`:
    /// again if old, while the JVM surely runs).
    fn blob(&mut self, pid: u32, blob: u64, fresh: bool) -> Option<Arc<BlobInfo>> {
        if let Some(known) = self.blobs.cached(pid, blob, fresh)
            && !(fresh && self.replaced(pid, blob, known.as_deref()))
        {
            return known;
        }
        let layout = self.layout(pid)?;
        let memory = self.processes.get_mut(&pid)?.memory.get()?;
        let cache = CodeCache::read(memory, layout)?;
        let info = cache.blob_at(blob).filter(|b| b.address == blob).map(|b| {
            let nmethod = b.is_java_nmethod().then(|| cache.nmethod(&b)).flatten();
            let native_method = (b.name == "native nmethod")
                .then(|| memory.read_u64(b.address + layout.nmethod.method).ok())
                .flatten();
            Arc::new(BlobInfo {
                blob: b,
                nmethod,
                native_method,
            })
        });
        self.blobs.store(pid, blob, info.clone());
        info
    }

    /// Whether the nmethod `known` read at `blob` was freed and another
    /// placed there since (its compile ID differs). Checked at most every
    /// [`IDENTITY_CHECK`] per blob: a reused address is renamed within that.
    fn replaced(&mut self, pid: u32, blob: u64, known: Option<&BlobInfo>) -> bool {
        let Some(compile_id) = known.and_then(|i| i.nmethod.as_ref()).map(|n| n.compile_id) else {
            return false;
        };
        if self
            .checked
            .get(&(pid, blob))
            .is_some_and(|at| at.elapsed() < IDENTITY_CHECK)
        {
            return false;
        }
        self.checked.put((pid, blob), Instant::now());
        let Some(layout) = self.layout(pid) else {
            return false;
        };
        let now = self
            .processes
            .get_mut(&pid)
            .and_then(|p| p.memory.get())
            .and_then(|m| m.read_u32(blob + layout.nmethod.compile_id).ok());
        // Unreadable: the process is going; keep what was read.
        now.is_some_and(|id| id != compile_id)
    }

    /// The method at `method`, read once (`fresh` as for blobs).
    fn method(&mut self, pid: u32, method: u64, fresh: bool) -> Option<Arc<JavaMethod>> {
        if let Some(known) = self.methods.cached(pid, method, fresh) {
            return known;
        }
        let layout = self.layout(pid)?;
        let memory = self.processes.get_mut(&pid)?.memory.get()?;
        let found = Methods::new(memory, layout).method(method).map(Arc::new);
        self.methods.store(pid, method, found.clone());
        found
    }

    /// A frame of one Java method, at the bytecode index `bci` gives.
    fn java_frame(
        &mut self,
        pid: u32,
        method: u64,
        bci: impl FnOnce(&JavaMethod) -> i32,
        fresh: bool,
    ) -> Arc<Frame> {
        match self.method(pid, method, fresh) {
            Some(m) => java_frame(0, &[java_line(&m, bci(&m))]),
            None => {
                self.stats.frame_errors += 1;
                Symbolizer::unknown_frame(FrameKind::Jvm, method)
            }
        }
    }

    /// One compiled frame: a location at `pc` whose lines are every method
    /// inlined there, innermost first, then the compiled one (as pprof and
    /// OTLP represent inlining).
    fn compiled(&mut self, pid: u32, blob: u64, pc: u64, top: bool, fresh: bool) -> Arc<Frame> {
        let Some(info) = self.blob(pid, blob, fresh) else {
            self.stats.frame_errors += 1;
            return Symbolizer::unknown_frame(FrameKind::Jvm, pc);
        };
        let base = self.layout(pid).map_or(0, |l| l.unsigned5_base());
        let Some(nmethod) = &info.nmethod else {
            // A native method's wrapper: the Java method it stands for.
            if let Some(method) = info.native_method {
                return self.java_frame(pid, method, |_| 0, fresh);
            }
            return stub_frame(&info.blob.name);
        };
        let offset = u32::try_from(pc.wrapping_sub(info.blob.code_begin)).unwrap_or(u32::MAX);
        let mut scopes = nmethod.frames_at(offset, !top, base);
        if scopes.is_empty() {
            scopes.push((nmethod.method, 0));
        }
        let mut lines = Vec::with_capacity(scopes.len());
        for (method, bci) in scopes {
            match self.method(pid, method, fresh) {
                Some(m) => lines.push(java_line(&m, bci)),
                None => self.stats.frame_errors += 1,
            }
        }
        if lines.is_empty() {
            return Symbolizer::unknown_frame(FrameKind::Jvm, pc);
        }
        java_frame(pc, &lines)
    }

    fn interpreted(&mut self, pid: u32, method: u64, bcp: u64, fresh: bool) -> Arc<Frame> {
        self.java_frame(pid, method, |m| m.bci_of(bcp), fresh)
    }

    fn stub(&mut self, pid: u32, blob: u64, fresh: bool) -> Arc<Frame> {
        match self.blob(pid, blob, fresh) {
            Some(info) => stub_frame(&info.blob.name),
            None => Symbolizer::unknown_frame(FrameKind::Jvm, blob),
        }
    }

    /// The frames of a run of HotSpot words, innermost first (`fresh`: at
    /// drain time, re-reading what is old).
    fn frames_of(&mut self, pid: u32, words: &[u64], fresh: bool) -> Vec<Arc<Frame>> {
        let mut out = Vec::new();
        let mut i = 0;
        let payload = |w: u64| w & PAYLOAD_MASK;
        while let Some(&w) = words.get(i) {
            let next = words.get(i + 1).copied().unwrap_or(0);
            match HOTSPOT.tags.local_tag(w) {
                Some(word::COMPILED) => {
                    let top = HOTSPOT.tags.local_tag(next) == Some(word::TOP_PC);
                    out.push(self.compiled(pid, payload(w), payload(next), top, fresh));
                    i += 2;
                }
                Some(word::INTERPRETED) => {
                    out.push(self.interpreted(pid, payload(w), payload(next), fresh));
                    i += 2;
                }
                Some(word::STUB) => {
                    out.push(self.stub(pid, payload(w), fresh));
                    i += 1;
                }
                _ => break,
            }
        }
        out
    }
}

/// What BPF needs of the JVM that loaded `binary` at `bias`.
pub(super) fn read_jvm(
    binary: &JvmBinary,
    bias: u64,
    memory: &ProcessMemory,
) -> Result<(HotSpotLayout, HotSpotProcess), String> {
    let vm = binary.vm_structs(memory, bias).map_err(|e| e.to_string())?;
    let major = major_version(&vm, memory).map_err(|e| e.to_string())?;
    let layout = HotSpotLayout::new(&vm, major).map_err(|e| e.to_string())?;
    let cache = CodeCache::read(memory, layout).ok_or("the code cache cannot be read")?;
    if cache.heaps.is_empty() {
        return Err("no code heap yet".into());
    }
    let mut heaps = [CodeHeapRange::default(); MAX_CODE_HEAPS];
    for (slot, heap) in heaps.iter_mut().zip(&cache.heaps) {
        *slot = CodeHeapRange {
            low: heap.low,
            high: heap.high,
            segmap: heap.segmap,
            log2_segment_size: heap.log2_segment_size,
            reserved: 0,
        };
    }
    let stub = vm
        .static_address("StubRoutines::_call_stub_return_address")
        .map_err(|e| e.to_string())?;
    let call_stub_return = memory.read_u64(stub).map_err(|e| e.to_string())?;
    if call_stub_return == 0 {
        return Err("the call stub is not generated yet".into());
    }
    let interpreter = vm
        .static_address("AbstractInterpreter::_code")
        .map_err(|e| e.to_string())?;
    let queue = memory.read_u64(interpreter).map_err(|e| e.to_string())?;
    let buffer_at = vm
        .field("StubQueue::_stub_buffer")
        .map_err(|e| e.to_string())?;
    let limit_at = vm
        .field("StubQueue::_buffer_limit")
        .map_err(|e| e.to_string())?;
    let (interpreter_low, limit) = if queue == 0 {
        return Err("the interpreter is not generated yet".into());
    } else {
        (
            memory
                .read_u64(queue + buffer_at)
                .map_err(|e| e.to_string())?,
            memory
                .read_u32(queue + limit_at)
                .map_err(|e| e.to_string())?,
        )
    };
    let small = |v: u64, what: &str| u16::try_from(v).map_err(|_| format!("{what} at {v}"));
    let code_begin_field = match layout.blob.code_begin {
        Location::Pointer(field) | Location::Offset(field) => field,
    };
    // Without them, a frame pending deoptimization is named at its handler.
    let (deopt_handler, orig_pc_offset, deopt_handler_is_offset) = match layout.nmethod.deopt {
        Some((handler, orig_pc)) => {
            let (field, is_offset) = match handler {
                Location::Pointer(field) => (field, 0),
                Location::Offset(field) => (field, 1),
            };
            (
                small(field, "the deoptimization handler")?,
                small(orig_pc, "nmethod::_orig_pc_offset")?,
                is_offset,
            )
        }
        None => (0, 0, 0),
    };
    let process = HotSpotProcess {
        heaps,
        interpreter_low,
        interpreter_high: interpreter_low + u64::from(limit),
        call_stub_return,
        heap_block_size: small(layout.code_cache.heap_block_size, "sizeof(HeapBlock)")?,
        blob_frame_size: small(layout.blob.frame_size, "CodeBlob::_frame_size")?,
        method_slot: METHOD_SLOT,
        // JDK 9 added the mirror slot above the bytecode pointer.
        bcp_slot: if layout.major <= 8 { 7 } else { 8 },
        code_begin_is_offset: u8::from(matches!(layout.blob.code_begin, Location::Offset(_))),
        frame_complete_bytes: layout.blob.frame_complete_bytes,
        blob_code_begin: small(code_begin_field, "CodeBlob::_code_begin")?,
        blob_frame_complete: small(
            layout.blob.frame_complete,
            "CodeBlob::_frame_complete_offset",
        )?,
        nmethod_deopt_handler: deopt_handler,
        nmethod_orig_pc_offset: orig_pc_offset,
        deopt_handler_is_offset,
        reserved2: [0; 7],
    };
    Ok((layout, process))
}

/// A Java method at bytecode `bci`, as a line of a frame.
fn java_line(method: &JavaMethod, bci: i32) -> Line {
    Line {
        function_name: Arc::from(method.qualified_name()),
        system_name: Arc::from(format!("{}{}", method.qualified_name(), method.signature)),
        filename: method.source_file.as_deref().map(Arc::from),
        line: method.line(bci),
        column: 0,
    }
}

/// A Java frame at `address` (0 for an interpreted one) with `lines`.
fn java_frame(address: u64, lines: &[Line]) -> Arc<Frame> {
    Arc::new(Frame {
        kind: FrameKind::Jvm,
        address,
        mapping: None,
        lines: lines.to_vec(),
    })
}

/// A stub's, adapter's or native wrapper's frame, by its blob's name.
fn stub_frame(name: &str) -> Arc<Frame> {
    let name: Arc<str> = Arc::from(format!("[jvm] {name}"));
    Arc::new(Frame {
        kind: FrameKind::Jvm,
        address: 0,
        mapping: None,
        lines: vec![Line {
            function_name: name.clone(),
            system_name: name,
            filename: None,
            line: 0,
            column: 0,
        }],
    })
}

#[cfg(test)]
impl HotSpotPlugin {
    /// Makes the cached nmethod at `blob` look like another one (its
    /// method `method`, another compile ID), as if the address had held it
    /// before: what a freed and reused code-cache address looks like.
    pub(crate) fn pretend_blob_held_another(&mut self, pid: u32, blob: u64, method: u64) {
        let Some(Some(info)) = self.blobs.cached(pid, blob, false) else {
            return;
        };
        let Some(nmethod) = &info.nmethod else {
            return;
        };
        let mut other = nmethod.clone();
        other.compile_id = other.compile_id.wrapping_add(1);
        // Every scope names `method` now.
        for entry in &mut other.metadata {
            *entry = method;
        }
        let stale = BlobInfo {
            blob: info.blob.clone(),
            nmethod: Some(other),
            native_method: None,
        };
        self.blobs.store(pid, blob, Some(Arc::new(stale)));
        self.checked.pop(&(pid, blob));
    }
}

impl RuntimePlugin for HotSpotPlugin {
    fn descriptor(&self) -> &'static RuntimeDescriptor {
        &HOTSPOT_RUNTIME
    }

    fn attach(&mut self, pid: u32, mappings: &ProcessMappings) -> Option<Attachment> {
        if let Some(instance) = self.processes.get(&pid) {
            if instance.described.is_none() {
                self.describe(pid);
            }
            return self.processes.get(&pid).map(JvmInstance::attachment);
        }
        let (binary, bias) = self.binaries.find_in(
            pid,
            mappings,
            ("HotSpot", &mut self.stats),
            is_jvm_name,
            inspect,
        )?;
        let now = Instant::now();
        self.processes.insert(
            pid,
            JvmInstance {
                binary,
                bias,
                memory: LazyMemory::new(pid),
                described: None,
                first_try: now,
                tried_at: now,
            },
        );
        self.describe(pid);
        self.processes.get(&pid).map(JvmInstance::attachment)
    }

    fn detach(&mut self, pid: u32) {
        if self.processes.remove(&pid).is_none() {
            return;
        }
        self.map.remove(pid);
        self.blobs.forget_process(pid);
        remove_where(&mut self.checked, |k| k.0 == pid);
        self.methods.forget_process(pid);
    }

    fn due_for_attach(&mut self) -> Vec<u32> {
        self.processes
            .iter()
            .filter(|(_, p)| p.described.is_none() && p.tried_at.elapsed() >= DESCRIBE_RETRY)
            .map(|(&pid, _)| pid)
            .collect()
    }

    fn observe(&mut self, pid: u32, words: &[u64]) {
        // Reads what naming needs while the JVM surely runs.
        let _ = self.frames_of(pid, words, true);
    }

    fn frames(&mut self, pid: u32, words: &[u64]) -> Vec<Vec<Arc<Frame>>> {
        let frames = self.frames_of(pid, words, false);
        self.stats.frames += frames.len() as u64;
        vec![frames]
    }

    fn stats(&self) -> RuntimeStats {
        RuntimeStats {
            processes: self.processes.len(),
            ..self.stats
        }
    }
}
