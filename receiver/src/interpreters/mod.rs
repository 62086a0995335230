//! Interpreter plugins: the user-space halves of the interpreter unwinders.
//!
//! # Adding a runtime
//!
//! The BPF half follows the convention in `icecore_unwinders::interpreter`
//! (a program slot, a pid-keyed map of its own, tagged words after the
//! native frames). The user-space half is an [`InterpreterPlugin`] in
//! `interpreters/<runtime>/`, registered in [`Interpreters::new`]:
//!
//! - [`attach`](InterpreterPlugin::attach) looks at a process's mappings
//!   (its executable and libraries), and when the runtime is there, writes
//!   the process's entry in the runtime's BPF map and returns the program
//!   slot, which the native unwinder then tail-calls for that process.
//!   Per-file work (parsing the ELF file, finding symbols, the version) is
//!   cached per file, as processes of one interpreter binary come and go.
//! - [`is_interpreter_loop`](InterpreterPlugin::is_interpreter_loop) names
//!   the native frames the interpreted frames replace (CPython's
//!   `_PyEval_EvalFrameDefault`).
//! - [`observe`](InterpreterPlugin::observe) reads what symbolizing a
//!   sample's words needs as soon as the sample arrives (code objects of a
//!   process that exits before its batch is cut can no longer be read).
//! - [`frames`](InterpreterPlugin::frames) turns one sample's tagged words
//!   into frames, one group per interpreter-loop invocation; [`splice`] puts
//!   each group in the place of its loop's native frame.
//! - [`detach`](InterpreterPlugin::detach) frees the BPF entry and every
//!   cache of a process that exited or exec'd.
//!
//! Per-version struct layouts are data (see `python/layouts.rs`), and every
//! failure is counted in [`InterpreterStats`] rather than logged per sample.

pub mod memory;
pub mod python;

use std::{collections::HashMap, sync::Arc};

use icecore_otlp::model::Frame;
use icecore_unwinders::ProgramIndex;

use crate::process_maps::ProcessMappings;

/// Counts of one plugin, for logs and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InterpreterStats {
    /// Processes described to BPF now.
    pub processes: usize,
    /// Processes whose interpreter was found but could not be described
    /// (unsupported version, missing symbols, failed map update).
    pub attach_failures: u64,
    /// Interpreter frames symbolized (cache hits included).
    pub frames: u64,
    /// Frames whose code object could not be read or made no sense.
    pub frame_errors: u64,
}

/// The user-space half of one interpreter unwinder.
pub trait InterpreterPlugin: Send {
    /// Short name for logs and metrics (`"cpython"`).
    fn name(&self) -> &'static str;
    /// Examines a process (first sample, new mappings); when it runs this
    /// interpreter, describes it to BPF and returns the program slot the
    /// native unwinder hands the sample to.
    fn attach(&mut self, pid: u32, mappings: &ProcessMappings) -> Option<ProgramIndex>;
    /// Frees everything held for `pid` (exit or exec); unknown pids are ignored.
    fn detach(&mut self, pid: u32);
    /// Reads now, while the process surely runs, what symbolizing `words`
    /// later will need: samples are symbolized when their batch is cut, by
    /// which time a short-lived process may be gone.
    fn observe(&mut self, pid: u32, words: &[u64]);
    /// Whether the native frame at `address` of `pid` is an invocation of the
    /// interpreter loop, to be replaced by that invocation's frames.
    fn is_interpreter_loop(&self, pid: u32, address: u64) -> bool;
    /// One sample's tagged words as frames: one group per interpreter-loop
    /// invocation, innermost group first, each group innermost frame first.
    fn frames(&mut self, pid: u32, words: &[u64]) -> Vec<Vec<Arc<Frame>>>;
    /// Current counts.
    fn stats(&self) -> InterpreterStats;
}

/// Every plugin, and which one owns each process.
pub struct Interpreters {
    plugins: Vec<Box<dyn InterpreterPlugin>>,
    owners: HashMap<u32, usize>,
}

impl Interpreters {
    /// The registry of the given plugins.
    pub fn new(plugins: Vec<Box<dyn InterpreterPlugin>>) -> Self {
        Interpreters {
            plugins,
            owners: HashMap::new(),
        }
    }

    /// Offers a process to each plugin; the first that recognizes it owns it.
    /// Returns the program slot to record in the process's mapping table.
    pub fn attach(&mut self, pid: u32, mappings: &ProcessMappings) -> Option<ProgramIndex> {
        if let Some(&owner) = self.owners.get(&pid) {
            // New mappings of a known process: the owner re-examines them.
            return self.plugins.get_mut(owner)?.attach(pid, mappings);
        }
        for (index, plugin) in self.plugins.iter_mut().enumerate() {
            if let Some(program) = plugin.attach(pid, mappings) {
                self.owners.insert(pid, index);
                return Some(program);
            }
        }
        None
    }

    /// Frees what the owning plugin holds for `pid`.
    pub fn detach(&mut self, pid: u32) {
        if let Some(owner) = self.owners.remove(&pid)
            && let Some(plugin) = self.plugins.get_mut(owner)
        {
            plugin.detach(pid);
        }
    }

    /// The plugin owning `pid`, if any.
    pub fn owner_of(&mut self, pid: u32) -> Option<&mut dyn InterpreterPlugin> {
        let owner = *self.owners.get(&pid)?;
        Some(self.plugins.get_mut(owner)?.as_mut())
    }

    /// Each plugin's name and counts.
    pub fn stats(&self) -> Vec<(&'static str, InterpreterStats)> {
        self.plugins.iter().map(|p| (p.name(), p.stats())).collect()
    }
}

/// Replaces the interpreter-loop frames among `native` (user frames, leaf
/// first, each with its address) by the groups of interpreter frames, in
/// order. Groups left over (the native walk ended early) go after the last
/// native frame, as its callers; loop frames left over stay native.
pub fn splice<F>(
    native: impl IntoIterator<Item = (u64, F)>,
    mut is_loop: impl FnMut(u64) -> bool,
    groups: Vec<Vec<Arc<Frame>>>,
) -> Vec<F>
where
    F: From<Arc<Frame>>,
{
    let mut groups = groups.into_iter();
    let mut out = Vec::new();
    for (address, frame) in native {
        if is_loop(address)
            && let Some(group) = groups.next()
        {
            out.extend(group.into_iter().map(F::from));
        } else {
            out.push(frame);
        }
    }
    out.extend(groups.flatten().map(F::from));
    out
}

#[cfg(test)]
mod tests {
    use icecore_otlp::model::FrameKind;

    use super::*;

    fn frame(address: u64) -> Arc<Frame> {
        Arc::new(Frame {
            kind: FrameKind::CPython,
            address,
            mapping: None,
            lines: Vec::new(),
        })
    }

    fn addresses(frames: &[Arc<Frame>]) -> Vec<u64> {
        frames.iter().map(|f| f.address).collect()
    }

    #[test]
    fn groups_replace_loop_frames_in_order() {
        // leaf (C extension), loop, native helper, loop, main
        let native: Vec<(u64, Arc<Frame>)> = [0x10, 0xe0, 0x20, 0xe1, 0x30]
            .into_iter()
            .map(|a| (a, frame(a)))
            .collect();
        let groups = vec![vec![frame(1), frame(2)], vec![frame(3)]];
        let out = splice(native, |a| a >= 0xe0, groups);
        assert_eq!(addresses(&out), [0x10, 1, 2, 0x20, 3, 0x30]);
    }

    #[test]
    fn leftovers_go_outermost_or_stay_native() {
        let native: Vec<(u64, Arc<Frame>)> =
            [0xe0, 0x10].into_iter().map(|a| (a, frame(a))).collect();
        let out = splice(
            native.clone(),
            |a| a >= 0xe0,
            vec![vec![frame(1)], vec![frame(2)]],
        );
        assert_eq!(addresses(&out), [1, 0x10, 2]);
        let out = splice(native, |a| a >= 0xe0, Vec::new());
        assert_eq!(addresses(&out), [0xe0, 0x10]);
    }
}
