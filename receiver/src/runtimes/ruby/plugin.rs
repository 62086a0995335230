//! The CRuby plugin: describes each CRuby process to BPF, and turns its
//! words into frames (`Foo#bar` at `app.rb:12`, `Integer#times`), each VM
//! invocation's frames in the place of its `vm_exec` frame.

use std::{sync::Arc, time::Duration};

use icecore_otlp::model::{Frame, FrameKind, Line};
use icecore_unwinders::{
    Dispatch,
    native::EarlyEndThreads,
    ruby::{RubyProcess, TAGS, word},
    runtime::PAYLOAD_MASK,
};
use lru::LruCache;
use tracing::info;

use super::{
    detect::{RubyBinary, inspect, is_ruby_name},
    methods::MethodEntry,
    objects::{IseqInfo, Objects},
};
use crate::{
    process_maps::ProcessMappings,
    runtimes::{
        Attachment, RuntimeCode, RuntimeDescriptor, RuntimePlugin, RuntimeStats,
        interpreters::{Interpreter, Interpreters},
        object_cache::{ObjectCache, lru},
        registry::CRUBY_RUNTIME,
        services::{ProcessMap, remove_where},
    },
    symbolize::Symbolizer,
};

/// CRuby files inspected and remembered (per device and inode).
const BINARY_CACHE: usize = 256;
/// Iseqs remembered, over all processes.
const ISEQ_CACHE: usize = 16_384;
/// Method entries remembered, over all processes.
const METHOD_CACHE: usize = 16_384;
/// Distinct frames (iseq, `pc`, method) remembered, over all processes.
const FRAME_CACHE: usize = 65_536;
/// An iseq still sampled is read again after this long: the GC may free an
/// iseq (code made by `eval`, a redefined method) and place another at its
/// address, and the caches are keyed by address.
const REREAD_AFTER: Duration = Duration::from_secs(60);

/// One frame as BPF reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameWords {
    /// A Ruby frame: its iseq, `pc` and, for a method's own frame, its
    /// `ep[-2]` (a method entry, or a cref outside methods); 0 otherwise.
    Iseq {
        /// The iseq.
        iseq: u64,
        /// The next instruction.
        pc: u64,
        /// The method entry candidate.
        method: u64,
    },
    /// A C function's frame: its method entry (0 when BPF found none).
    Cfunc {
        /// The method entry.
        method: u64,
    },
}

/// One sample's words, split into VM invocations (innermost first, each
/// innermost frame first), and whether BPF said the process is not described.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Invocations {
    /// The frames of each invocation.
    pub groups: Vec<Vec<FrameWords>>,
    /// BPF had no entry for the process.
    pub not_described: bool,
}

/// Splits a run of CRuby words: an invocation ends with the frame its
/// `vm_exec` started at (an [`word::ENTRY_ISEQ`] word).
pub fn invocations(words: &[u64]) -> Invocations {
    let mut out = Invocations::default();
    let mut current = Vec::new();
    let mut i = 0;
    let payload = |w: u64| w & PAYLOAD_MASK;
    while let Some(&w) = words.get(i) {
        match TAGS.local_tag(w) {
            Some(tag @ (word::ISEQ | word::ENTRY_ISEQ)) => {
                let pc = words
                    .get(i + 1)
                    .filter(|&&w| TAGS.local_tag(w) == Some(word::PC))
                    .map(|&w| payload(w));
                i += 1 + usize::from(pc.is_some());
                let method = words
                    .get(i)
                    .filter(|&&w| TAGS.local_tag(w) == Some(word::METHOD))
                    .map(|&w| payload(w));
                i += usize::from(method.is_some());
                current.push(FrameWords::Iseq {
                    iseq: payload(w),
                    pc: pc.unwrap_or(0),
                    method: method.unwrap_or(0),
                });
                if tag == word::ENTRY_ISEQ {
                    out.groups.push(std::mem::take(&mut current));
                }
            }
            Some(word::CFUNC) => {
                current.push(FrameWords::Cfunc { method: payload(w) });
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
    if !current.is_empty() {
        out.groups.push(current);
    }
    out
}

/// The code of a CRuby process its program unwinds: `vm_exec`.
fn attachment(process: &Interpreter<RubyBinary, ()>) -> Attachment {
    Attachment {
        code: process
            .binary
            .vm_exec
            .iter()
            .map(|range| RuntimeCode {
                start: range.start.wrapping_add(process.bias),
                end: range.end.wrapping_add(process.bias),
                dispatch: Dispatch::Deferred,
            })
            .collect(),
        walk_after_early_end: Some(EarlyEndThreads::Every),
        names_anonymous_code: false,
    }
}

/// The CRuby plugin.
pub struct RubyPlugin {
    map: Box<dyn ProcessMap<RubyProcess>>,
    processes: Interpreters<RubyBinary>,
    iseqs: ObjectCache<IseqInfo>,
    methods: LruCache<(u32, u64), Option<Arc<MethodEntry>>>,
    /// A method's iseq → its method entry, learned from the method's own
    /// frames, to name its blocks (`block in Foo#bar`).
    method_of_iseq: LruCache<(u32, u64), u64>,
    /// (pid, iseq or 0 for a C function, pc, method entry) → frame.
    frames: LruCache<(u32, u64, u64, u64), Arc<Frame>>,
    stats: RuntimeStats,
}

impl RubyPlugin {
    /// A plugin writing its per-process data to `map`.
    pub fn new(map: Box<dyn ProcessMap<RubyProcess>>) -> Self {
        RubyPlugin {
            map,
            processes: Interpreters::new(BINARY_CACHE),
            iseqs: ObjectCache::new(ISEQ_CACHE, REREAD_AFTER),
            methods: lru(METHOD_CACHE),
            method_of_iseq: lru(METHOD_CACHE),
            frames: lru(FRAME_CACHE),
            stats: RuntimeStats::default(),
        }
    }

    /// Tells BPF where `pid`'s execution contexts are, once the dynamic
    /// loader has filled in libruby's TLS slot.
    fn describe(&mut self, pid: u32) {
        let written = self
            .processes
            .describe(pid, &mut *self.map, &mut self.stats, |process| {
                let (binary, bias) = (process.binary.clone(), process.bias);
                let memory = process.memory.get()?;
                binary.bpf_process(bias, |at| memory.read_u64(at).ok())
            });
        if written && let Some(process) = self.processes.get(pid) {
            info!(pid, version = %process.binary.version, "CRuby process");
        }
    }

    /// The iseq at `iseq`, read once and cached. `fresh` (at drain time,
    /// while the process runs) re-reads an entry older than
    /// [`REREAD_AFTER`], and drops the frames made from it if it changed.
    fn iseq(&mut self, pid: u32, iseq: u64, fresh: bool) -> Option<Arc<IseqInfo>> {
        if let Some(known) = self.iseqs.cached(pid, iseq, fresh) {
            return known;
        }
        let info = self
            .objects(pid, |objects| objects.iseq(iseq))
            .flatten()
            .map(Arc::new);
        if self.iseqs.store(pid, iseq, info.clone()) {
            remove_where(&mut self.frames, |k| k.0 == pid && k.1 == iseq);
            remove_where(&mut self.method_of_iseq, |k| k.0 == pid && k.1 == iseq);
        }
        info
    }

    /// The method entry at `value`, read once and cached.
    fn method_entry(&mut self, pid: u32, value: u64) -> Option<Arc<MethodEntry>> {
        if value == 0 {
            return None;
        }
        if let Some(known) = self.methods.get(&(pid, value)) {
            return known.clone();
        }
        let entry = self
            .objects(pid, |objects| objects.method_entry(value))
            .flatten()
            .map(Arc::new);
        self.methods.put((pid, value), entry.clone());
        entry
    }

    /// Runs `read` on the process's objects.
    fn objects<T>(&mut self, pid: u32, read: impl FnOnce(&Objects<'_>) -> T) -> Option<T> {
        let instance = self.processes.get_mut(pid)?;
        let (layout, symbols) = (
            instance.binary.layout,
            instance
                .binary
                .global_symbols
                .map(|at| at.wrapping_add(instance.bias)),
        );
        let memory = instance.memory.get()?;
        Some(read(&Objects::new(memory, layout).with_symbols(symbols)))
    }

    /// Remembers the method entry of each method frame among `groups`, so
    /// that the blocks above it in the same sample are named after it.
    fn learn_methods(&mut self, pid: u32, groups: &[Vec<FrameWords>]) {
        for frame in groups.iter().flatten() {
            if let FrameWords::Iseq { iseq, method, .. } = *frame
                && method != 0
            {
                self.method_of_iseq.put((pid, iseq), method);
            }
        }
    }

    /// The frame of `words`, from the caches or read now.
    fn frame(&mut self, pid: u32, words: FrameWords) -> Arc<Frame> {
        match words {
            FrameWords::Cfunc { method } => {
                if let Some(frame) = self.frames.get(&(pid, 0, 0, method)) {
                    return frame.clone();
                }
                let entry = self.method_entry(pid, method);
                let name = entry.as_ref().and_then(|e| e.full_name());
                let Some(name) = name else {
                    self.stats.frame_errors += 1;
                    return unknown(method);
                };
                let frame = ruby_frame(name, String::new(), None, 0);
                self.frames.put((pid, 0, 0, method), frame.clone());
                frame
            }
            FrameWords::Iseq { iseq, pc, method } => {
                let Some(info) = self.iseq(pid, iseq, false) else {
                    self.stats.frame_errors += 1;
                    return unknown(iseq);
                };
                // A method's own frame names its class; a block's frame
                // borrows its method's, if a frame of it was seen.
                let method = if method != 0 {
                    method
                } else if info.local_iseq != iseq && info.local_iseq != 0 {
                    self.method_of_iseq
                        .get(&(pid, info.local_iseq))
                        .copied()
                        .unwrap_or(0)
                } else {
                    0
                };
                let key = (pid, iseq, pc, method);
                if let Some(frame) = self.frames.get(&key) {
                    return frame.clone();
                }
                let qualifier = self
                    .method_entry(pid, method)
                    .and_then(|e| e.qualifier.clone());
                let name = match qualifier {
                    None => info.label.clone(),
                    Some(q) => match info.label.split_once(" in ") {
                        // `block in bar`, `block (2 levels) in bar`.
                        Some((block, method)) => format!("{block} in {}", q.name(method)),
                        None => q.name(&info.label),
                    },
                };
                let line = self
                    .objects(pid, |objects| objects.line(info.body, pc))
                    .flatten()
                    .unwrap_or(info.first_line);
                let frame = ruby_frame(name, info.label.clone(), Some(&info.path), line);
                self.frames.put(key, frame.clone());
                frame
            }
        }
    }
}

/// A Ruby frame.
fn ruby_frame(name: String, system_name: String, path: Option<&str>, line: u32) -> Arc<Frame> {
    let system_name = if system_name.is_empty() {
        name.clone()
    } else {
        system_name
    };
    Arc::new(Frame {
        kind: FrameKind::Ruby,
        address: 0,
        mapping: None,
        lines: vec![Line {
            function_name: Arc::from(name),
            system_name: Arc::from(system_name),
            filename: path.map(Arc::from),
            line,
            column: 0,
        }],
    })
}

/// A frame whose iseq or method entry could not be read: kept, so the
/// stack keeps its shape, with the address BPF reported.
fn unknown(address: u64) -> Arc<Frame> {
    Symbolizer::unknown_frame(FrameKind::Ruby, address)
}

impl RuntimePlugin for RubyPlugin {
    fn descriptor(&self) -> &'static RuntimeDescriptor {
        &CRUBY_RUNTIME
    }

    fn attach(&mut self, pid: u32, mappings: &ProcessMappings) -> Option<Attachment> {
        let process = self.processes.claim(
            pid,
            mappings,
            ("CRuby", &mut self.stats),
            is_ruby_name,
            inspect,
            || (),
        )?;
        let claimed = attachment(process);
        self.describe(pid);
        Some(claimed)
    }

    fn detach(&mut self, pid: u32) {
        if !self.processes.remove(pid) {
            return;
        }
        self.map.remove(pid);
        self.iseqs.forget_process(pid);
        remove_where(&mut self.methods, |k| k.0 == pid);
        remove_where(&mut self.method_of_iseq, |k| k.0 == pid);
        remove_where(&mut self.frames, |k| k.0 == pid);
    }

    fn observe(&mut self, pid: u32, words: &[u64]) {
        let found = invocations(words);
        self.learn_methods(pid, &found.groups);
        if found.not_described && self.processes.retry_due(pid) {
            self.describe(pid);
        }
        for frame in found.groups.into_iter().flatten() {
            if let FrameWords::Iseq { iseq, .. } = frame {
                self.iseq(pid, iseq, true);
            }
            self.frame(pid, frame);
        }
    }

    fn frames(&mut self, pid: u32, words: &[u64]) -> Vec<Vec<Arc<Frame>>> {
        let groups = invocations(words).groups;
        self.learn_methods(pid, &groups);
        groups
            .into_iter()
            .map(|group| {
                self.stats.frames += group.len() as u64;
                group
                    .into_iter()
                    .map(|frame| self.frame(pid, frame))
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
    fn invocations_end_at_entry_frames_and_carry_methods() {
        let iseq = |n| TAGS.word(word::ISEQ, n);
        let entry = |n| TAGS.word(word::ENTRY_ISEQ, n);
        let pc = |n| TAGS.word(word::PC, n);
        let me = |n| TAGS.word(word::METHOD, n);
        let cfunc = |n| TAGS.word(word::CFUNC, n);
        // leaf (method), block in mid (entry), Integer#times, mid, <main> (entry).
        let words = [
            iseq(0x100),
            pc(1),
            me(0x900),
            entry(0x200),
            pc(2),
            cfunc(0x910),
            iseq(0x300),
            pc(3),
            me(0x920),
            entry(0x400),
            pc(4),
        ];
        let found = invocations(&words);
        assert!(!found.not_described);
        assert_eq!(
            found.groups,
            vec![
                vec![
                    FrameWords::Iseq {
                        iseq: 0x100,
                        pc: 1,
                        method: 0x900
                    },
                    FrameWords::Iseq {
                        iseq: 0x200,
                        pc: 2,
                        method: 0
                    },
                ],
                vec![
                    FrameWords::Cfunc { method: 0x910 },
                    FrameWords::Iseq {
                        iseq: 0x300,
                        pc: 3,
                        method: 0x920
                    },
                    FrameWords::Iseq {
                        iseq: 0x400,
                        pc: 4,
                        method: 0
                    },
                ],
            ]
        );
        // A cut walk keeps its last group; junk ends the parse.
        let found = invocations(&[cfunc(0x910), iseq(0x100), 0x7fff_0000, entry(0x200)]);
        assert_eq!(
            found.groups,
            vec![vec![
                FrameWords::Cfunc { method: 0x910 },
                FrameWords::Iseq {
                    iseq: 0x100,
                    pc: 0,
                    method: 0
                }
            ]]
        );
        let found = invocations(&[TAGS.word(word::NOT_DESCRIBED, 0)]);
        assert!(found.not_described && found.groups.is_empty());
    }
}
