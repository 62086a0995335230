//! The perf-map plugin: JIT code without a dedicated unwinder, walked by
//! the native unwinder with frame pointers, named from the symbol files the
//! runtime writes for `perf`: `/tmp/perf-PID.map` (in the process's own
//! mount namespace, named with its own PID) and a mapped `jit-PID.dump`.
//!
//! Both grow while the runtime compiles; they are read incrementally, when
//! a process is first seen, when its mappings change, and when a sampled
//! address in its JIT code is not named yet (at most once a second). The
//! frames' type is the runtime's, told from the files the process maps
//! (`libcoreclr.so`: .NET, `node`: V8, `libjvm.so`: JVM).

use std::{
    collections::HashMap,
    num::NonZeroUsize,
    sync::Arc,
    time::{Duration, Instant},
};

use icecore_otlp::model::{Frame, FrameKind, Line};
use lru::LruCache;
use tracing::debug;

use super::{
    jitdump::{JitDumpFile, SymbolAt},
    names::clean,
    parse::PerfMapFile,
};
use crate::{
    process_maps::ProcessMappings,
    runtimes::{
        Attachment, RuntimeDescriptor, RuntimePlugin, RuntimeStats,
        registry::PERF_MAP_RUNTIME,
        services::{path_in_process, remove_where},
    },
};

/// Symbols kept per process at most; a runtime that compiles without end
/// (code generated per request) has its later symbols dropped and counted.
const MAX_SYMBOLS_PER_PROCESS: usize = 1 << 20;
/// A symbol file is read again for an unnamed address at most this often.
const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// Frames remembered, over all processes.
const FRAME_CACHE: usize = 65_536;

/// One process with JIT code.
struct JitProcess {
    /// The runtime whose code the symbols name.
    kind: FrameKind,
    /// `/tmp/perf-NSPID.map` as the process sees it.
    perf_map: PerfMapFile,
    /// The mapped `jit-NSPID.dump`, if any.
    jitdump: Option<JitDumpFile>,
    /// When the files were last read.
    read_at: Option<Instant>,
}

impl JitProcess {
    /// Reads what the runtime appended since the last read.
    fn refresh(&mut self, pid: u32) {
        self.read_at = Some(Instant::now());
        match self.perf_map.refresh() {
            Ok(read) if read.malformed > 0 => {
                debug!(pid, malformed = read.malformed, "perf map lines skipped");
            }
            Ok(_) => {}
            // Most JIT processes write no perf map: not worth a log line.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => debug!(pid, "perf map: {e}"),
        }
        if let Some(jitdump) = &mut self.jitdump
            && let Err(e) = jitdump.refresh()
        {
            debug!(pid, "jitdump: {e}");
        }
    }

    fn due(&self) -> bool {
        self.read_at.is_none_or(|at| at.elapsed() >= REFRESH_EVERY)
    }

    /// The symbol covering `address`, the jitdump's first (it has lines).
    fn lookup(&self, address: u64) -> Option<SymbolAt<'_>> {
        if let Some(jitdump) = &self.jitdump
            && let Some(found) = jitdump.lookup(address)
        {
            return Some(found);
        }
        self.perf_map.lookup(address).map(|symbol| (symbol, None))
    }
}

/// The perf-map plugin.
pub struct PerfMapPlugin {
    processes: HashMap<u32, JitProcess>,
    /// (pid, symbol start, symbol name pointer) → frame.
    frames: LruCache<(u32, u64, usize), Arc<Frame>>,
    stats: RuntimeStats,
}

impl Default for PerfMapPlugin {
    fn default() -> Self {
        Self::new()
    }
}

impl PerfMapPlugin {
    /// A plugin with no process yet.
    pub fn new() -> Self {
        PerfMapPlugin {
            processes: HashMap::new(),
            frames: LruCache::new(NonZeroUsize::new(FRAME_CACHE).unwrap_or(NonZeroUsize::MIN)),
            stats: RuntimeStats::default(),
        }
    }
}

/// The runtime that JIT-compiles in a process, from the files it maps.
pub fn jit_runtime(mappings: &ProcessMappings) -> FrameKind {
    for mapping in mappings.executable() {
        let name = mapping.path.rsplit('/').next().unwrap_or("");
        if name.starts_with("libcoreclr.so") || name.starts_with("libclrjit.so") {
            return FrameKind::DotNet;
        }
        if name == "node" || name.starts_with("libnode.so") || name == "nodejs" {
            return FrameKind::V8Js;
        }
        if name == "libjvm.so" {
            return FrameKind::Jvm;
        }
    }
    FrameKind::Native
}

/// The process's PID in its own PID namespace (the one its runtime writes
/// in file names): the last `NSpid` of `/proc/PID/status`.
fn namespace_pid(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
            line.split_whitespace().last()?.parse().ok()
        })
        .unwrap_or(pid)
}

impl RuntimePlugin for PerfMapPlugin {
    fn descriptor(&self) -> &'static RuntimeDescriptor {
        &PERF_MAP_RUNTIME
    }

    fn attach(&mut self, pid: u32, mappings: &ProcessMappings) -> Option<Attachment> {
        let jitdump_path = |ns_pid: u32| {
            let wanted = format!("jit-{ns_pid}.dump");
            mappings
                .mappings()
                .iter()
                .find(|m| m.path.rsplit('/').next() == Some(wanted.as_str()))
                .map(|m| path_in_process(pid, &m.path))
        };
        let process = match self.processes.entry(pid) {
            std::collections::hash_map::Entry::Occupied(known) => known.into_mut(),
            std::collections::hash_map::Entry::Vacant(new) => {
                let ns_pid = namespace_pid(pid);
                let jitdump = jitdump_path(ns_pid);
                if mappings.anonymous_code().is_empty() && jitdump.is_none() {
                    return None;
                }
                let perf_map = path_in_process(pid, &format!("/tmp/perf-{ns_pid}.map"));
                new.insert(JitProcess {
                    kind: jit_runtime(mappings),
                    perf_map: PerfMapFile::new(perf_map, MAX_SYMBOLS_PER_PROCESS),
                    jitdump: jitdump.map(|path| JitDumpFile::new(path, MAX_SYMBOLS_PER_PROCESS)),
                    read_at: None,
                })
            }
        };
        if process.jitdump.is_none()
            && let Some(path) = jitdump_path(namespace_pid(pid))
        {
            process.jitdump = Some(JitDumpFile::new(path, MAX_SYMBOLS_PER_PROCESS));
        }
        // New mappings: the runtime compiled more, read what it wrote.
        process.refresh(pid);
        Some(Attachment {
            code: Vec::new(),
            walk_after_early_end: None,
            names_anonymous_code: true,
        })
    }

    fn detach(&mut self, pid: u32) {
        if self.processes.remove(&pid).is_none() {
            return;
        }
        remove_where(&mut self.frames, |k| k.0 == pid);
    }

    fn jit_frame(&mut self, pid: u32, address: u64) -> Option<Arc<Frame>> {
        let process = self.processes.get_mut(&pid)?;
        if process.lookup(address).is_none() && process.due() {
            process.refresh(pid);
        }
        let kind = process.kind;
        let Some((symbol, line)) = process.lookup(address) else {
            self.stats.frame_errors += 1;
            return None;
        };
        self.stats.frames += 1;
        let key = (
            pid,
            symbol.start,
            Arc::as_ptr(&symbol.name).cast::<u8>() as usize,
        );
        if line.is_none()
            && let Some(frame) = self.frames.get(&key)
        {
            return Some(frame.clone());
        }
        let cleaned = clean(&symbol.name);
        let (filename, line) = match line {
            Some((file, line)) => (Some(file), line),
            None => (cleaned.file.map(Arc::from), cleaned.line),
        };
        let frame = Arc::new(Frame {
            kind,
            address: 0,
            mapping: None,
            lines: vec![Line {
                function_name: Arc::from(cleaned.function.as_ref()),
                system_name: symbol.name.clone(),
                filename,
                line,
                column: 0,
            }],
        });
        self.frames.put(key, frame.clone());
        Some(frame)
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
    fn the_runtime_is_told_from_its_files() {
        let maps = |path: &str| {
            ProcessMappings::parse(&format!(
                "7f0000000000-7f0000001000 r-xp 00000000 fd:01 1 {path}\n"
            ))
            .unwrap()
        };
        let kind = |path| jit_runtime(&maps(path));
        assert_eq!(
            kind("/usr/share/dotnet/shared/Microsoft.NETCore.App/3.1.0/libcoreclr.so"),
            FrameKind::DotNet
        );
        assert_eq!(kind("/usr/bin/node"), FrameKind::V8Js);
        assert_eq!(
            kind("/usr/lib/jvm/java-17/lib/server/libjvm.so"),
            FrameKind::Jvm
        );
        assert_eq!(
            kind("/usr/lib/erlang/erts-14/bin/beam.smp"),
            FrameKind::Native
        );
    }

    #[test]
    fn our_own_namespace_pid_is_our_pid() {
        assert_eq!(namespace_pid(std::process::id()), std::process::id());
        assert_eq!(
            namespace_pid(u32::MAX),
            u32::MAX,
            "a gone process keeps its pid"
        );
    }

    #[test]
    fn a_process_without_jit_code_is_not_claimed() {
        let maps = ProcessMappings::read(std::process::id()).unwrap();
        let mut plugin = PerfMapPlugin::new();
        // The test binary has no anonymous executable memory.
        if maps.anonymous_code().is_empty() {
            assert!(plugin.attach(std::process::id(), &maps).is_none());
        }
    }
}
