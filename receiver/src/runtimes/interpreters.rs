//! The processes of one interpreter runtime whose plugin describes them to
//! BPF (CRuby, PHP, Perl): which file of each process is the interpreter
//! and where it is loaded, its memory, and whether BPF has its entry yet.
//!
//! A process is described at its first `attach`; when that fails (a TLS
//! slot the dynamic loader has not filled yet, a thread-safe PHP whose
//! globals are not set up), BPF reports the process's samples as not
//! described, and the plugin tries again at most every [`DESCRIBE_RETRY`].

use std::{
    collections::{HashMap, hash_map::Entry},
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use tracing::debug;

use super::{
    RuntimeStats,
    memory::LazyMemory,
    services::{FileProbes, ProbeFailure, ProcessMap, RuntimeFile},
};
use crate::process_maps::ProcessMappings;

/// A process BPF could not be told of yet is tried again at most this often.
pub const DESCRIBE_RETRY: Duration = Duration::from_millis(200);

/// One process of the runtime.
pub struct Interpreter<B, X> {
    /// The interpreter's file, as probed.
    pub binary: Arc<B>,
    /// Its load bias in the process.
    pub bias: u64,
    /// The process's memory.
    pub memory: LazyMemory,
    /// What the plugin keeps beside (PHP: its JIT code).
    pub extra: X,
    /// Whether BPF has its entry.
    described: bool,
    /// When describing it was last tried.
    tried_at: Instant,
}

/// The processes of one runtime, by pid, and the runtime's files.
pub struct Interpreters<B, X = ()> {
    processes: HashMap<u32, Interpreter<B, X>>,
    binaries: FileProbes<B>,
}

impl<B: RuntimeFile, X> Interpreters<B, X> {
    /// No process yet; the probes of `binary_cache` files are remembered.
    pub fn new(binary_cache: usize) -> Self {
        Interpreters {
            processes: HashMap::new(),
            binaries: FileProbes::new(binary_cache),
        }
    }

    /// `pid`'s entry, probing its mappings the first time (see
    /// [`FileProbes::find_in`]: `who` names the runtime in warnings and
    /// counts refusals); `None` when the process does not run the runtime.
    pub fn claim<E: ProbeFailure>(
        &mut self,
        pid: u32,
        mappings: &ProcessMappings,
        who: (&str, &mut RuntimeStats),
        named: impl Fn(&str) -> bool,
        probe: impl Fn(&Path) -> Result<B, E>,
        extra: impl FnOnce() -> X,
    ) -> Option<&mut Interpreter<B, X>> {
        match self.processes.entry(pid) {
            Entry::Occupied(known) => Some(known.into_mut()),
            Entry::Vacant(new) => {
                let (binary, bias) = self.binaries.find_in(pid, mappings, who, named, probe)?;
                Some(
                    new.insert(Interpreter {
                        binary,
                        bias,
                        memory: LazyMemory::new(pid),
                        extra: extra(),
                        described: false,
                        // Due for a first try.
                        tried_at: Instant::now()
                            .checked_sub(DESCRIBE_RETRY)
                            .unwrap_or_else(Instant::now),
                    }),
                )
            }
        }
    }

    /// Writes `pid`'s entry into `map` with what `entry` makes of the
    /// process, unless BPF has it; `entry` returns `None` while the process
    /// cannot be described yet. True when the entry was written now.
    pub fn describe<P>(
        &mut self,
        pid: u32,
        map: &mut dyn ProcessMap<P>,
        stats: &mut RuntimeStats,
        entry: impl FnOnce(&mut Interpreter<B, X>) -> Option<P>,
    ) -> bool {
        let Some(process) = self.processes.get_mut(&pid) else {
            return false;
        };
        if process.described {
            return false;
        }
        process.tried_at = Instant::now();
        let Some(value) = entry(process) else {
            debug!(pid, "not describable to BPF yet");
            return false;
        };
        if let Err(e) = map.insert(pid, &value) {
            stats.attach_failures += 1;
            debug!(pid, "cannot describe a process to BPF: {e}");
            return false;
        }
        process.described = true;
        true
    }

    /// Whether `pid` is known, not described yet, and due for another try
    /// (BPF reported one of its samples as not described).
    pub fn retry_due(&self, pid: u32) -> bool {
        self.processes
            .get(&pid)
            .is_some_and(|p| !p.described && p.tried_at.elapsed() >= DESCRIBE_RETRY)
    }

    /// `pid`'s entry.
    pub fn get_mut(&mut self, pid: u32) -> Option<&mut Interpreter<B, X>> {
        self.processes.get_mut(&pid)
    }

    /// `pid`'s entry.
    pub fn get(&self, pid: u32) -> Option<&Interpreter<B, X>> {
        self.processes.get(&pid)
    }

    /// Forgets `pid`; false when it was not known.
    pub fn remove(&mut self, pid: u32) -> bool {
        self.processes.remove(&pid).is_some()
    }

    /// Processes known.
    pub fn len(&self) -> usize {
        self.processes.len()
    }

    /// Whether no process is known.
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
    }
}
