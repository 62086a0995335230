//! One sample's user words as frames.
//!
//! BPF writes native frames' addresses and runtimes' tagged words in walk
//! order (see `icecore_unwinders::runtime`). A handover runtime's words sit
//! where its code was on the stack and become frames there; a deferred
//! runtime's words come after the native walk and replace, one invocation
//! each, the native frames of its code (an interpreter loop), innermost
//! first. Groups left over (the native walk ended early) go after the last
//! native frame, as its callers; loop frames left over stay native.

use std::sync::Arc;

use icecore_otlp::model::{Frame, FrameKind};
use icecore_unwinders::{Dispatch, runtime::tag_of};

use super::Runtimes;
use crate::symbolize::Symbolizer;

/// A maximal run of user words of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run<'a> {
    /// Native frames' addresses.
    Native(&'a [u64]),
    /// Words of the runtime owning `tag`'s range.
    Runtime {
        /// The first word's tag.
        tag: u8,
        /// The run.
        words: &'a [u64],
    },
}

/// Splits user words into runs of native addresses and of one runtime's words.
pub fn runs(words: &[u64]) -> impl Iterator<Item = Run<'_>> {
    let mut rest = words;
    std::iter::from_fn(move || {
        let first = *rest.first()?;
        let range = tag_of(first) & 0xf0;
        let tagged = tag_of(first) != 0;
        let len = rest
            .iter()
            .position(|&w| (tag_of(w) != 0) != tagged || (tagged && tag_of(w) & 0xf0 != range))
            .unwrap_or(rest.len());
        let (run, tail) = rest.split_at(len);
        rest = tail;
        Some(if tagged {
            Run::Runtime {
                tag: tag_of(first),
                words: run,
            }
        } else {
            Run::Native(run)
        })
    })
}

/// The frame standing for a run of runtime words no plugin claims.
fn unclaimed_frame(tag: u8, words: &[u64]) -> Arc<Frame> {
    let kind = super::RUNTIMES
        .iter()
        .find(|r| r.bpf.is_some_and(|b| b.tags.first == tag & 0xf0))
        .map_or(FrameKind::Native, |r| r.frame_kind);
    let first = words
        .first()
        .map_or(0, |w| w & icecore_unwinders::runtime::PAYLOAD_MASK);
    Symbolizer::unknown_frame(kind, first)
}

/// One piece of a user stack before deferred groups are spliced in.
enum Piece {
    /// A native frame and the address its code is looked up at.
    Native { pc: u64, frame: Arc<Frame> },
    /// Frames in place.
    Frames(Vec<Arc<Frame>>),
}

impl Runtimes {
    /// The frames of a sample's `user_words` for process `pid`, leaf first.
    /// `native` names a native frame (address, whether it is a return
    /// address) from the process's files, `None` when no file maps it.
    pub fn user_stack(
        &mut self,
        pid: u32,
        user_words: &[u64],
        mut native: impl FnMut(u64, bool) -> Option<Arc<Frame>>,
    ) -> Vec<Arc<Frame>> {
        let mut pieces = Vec::with_capacity(user_words.len());
        // Per deferred plugin, its groups in order.
        let mut deferred: Vec<(usize, std::vec::IntoIter<Vec<Arc<Frame>>>)> = Vec::new();
        let mut native_frames = 0usize;
        for run in runs(user_words) {
            match run {
                Run::Native(addresses) => {
                    for &address in addresses {
                        let is_return = native_frames > 0;
                        native_frames += 1;
                        let frame = native(address, is_return)
                            .or_else(|| self.jit_frame(pid, address))
                            .unwrap_or_else(|| {
                                Symbolizer::unknown_frame(FrameKind::Native, address)
                            });
                        let pc = address.saturating_sub(u64::from(is_return));
                        pieces.push(Piece::Native { pc, frame });
                    }
                }
                Run::Runtime { tag, words } => {
                    let Some(index) = self.plugin_of_tag(pid, tag) else {
                        // A process whose runtime was detached meanwhile:
                        // one unnamed frame of that runtime keeps the
                        // sample's place (a stack of nothing is no stack).
                        pieces.push(Piece::Frames(vec![unclaimed_frame(tag, words)]));
                        continue;
                    };
                    let groups = self.plugins[index].frames(pid, words);
                    if self.is_deferred(pid, index) {
                        deferred.push((index, groups.into_iter()));
                    } else {
                        pieces.push(Piece::Frames(groups.into_iter().flatten().collect()));
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(pieces.len());
        for piece in pieces {
            match piece {
                Piece::Native { pc, frame } => {
                    let group = deferred.iter_mut().find_map(|(index, groups)| {
                        self.claims(pid, *index, pc, Dispatch::Deferred)
                            .then(|| groups.next())
                            .flatten()
                    });
                    match group {
                        Some(group) => out.extend(group),
                        None => out.push(frame),
                    }
                }
                Piece::Frames(frames) => out.extend(frames),
            }
        }
        for (_, groups) in deferred {
            out.extend(groups.flatten());
        }
        out
    }

    /// Whether plugin `index`'s code in `pid` is dispatched as deferred.
    fn is_deferred(&self, pid: u32, index: usize) -> bool {
        self.attachment(pid, index)
            .is_some_and(|a| a.code.iter().any(|c| c.dispatch == Dispatch::Deferred))
    }

    fn claims(&self, pid: u32, index: usize, pc: u64, dispatch: Dispatch) -> bool {
        self.attachment(pid, index)
            .is_some_and(|a| a.dispatches(pc, dispatch))
    }

    fn attachment(&self, pid: u32, index: usize) -> Option<&super::Attachment> {
        self.processes
            .get(&pid)?
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, a)| a)
    }

    /// The frame a plugin names for `address` of `pid`'s anonymous code.
    fn jit_frame(&mut self, pid: u32, address: u64) -> Option<Arc<Frame>> {
        let claimed = self.processes.get(&pid)?;
        let namers: Vec<usize> = claimed
            .iter()
            .filter(|(_, a)| a.names_anonymous_code)
            .map(|(i, _)| *i)
            .collect();
        namers
            .into_iter()
            .find_map(|index| self.plugins[index].jit_frame(pid, address))
    }
}

#[cfg(test)]
mod tests {
    use icecore_otlp::model::Line;
    use icecore_unwinders::python::CPYTHON;

    use super::*;
    use crate::runtimes::{
        Attachment, RuntimeCode, RuntimeDescriptor, RuntimePlugin, RuntimeStats,
        registry::CPYTHON_RUNTIME,
    };

    /// A deferred runtime whose loop is 0xe0..0xf0: each word is one group
    /// of one frame named after its payload.
    struct Loops;

    impl RuntimePlugin for Loops {
        fn descriptor(&self) -> &'static RuntimeDescriptor {
            &CPYTHON_RUNTIME
        }
        fn attach(
            &mut self,
            _: u32,
            _: &crate::process_maps::ProcessMappings,
        ) -> Option<Attachment> {
            Some(Attachment {
                code: vec![RuntimeCode {
                    start: 0xe0,
                    end: 0xf0,
                    dispatch: Dispatch::Deferred,
                }],
                walk_after_early_end: Some(icecore_unwinders::native::EarlyEndThreads::Every),
                names_anonymous_code: false,
            })
        }
        fn detach(&mut self, _: u32) {}
        fn frames(&mut self, _: u32, words: &[u64]) -> Vec<Vec<Arc<Frame>>> {
            words.iter().map(|w| vec![named(w & 0xff)]).collect()
        }
        fn stats(&self) -> RuntimeStats {
            RuntimeStats::default()
        }
    }

    fn named(n: u64) -> Arc<Frame> {
        Arc::new(Frame {
            kind: FrameKind::CPython,
            address: 0,
            mapping: None,
            lines: vec![Line {
                function_name: Arc::from(format!("py{n}")),
                system_name: Arc::from(""),
                filename: None,
                line: 0,
                column: 0,
            }],
        })
    }

    fn names(frames: &[Arc<Frame>]) -> Vec<String> {
        frames
            .iter()
            .map(|f| match f.lines.first() {
                Some(l) => l.function_name.to_string(),
                None => format!("{:#x}", f.address),
            })
            .collect()
    }

    fn runtimes() -> Runtimes {
        let mut r = Runtimes::new(vec![Box::new(Loops)]);
        r.attach(1, &crate::process_maps::ProcessMappings::default());
        r
    }

    fn native(address: u64, _: bool) -> Option<Arc<Frame>> {
        Some(Symbolizer::unknown_frame(FrameKind::Native, address))
    }

    #[test]
    fn deferred_groups_replace_loop_frames_in_order() {
        let w = |n| CPYTHON.tags.word(0, n);
        // leaf (C extension), loop, native helper, loop, main; then 2 groups.
        let words = [0x10, 0xe1, 0x20, 0xe1, 0x30, w(1), w(2)];
        let out = runtimes().user_stack(1, &words, native);
        assert_eq!(names(&out), ["0x10", "py1", "0x20", "py2", "0x30"]);
    }

    #[test]
    fn leftovers_go_outermost_or_stay_native() {
        let w = |n| CPYTHON.tags.word(0, n);
        let mut r = runtimes();
        let out = r.user_stack(1, &[0xe1, 0x10, w(1), w(2)], native);
        assert_eq!(names(&out), ["py1", "0x10", "py2"]);
        let out = r.user_stack(1, &[0xe1, 0x10], native);
        assert_eq!(names(&out), ["0xe1", "0x10"]);
        // Words of a runtime the process does not have (any more) keep
        // their place as one unnamed frame of that runtime.
        let out = r.user_stack(2, &[0x10, w(1), w(2)], native);
        assert_eq!(names(&out), ["0x10", "0x1"]);
        assert_eq!(out[1].kind, FrameKind::CPython);
    }

    #[test]
    fn runs_split_by_runtime() {
        let a = CPYTHON.tags.word(0, 1);
        let b = icecore_unwinders::runtime::TagRange { first: 0x20 }.word(0, 1);
        let words = [1, 2, a, a, b, 3];
        let kinds: Vec<(bool, usize)> = runs(&words)
            .map(|r| match r {
                Run::Native(w) => (false, w.len()),
                Run::Runtime { words, .. } => (true, words.len()),
            })
            .collect();
        assert_eq!(kinds, [(false, 2), (true, 2), (true, 1), (false, 1)]);
        assert_eq!(runs(&[]).count(), 0);
    }
}
