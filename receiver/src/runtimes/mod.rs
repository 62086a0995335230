//! Runtime plugins: the user-space halves of the runtime unwinders, and the
//! framework they share. How to add a runtime: `README.md` in this folder.
//!
//! - [`registry`]: one [`RuntimeDescriptor`] per runtime (name, config
//!   switch, frame type, BPF half) and the plugin each one builds.
//! - [`services`]: opening mapped files, per-file probe caches, per-process
//!   BPF maps; [`object_cache`]: runtime objects read from processes;
//!   [`memory`]: reading them.
//! - [`stack`]: one sample's user words (native addresses and runtimes'
//!   tagged words) turned into frames.
//! - [`python`]: CPython 3.8–3.15; [`ruby`]: CRuby 3.1–3.4; [`hotspot`]:
//!   OpenJDK 8–27; [`v8`]: Node.js 18–24; [`php`]: PHP 8.0–8.5; [`perl`]:
//!   Perl 5.36–5.44; [`perf_map`]:
//!   JIT code named from perf maps and jitdump files (Node.js, .NET,
//!   Erlang, Julia, …).
//!
//! Per-version struct layouts are data (see `python/layouts.rs`), and every
//! failure is counted in [`RuntimeStats`] rather than logged per sample.

#[cfg(test)]
pub(crate) mod dwarf_layout;
#[cfg(test)]
pub(crate) mod host_walk;
pub mod hotspot;
pub mod interpreters;
pub mod memory;
pub mod object_cache;
pub mod perf_map;
pub mod perl;
pub mod php;
pub mod python;
pub mod registry;
pub mod ruby;
pub mod services;
pub mod stack;
pub mod v8;

use std::{collections::HashMap, sync::Arc};

use icecore_otlp::model::Frame;
use icecore_unwinders::{Dispatch, native::EarlyEndThreads, runtime::tag_of};

pub use self::registry::{RUNTIMES, RuntimeDescriptor};
use crate::process_maps::ProcessMappings;

/// Counts of one plugin, for logs and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    /// Processes described now.
    pub processes: usize,
    /// Processes whose runtime was found but could not be described
    /// (unsupported version, missing symbols, failed map update).
    pub attach_failures: u64,
    /// Runtime frames symbolized (cache hits included).
    pub frames: u64,
    /// Frames whose runtime data could not be read or made no sense.
    pub frame_errors: u64,
}

/// Code of a process that a runtime's program unwinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeCode {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// How the native unwinder hands frames in it to the runtime.
    pub dispatch: Dispatch,
}

/// What a plugin claims of a process it recognized.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attachment {
    /// Address ranges the runtime's BPF program unwinds.
    pub code: Vec<RuntimeCode>,
    /// For which threads the runtime's program also runs when the native
    /// walk ends before reaching its code (an interpreter whose frames are
    /// found from its own state); `None` for no thread.
    pub walk_after_early_end: Option<EarlyEndThreads>,
    /// Whether the plugin names code in anonymous executable mappings
    /// ([`RuntimePlugin::jit_frame`]).
    pub names_anonymous_code: bool,
}

impl Attachment {
    /// Whether `address` is in code dispatched as `dispatch`.
    pub fn dispatches(&self, address: u64, dispatch: Dispatch) -> bool {
        self.code
            .iter()
            .any(|c| c.dispatch == dispatch && c.start <= address && address < c.end)
    }
}

/// The user-space half of one runtime. Only [`descriptor`](Self::descriptor),
/// [`attach`](Self::attach), [`detach`](Self::detach) and
/// [`stats`](Self::stats) are required; the rest have defaults for runtimes
/// that do not need them.
pub trait RuntimePlugin: Send {
    /// The runtime's descriptor.
    fn descriptor(&self) -> &'static RuntimeDescriptor;
    /// Examines a process (first sample, new mappings); when it runs this
    /// runtime, describes it to BPF and says which code is the runtime's.
    /// Called again for a process it attached, with its current mappings.
    fn attach(&mut self, pid: u32, mappings: &ProcessMappings) -> Option<Attachment>;
    /// Frees everything held for `pid` (exit or exec); unknown pids are ignored.
    fn detach(&mut self, pid: u32);
    /// Reads now, while the process surely runs, what symbolizing `words`
    /// (a run of this runtime's words) later will need: samples are
    /// symbolized when their batch is cut, by which time a short-lived
    /// process may be gone.
    fn observe(&mut self, _pid: u32, _words: &[u64]) {}
    /// A run of this runtime's words as frames: one group per invocation of
    /// its code (a deferred runtime's groups replace its loop frames one by
    /// one), innermost group first, each group innermost frame first.
    fn frames(&mut self, _pid: u32, _words: &[u64]) -> Vec<Vec<Arc<Frame>>> {
        Vec::new()
    }
    /// Processes this plugin claimed but could not describe yet (a JVM
    /// whose code cache does not exist yet), due for another
    /// [`attach`](Self::attach): the profiler calls it again with each one's
    /// mappings and describes the process to BPF anew.
    fn due_for_attach(&mut self) -> Vec<u32> {
        Vec::new()
    }
    /// The frame of `address`, in an anonymous executable mapping of `pid`.
    fn jit_frame(&mut self, _pid: u32, _address: u64) -> Option<Arc<Frame>> {
        None
    }
    /// Current counts.
    fn stats(&self) -> RuntimeStats;
}

/// What the native unwinder's table says of a process's runtimes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessRuntimes {
    /// Code each runtime's program unwinds, with its program slot.
    pub code: Vec<(RuntimeCode, u8)>,
    /// The program to run when the native walk ends early; 0 for none.
    pub deferred_program: u32,
    /// The threads it runs for.
    pub deferred_threads: EarlyEndThreads,
}

/// Every enabled plugin, and which ones claimed each process.
pub struct Runtimes {
    plugins: Vec<Box<dyn RuntimePlugin>>,
    processes: HashMap<u32, Vec<(usize, Attachment)>>,
}

impl Runtimes {
    /// The registry of the given plugins.
    pub fn new(plugins: Vec<Box<dyn RuntimePlugin>>) -> Self {
        Runtimes {
            plugins,
            processes: HashMap::new(),
        }
    }

    /// Offers a process to every plugin; each that recognizes it keeps it.
    /// Returns what the native unwinder's table needs.
    pub fn attach(&mut self, pid: u32, mappings: &ProcessMappings) -> ProcessRuntimes {
        let mut claimed = Vec::new();
        for (index, plugin) in self.plugins.iter_mut().enumerate() {
            if let Some(attachment) = plugin.attach(pid, mappings) {
                claimed.push((index, attachment));
            }
        }
        let mut out = ProcessRuntimes::default();
        for (index, attachment) in &claimed {
            let Some(bpf) = self.plugins[*index].descriptor().bpf else {
                continue;
            };
            let program = bpf.program as u8;
            out.code
                .extend(attachment.code.iter().map(|&code| (code, program)));
            if let Some(threads) = attachment.walk_after_early_end
                && out.deferred_program == 0
            {
                out.deferred_program = u32::from(program);
                out.deferred_threads = threads;
            }
        }
        if claimed.is_empty() {
            self.processes.remove(&pid);
        } else {
            self.processes.insert(pid, claimed);
        }
        out
    }

    /// Frees what every plugin holds for `pid`.
    pub fn detach(&mut self, pid: u32) {
        if let Some(claimed) = self.processes.remove(&pid) {
            for (index, _) in claimed {
                if let Some(plugin) = self.plugins.get_mut(index) {
                    plugin.detach(pid);
                }
            }
        }
    }

    /// Processes some plugin wants attached again (see
    /// [`RuntimePlugin::due_for_attach`]).
    pub fn due_for_attach(&mut self) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .plugins
            .iter_mut()
            .flat_map(|p| p.due_for_attach())
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Hands each run of runtime words among a sample's `user_words` to its
    /// plugin's [`RuntimePlugin::observe`].
    pub fn observe(&mut self, pid: u32, user_words: &[u64]) {
        for run in stack::runs(user_words) {
            if let stack::Run::Runtime { tag, words } = run
                && let Some(index) = self.plugin_of_tag(pid, tag)
            {
                self.plugins[index].observe(pid, words);
            }
        }
    }

    /// The plugin that claimed `pid` and owns words tagged `tag`.
    fn plugin_of_tag(&self, pid: u32, tag: u8) -> Option<usize> {
        self.processes.get(&pid)?.iter().find_map(|(index, _)| {
            let bpf = self.plugins[*index].descriptor().bpf?;
            (tag & 0xf0 == bpf.tags.first).then_some(*index)
        })
    }

    /// Whether any plugin claimed `pid`.
    pub fn has_process(&self, pid: u32) -> bool {
        self.processes.contains_key(&pid)
    }

    /// Each plugin's name and counts.
    pub fn stats(&self) -> Vec<(&'static str, RuntimeStats)> {
        self.plugins
            .iter()
            .map(|p| (p.descriptor().name, p.stats()))
            .collect()
    }

    /// Names of the enabled plugins.
    pub fn names(&self) -> Vec<&'static str> {
        self.plugins.iter().map(|p| p.descriptor().name).collect()
    }
}

/// Whether a sample's user words hold any runtime word.
pub fn has_runtime_words(words: &[u64]) -> bool {
    words.iter().any(|&w| tag_of(w) != 0)
}
