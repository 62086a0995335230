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
    /// A Ruby method.
    Ruby,
    /// A PHP function.
    Php,
    /// A Perl subroutine.
    Perl,
    /// A JVM method (interpreted or compiled by HotSpot).
    Jvm,
    /// A JavaScript function run by V8 (Node.js).
    V8Js,
    /// A .NET method.
    DotNet,
}

impl FrameKind {
    /// Every kind.
    pub const ALL: [FrameKind; 9] = [
        FrameKind::Native,
        FrameKind::Kernel,
        FrameKind::CPython,
        FrameKind::Ruby,
        FrameKind::Php,
        FrameKind::Perl,
        FrameKind::Jvm,
        FrameKind::V8Js,
        FrameKind::DotNet,
    ];

    /// The value of the `profile.frame.type` semantic-convention attribute.
    pub fn as_otel_str(self) -> &'static str {
        match self {
            FrameKind::Native => "native",
            FrameKind::Kernel => "kernel",
            FrameKind::CPython => "cpython",
            FrameKind::Ruby => "ruby",
            FrameKind::Php => "php",
            FrameKind::Perl => "perl",
            FrameKind::Jvm => "jvm",
            FrameKind::V8Js => "v8js",
            FrameKind::DotNet => "dotnet",
        }
    }

    /// The kind a `profile.frame.type` value names; `None` for values icecore
    /// does not produce.
    pub fn from_otel_str(value: &str) -> Option<FrameKind> {
        FrameKind::ALL
            .into_iter()
            .find(|k| k.as_otel_str() == value)
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
    /// 1-based column in that line; 0 when unknown (most runtimes report
    /// lines only).
    pub column: u32,
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
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
    /// The container the process runs in (`container.id`); empty when none.
    pub container_id: Arc<str>,
    /// The Kubernetes pod it runs in (`k8s.pod.uid`); empty when none.
    pub k8s_pod_uid: Arc<str>,
    /// The container's name as its runtime knows it (`container.name`,
    /// from the Docker Engine); empty when unknown.
    pub container_name: Arc<str>,
    /// The parent process's ID (`process.parent_pid`); 0 when unknown.
    pub parent_pid: u32,
    /// Its arguments joined by spaces (`process.command_line`), only when
    /// configured (arguments may hold secrets); empty otherwise.
    pub command_line: Arc<str>,
    /// Build IDs of the executable (`process.executable.build_id.*`).
    pub build_ids: ExecutableBuildIds,
    /// The Kubernetes pod's name (`k8s.pod.name`), namespace
    /// (`k8s.namespace.name`), container (`k8s.container.name`) and node
    /// (`k8s.node.name`), from the Kubernetes API; empty when unknown.
    pub k8s: Arc<K8sNames>,
    /// Labels the process was given by relabeling and external labels, by
    /// Prometheus label name, sorted and unique: OTLP resource attributes,
    /// Parca series labels and pprof sample labels alike. A label of the
    /// same name as one of the fields above wins over it on Parca and pprof.
    pub labels: Labels,
}

/// What is known of the machine samples come from, beyond its name: one
/// value per batch, since the receiver's batches come from other hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct HostInfo {
    /// `host.arch`, as OpenTelemetry names it (`amd64`, `arm64`, ...); empty
    /// when unknown.
    pub arch: Arc<str>,
    /// `os.type` (`linux`); empty when unknown.
    pub os_type: Arc<str>,
}

impl HostInfo {
    /// This machine, as this build of icecore runs on it.
    pub fn this_host() -> Self {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "x86",
            "powerpc64" => "ppc64",
            "s390x" => "s390x",
            "arm" => "arm32",
            other => other,
        };
        HostInfo {
            arch: Arc::from(arch),
            os_type: Arc::from(std::env::consts::OS),
        }
    }
}

/// Build IDs an executable carries, as hex (GNU) or as written (Go); empty
/// when it has none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ExecutableBuildIds {
    /// The `NT_GNU_BUILD_ID` note (`process.executable.build_id.gnu`).
    pub gnu: Arc<str>,
    /// The Go toolchain's build ID note (`process.executable.build_id.go`).
    pub go: Arc<str>,
}

impl ExecutableBuildIds {
    /// The IDs as (OTel attribute, value), the empty ones left out.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("process.executable.build_id.gnu", &self.gnu),
            ("process.executable.build_id.go", &self.go),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(attr, v)| (attr, &**v))
    }
}

/// Names of a process's Kubernetes pod, container and node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct K8sNames {
    /// `k8s.pod.name`.
    pub pod: Arc<str>,
    /// `k8s.namespace.name`.
    pub namespace: Arc<str>,
    /// `k8s.container.name`.
    pub container: Arc<str>,
    /// `k8s.node.name`.
    pub node: Arc<str>,
}

impl K8sNames {
    /// The names as (OTel attribute, Prometheus label, value), the empty
    /// ones left out.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, &'static str, &str)> {
        [
            ("k8s.pod.name", "pod", &self.pod),
            ("k8s.namespace.name", "namespace", &self.namespace),
            ("k8s.container.name", "container", &self.container),
            ("k8s.node.name", "k8s_node", &self.node),
        ]
        .into_iter()
        .filter(|(_, _, v)| !v.is_empty())
        .map(|(attr, label, v)| (attr, label, &**v))
    }
}

/// Name → value pairs, sorted by name, names unique.
pub type Labels = Arc<[(Arc<str>, Arc<str>)]>;

impl ProcessInfo {
    /// Every string field (what memory budgets charge), labels aside.
    pub fn strings(&self) -> [&Arc<str>; 13] {
        [
            &self.executable_name,
            &self.executable_path,
            &self.service_name,
            &self.container_id,
            &self.k8s_pod_uid,
            &self.container_name,
            &self.command_line,
            &self.build_ids.gnu,
            &self.build_ids.go,
            &self.k8s.pod,
            &self.k8s.namespace,
            &self.k8s.container,
            &self.k8s.node,
        ]
    }

    /// Adds `extra` labels the process does not have yet (external labels
    /// never override the process's own).
    pub fn add_missing_labels(&mut self, extra: &[(Arc<str>, Arc<str>)]) {
        if extra
            .iter()
            .all(|(name, _)| self.labels.iter().any(|(n, _)| n == name))
        {
            return;
        }
        let mut labels: Vec<(Arc<str>, Arc<str>)> = self.labels.to_vec();
        for (name, value) in extra {
            if !labels.iter().any(|(n, _)| n == name) {
                labels.push((name.clone(), value.clone()));
            }
        }
        labels.sort_by(|a, b| a.0.cmp(&b.0));
        self.labels = labels.into();
    }
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
    /// One timestamp (Unix epoch nanoseconds) per sample, inside the batch
    /// window, when the source timed each sample (the eBPF source always
    /// does); empty for samples known only by their number (OTLP received
    /// with values only), so a count never turns into per-sample memory.
    pub timestamps_unix_nanos: Vec<u64>,
    /// Samples in the group: `timestamps_unix_nanos.len()` when timed.
    /// A group with no samples is never built.
    pub count: u64,
    /// The CPU the samples were taken on (`cpu.logical_number`); `None`
    /// when the source did not say.
    pub cpu: Option<u32>,
    /// Labels of these samples beyond their process's (relabeling by
    /// thread or CPU): OTLP sample attributes, pprof sample labels.
    pub labels: Labels,
    /// In a batch of weighted samples ([`ProfileKind::OffCpu`],
    /// [`ProfileKind::WallClock`]): each
    /// sample's weight in nanoseconds, one per timestamp; empty otherwise.
    pub weights_nanos: Vec<u64>,
}

impl SampleGroup {
    /// A group of timed samples: one per timestamp.
    pub fn timed(
        stack: Stack,
        thread_id: u32,
        thread_name: Arc<str>,
        timestamps_unix_nanos: Vec<u64>,
    ) -> Self {
        let count = timestamps_unix_nanos.len() as u64;
        Self {
            stack,
            thread_id,
            thread_name,
            timestamps_unix_nanos,
            count,
            cpu: None,
            labels: Labels::default(),
            weights_nanos: Vec::new(),
        }
    }

    /// A group of timed samples, each of its own weight: `samples` holds
    /// (timestamp, nanoseconds) pairs.
    pub fn weighted(
        stack: Stack,
        thread_id: u32,
        thread_name: Arc<str>,
        samples: &[(u64, u64)],
    ) -> Self {
        Self {
            weights_nanos: samples.iter().map(|&(_, weight)| weight).collect(),
            ..Self::timed(
                stack,
                thread_id,
                thread_name,
                samples.iter().map(|&(t, _)| t).collect(),
            )
        }
    }

    /// The group's nanoseconds: its weights' sum when weighted, otherwise
    /// its count times `period_nanos`.
    pub fn total_nanos(&self, period_nanos: i64) -> u64 {
        if self.weights_nanos.is_empty() {
            self.count
                .saturating_mul(u64::try_from(period_nanos).unwrap_or(0))
        } else {
            self.weights_nanos
                .iter()
                .fold(0u64, |sum, w| sum.saturating_add(*w))
        }
    }

    /// The group, taken on `cpu`.
    pub fn on_cpu(mut self, cpu: u32) -> Self {
        self.cpu = Some(cpu);
        self
    }

    /// Whether each sample has its own timestamp.
    pub fn is_timed(&self) -> bool {
        !self.timestamps_unix_nanos.is_empty()
    }
}

/// All samples of one process within the batch window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessProfile {
    /// Who the samples belong to.
    pub process: ProcessInfo,
    /// The samples, grouped by (stack, thread).
    pub samples: Vec<SampleGroup>,
}

/// What a batch's samples measure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ProfileKind {
    /// CPU time: each sample stands for one sampling period on CPU.
    #[default]
    Cpu,
    /// Time threads waited off CPU: each sample weighs the nanoseconds one
    /// recorded wait lasted, scaled by `one_in` ([`SampleGroup::weights_nanos`]).
    OffCpu {
        /// Context switches per recorded one (1 / the sampling probability).
        one_in: u64,
    },
    /// Wall-clock time per thread: its CPU samples (one period each) and
    /// its off-CPU waits together, every sample weighted in nanoseconds.
    WallClock,
}

impl ProfileKind {
    /// The profile's name: the `__name__` of its series, the type of its
    /// sample values.
    pub const fn name(self) -> &'static str {
        match self {
            ProfileKind::Cpu => "cpu",
            ProfileKind::OffCpu { .. } => "off_cpu",
            ProfileKind::WallClock => "wall",
        }
    }
}

/// One reporting interval of samples of one [`ProfileKind`] from every process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileBatch {
    /// What the samples measure.
    pub kind: ProfileKind,
    /// Start of the window, Unix epoch nanoseconds.
    pub start_unix_nanos: u64,
    /// Length of the window in nanoseconds; every timestamp lies in
    /// `[start_unix_nanos, start_unix_nanos + duration_nanos)`.
    pub duration_nanos: u64,
    /// Sampling period in nanoseconds (1e9 / frequency).
    pub period_nanos: i64,
    /// `host.name` of the machine the samples come from.
    pub host_name: Arc<str>,
    /// The rest of what is known of that machine.
    pub host: HostInfo,
    /// One entry per process that had samples.
    pub processes: Vec<ProcessProfile>,
}

impl ProfileBatch {
    /// Total number of samples in the batch.
    pub fn sample_count(&self) -> u64 {
        self.processes
            .iter()
            .flat_map(|p| &p.samples)
            .map(|s| s.count)
            .sum()
    }
}

impl ProfileBatch {
    /// Adds `other`'s samples: its processes join this batch's (a process
    /// already here gets the other's sample groups), and the window grows to
    /// cover both (the batches must be of one kind). The period stays this
    /// batch's unless it has none.
    pub fn merge(&mut self, other: ProfileBatch) {
        let end = (self.start_unix_nanos.saturating_add(self.duration_nanos))
            .max(other.start_unix_nanos.saturating_add(other.duration_nanos));
        if self.processes.is_empty() && self.duration_nanos == 0 {
            self.start_unix_nanos = other.start_unix_nanos;
        }
        self.start_unix_nanos = self.start_unix_nanos.min(other.start_unix_nanos);
        self.duration_nanos = end - self.start_unix_nanos;
        if self.period_nanos == 0 {
            self.period_nanos = other.period_nanos;
        }
        let mut index: std::collections::HashMap<ProcessInfo, usize> = self
            .processes
            .iter()
            .enumerate()
            .map(|(i, p)| (p.process.clone(), i))
            .collect();
        for process in other.processes {
            match index.get(&process.process) {
                Some(&i) => self.processes[i].samples.extend(process.samples),
                None => {
                    index.insert(process.process.clone(), self.processes.len());
                    self.processes.push(process);
                }
            }
        }
    }
}

impl ProfileBatch {
    /// Heap memory the batch holds, about: every shared stack, frame,
    /// mapping and string counted once, plus each allocation's overhead.
    /// What budgets that hold batches (the receiver's, a history) charge.
    pub fn heap_bytes(&self) -> usize {
        use std::collections::HashSet;
        use std::mem::size_of;
        const OVERHEAD: usize = 16;
        let mut seen: HashSet<*const u8> = HashSet::new();
        let mut bytes = self.processes.capacity() * size_of::<ProcessProfile>();
        let string = |s: &Arc<str>, seen: &mut HashSet<*const u8>| {
            if !s.is_empty() && seen.insert(s.as_ptr()) {
                s.len() + 2 * size_of::<usize>() + OVERHEAD
            } else {
                0
            }
        };
        bytes += string(&self.host_name, &mut seen);
        for process in &self.processes {
            let info = &process.process;
            for s in info.strings() {
                bytes += string(s, &mut seen);
            }
            for (name, value) in info.labels.iter() {
                bytes += string(name, &mut seen) + string(value, &mut seen);
            }
            bytes += process.samples.capacity() * size_of::<SampleGroup>() + OVERHEAD;
            for group in &process.samples {
                bytes += group.timestamps_unix_nanos.capacity() * size_of::<u64>();
                bytes += string(&group.thread_name, &mut seen);
                for (name, value) in group.labels.iter() {
                    bytes += string(name, &mut seen) + string(value, &mut seen);
                }
                if !seen.insert(group.stack.as_ptr().cast()) {
                    continue;
                }
                bytes += group.stack.len() * size_of::<Arc<Frame>>() + 2 * size_of::<usize>();
                bytes += OVERHEAD;
                for frame in group.stack.iter() {
                    if !seen.insert(Arc::as_ptr(frame).cast()) {
                        continue;
                    }
                    bytes += size_of::<Frame>() + 2 * size_of::<usize>() + OVERHEAD;
                    bytes += frame.lines.capacity() * size_of::<Line>();
                    for line in &frame.lines {
                        bytes += string(&line.function_name, &mut seen);
                        bytes += string(&line.system_name, &mut seen);
                        if let Some(f) = &line.filename {
                            bytes += string(f, &mut seen);
                        }
                    }
                    if let Some(mapping) = &frame.mapping
                        && seen.insert(Arc::as_ptr(mapping).cast())
                    {
                        bytes += size_of::<Mapping>() + 2 * size_of::<usize>() + OVERHEAD;
                        bytes += string(&mapping.filename, &mut seen);
                        if let Some(id) = &mapping.build_id {
                            bytes += string(id, &mut seen);
                        }
                    }
                }
            }
        }
        bytes
    }
}

impl ProfileBatch {
    /// The samples of `batches` whose timestamps fall in `[start, end)`, as
    /// one batch over that window (for a pull of "the next N seconds").
    /// Untimed groups count as taken at their batch's start.
    /// Processes and sample groups are concatenated, not merged: encoders
    /// deduplicate stacks anyway. `kind`, `period_nanos` and `host_name`
    /// come from the first batch: the batches must be of one kind.
    pub fn window_of(batches: &[Arc<ProfileBatch>], start: u64, end: u64) -> ProfileBatch {
        let mut processes: Vec<ProcessProfile> = Vec::new();
        for batch in batches {
            for process in &batch.processes {
                let samples: Vec<SampleGroup> = process
                    .samples
                    .iter()
                    .filter_map(|group| {
                        if !group.is_timed() {
                            return (start..end)
                                .contains(&batch.start_unix_nanos)
                                .then(|| group.clone());
                        }
                        let inside =
                            |i: &usize| (start..end).contains(&group.timestamps_unix_nanos[*i]);
                        let kept: Vec<usize> = (0..group.timestamps_unix_nanos.len())
                            .filter(inside)
                            .collect();
                        let pick = |values: &[u64]| -> Vec<u64> {
                            kept.iter()
                                .filter_map(|&i| values.get(i).copied())
                                .collect()
                        };
                        (!kept.is_empty()).then(|| SampleGroup {
                            count: kept.len() as u64,
                            timestamps_unix_nanos: pick(&group.timestamps_unix_nanos),
                            weights_nanos: pick(&group.weights_nanos),
                            ..group.clone()
                        })
                    })
                    .collect();
                if samples.is_empty() {
                    continue;
                }
                match processes.iter_mut().find(|p| p.process == process.process) {
                    Some(known) => known.samples.extend(samples),
                    None => processes.push(ProcessProfile {
                        process: process.process.clone(),
                        samples,
                    }),
                }
            }
        }
        let first = batches.first();
        ProfileBatch {
            kind: first.map(|b| b.kind).unwrap_or_default(),
            start_unix_nanos: start,
            duration_nanos: end.saturating_sub(start),
            period_nanos: first.map_or(0, |b| b.period_nanos),
            host_name: first.map_or_else(|| Arc::from(""), |b| b.host_name.clone()),
            host: first.map(|b| b.host.clone()).unwrap_or_default(),
            processes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures;

    #[test]
    fn merging_keeps_every_sample_and_widens_the_window() {
        let a = test_fixtures::batch();
        let mut b = test_fixtures::batch();
        b.start_unix_nanos += 5_000_000_000;
        let mut merged = a.clone();
        merged.merge(b.clone());
        assert_eq!(merged.sample_count(), a.sample_count() + b.sample_count());
        assert_eq!(
            merged.processes.len(),
            a.processes.len(),
            "same processes joined"
        );
        assert_eq!(merged.start_unix_nanos, a.start_unix_nanos);
        assert_eq!(
            merged.start_unix_nanos + merged.duration_nanos,
            b.start_unix_nanos + b.duration_nanos
        );
    }

    #[test]
    fn window_of_keeps_only_timestamps_inside() {
        let batch = Arc::new(test_fixtures::batch());
        let all: Vec<u64> = batch
            .processes
            .iter()
            .flat_map(|p| &p.samples)
            .flat_map(|s| s.timestamps_unix_nanos.iter().copied())
            .collect();
        let (lo, hi) = (*all.iter().min().unwrap(), *all.iter().max().unwrap());
        let whole = ProfileBatch::window_of(&[batch.clone(), batch.clone()], lo, hi + 1);
        assert_eq!(whole.sample_count(), 2 * all.len() as u64);
        assert_eq!(
            whole.processes.len(),
            batch
                .processes
                .iter()
                .filter(|p| !p.samples.is_empty())
                .count()
        );
        let mid = lo + (hi - lo) / 2;
        let half = ProfileBatch::window_of(&[batch], lo, mid);
        let expected = all.iter().filter(|&&t| t < mid).count();
        assert_eq!(half.sample_count(), expected as u64);
        assert_eq!(half.start_unix_nanos, lo);
        assert_eq!(half.duration_nanos, mid - lo);
    }
}
