//! The V8 plugin: recognizes a V8 binary (`node`, `libnode`, any file
//! exporting `v8dbg_*` constants) in a process, describes its builtins and
//! JIT code to BPF (handover: V8's frames are walked from their own frame
//! pointers), follows the JIT code range as V8 commits more of it, and
//! names the JavaScript frames BPF reports (see [`super::symbols`]).

use std::{collections::HashMap, path::Path, sync::Arc};

use icecore_otlp::model::Frame;
use icecore_unwinders::{
    Dispatch,
    runtime::PAYLOAD_MASK,
    v8::{V8, V8Process, word},
};
use tracing::{debug, info, warn};

use super::{
    introspection::{InspectError, V8Binary, inspect},
    layout::{MissingConstant, V8Layout, resolve},
    names::V8Objects,
    process::describe,
    symbols::{JsFrame, V8Symbols},
};
use crate::{
    process_maps::{MappedFile, ProcessMappings},
    runtimes::{
        Attachment, RuntimeCode, RuntimeDescriptor, RuntimePlugin, RuntimeStats,
        memory::LazyMemory,
        registry::V8_RUNTIME,
        services::{FileProbes, ProcessMap},
    },
};

/// V8 files inspected and remembered.
const BINARY_CACHE: usize = 64;
/// A file this small holds no V8 (V8 alone is tens of MiB of code): it is
/// not parsed.
const MIN_V8_FILE_BYTES: u64 = 8 << 20;

/// Why a file is not a V8 icecore profiles.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    /// Too small to hold V8.
    #[error("too small to hold V8")]
    Small,
    /// Its size could not be read.
    #[error("cannot stat: {0}")]
    Stat(std::io::Error),
    /// Not V8, or unreadable.
    #[error(transparent)]
    Inspect(#[from] InspectError),
    /// A V8 whose layout is not known.
    #[error(transparent)]
    Layout(#[from] MissingConstant),
    /// A V8 whose file does not say where its builtins are: a binary or
    /// library whose `.symtab` was stripped (Debian's `libnode`), which
    /// keeps only the exported `v8dbg_*` constants.
    #[error(
        "{0} has V8 {1} but no symbol table locating its builtins \
         (stripped); its JavaScript frames are not unwound"
    )]
    Stripped(String, String),
}

/// A V8 binary and the layout it describes.
struct V8Runtime {
    binary: V8Binary,
    layout: V8Layout,
}

fn probe(path: &Path) -> Result<V8Runtime, ProbeError> {
    let size = std::fs::metadata(path).map_err(ProbeError::Stat)?.len();
    if size < MIN_V8_FILE_BYTES {
        return Err(ProbeError::Small);
    }
    let binary = inspect(path)?;
    let layout = resolve(&binary)?;
    let trampoline = binary.builtin("Builtins_InterpreterEntryTrampoline");
    if binary.embedded_blob.is_none() || trampoline.is_none() {
        return Err(ProbeError::Stripped(
            path.display().to_string(),
            binary.version.to_string(),
        ));
    }
    Ok(V8Runtime { binary, layout })
}

/// One process running V8.
struct V8Instance {
    runtime: Arc<V8Runtime>,
    /// The V8 binary's file (device, inode).
    file: ((u32, u32), u64),
    /// Its load bias.
    bias: u64,
    memory: LazyMemory,
    /// What BPF was told.
    process: V8Process,
    /// The JS dispatch table (V8 13), once read.
    dispatch_table: Option<u64>,
}

impl V8Instance {
    fn attachment(&self) -> Attachment {
        let code = self
            .process
            .code
            .iter()
            .filter(|r| r.high > r.low)
            .map(|r| RuntimeCode {
                start: r.low,
                end: r.high,
                dispatch: Dispatch::Handover,
            })
            .collect();
        Attachment {
            code,
            walk_after_early_end: None,
            names_anonymous_code: false,
        }
    }

    /// The JS dispatch table's address, read at first need.
    fn dispatch_table(&mut self) -> Option<u64> {
        if self.dispatch_table.is_none()
            && let Some((_, in_group)) = self.runtime.layout.code.dispatch
            && let Some(group_at) = self.runtime.binary.isolate_group
            && let Some(memory) = self.memory.get()
        {
            let group = memory.read_u64(group_at.wrapping_add(self.bias)).ok();
            self.dispatch_table = group
                .filter(|&g| g != 0)
                .and_then(|g| memory.read_u64(g.wrapping_add(in_group)).ok())
                .filter(|&t| t != 0);
        }
        self.dispatch_table
    }
}

/// The V8 plugin.
pub struct V8Plugin {
    map: Box<dyn ProcessMap<V8Process>>,
    binaries: FileProbes<V8Runtime>,
    processes: HashMap<u32, V8Instance>,
    symbols: V8Symbols,
    stats: RuntimeStats,
}

impl V8Plugin {
    /// A plugin writing its per-process data to `map`.
    pub fn new(map: Box<dyn ProcessMap<V8Process>>) -> Self {
        V8Plugin {
            map,
            binaries: FileProbes::new(BINARY_CACHE),
            processes: HashMap::new(),
            symbols: V8Symbols::default(),
            stats: RuntimeStats::default(),
        }
    }

    /// The V8 binary among `mappings`, with the mapping it was found in.
    fn find_binary(
        &mut self,
        pid: u32,
        mappings: &ProcessMappings,
    ) -> Option<(Arc<V8Runtime>, MappedFile)> {
        for mapping in mappings.executable() {
            let stats = &mut self.stats;
            let runtime = self.binaries.get_or_probe(pid, mapping, |path| {
                probe(path).inspect_err(|e| {
                    // Once per file: a failed probe is remembered.
                    if matches!(e, ProbeError::Layout(_) | ProbeError::Stripped(..)) {
                        stats.attach_failures += 1;
                        warn!(pid, file = %mapping.path, "V8 not profiled: {e}");
                    }
                })
            });
            if let Some(runtime) = runtime {
                return Some((runtime, mapping.clone()));
            }
        }
        None
    }

    /// Describes (again) the process to BPF from its current mappings;
    /// false when it cannot be.
    fn describe(&mut self, pid: u32, mappings: &ProcessMappings) -> bool {
        let Some(instance) = self.processes.get_mut(&pid) else {
            return false;
        };
        let file = instance.file;
        let described = describe(
            &instance.runtime.binary,
            &instance.runtime.layout,
            mappings,
            |m: &MappedFile| (m.dev, m.inode) == file,
        );
        let process = match described {
            Ok(process) => process,
            Err(e) => {
                self.stats.attach_failures += 1;
                warn!(pid, "V8 not profiled: {e}");
                return false;
            }
        };
        if process == instance.process {
            return true;
        }
        if let Err(e) = self.map.insert(pid, &process) {
            self.stats.attach_failures += 1;
            debug!(pid, "cannot describe a V8 process to BPF: {e}");
            return false;
        }
        let ranges = process.code.iter().filter(|r| r.high > r.low).count();
        if instance.process == V8Process::default() {
            info!(pid, v8 = %instance.runtime.binary.version, ranges, "V8");
        } else {
            debug!(pid, ranges, "V8 code ranges changed");
        }
        instance.process = process;
        true
    }

    /// Reads what naming the frames of a run of V8 words will need.
    fn observe_words(&mut self, pid: u32, words: &[u64]) {
        let frames = js_frames(words);
        let Some(instance) = self.processes.get_mut(&pid) else {
            return;
        };
        let dispatch_table = if frames.iter().any(|f| matches!(f, JsFrame::Compiled { .. })) {
            instance.dispatch_table()
        } else {
            None
        };
        let runtime = instance.runtime.clone();
        let Some(memory) = instance.memory.get() else {
            return;
        };
        let objects = V8Objects::new(&runtime.layout, memory);
        for frame in frames {
            self.symbols.observe(
                pid,
                frame,
                &objects,
                &runtime.binary.bytecode_sizes,
                dispatch_table,
            );
        }
    }

    /// The frames of a run of V8 words, innermost first, one per
    /// JavaScript frame, from what was read while the process ran (it may
    /// have exited since).
    fn frames_of(&mut self, pid: u32, words: &[u64]) -> Vec<Arc<Frame>> {
        let runtime = self.processes.get(&pid).map(|i| i.runtime.clone());
        let sizes = runtime
            .as_ref()
            .map_or(&[][..], |r| &r.binary.bytecode_sizes[..]);
        js_frames(words)
            .into_iter()
            .map(|f| self.symbols.frame(pid, f, None, sizes))
            .collect()
    }
}

/// The JavaScript frames of a run of V8 words, innermost first.
fn js_frames(words: &[u64]) -> Vec<JsFrame> {
    let tag = |i: usize| words.get(i).and_then(|&w| V8.tags.local_tag(w));
    let payload = |i: usize| words.get(i).map_or(0, |&w| w & PAYLOAD_MASK);
    let mut frames = Vec::new();
    let mut i = 0;
    while tag(i) == Some(word::SHARED) {
        match (tag(i + 1), tag(i + 2)) {
            (Some(word::BYTECODE_OFFSET), _) => {
                frames.push(JsFrame::Interpreted {
                    shared: payload(i),
                    offset: payload(i + 1),
                });
                i += 2;
            }
            (Some(word::FUNCTION), Some(pc @ (word::PC | word::TOP_PC))) => {
                frames.push(JsFrame::Compiled {
                    shared: payload(i),
                    function: payload(i + 1),
                    pc: payload(i + 2),
                    top: pc == word::TOP_PC,
                });
                i += 3;
            }
            _ => break,
        }
    }
    frames
}

impl RuntimePlugin for V8Plugin {
    fn descriptor(&self) -> &'static RuntimeDescriptor {
        &V8_RUNTIME
    }

    fn attach(&mut self, pid: u32, mappings: &ProcessMappings) -> Option<Attachment> {
        if !self.processes.contains_key(&pid) {
            let (runtime, mapping) = self.find_binary(pid, mappings)?;
            let bias = runtime
                .binary
                .segments
                .load_bias(mapping.start, mapping.file_offset)?;
            self.processes.insert(
                pid,
                V8Instance {
                    runtime,
                    file: (mapping.dev, mapping.inode),
                    bias,
                    memory: LazyMemory::new(pid),
                    process: V8Process::default(),
                    dispatch_table: None,
                },
            );
        }
        if !self.describe(pid, mappings)
            && self
                .processes
                .get(&pid)
                .is_none_or(|i| i.process == V8Process::default())
        {
            // Never described. (One described before keeps what BPF was
            // told: its mappings may be going away as it exits.)
            self.detach(pid);
            return None;
        }
        self.processes.get(&pid).map(V8Instance::attachment)
    }

    fn detach(&mut self, pid: u32) {
        if self.processes.remove(&pid).is_none() {
            return;
        }
        self.map.remove(pid);
        self.symbols.forget_process(pid);
    }

    fn observe(&mut self, pid: u32, words: &[u64]) {
        self.observe_words(pid, words);
    }

    fn frames(&mut self, pid: u32, words: &[u64]) -> Vec<Vec<Arc<Frame>>> {
        let frames = self.frames_of(pid, words);
        self.stats.frames += frames.len() as u64;
        vec![frames]
    }

    fn stats(&self) -> RuntimeStats {
        RuntimeStats {
            processes: self.processes.len(),
            frame_errors: self.symbols.errors,
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::test_support::missing_prerequisite;

    /// A node whose `.symtab` was stripped (as Debian strips `libnode`)
    /// is refused with the reason, once per file, not described in vain.
    #[test]
    fn a_stripped_v8_is_refused_with_its_reason() {
        let node = Path::new("/usr/bin/node");
        if !node.exists() {
            missing_prerequisite("/usr/bin/node");
            return;
        }
        assert!(probe(node).is_ok(), "the unstripped node is a V8");
        let dir = tempfile::tempdir().unwrap();
        let stripped = dir.path().join("node");
        let status = std::process::Command::new("strip")
            .arg("--strip-all")
            .arg("-o")
            .arg(&stripped)
            .arg(node)
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            missing_prerequisite(&format!("binutils' strip ({status:?})"));
            return;
        }
        let err = probe(&stripped).err().expect("refused");
        assert!(matches!(err, ProbeError::Stripped(..)), "{err}");
        assert!(err.to_string().contains("stripped"), "{err}");
        assert!(matches!(
            probe(Path::new("/bin/sh")),
            Err(ProbeError::Small)
        ));
    }
}
