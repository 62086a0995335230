//! The symbolizer's per-file work: parsing files into the file cache, loading
//! their debug information within its bounds, and turning look-ups into lines.

use std::sync::Arc;
use std::time::Instant;

use icecore_otlp::model::Line;

use super::debug::{self, DebugInfo, RawFrame};
use super::elf::{ElfError, ElfSymbols};
use super::{CachedFile, DebugEntry, DebugState, FileKey, LoadedFile, Symbolizer, make_line, vdso};
use crate::exec_watch::HeldFile;
use crate::process_maps::{MappedFile, ProcessMappings};

impl Symbolizer {
    /// The lines of the code at `file_offset` of the mapping's file, its build
    /// ID, and whether the file was out of reach (so the result may change).
    pub(super) fn file_lines(
        &mut self,
        pid: u32,
        mapping: &MappedFile,
        file_offset: u64,
    ) -> (Vec<Line>, Option<Arc<str>>, bool) {
        let (key, transient) = self.load_file(pid, mapping);
        let Some(key) = key else {
            return (Vec::new(), None, transient);
        };
        self.load_debug(pid, mapping, &key);
        let Some(CachedFile::Loaded(file)) = self.files.peek(&key) else {
            return (Vec::new(), None, false);
        };
        let symbols = Arc::clone(&file.symbols);
        let debug_symbols = file.debug_symbols.clone();
        let build_id = symbols.build_id().cloned();
        // Debug information out of reach for now: do not cache the poorer frame.
        let transient = matches!(file.debug, DebugState::Retry(_));
        let Some(vaddr) = symbols.file_offset_to_vaddr(file_offset) else {
            return (Vec::new(), build_id, false);
        };
        let found = match &file.debug {
            DebugState::Loaded(info) => {
                let info = &**info;
                Some(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                    || info.frames(vaddr),
                )))
            }
            _ => None,
        };
        let (frames, fallback) = match found {
            Some(Ok(Ok(found))) => {
                if let Some(entry) = self.debug_files.get_mut(&key) {
                    entry.last_used = Instant::now();
                }
                found
            }
            Some(Ok(Err(error))) => {
                self.stats.debug_lookup_failures += 1;
                tracing::debug!(path = %mapping.path, vaddr, %error, "DWARF look-up failed");
                Default::default()
            }
            Some(Err(_panic)) => {
                // A parser bug on hostile input: never trust this file's data again.
                self.stats.debug_lookup_failures += 1;
                self.set_debug(&key, DebugState::Absent);
                Default::default()
            }
            None => Default::default(),
        };
        // The debug file's table is the complete one (local functions too).
        // A name is read (inflated, for big files) only when the function's
        // line is not cached.
        let function = debug_symbols
            .as_deref()
            .and_then(|table| table.function_at(vaddr).map(|f| (table, f)))
            .or_else(|| symbols.function_at(vaddr).map(|f| (&*symbols, f)));
        let lines = if frames.is_empty() {
            match function {
                Some((table, (index, address))) => {
                    vec![
                        self.function_line_with(mapping.dev, mapping.inode, address, || {
                            table.name_at(index)
                        }),
                    ]
                }
                None => Vec::new(),
            }
        } else {
            // Go's own names (pclntab, DWARF) are canonical; its symbol table
            // adds ABI suffixes (`runtime.goexit.abi0`).
            let outer = if symbols.debug_hints().gopclntab.is_some() {
                None
            } else {
                function
                    .map(|(table, (index, _))| table.name_at(index).into_owned())
                    .or(fallback)
            };
            self.debug_lines(frames, outer)
        };
        (lines, build_id, transient)
    }

    /// Lines from debug frames. As `perf report` does, the outermost (not
    /// inlined) function is named by the symbol table when it knows the address
    /// (`outer`): DWARF may name an internal alias (`__GI___libc_malloc`). A
    /// nameless outermost frame takes `outer` too.
    fn debug_lines(&mut self, frames: Vec<RawFrame>, outer: Option<String>) -> Vec<Line> {
        let last = frames.len().saturating_sub(1);
        let mut lines = Vec::with_capacity(frames.len());
        let mut outer = outer;
        for (index, frame) in frames.into_iter().enumerate() {
            let name = match (frame.name, index == last) {
                (name, true) => outer.take().or(name).unwrap_or_else(|| "??".to_owned()),
                (Some(name), false) => name,
                (None, false) => "??".to_owned(),
            };
            let mut line = match self.names.get(name.as_str()) {
                Some(line) => line.clone(),
                None => {
                    let line = make_line(&name);
                    self.names.put(name.into_boxed_str(), line.clone());
                    line
                }
            };
            line.filename = frame.file.map(|file| self.source_file(file));
            line.line = frame.line;
            lines.push(line);
        }
        lines
    }

    fn source_file(&mut self, file: String) -> Arc<str> {
        if let Some(shared) = self.source_files.get(file.as_str()) {
            return Arc::clone(shared);
        }
        let shared: Arc<str> = Arc::from(file.as_str());
        self.source_files
            .put(file.into_boxed_str(), Arc::clone(&shared));
        shared
    }

    /// The lines of an offset in this host's vDSO.
    pub(super) fn vdso_lines(&mut self, file_offset: u64) -> Vec<Line> {
        let found = vdso::own().and_then(|v| v.symbols.lookup_file_offset(file_offset));
        match found {
            // A device no file has keeps vDSO functions apart from files' and the kernel's.
            Some(function) => vec![self.function_line((u32::MAX, u32::MAX), 0, function)],
            None => Vec::new(),
        }
    }

    /// Parses the files of a process's executable mappings now, while the
    /// process runs and its files can be opened through `/proc/PID`: a
    /// short-lived process is gone by the time its samples are symbolized,
    /// and a file in a container or deleted since is then out of reach.
    /// Files already parsed cost a look-up.
    /// `held` are files opened earlier (right after an exec), read through
    /// `/proc/self/fd` when the process's own paths to them are gone.
    pub fn preload(&mut self, pid: u32, mappings: &ProcessMappings, held: &[HeldFile]) {
        for mapping in mappings
            .mappings()
            .iter()
            .filter(|m| m.executable && !m.is_vdso())
        {
            let held = held
                .iter()
                .find(|h| h.dev == mapping.dev && h.inode == mapping.inode);
            let _ = self.load_file_from(pid, mapping, held);
        }
    }

    /// Makes sure the mapping's file is parsed (or known broken); returns its key
    /// when parsed, and whether a failure may be temporary.
    fn load_file(&mut self, pid: u32, mapping: &MappedFile) -> (Option<FileKey>, bool) {
        self.load_file_from(pid, mapping, None)
    }

    /// [`Self::load_file`], trying `held` first when given.
    fn load_file_from(
        &mut self,
        pid: u32,
        mapping: &MappedFile,
        held: Option<&HeldFile>,
    ) -> (Option<FileKey>, bool) {
        let key = FileKey {
            dev: mapping.dev,
            inode: mapping.inode,
            path: Arc::clone(&mapping.path),
        };
        match self.files.get(&key) {
            Some(CachedFile::Loaded(_)) => {
                self.stats.file_cache_hits += 1;
                return (Some(key), false);
            }
            Some(CachedFile::Broken) => {
                self.stats.file_cache_hits += 1;
                return (None, false);
            }
            Some(CachedFile::Unreachable(retry_at)) if Instant::now() < *retry_at => {
                self.stats.file_cache_hits += 1;
                return (None, true);
            }
            _ => {}
        }
        self.stats.file_cache_misses += 1;
        let loaded = held
            .and_then(|h| ElfSymbols::load_with_limit(h.path(), self.limits.max_file_size).ok())
            .map_or_else(|| load_symbols(pid, mapping, self.limits.max_file_size), Ok);
        let (cached, result) = match loaded {
            Ok(symbols) => {
                self.stats.files_loaded += 1;
                let file = LoadedFile {
                    symbols: Arc::new(symbols),
                    debug_symbols: None,
                    debug: DebugState::NotLoaded,
                };
                (
                    CachedFile::Loaded(Box::new(file)),
                    (Some(key.clone()), false),
                )
            }
            Err(error) => {
                self.stats.load_failures += 1;
                tracing::debug!(pid, path = %mapping.path, %error, "cannot load symbols");
                if matches!(error, ElfError::Io { .. }) {
                    let retry_at = Instant::now() + self.limits.retry_unreachable_after;
                    (CachedFile::Unreachable(retry_at), (None, true))
                } else {
                    (CachedFile::Broken, (None, false))
                }
            }
        };
        // The evicted file (or the one replaced) takes its debug information along.
        if let Some((old_key, CachedFile::Loaded(_))) = self.files.push(key, cached)
            && let Some(entry) = self.debug_files.pop(&old_key)
        {
            self.debug_bytes = self.debug_bytes.saturating_sub(entry.cost);
        }
        result
    }

    /// Loads the debug information of a parsed file when it was not tried yet.
    fn load_debug(&mut self, pid: u32, mapping: &MappedFile, key: &FileKey) {
        let symbols = match self.files.peek(key) {
            Some(CachedFile::Loaded(file)) => match file.debug {
                DebugState::NotLoaded => Arc::clone(&file.symbols),
                DebugState::Retry(at) if Instant::now() >= at => Arc::clone(&file.symbols),
                _ => return,
            },
            _ => return,
        };
        // Only what has not been used for a while may make room.
        let now = Instant::now();
        let window = self.limits.debug_in_use;
        if self.debug_files.len() >= self.limits.max_debug_files.max(1)
            && self
                .debug_files
                .peek_lru()
                .is_some_and(|(_, e)| now.duration_since(e.last_used) < window)
        {
            self.set_debug(key, DebugState::Retry(now + window));
            return;
        }
        let in_use: u64 = self
            .debug_files
            .iter()
            .filter(|(_, e)| now.duration_since(e.last_used) < window)
            .map(|(_, e)| e.cost)
            .sum();
        let limit = self.limits.max_debug_bytes.saturating_sub(in_use);
        let crowded_out = limit < self.limits.max_debug_bytes;
        let max_file_size = self.limits.max_file_size;
        // The parsers are meant never to panic on hostile input; should one, the
        // file is symbolized without debug information instead of the task dying.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            debug::load(pid, mapping, &symbols, max_file_size, limit)
        }))
        .unwrap_or_else(|_| debug::Outcome {
            failures: 1,
            ..debug::Outcome::default()
        });
        self.stats.debug_files_rejected += outcome.rejected;
        self.stats.debug_load_failures += outcome.failures;
        if let Some(symbols) = outcome.symbols
            && let Some(CachedFile::Loaded(file)) = self.files.peek_mut(key)
        {
            self.stats.debug_symbol_tables += 1;
            file.debug_symbols = Some(Arc::new(symbols));
        }
        let state = match outcome.info {
            Some(info) => {
                match &info {
                    DebugInfo::Dwarf(_) => self.stats.dwarf_loaded += 1,
                    DebugInfo::Go(_) => self.stats.go_tables_loaded += 1,
                }
                self.stats.separate_debug_files += u64::from(outcome.separate);
                let cost = info.cost();
                tracing::debug!(path = %mapping.path, estimated_bytes = cost, "debug information loaded");
                if self.make_room(cost) {
                    let entry = DebugEntry {
                        cost,
                        last_used: now,
                    };
                    self.debug_files.put(key.clone(), entry);
                    self.debug_bytes = self.debug_bytes.saturating_add(cost);
                    DebugState::Loaded(Box::new(info))
                } else {
                    DebugState::Retry(now + window)
                }
            }
            // Refused for the room others use now: it may fit later.
            None if outcome.rejected > 0 && crowded_out => DebugState::Retry(now + window),
            None if outcome.unreachable => {
                DebugState::Retry(Instant::now() + self.limits.retry_unreachable_after)
            }
            None => DebugState::Absent,
        };
        self.set_debug(key, state);
    }

    /// Drops least recently used debug information, if unused for
    /// `debug_in_use`, until `cost` more fits; false when it cannot.
    fn make_room(&mut self, cost: u64) -> bool {
        let max_files = self.limits.max_debug_files.max(1);
        while self.debug_files.len() >= max_files
            || (!self.debug_files.is_empty()
                && self.debug_bytes.saturating_add(cost) > self.limits.max_debug_bytes)
        {
            let in_use = self
                .debug_files
                .peek_lru()
                .is_none_or(|(_, e)| e.last_used.elapsed() < self.limits.debug_in_use);
            if in_use {
                return false;
            }
            let Some((old, old_entry)) = self.debug_files.pop_lru() else {
                break;
            };
            self.debug_bytes = self.debug_bytes.saturating_sub(old_entry.cost);
            self.stats.debug_evictions += 1;
            if let Some(CachedFile::Loaded(file)) = self.files.peek_mut(&old) {
                file.debug = DebugState::NotLoaded;
            }
        }
        self.debug_bytes.saturating_add(cost) <= self.limits.max_debug_bytes
    }

    /// Sets a cached file's debug state, keeping the byte count right.
    fn set_debug(&mut self, key: &FileKey, state: DebugState) {
        if !matches!(state, DebugState::Loaded(_))
            && let Some(entry) = self.debug_files.pop(key)
        {
            self.debug_bytes = self.debug_bytes.saturating_sub(entry.cost);
        }
        if let Some(CachedFile::Loaded(file)) = self.files.peek_mut(key) {
            file.debug = state;
        }
    }
}

/// Loads the mapped file as the process sees it: the exact mapped file via
/// `map_files` (needs privileges), then the path in the process's mount
/// namespace, then the path here. A deleted file is only read via `map_files`.
fn load_symbols(pid: u32, mapping: &MappedFile, max_size: u64) -> Result<ElfSymbols, ElfError> {
    let mut last_error = None;
    for path in debug::binary_candidates(pid, mapping) {
        match ElfSymbols::load_with_limit(&path, max_size) {
            Ok(symbols) => return Ok(symbols),
            // Unreachable this way (process gone, no privilege): try the next way.
            Err(error @ ElfError::Io { .. }) => last_error = Some(error),
            // The file itself is unusable; another path to it will not help.
            Err(error) => return Err(error),
        }
    }
    Err(last_error.unwrap_or_else(|| ElfError::NotElf {
        path: mapping.path.to_string(),
    }))
}
