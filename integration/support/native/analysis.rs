// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! Analysis of a native fixture's decoded samples: where their leaf is, which
//! reach `main`, the inclusive split between two functions, the names seen.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::{MEASURE, NATIVE_HZ, REACH_MAIN_PCT, SHARE_TOLERANCE, WARM_UP};
use crate::support::summary::{
    self, DecodedSample, count_where, inclusive, of_pid_since, pct, total,
};

/// Where a sample's user-space leaf is, by the file of its mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LeafIn {
    /// The fixture's executable (or the library under test).
    Fixture,
    Libc,
    Vdso,
    /// Anything else (another library, no mapping, no user frame at all).
    Other,
}

pub fn leaf_in(sample: &DecodedSample, fixture_files: &[&Path]) -> LeafIn {
    let Some(leaf) = sample.user_leaf() else {
        return LeafIn::Other;
    };
    let file = leaf.mapping.as_deref().unwrap_or("");
    if fixture_files.iter().any(|f| Path::new(file) == *f) {
        LeafIn::Fixture
    } else if file.contains("/libc.so") || file.contains("/libc-") {
        LeafIn::Libc
    } else if file == "[vdso]" || file.ends_with("linux-vdso.so.1") {
        LeafIn::Vdso
    } else {
        LeafIn::Other
    }
}

/// Samples per leaf location, for printing.
pub fn leaf_breakdown(samples: &[DecodedSample], fixture_files: &[&Path]) -> BTreeMap<LeafIn, u64> {
    let mut m = BTreeMap::new();
    for s in samples {
        *m.entry(leaf_in(s, fixture_files)).or_default() += s.count;
    }
    m
}

/// The heaviest stacks among `samples` that fail `ok`, root first, with the
/// mapping of their rootmost user frame (where unwinding stopped).
pub fn failing_stacks(
    samples: &[DecodedSample],
    ok: impl Fn(&DecodedSample) -> bool,
    n: usize,
) -> String {
    let bad: Vec<DecodedSample> = samples.iter().filter(|s| !ok(s)).cloned().collect();
    if bad.is_empty() {
        return "  (none)\n".into();
    }
    let mut by_root: BTreeMap<String, u64> = BTreeMap::new();
    for s in &bad {
        let root = s
            .stack
            .iter()
            .rev()
            .find(|f| !f.is_kernel())
            .map(|f| {
                format!(
                    "{} in {}",
                    f.display_name(),
                    f.mapping.as_deref().unwrap_or("no mapping")
                )
            })
            .unwrap_or_else(|| "no user frame".into());
        *by_root.entry(root).or_default() += s.count;
    }
    format!(
        "  unwinding stopped at (rootmost user frame): {by_root:?}\n{}",
        summary::top_stacks(&bad, n)
    )
}

/// The fixture's samples from `from` on, printed with the number excluded before.
pub fn evaluated(
    samples: &[DecodedSample],
    pid: u32,
    from: u64,
    label: &str,
) -> Vec<DecodedSample> {
    let (kept, excluded) = of_pid_since(samples, pid, from);
    println!(
        "{label}: {} samples of pid {pid} evaluated (taken from {:.2} s after the fixture was \
         seen described to BPF); {excluded} earlier samples excluded as warm-up",
        total(&kept),
        WARM_UP.as_secs_f64()
    );
    kept
}

/// Asserts that at least `min_pct` % of `scope` reach main (`reaches`), printing
/// the leaf breakdown and the failing stacks. Returns the percentage.
pub fn assert_reach_main(
    label: &str,
    samples: &[DecodedSample],
    fixture_files: &[&Path],
    reaches: impl Fn(&DecodedSample) -> bool,
    min_pct: f64,
) -> f64 {
    let all = total(samples);
    let leaves = leaf_breakdown(samples, fixture_files);
    let in_scope = |s: &DecodedSample| {
        matches!(
            leaf_in(s, fixture_files),
            LeafIn::Fixture | LeafIn::Libc | LeafIn::Vdso
        )
    };
    let scope = count_where(samples, in_scope);
    let ok = count_where(samples, |s| in_scope(s) && reaches(s));
    let share = pct(ok, scope);
    println!(
        "{label}: user leaf by file {leaves:?}; {ok} of {scope} samples with the leaf in the \
         fixture/libc/vdso reach main ({share:.2}%); {all} samples in all"
    );
    println!("{label}: top stacks:\n{}", summary::top_stacks(samples, 6));
    println!(
        "{label}: samples not reaching main:\n{}",
        failing_stacks(
            &samples
                .iter()
                .filter(|s| in_scope(s))
                .cloned()
                .collect::<Vec<_>>(),
            &reaches,
            8
        )
    );
    assert!(
        scope as f64 >= 0.95 * all as f64,
        "{label}: only {scope} of {all} samples have their user leaf in the fixture, libc or \
         the vDSO ({leaves:?}): the fixture's frames are not attributed to its file"
    );
    assert!(
        share >= min_pct,
        "{label}: only {ok} of {scope} samples ({share:.2}%) reach main, expected >= {min_pct}%\n{}",
        failing_stacks(samples, &reaches, 12)
    );
    share
}

/// Asserts the inclusive shares of `a` and `b` among samples containing either.
pub fn assert_split(
    label: &str,
    samples: &[DecodedSample],
    (a, a_pct): (&str, f64),
    (b, b_pct): (&str, f64),
) {
    let na = inclusive(samples, a);
    let nb = inclusive(samples, b);
    let either = count_where(samples, |s| s.contains(a) || s.contains(b));
    let (sa, sb) = (pct(na, either), pct(nb, either));
    println!(
        "{label}: inclusive shares {a} {sa:.2}% ({na}), {b} {sb:.2}% ({nb}) of {either} samples \
         (built-in split {a_pct}/{b_pct}, tolerance {SHARE_TOLERANCE} pp)"
    );
    assert!(
        either as f64 >= 0.9 * total(samples) as f64,
        "{label}: only {either} of {} samples contain {a} or {b}",
        total(samples)
    );
    assert!(
        (sa - a_pct).abs() <= SHARE_TOLERANCE,
        "{label}: {a} has {sa:.2}% of the samples, expected {a_pct} +- {SHARE_TOLERANCE}"
    );
    assert!(
        (sb - b_pct).abs() <= SHARE_TOLERANCE,
        "{label}: {b} has {sb:.2}% of the samples, expected {b_pct} +- {SHARE_TOLERANCE}"
    );
}

/// Asserts that enough samples were evaluated for the percentages to mean something.
pub fn assert_enough(label: &str, samples: &[DecodedSample], min: u64) {
    let n = total(samples);
    assert!(
        n >= min,
        "{label}: only {n} samples evaluated, expected at least {min} ({NATIVE_HZ} Hz over {:.1} s)",
        MEASURE.as_secs_f64()
    );
}

/// True for a Rust symbol still carrying its hash (`…::h0123456789abcdef`, or
/// the mangled `17h0123456789abcdefE`).
pub fn has_rust_hash(name: &str) -> bool {
    let hex16 = |s: &str| s.len() == 16 && s.chars().all(|c| c.is_ascii_hexdigit());
    name.rsplit_once("::h").is_some_and(|(_, h)| hex16(h))
        || name.match_indices("17h").any(|(i, _)| {
            name.get(i + 3..i + 19).is_some_and(hex16) && name[i + 19..].starts_with('E')
        })
}

/// `assert_reach_main` of samples whose user leaf is in `exe`, libc or the
/// vDSO, with "reaching main" meaning a frame named `main`, at `REACH_MAIN_PCT`.
pub fn assert_reach_c_main(label: &str, samples: &[DecodedSample], exe: &Path) -> f64 {
    assert_reach_main(
        label,
        samples,
        &[exe],
        |s| s.contains("main"),
        REACH_MAIN_PCT,
    )
}

/// The names of every user-space frame in `samples`.
pub fn user_function_names(samples: &[DecodedSample]) -> BTreeSet<&str> {
    samples
        .iter()
        .flat_map(|s| s.stack.iter().filter(|f| !f.is_kernel()))
        .map(|f| f.function.as_str())
        .collect()
}

/// True for a name still mangled by rustc (legacy `_ZN…` or v0 `_R…`).
pub fn is_mangled_rust(name: &str) -> bool {
    name.starts_with("_ZN")
        || name
            .strip_prefix("_R")
            .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_uppercase()))
}

/// The samples whose user-space leaf is in `file`.
pub fn with_leaf_in(samples: &[DecodedSample], file: &Path) -> Vec<DecodedSample> {
    samples
        .iter()
        .filter(|s| leaf_in(s, &[file]) == LeafIn::Fixture)
        .cloned()
        .collect()
}

/// The samples whose user-space leaf is the function `name`.
pub fn with_user_leaf_named(samples: &[DecodedSample], name: &str) -> Vec<DecodedSample> {
    samples
        .iter()
        .filter(|s| s.user_leaf().is_some_and(|f| f.function == name))
        .cloned()
        .collect()
}

/// Samples per number of frames named `name` in a stack, and per number of
/// user frames in a stack.
pub fn depth_histograms(
    samples: &[DecodedSample],
    name: &str,
) -> (BTreeMap<usize, u64>, BTreeMap<usize, u64>) {
    let mut depths: BTreeMap<usize, u64> = BTreeMap::new();
    let mut user_frames: BTreeMap<usize, u64> = BTreeMap::new();
    for s in samples {
        *depths.entry(s.frames_named(name)).or_default() += s.count;
        *user_frames.entry(s.user_names().len()).or_default() += s.count;
    }
    (depths, user_frames)
}
