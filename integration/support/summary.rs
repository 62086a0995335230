// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The decoded-profile summary that assertions on both output paths (OTLP and
//! pprof) work on: one entry per decoded sample record.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One frame of a decoded stack.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// Function name; empty when the frame is not symbolized.
    pub function: String,
    /// OTLP `profile.frame.type` of the location (`native`, `kernel`, …);
    /// None when the format has no such notion (pprof) or it is missing.
    pub kind: Option<String>,
    /// Instruction address of the location.
    pub address: u64,
    /// File name of the location's mapping (`/usr/lib/…/libc.so.6`, `[vdso]`);
    /// None when the location has no mapping.
    pub mapping: Option<String>,
    /// Source file of the line's function (OTLP only); None when unknown.
    pub filename: Option<String>,
    /// Source line; 0 when unknown.
    pub line: i64,
    /// Column in that line (1-based); 0 when unknown.
    pub column: i64,
}

impl Frame {
    pub fn is_kernel(&self) -> bool {
        self.kind.as_deref() == Some("kernel")
    }

    /// Name for display: the function, or the address when unsymbolized.
    pub fn display_name(&self) -> String {
        if self.function.is_empty() {
            format!("0x{:x}", self.address)
        } else {
            self.function.clone()
        }
    }
}

/// One decoded sample record (an OTLP Sample or a pprof Sample).
#[derive(Debug, Clone, Default)]
pub struct DecodedSample {
    /// Process ID: OTLP resource `process.pid`, pprof label `pid`.
    pub pid: Option<i64>,
    /// pprof label `comm`; OTLP resource `process.executable.name`.
    pub comm: Option<String>,
    /// OTLP sample attribute `thread.name`, pprof label `thread`.
    pub thread_name: Option<String>,
    /// OTLP sample attribute `thread.id` (pprof carries none).
    pub thread_id: Option<i64>,
    /// Frames, leaf first; inlined functions expanded innermost first.
    pub stack: Vec<Frame>,
    /// Number of samples this record stands for.
    pub count: u64,
    /// The samples' time in nanoseconds where the profile gives it per
    /// sample: pprof's second value, the values of an OTLP sample that has
    /// timestamps too (off-CPU waits); 0 otherwise.
    pub nanos: u64,
    /// Per-sample timestamps (OTLP only), Unix epoch nanoseconds.
    pub timestamps: Vec<u64>,
    /// OTLP resource `container.id`, pprof label `container_id`.
    pub container_id: Option<String>,
    /// OTLP resource `k8s.pod.uid`, pprof label `pod_uid`.
    pub pod_uid: Option<String>,
    /// OTLP resource `process.parent_pid` (pprof carries none).
    pub parent_pid: Option<i64>,
    /// Every string-valued OTLP resource attribute, or pprof string label.
    pub labels: std::collections::BTreeMap<String, String>,
    /// OTLP sample attribute `cpu.logical_number`, pprof label `cpu`.
    pub cpu: Option<i64>,
    /// String-valued OTLP sample attributes other than `thread.name`.
    pub sample_labels: std::collections::BTreeMap<String, String>,
}

impl DecodedSample {
    pub fn contains(&self, function: &str) -> bool {
        self.stack.iter().any(|f| f.function == function)
    }

    pub fn leaf(&self) -> Option<&Frame> {
        self.stack.first()
    }

    /// The first frame that is not a kernel frame (where user space was).
    pub fn user_leaf(&self) -> Option<&Frame> {
        self.stack.iter().find(|f| !f.is_kernel())
    }

    /// How many frames name `function`.
    pub fn frames_named(&self, function: &str) -> usize {
        self.stack.iter().filter(|f| f.function == function).count()
    }

    /// Timestamps not before `from` (Unix epoch ns) as a sample of their own
    /// (count = how many); None when there are none.
    pub fn since(&self, from: u64) -> Option<DecodedSample> {
        self.between(from, u64::MAX)
    }

    /// Timestamps in `from..until` (Unix epoch ns) as a sample of their own
    /// (count = how many); None when there are none.
    pub fn between(&self, from: u64, until: u64) -> Option<DecodedSample> {
        let timestamps: Vec<u64> = self
            .timestamps
            .iter()
            .copied()
            .filter(|&t| (from..until).contains(&t))
            .collect();
        (!timestamps.is_empty()).then(|| DecodedSample {
            count: timestamps.len() as u64,
            timestamps,
            ..self.clone()
        })
    }

    /// Function names, leaf first.
    pub fn names(&self) -> Vec<&str> {
        self.stack.iter().map(|f| f.function.as_str()).collect()
    }

    /// Frames that are not kernel frames (the user-space part of the stack), leaf first.
    pub fn user_names(&self) -> Vec<&str> {
        self.stack
            .iter()
            .filter(|f| !f.is_kernel())
            .map(|f| f.function.as_str())
            .collect()
    }

    /// True when no kernel frame follows (is rootward of) a user frame.
    pub fn kernel_frames_are_leafward(&self) -> bool {
        let mut seen_user = false;
        for f in &self.stack {
            if f.is_kernel() {
                if seen_user {
                    return false;
                }
            } else {
                seen_user = true;
            }
        }
        true
    }

    /// Folded stack, root first ("main;run_cycle;hot_alpha"), kernel frames marked.
    pub fn folded(&self) -> String {
        self.stack
            .iter()
            .rev()
            .map(|f| {
                if f.is_kernel() {
                    format!("{}_[k]", f.display_name())
                } else {
                    f.display_name()
                }
            })
            .collect::<Vec<_>>()
            .join(";")
    }
}

pub fn total(samples: &[DecodedSample]) -> u64 {
    samples.iter().map(|s| s.count).sum()
}

/// Samples whose stack contains `function` (inclusive count).
pub fn inclusive(samples: &[DecodedSample], function: &str) -> u64 {
    samples
        .iter()
        .filter(|s| s.contains(function))
        .map(|s| s.count)
        .sum()
}

/// Sum of counts of the samples matching `pred`.
pub fn count_where(samples: &[DecodedSample], pred: impl Fn(&DecodedSample) -> bool) -> u64 {
    samples.iter().filter(|s| pred(s)).map(|s| s.count).sum()
}

/// The samples matching `pred`, cloned.
pub fn filtered(
    samples: &[DecodedSample],
    pred: impl Fn(&DecodedSample) -> bool,
) -> Vec<DecodedSample> {
    samples.iter().filter(|s| pred(s)).cloned().collect()
}

/// The samples (with per-sample timestamps, i.e. from OTLP) of `pid` taken at
/// or after `from` (Unix epoch ns), and how many samples of `pid` were earlier.
pub fn of_pid_since(samples: &[DecodedSample], pid: u32, from: u64) -> (Vec<DecodedSample>, u64) {
    let mut kept = Vec::new();
    let mut earlier = 0;
    for s in samples.iter().filter(|s| s.pid == Some(i64::from(pid))) {
        assert_eq!(
            s.count,
            s.timestamps.len() as u64,
            "a sample's count differs from its number of timestamps: {s:?}"
        );
        match s.since(from) {
            Some(k) => {
                earlier += s.count - k.count;
                kept.push(k);
            }
            None => earlier += s.count,
        }
    }
    (kept, earlier)
}

/// Counts per pid.
pub fn by_pid(samples: &[DecodedSample]) -> BTreeMap<Option<i64>, u64> {
    let mut m = BTreeMap::new();
    for s in samples {
        *m.entry(s.pid).or_default() += s.count;
    }
    m
}

/// Asserts that every sample belongs to `pid`; on failure the message is
/// `"{what}: {counts by pid:?}"`.
pub fn assert_only_pid(samples: &[DecodedSample], pid: u32, what: &str) {
    let pids = by_pid(samples);
    assert_eq!(
        pids.keys().copied().collect::<Vec<_>>(),
        vec![Some(pid as i64)],
        "{what}: {pids:?}"
    );
}

/// The `n` heaviest folded stacks with counts, for diagnostics.
pub fn top_stacks(samples: &[DecodedSample], n: usize) -> String {
    let mut m: BTreeMap<String, u64> = BTreeMap::new();
    for s in samples {
        let key = format!(
            "[pid {} tid {} {}] {}",
            s.pid.map_or("?".into(), |p| p.to_string()),
            s.thread_id.map_or("?".into(), |p| p.to_string()),
            s.thread_name.as_deref().unwrap_or("?"),
            s.folded()
        );
        *m.entry(key).or_default() += s.count;
    }
    let mut v: Vec<_> = m.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut out = String::new();
    for (stack, count) in v.into_iter().take(n) {
        let _ = writeln!(out, "{count:6} {stack}");
    }
    out
}

/// Percentage `part / whole`, 0 when `whole` is 0.
pub fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// A kernel function on the system call path (`*sys_*`, `entry_SYSCALL*`, `do_syscall*`).
pub fn looks_like_kernel_syscall_path(name: &str) -> bool {
    name.contains("sys_") || name.contains("entry_SYSCALL") || name.contains("do_syscall")
}

/// A kernel symbol: non-empty, not a raw address, identifier-like characters.
pub fn looks_like_symbol(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with("0x")
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '@'))
}
