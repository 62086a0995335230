//! The Perl plugin: describes each Perl process to BPF, and turns its words
//! into frames (`Shop::total` at `shop.pl:12`, `main::__ANON__`, `(eval)`,
//! `main`), each run loop's frames in the place of its `Perl_runops_*` frame.

use std::{sync::Arc, time::Duration};

use icecore_otlp::model::{Frame, FrameKind, Line};
use icecore_unwinders::{
    Dispatch,
    perl::{CALLERS_STATEMENT, PerlProcess, TAGS, word},
    runtime::PAYLOAD_MASK,
};
use lru::LruCache;
use tracing::info;

use super::{
    detect::{PerlBinary, inspect, is_perl_name},
    objects::{PerlObjects, Statement, SubName},
};
use crate::{
    process_maps::ProcessMappings,
    runtimes::{
        Attachment, RuntimeCode, RuntimeDescriptor, RuntimePlugin, RuntimeStats,
        interpreters::{Interpreter, Interpreters},
        object_cache::{ObjectCache, lru},
        registry::PERL_RUNTIME,
        services::{ProcessMap, remove_where},
    },
    symbolize::Symbolizer,
};

/// Perl files inspected and remembered (per device and inode).
const BINARY_CACHE: usize = 64;
/// Subs and statements remembered, each, over all processes.
const OBJECT_CACHE: usize = 32_768;
/// Distinct frames (sub, statement) remembered, over all processes.
const FRAME_CACHE: usize = 65_536;
/// A sub or statement still sampled is read again after this long: an
/// anonymous sub's closures, a string `eval`'s code and a redefined sub
/// are freed, and their addresses may be taken by others.
const REREAD_AFTER: Duration = Duration::from_secs(1);

/// What a frame is, as BPF reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameWhat {
    /// A sub call: its CV.
    Sub(u64),
    /// An `eval`: its context's type byte.
    Eval(u8),
    /// The main program.
    Main,
}

/// One frame as BPF reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameWords {
    /// What it is.
    pub what: FrameWhat,
    /// The COP (statement) it is at; 0 for a sub just entered, at its
    /// first statement.
    pub cop: u64,
    /// The last frame of its run loop (a `MULTICALL` sub, or the last
    /// before an older stack info).
    pub ends_run: bool,
}

/// One sample's Perl words: its frames, newest first, and whether BPF said
/// the process is not described.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SampleWords {
    /// The frames.
    pub frames: Vec<FrameWords>,
    /// BPF had no entry for the process.
    pub not_described: bool,
}

/// Parses a run of Perl words.
pub fn parse(words: &[u64]) -> SampleWords {
    let mut out = SampleWords::default();
    let payload = |w: u64| w & PAYLOAD_MASK;
    let mut i = 0;
    while let Some(&w) = words.get(i) {
        let what = match TAGS.local_tag(w) {
            Some(word::SUB | word::MULTICALL_SUB) => FrameWhat::Sub(payload(w)),
            Some(word::EVAL) => FrameWhat::Eval(payload(w) as u8),
            Some(word::MAIN) => FrameWhat::Main,
            Some(word::STACK_SWITCH) => {
                if let Some(last) = out.frames.last_mut() {
                    last.ends_run = true;
                }
                i += 1;
                continue;
            }
            Some(word::NOT_DESCRIBED) => {
                out.not_described = true;
                i += 1;
                continue;
            }
            // Not a word this plugin reads here: the rest cannot be trusted.
            _ => break,
        };
        let Some(cop) = words
            .get(i + 1)
            .filter(|&&w| TAGS.local_tag(w) == Some(word::COP))
            .map(|&w| payload(w))
        else {
            break;
        };
        out.frames.push(FrameWords {
            what,
            cop,
            ends_run: TAGS.local_tag(w) == Some(word::MULTICALL_SUB),
        });
        i += 2;
    }
    // The newest frame at the statement its caller called it from: entered
    // and at no statement of its own yet, unless its caller is the same sub
    // (a recursive call at the very statement that made it).
    if let Some(newest) = out.frames.first().copied()
        && newest.cop & CALLERS_STATEMENT != 0
        && let FrameWhat::Sub(cv) = newest.what
    {
        let recursive = out
            .frames
            .get(1)
            .is_some_and(|older| older.what == FrameWhat::Sub(cv));
        if !recursive {
            out.frames[0].cop = 0;
        }
    }
    for frame in &mut out.frames {
        frame.cop &= !CALLERS_STATEMENT;
    }
    out
}

/// The code of a Perl process its program unwinds: the run loops.
fn attachment(process: &Interpreter<PerlBinary, ()>) -> Attachment {
    let code = process
        .binary
        .run_loops
        .iter()
        .map(|range| RuntimeCode {
            start: range.start.wrapping_add(process.bias),
            end: range.end.wrapping_add(process.bias),
            dispatch: Dispatch::Deferred,
        })
        .collect();
    Attachment {
        code,
        // An XS module without unwind information ends the native walk
        // early: the Perl frames below it are still walked.
        walk_after_early_end: Some(process.binary.early_end_threads()),
        names_anonymous_code: false,
    }
}

/// The Perl plugin.
pub struct PerlPlugin {
    map: Box<dyn ProcessMap<PerlProcess>>,
    processes: Interpreters<PerlBinary>,
    subs: ObjectCache<SubName>,
    statements: ObjectCache<Statement>,
    /// Each sub's first statement, by CV.
    starts: ObjectCache<Statement>,
    /// (pid, what, cop) → frame.
    frames: LruCache<(u32, FrameWhat, u64), Arc<Frame>>,
    stats: RuntimeStats,
}

impl PerlPlugin {
    /// A plugin writing its per-process data to `map`.
    pub fn new(map: Box<dyn ProcessMap<PerlProcess>>) -> Self {
        PerlPlugin {
            map,
            processes: Interpreters::new(BINARY_CACHE),
            subs: ObjectCache::new(OBJECT_CACHE, REREAD_AFTER),
            statements: ObjectCache::new(OBJECT_CACHE, REREAD_AFTER),
            starts: ObjectCache::new(OBJECT_CACHE, REREAD_AFTER),
            frames: lru(FRAME_CACHE),
            stats: RuntimeStats::default(),
        }
    }

    /// Tells BPF how `pid`'s threads find their interpreter.
    fn describe(&mut self, pid: u32) {
        let written = self
            .processes
            .describe(pid, &mut *self.map, &mut self.stats, |process| {
                let (binary, bias) = (process.binary.clone(), process.bias);
                let memory = process.memory.get()?;
                binary.bpf_process(bias, |a| memory.read_u64(a).ok())
            });
        if written && let Some(process) = self.processes.get(pid) {
            info!(pid, version = %process.binary.version, "Perl process");
        }
    }

    /// Runs `read` on the process's objects.
    fn objects<T>(&mut self, pid: u32, read: impl FnOnce(&PerlObjects<'_>) -> T) -> Option<T> {
        let process = self.processes.get_mut(pid)?;
        let binary = process.binary.clone();
        let memory = process.memory.get()?;
        Some(read(&PerlObjects {
            layout: &binary.layout,
            memory,
        }))
    }

    /// The sub at `cv`, read once and cached; `fresh` (at drain time, while
    /// the process runs) reads again an entry older than [`REREAD_AFTER`].
    fn sub(&mut self, pid: u32, cv: u64, fresh: bool) -> Option<Arc<SubName>> {
        if let Some(cached) = self.subs.cached(pid, cv, fresh) {
            return cached;
        }
        let read = self
            .objects(pid, |o| o.sub_name(cv).ok())
            .flatten()
            .map(Arc::new);
        if self.subs.store(pid, cv, read.clone()) {
            remove_where(&mut self.frames, |k| {
                k.0 == pid && k.1 == FrameWhat::Sub(cv)
            });
        }
        read.or_else(|| self.subs.cached(pid, cv, false).flatten())
    }

    /// The statement at `cop`, as [`Self::sub`] reads a sub.
    fn statement(&mut self, pid: u32, cop: u64, fresh: bool) -> Option<Arc<Statement>> {
        if let Some(cached) = self.statements.cached(pid, cop, fresh) {
            return cached;
        }
        let read = self
            .objects(pid, |o| o.statement(cop).ok())
            .flatten()
            .map(Arc::new);
        if self.statements.store(pid, cop, read.clone()) {
            remove_where(&mut self.frames, |k| k.0 == pid && k.2 == cop);
        }
        read.or_else(|| self.statements.cached(pid, cop, false).flatten())
    }

    /// The first statement of the sub at `cv`, as [`Self::sub`] reads a sub.
    fn first_statement(&mut self, pid: u32, cv: u64, fresh: bool) -> Option<Arc<Statement>> {
        if let Some(cached) = self.starts.cached(pid, cv, fresh) {
            return cached;
        }
        let read = self
            .objects(pid, |o| o.first_statement(cv).ok())
            .flatten()
            .map(Arc::new);
        if self.starts.store(pid, cv, read.clone()) {
            remove_where(&mut self.frames, |k| {
                k.0 == pid && k.1 == FrameWhat::Sub(cv)
            });
        }
        read.or_else(|| self.starts.cached(pid, cv, false).flatten())
    }

    /// The frame of `words`.
    fn frame(&mut self, pid: u32, words: FrameWords, fresh: bool) -> Arc<Frame> {
        let key = (pid, words.what, words.cop);
        let sub = match words.what {
            FrameWhat::Sub(cv) => Some(self.sub(pid, cv, fresh)),
            _ => None,
        };
        let statement = match (words.cop, words.what) {
            (0, FrameWhat::Sub(cv)) => self.first_statement(pid, cv, fresh),
            (cop, _) => self.statement(pid, cop, fresh),
        };
        if let Some(frame) = self.frames.get(&key) {
            return frame.clone();
        }
        let name: Arc<str> = match (words.what, sub) {
            (FrameWhat::Sub(_), Some(Some(sub))) => Arc::from(sub.name.as_str()),
            (FrameWhat::Sub(cv), _) => {
                self.stats.frame_errors += 1;
                return Symbolizer::unknown_frame(FrameKind::Perl, cv);
            }
            // As Perl's `caller` names them.
            (FrameWhat::Eval(_), _) => Arc::from("(eval)"),
            (FrameWhat::Main, _) => Arc::from("main"),
        };
        if statement.is_none() {
            self.stats.frame_errors += 1;
        }
        let frame = Arc::new(Frame {
            kind: FrameKind::Perl,
            address: 0,
            mapping: None,
            lines: vec![Line {
                function_name: name.clone(),
                system_name: name,
                filename: statement.as_ref().map(|s| Arc::from(s.file.as_str())),
                line: statement.map_or(0, |s| s.line),
                column: 0,
            }],
        });
        self.frames.put(key, frame.clone());
        frame
    }

    /// The frames of one sample's words, grouped by run loop.
    fn groups(&mut self, pid: u32, words: &[u64], fresh: bool) -> Vec<Vec<Arc<Frame>>> {
        let sample = parse(words);
        let mut groups = Vec::new();
        let mut current = Vec::new();
        for words in sample.frames {
            current.push(self.frame(pid, words, fresh));
            if words.ends_run {
                groups.push(std::mem::take(&mut current));
            }
        }
        if !current.is_empty() {
            groups.push(current);
        }
        groups
    }
}

impl RuntimePlugin for PerlPlugin {
    fn descriptor(&self) -> &'static RuntimeDescriptor {
        &PERL_RUNTIME
    }

    fn attach(&mut self, pid: u32, mappings: &ProcessMappings) -> Option<Attachment> {
        let process = self.processes.claim(
            pid,
            mappings,
            ("Perl", &mut self.stats),
            is_perl_name,
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
        self.subs.forget_process(pid);
        self.statements.forget_process(pid);
        self.starts.forget_process(pid);
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
    fn words_parse_into_frames_grouped_by_run_loop() {
        let w = |tag, payload| TAGS.word(tag, payload);
        let words = [
            w(word::MULTICALL_SUB, 0x100),
            w(word::COP, 0x10),
            w(word::SUB, 0x200),
            w(word::COP, 0x20),
            w(word::STACK_SWITCH, 0),
            w(word::EVAL, 0x4b),
            w(word::COP, 0x30),
            w(word::MAIN, 0),
            w(word::COP, 0x40),
        ];
        let parsed = parse(&words);
        let frame = |what, cop, ends_run| FrameWords {
            what,
            cop,
            ends_run,
        };
        assert_eq!(
            parsed.frames,
            [
                frame(FrameWhat::Sub(0x100), 0x10, true),
                frame(FrameWhat::Sub(0x200), 0x20, true),
                frame(FrameWhat::Eval(0x4b), 0x30, false),
                frame(FrameWhat::Main, 0x40, false),
            ]
        );
        // Junk, or a frame word without its COP, ends the parse.
        let parsed = parse(&[
            w(word::SUB, 1),
            w(word::COP, 2),
            0x7fff_0000,
            w(word::MAIN, 0),
        ]);
        assert_eq!(parsed.frames.len(), 1);
        assert!(parse(&[w(word::SUB, 1), w(word::SUB, 2)]).frames.is_empty());
        assert!(parse(&[w(word::NOT_DESCRIBED, 0)]).not_described);
        // The newest sub at its caller's statement: just entered, unless
        // its caller is itself.
        let flagged = |older_cv| {
            parse(&[
                w(word::SUB, 0x100),
                w(word::COP, 0x10 | CALLERS_STATEMENT),
                w(word::SUB, older_cv),
                w(word::COP, 0x10),
            ])
            .frames
            .iter()
            .map(|f| f.cop)
            .collect::<Vec<_>>()
        };
        assert_eq!(flagged(0x200), [0, 0x10]);
        assert_eq!(flagged(0x100), [0x10, 0x10]);
    }
}
