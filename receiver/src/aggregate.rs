//! Collects raw samples over one reporting interval, then symbolizes each
//! distinct stack once and builds the [`ProfileBatch`].

use std::{collections::HashMap, sync::Arc};

use icecore_otlp::model::{
    Frame, Labels, ProcessInfo, ProcessProfile, ProfileBatch, ProfileKind, SampleGroup,
};

use crate::{
    processes::ProcessTable, record::RawSample, runtimes::Runtimes, symbolize::Symbolizer,
};

/// A distinct (thread, stack) of one interval.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct StackKey {
    pid: u32,
    /// The process image the sample was taken in ([`ProcessTable::image_at`]).
    image: Option<u64>,
    tid: u32,
    comm: [u8; 16],
    cpu: u32,
    kernel_frames: u32,
    /// Kernel frames then user words, leaf first.
    frames: Box<[u64]>,
    /// An off-CPU sample's stack (the thread waited in it).
    off_cpu: bool,
}

/// The samples of one stack: their times and, for off-CPU samples, their
/// weights (empty for CPU samples, which weigh one period each).
#[derive(Debug, Default)]
struct Samples {
    timestamps: Vec<u64>,
    weights_nanos: Vec<u64>,
}

/// Raw samples of the current interval, bounded in count.
pub struct Aggregator {
    stacks: HashMap<StackKey, Samples>,
    samples: usize,
    max_samples: usize,
    dropped: u64,
    /// The share of context switches BPF records, when off-CPU sampling is
    /// on: an off-CPU sample weighs its wait divided by it.
    off_cpu_probability: Option<f64>,
    /// Whether a wall-clock batch (CPU and off-CPU samples together) is cut
    /// too.
    wall_clock: bool,
}

/// What one interval's worth of raw samples became.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IntervalStats {
    /// CPU samples in the batch.
    pub samples: usize,
    /// Off-CPU waits in the batch.
    pub off_cpu_waits: usize,
    /// Distinct (thread, stack) pairs.
    pub stacks: usize,
    /// Samples dropped because the interval hit its sample limit.
    pub dropped: u64,
    /// Samples relabeling by thread or CPU dropped (not in the batch).
    pub relabel_dropped: u64,
}

impl Aggregator {
    /// An aggregator keeping at most `max_samples` samples per interval;
    /// off-CPU samples are expected when `off_cpu_probability` is set, and
    /// with them a wall-clock batch is cut when `wall_clock`.
    pub fn new(max_samples: usize, off_cpu_probability: Option<f64>, wall_clock: bool) -> Self {
        let off_cpu_probability = off_cpu_probability.filter(|p| *p > 0.0 && *p <= 1.0);
        Aggregator {
            stacks: HashMap::new(),
            samples: 0,
            max_samples,
            dropped: 0,
            off_cpu_probability,
            wall_clock: wall_clock && off_cpu_probability.is_some(),
        }
    }

    /// The off-CPU profile's kind, when off-CPU sampling is on.
    fn off_cpu_kind(&self) -> Option<ProfileKind> {
        let p = self.off_cpu_probability?;
        Some(ProfileKind::OffCpu {
            one_in: (1.0 / p).round() as u64,
        })
    }

    /// Adds a CPU sample taken at `unix_nanos` in process image `image`.
    /// Returns false if it was dropped.
    pub fn add(&mut self, sample: &RawSample<'_>, unix_nanos: u64, image: Option<u64>) -> bool {
        self.insert(sample, unix_nanos, image, None)
    }

    /// Adds an off-CPU wait: `sample` is its start (the stack it blocked
    /// with, in process image `image`), `unix_nanos` the time it ended and
    /// `off_cpu_ns` how long it lasted. Returns false if it was dropped.
    pub fn add_off_cpu(
        &mut self,
        sample: &RawSample<'_>,
        unix_nanos: u64,
        image: Option<u64>,
        off_cpu_ns: u64,
    ) -> bool {
        let Some(p) = self.off_cpu_probability else {
            self.dropped += 1;
            return false;
        };
        // Scaled up for the waits not recorded: an unbiased estimate of the
        // total, each wait being recorded with probability p.
        let weight = (off_cpu_ns as f64 / p).round() as u64;
        self.insert(sample, unix_nanos, image, Some(weight))
    }

    fn insert(
        &mut self,
        sample: &RawSample<'_>,
        unix_nanos: u64,
        image: Option<u64>,
        weight_nanos: Option<u64>,
    ) -> bool {
        if self.samples >= self.max_samples {
            self.dropped += 1;
            return false;
        }
        let frames: Box<[u64]> = sample.kernel_frames().chain(sample.user_words()).collect();
        let key = StackKey {
            pid: sample.header.pid,
            image,
            tid: sample.header.tid,
            comm: sample.header.comm,
            cpu: sample.header.cpu,
            kernel_frames: sample.header.kernel_frames,
            frames,
            off_cpu: weight_nanos.is_some(),
        };
        let samples = self.stacks.entry(key).or_default();
        samples.timestamps.push(unix_nanos);
        if let Some(weight) = weight_nanos {
            samples.weights_nanos.push(weight);
        }
        self.samples += 1;
        true
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.samples
    }

    /// Whether no sample is held.
    pub fn is_empty(&self) -> bool {
        self.samples == 0
    }

    /// Symbolizes the interval's stacks and empties the aggregator: the
    /// CPU batch, then the off-CPU batch when off-CPU sampling is on.
    ///
    /// Timestamps are clamped into `[start, start + duration)` so late-drained
    /// samples still satisfy the window rule consumers such as Parca enforce.
    pub fn take_batches(
        &mut self,
        window: BatchWindow,
        processes: &mut ProcessTable,
        symbolizer: &mut Symbolizer,
        runtimes: &mut Runtimes,
    ) -> (Vec<ProfileBatch>, IntervalStats) {
        let mut stats = IntervalStats {
            samples: 0,
            off_cpu_waits: 0,
            stacks: self.stacks.len(),
            dropped: std::mem::take(&mut self.dropped),
            relabel_dropped: 0,
        };
        let per_thread = processes.labels_per_thread();
        self.samples = 0;
        let last = window.start_unix_nanos + window.duration_nanos.saturating_sub(1);
        // One profile per process image and kind: an exec within the
        // interval makes two.
        let mut by_image: HashMap<(bool, u32, Option<u64>), Vec<SampleGroup>> = HashMap::new();
        let mut thread_names: HashMap<[u8; 16], Arc<str>> = HashMap::new();
        for (key, samples) in self.stacks.drain() {
            let Samples {
                mut timestamps,
                weights_nanos,
            } = samples;
            let labels = if per_thread {
                match processes.thread_labels(key.pid, key.image, key.tid, &key.comm, key.cpu) {
                    Some(labels) => labels,
                    None => {
                        stats.relabel_dropped += timestamps.len() as u64;
                        continue;
                    }
                }
            } else {
                Labels::default()
            };
            if key.off_cpu {
                stats.off_cpu_waits += timestamps.len();
            } else {
                stats.samples += timestamps.len();
            }
            for t in &mut timestamps {
                *t = (*t).clamp(window.start_unix_nanos, last);
            }
            let stack = symbolize_stack(&key, processes, symbolizer, runtimes);
            let thread_name = thread_names
                .entry(key.comm)
                .or_insert_with(|| Arc::from(comm_str(&key.comm).as_ref()))
                .clone();
            // Samples of an image never learned (before an exec icecore saw
            // first) join the process's current one; their user frames are
            // left unnamed (symbolize_stack), their kernel frames are not.
            let image = key
                .image
                .or_else(|| processes.get(key.pid).map(|p| p.image));
            by_image
                .entry((key.off_cpu, key.pid, image))
                .or_default()
                .push(SampleGroup {
                    labels,
                    weights_nanos,
                    ..SampleGroup::timed(stack, key.tid, thread_name, timestamps).on_cpu(key.cpu)
                });
        }
        let mut cpu = Vec::new();
        let mut off_cpu = Vec::new();
        let mut wall: HashMap<(u32, Option<u64>), Vec<SampleGroup>> = HashMap::new();
        let period = u64::try_from(window.period_nanos).unwrap_or(0);
        for ((is_off_cpu, pid, image), samples) in by_image {
            if self.wall_clock {
                // Both kinds in nanoseconds: a CPU sample is one period.
                let groups = wall.entry((pid, image)).or_default();
                groups.extend(samples.iter().map(|group| {
                    let mut group = group.clone();
                    if !is_off_cpu {
                        group.weights_nanos = vec![period; group.timestamps_unix_nanos.len()];
                    }
                    group
                }));
            }
            let profile = ProcessProfile {
                process: process_info(pid, image, &samples, processes),
                samples,
            };
            if is_off_cpu { &mut off_cpu } else { &mut cpu }.push(profile);
        }
        let batch = |kind, processes: Vec<ProcessProfile>| {
            let mut processes = one_per_identity(processes);
            processes.sort_by_key(|p| p.process.pid);
            ProfileBatch {
                kind,
                start_unix_nanos: window.start_unix_nanos,
                duration_nanos: window.duration_nanos,
                period_nanos: window.period_nanos,
                host_name: window.host_name.clone(),
                host: window.host.clone(),
                processes,
            }
        };
        let mut batches = vec![batch(ProfileKind::Cpu, cpu)];
        if let Some(kind) = self.off_cpu_kind() {
            batches.push(batch(kind, off_cpu));
        }
        if self.wall_clock {
            let wall = wall
                .into_iter()
                .map(|((pid, image), samples)| ProcessProfile {
                    process: process_info(pid, image, &samples, processes),
                    samples,
                })
                .collect();
            batches.push(batch(ProfileKind::WallClock, wall));
        }
        (batches, stats)
    }
}

/// The profiles of images that look alike (a pid that ran `exec` on the
/// same executable, or read while an `exec` replaced it) as one: a resource
/// is what its attributes say, and a request must not hold two equal ones.
fn one_per_identity(processes: Vec<ProcessProfile>) -> Vec<ProcessProfile> {
    let mut index: HashMap<ProcessInfo, usize> = HashMap::with_capacity(processes.len());
    let mut merged: Vec<ProcessProfile> = Vec::with_capacity(processes.len());
    for profile in processes {
        match index.get(&profile.process) {
            Some(&i) => merged[i].samples.extend(profile.samples),
            None => {
                index.insert(profile.process.clone(), merged.len());
                merged.push(profile);
            }
        }
    }
    merged
}

/// The time window and fixed metadata of a batch.
#[derive(Debug, Clone)]
pub struct BatchWindow {
    /// Window start, Unix nanoseconds.
    pub start_unix_nanos: u64,
    /// Window length in nanoseconds (at least 1).
    pub duration_nanos: u64,
    /// Sampling period in nanoseconds.
    pub period_nanos: i64,
    /// `host.name`.
    pub host_name: Arc<str>,
    /// `host.arch`, `os.type`.
    pub host: icecore_otlp::model::HostInfo,
}

fn comm_str(comm: &[u8; 16]) -> std::borrow::Cow<'_, str> {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end])
}

fn process_info(
    pid: u32,
    image: Option<u64>,
    samples: &[SampleGroup],
    processes: &ProcessTable,
) -> ProcessInfo {
    if let Some(p) = image.and_then(|image| processes.image(pid, image)) {
        return p.info.clone();
    }
    // Evicted or never learned: name it after the main thread's comm if seen.
    let name: Arc<str> = samples
        .iter()
        .find(|s| s.thread_id == pid)
        .or(samples.first())
        .map(|s| s.thread_name.clone())
        .unwrap_or_else(|| Arc::from("unknown"));
    ProcessInfo {
        pid,
        executable_name: name.clone(),
        executable_path: Arc::from(""),
        service_name: name,
        ..ProcessInfo::default()
    }
}

fn symbolize_stack(
    key: &StackKey,
    processes: &mut ProcessTable,
    symbolizer: &mut Symbolizer,
    runtimes: &mut Runtimes,
) -> Arc<[Arc<Frame>]> {
    let kernel = (key.kernel_frames as usize).min(key.frames.len());
    let (kernel_frames, user_words) = key.frames.split_at(kernel);
    let mut frames = Vec::with_capacity(key.frames.len());
    for (i, &address) in kernel_frames.iter().enumerate() {
        // Return addresses point after the call; symbolize the call itself.
        let address = if i == 0 {
            address
        } else {
            address.saturating_sub(1)
        };
        let frame = symbolizer.kernel_frame(address);
        // An off-CPU stack is taken in the sched_switch tracepoint: its
        // first frames are the BPF program and the tracing glue that ran
        // it, not where the thread waits.
        if key.off_cpu && frames.is_empty() && is_tracing_glue(&frame) {
            continue;
        }
        frames.push(frame);
    }
    let process = key.image.and_then(|image| processes.image(key.pid, image));
    frames.extend(
        runtimes.user_stack(key.pid, user_words, |address, is_return_address| {
            let mapping = process?.mapping(address)?;
            Some(symbolizer.native_frame(key.pid, mapping, address, is_return_address))
        }),
    );
    frames.into()
}

/// A kernel frame of the BPF program that took an off-CPU stack, or of the
/// tracepoint code that ran it.
fn is_tracing_glue(frame: &Frame) -> bool {
    frame.lines.first().is_some_and(|line| {
        let name = &*line.function_name;
        name.starts_with("bpf_prog_")
            || name.starts_with("bpf_trace_run")
            || name.starts_with("__bpf_trace_")
            || name.starts_with("__traceiter_")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(pid: u32, path: &str, tid: u32) -> ProcessProfile {
        ProcessProfile {
            process: ProcessInfo {
                pid,
                executable_path: Arc::from(path),
                ..ProcessInfo::default()
            },
            samples: vec![SampleGroup::timed(
                Arc::from(Vec::new()),
                tid,
                Arc::from("t"),
                vec![1],
            )],
        }
    }

    #[test]
    fn images_that_look_alike_are_one_resource() {
        let merged = one_per_identity(vec![
            profile(7, "/usr/bin/php8.2", 7),
            profile(8, "/usr/bin/php8.2", 8),
            profile(7, "/usr/bin/sh", 7),
            profile(7, "/usr/bin/php8.2", 9),
        ]);
        let seen: Vec<(u32, &str, Vec<u32>)> = merged
            .iter()
            .map(|p| {
                let tids = p.samples.iter().map(|s| s.thread_id).collect();
                (p.process.pid, &*p.process.executable_path, tids)
            })
            .collect();
        assert_eq!(
            seen,
            vec![
                (7, "/usr/bin/php8.2", vec![7, 9]),
                (8, "/usr/bin/php8.2", vec![8]),
                (7, "/usr/bin/sh", vec![7]),
            ]
        );
    }
}
