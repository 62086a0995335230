//! Collects raw samples over one reporting interval, then symbolizes each
//! distinct stack once and builds the [`ProfileBatch`].

use std::{collections::HashMap, sync::Arc};

use icecore_otlp::model::{Frame, Labels, ProcessInfo, ProcessProfile, ProfileBatch, SampleGroup};

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
}

/// Raw samples of the current interval, bounded in count.
pub struct Aggregator {
    stacks: HashMap<StackKey, Vec<u64>>,
    samples: usize,
    max_samples: usize,
    dropped: u64,
}

/// What one interval's worth of raw samples became.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IntervalStats {
    /// Samples in the batch.
    pub samples: usize,
    /// Distinct (thread, stack) pairs.
    pub stacks: usize,
    /// Samples dropped because the interval hit its sample limit.
    pub dropped: u64,
    /// Samples relabeling by thread or CPU dropped (not in the batch).
    pub relabel_dropped: u64,
}

impl Aggregator {
    /// An aggregator keeping at most `max_samples` samples per interval.
    pub fn new(max_samples: usize) -> Self {
        Aggregator {
            stacks: HashMap::new(),
            samples: 0,
            max_samples,
            dropped: 0,
        }
    }

    /// Adds a sample taken at `unix_nanos` in process image `image`.
    /// Returns false if it was dropped.
    pub fn add(&mut self, sample: &RawSample<'_>, unix_nanos: u64, image: Option<u64>) -> bool {
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
        };
        self.stacks.entry(key).or_default().push(unix_nanos);
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

    /// Symbolizes the interval's stacks and empties the aggregator.
    ///
    /// Timestamps are clamped into `[start, start + duration)` so late-drained
    /// samples still satisfy the window rule consumers such as Parca enforce.
    pub fn take_batch(
        &mut self,
        window: BatchWindow,
        processes: &mut ProcessTable,
        symbolizer: &mut Symbolizer,
        runtimes: &mut Runtimes,
    ) -> (ProfileBatch, IntervalStats) {
        let mut stats = IntervalStats {
            samples: self.samples,
            stacks: self.stacks.len(),
            dropped: std::mem::take(&mut self.dropped),
            relabel_dropped: 0,
        };
        let per_thread = processes.labels_per_thread();
        self.samples = 0;
        let last = window.start_unix_nanos + window.duration_nanos.saturating_sub(1);
        // One profile per process image: an exec within the interval makes two.
        let mut by_image: HashMap<(u32, Option<u64>), Vec<SampleGroup>> = HashMap::new();
        let mut thread_names: HashMap<[u8; 16], Arc<str>> = HashMap::new();
        for (key, mut timestamps) in self.stacks.drain() {
            let labels = if per_thread {
                match processes.thread_labels(key.pid, key.image, key.tid, &key.comm, key.cpu) {
                    Some(labels) => labels,
                    None => {
                        stats.relabel_dropped += timestamps.len() as u64;
                        stats.samples -= timestamps.len();
                        continue;
                    }
                }
            } else {
                Labels::default()
            };
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
                .entry((key.pid, image))
                .or_default()
                .push(SampleGroup {
                    labels,
                    ..SampleGroup::timed(stack, key.tid, thread_name, timestamps).on_cpu(key.cpu)
                });
        }
        let mut processes_out: Vec<ProcessProfile> = by_image
            .into_iter()
            .map(|((pid, image), samples)| ProcessProfile {
                process: process_info(pid, image, &samples, processes),
                samples,
            })
            .collect();
        processes_out.sort_by_key(|p| p.process.pid);
        let batch = ProfileBatch {
            start_unix_nanos: window.start_unix_nanos,
            duration_nanos: window.duration_nanos,
            period_nanos: window.period_nanos,
            host_name: window.host_name,
            host: window.host,
            processes: processes_out,
        };
        (batch, stats)
    }
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
        frames.push(symbolizer.kernel_frame(address));
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
