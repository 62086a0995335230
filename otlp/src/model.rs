//! The profile model: what every source (the eBPF receiver, OTLP received from
//! outside) hands to every sink (OTLP, pprof). It knows nothing of eBPF.
//!
//! Strings and frames are reference-counted so a source can intern them: the
//! same `Arc<Frame>` appears in thousands of stacks, and encoders deduplicate by
//! value anyway.

use std::sync::Arc;

/// What produced a frame; becomes the OTLP `profile.frame.type` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrameKind {
    /// Machine code of a user-space executable or library.
    Native,
    /// Kernel code.
    Kernel,
    /// A CPython function.
    CPython,
}

impl FrameKind {
    /// The value of the `profile.frame.type` semantic-convention attribute.
    pub fn as_otel_str(self) -> &'static str {
        match self {
            FrameKind::Native => "native",
            FrameKind::Kernel => "kernel",
            FrameKind::CPython => "cpython",
        }
    }
}

/// A mapped file in a process (or the kernel image).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Mapping {
    /// First address of the mapping in the process.
    pub memory_start: u64,
    /// One past the last address of the mapping.
    pub memory_limit: u64,
    /// Offset in the file of `memory_start`.
    pub file_offset: u64,
    /// Path of the mapped file as the process sees it (e.g. `/usr/lib/x86_64-linux-gnu/libc.so.6`),
    /// or a pseudo name such as `[kernel.kallsyms]`.
    pub filename: Arc<str>,
    /// Hex GNU build ID (`.note.gnu.build-id`), when the file has one.
    pub build_id: Option<Arc<str>>,
}

/// One function in a frame's inline chain.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Line {
    /// Demangled, human-readable function name.
    pub function_name: Arc<str>,
    /// The name as it appears in the binary (mangled); equal to `function_name` when not mangled.
    pub system_name: Arc<str>,
    /// Source file, when known.
    pub filename: Option<Arc<str>>,
    /// 1-based source line; 0 when unknown.
    pub line: u32,
}

/// One stack frame.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    /// What kind of code this frame is.
    pub kind: FrameKind,
    /// The instruction address in the process (for return addresses, the address
    /// of the call itself, i.e. already adjusted by the source).
    pub address: u64,
    /// The mapping the address falls in, when known.
    pub mapping: Option<Arc<Mapping>>,
    /// Symbolized functions, innermost inlined function first; empty when unsymbolized.
    pub lines: Vec<Line>,
}

/// A stack: frames ordered leaf first.
pub type Stack = Arc<[Arc<Frame>]>;

/// Identity of a process, for the OTLP resource and pprof labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProcessInfo {
    /// Process ID (thread-group ID).
    pub pid: u32,
    /// Basename of the executable (`process.executable.name`).
    pub executable_name: Arc<str>,
    /// Full path of the executable (`process.executable.path`); empty when
    /// there is none (kernel threads), and then not exported.
    pub executable_path: Arc<str>,
    /// `service.name`; sources default it to the executable name.
    pub service_name: Arc<str>,
}

/// Samples of one stack on one thread within the batch window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleGroup {
    /// The stack, leaf first.
    pub stack: Stack,
    /// OS thread ID (`thread.id`).
    pub thread_id: u32,
    /// Thread name, the kernel's `comm` (`thread.name`).
    pub thread_name: Arc<str>,
    /// One timestamp (Unix epoch nanoseconds) per sample, inside the batch window.
    /// Never empty.
    pub timestamps_unix_nanos: Vec<u64>,
}

/// All samples of one process within the batch window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessProfile {
    /// Who the samples belong to.
    pub process: ProcessInfo,
    /// The samples, grouped by (stack, thread).
    pub samples: Vec<SampleGroup>,
}

/// One reporting interval of CPU samples from every process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileBatch {
    /// Start of the window, Unix epoch nanoseconds.
    pub start_unix_nanos: u64,
    /// Length of the window in nanoseconds; every timestamp lies in
    /// `[start_unix_nanos, start_unix_nanos + duration_nanos)`.
    pub duration_nanos: u64,
    /// Sampling period in nanoseconds (1e9 / frequency).
    pub period_nanos: i64,
    /// `host.name` of the machine the samples come from.
    pub host_name: Arc<str>,
    /// One entry per process that had samples.
    pub processes: Vec<ProcessProfile>,
}

impl ProfileBatch {
    /// Total number of samples in the batch.
    pub fn sample_count(&self) -> usize {
        self.processes
            .iter()
            .flat_map(|p| &p.samples)
            .map(|s| s.timestamps_unix_nanos.len())
            .sum()
    }
}
