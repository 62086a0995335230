//! Cumulative profiles to deltas. Go's allocs, heap, block and mutex
//! profiles count from the process's start; a backend wants what happened
//! in each interval. The previous scrape's values are kept per stack and
//! subtracted, as Grafana Alloy does, with two differences: a value that
//! went down (the target restarted) starts a new baseline instead of
//! sending negative numbers, and the baseline keeps only the cumulative
//! values, keyed by a 64-bit hash of the stack's addresses and labels.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use crate::pprof::Profile;

/// The sample types that count since the process started, as `type/unit`:
/// Go's `alloc_*` (allocs and heap profiles) and `contentions` / `delay`
/// (block and mutex profiles). `inuse_*` and goroutine counts are gauges.
const CUMULATIVE: [(&str, &str); 4] = [
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("contentions", "count"),
    ("delay", "nanoseconds"),
];

/// Whether sample type (`kind`, `unit`) counts since the process started.
pub fn is_cumulative(kind: &str, unit: &str) -> bool {
    CUMULATIVE.contains(&(kind, unit))
}

/// What [`CumulativeDelta::apply`] made of a profile.
#[derive(Debug)]
pub enum DeltaOutcome {
    /// The profile to send: a delta over the time since the previous
    /// scrape, or the profile itself when nothing in it is cumulative.
    Ready(Box<Profile>),
    /// The first profile of a cumulative series: kept as the baseline.
    Baseline,
    /// A cumulative value went down (the target restarted, or its profile
    /// changed shape): kept as the new baseline, nothing sent.
    Reset,
}

/// One series' previous cumulative values.
#[derive(Debug, Default)]
pub struct CumulativeDelta {
    previous: Option<Baseline>,
}

#[derive(Debug)]
struct Baseline {
    time_nanos: i64,
    types: Vec<(String, String)>,
    values: HashMap<u64, Vec<i64>>,
}

impl CumulativeDelta {
    /// Turns `profile` into the delta since the previous one. A profile
    /// with a duration (asked for with `?seconds=`) or with no cumulative
    /// sample type is passed through.
    pub fn apply(&mut self, mut profile: Profile) -> DeltaOutcome {
        let types: Vec<(String, String)> = (0..profile.sample_type.len())
            .map(|i| super::sample_type_name(&profile, i))
            .collect();
        let cumulative: Vec<usize> = types
            .iter()
            .enumerate()
            .filter(|(_, (kind, unit))| is_cumulative(kind, unit))
            .map(|(i, _)| i)
            .collect();
        if cumulative.is_empty() || profile.duration_nanos != 0 {
            self.previous = None;
            return DeltaOutcome::Ready(Box::new(profile));
        }
        // Samples of one stack and labels summed, as pprof's merge does.
        let mut current: HashMap<u64, Vec<i64>> = HashMap::with_capacity(profile.sample.len());
        let mut first_of: HashMap<u64, usize> = HashMap::with_capacity(profile.sample.len());
        let function_names: HashMap<u64, &str> = profile
            .function
            .iter()
            .map(|f| {
                let name = usize::try_from(f.name)
                    .ok()
                    .and_then(|i| profile.string_table.get(i));
                (f.id, name.map_or("", String::as_str))
            })
            .collect();
        let addresses: HashMap<u64, LocationKey<'_>> = profile
            .location
            .iter()
            .map(|l| (l.id, location_key(&function_names, l)))
            .collect();
        let keys: Vec<u64> = profile
            .sample
            .iter()
            .map(|s| sample_key(s, &addresses, &profile.string_table))
            .collect();
        for (i, (key, sample)) in keys.iter().zip(&profile.sample).enumerate() {
            let values: Vec<i64> = cumulative.iter().map(|&t| sample.value[t]).collect();
            match current.get_mut(key) {
                Some(sum) => {
                    for (s, v) in sum.iter_mut().zip(values) {
                        *s = s.saturating_add(v);
                    }
                }
                None => {
                    current.insert(*key, values);
                    first_of.insert(*key, i);
                }
            }
        }
        let previous = self.previous.take();
        let baseline = Baseline {
            time_nanos: profile.time_nanos,
            types,
            values: current,
        };
        let Some(previous) = previous.filter(|p| p.types == baseline.types) else {
            self.previous = Some(baseline);
            return DeltaOutcome::Baseline;
        };
        let went_down = previous.values.iter().any(|(key, old)| {
            baseline
                .values
                .get(key)
                .is_some_and(|new| new.iter().zip(old).any(|(n, o)| n < o))
        }) || baseline.time_nanos < previous.time_nanos;
        if went_down {
            self.previous = Some(baseline);
            return DeltaOutcome::Reset;
        }
        // The first sample of each key carries the key's delta; the other
        // values stay as they are (gauges); samples left all zero are dropped.
        let samples = std::mem::take(&mut profile.sample);
        for (i, (key, mut sample)) in keys.iter().zip(samples).enumerate() {
            if first_of.get(key) != Some(&i) {
                continue;
            }
            let (Some(now), old) = (baseline.values.get(key), previous.values.get(key)) else {
                continue;
            };
            for (slot, &t) in cumulative.iter().enumerate() {
                let before = old.map_or(0, |o| o[slot]);
                sample.value[t] = now[slot].saturating_sub(before);
            }
            if sample.value.iter().any(|&v| v != 0) {
                profile.sample.push(sample);
            }
        }
        profile.duration_nanos = baseline.time_nanos.saturating_sub(previous.time_nanos);
        self.previous = Some(baseline);
        DeltaOutcome::Ready(Box::new(profile))
    }
}

/// What identifies a location across scrapes: its address, or where the
/// profile has none, its functions and lines.
#[derive(Hash)]
enum LocationKey<'a> {
    Address(u64),
    Lines(Vec<(&'a str, i64)>),
}

fn location_key<'a>(
    function_names: &HashMap<u64, &'a str>,
    location: &crate::pprof::proto::Location,
) -> LocationKey<'a> {
    if location.address != 0 {
        return LocationKey::Address(location.address);
    }
    LocationKey::Lines(
        location
            .line
            .iter()
            .map(|l| {
                (
                    function_names.get(&l.function_id).copied().unwrap_or(""),
                    l.line,
                )
            })
            .collect(),
    )
}

fn sample_key(
    sample: &crate::pprof::proto::Sample,
    locations: &HashMap<u64, LocationKey<'_>>,
    strings: &[String],
) -> u64 {
    let string = |i: i64| usize::try_from(i).ok().and_then(|i| strings.get(i));
    let mut h = DefaultHasher::new();
    sample.location_id.len().hash(&mut h);
    for id in &sample.location_id {
        match locations.get(id) {
            Some(key) => key.hash(&mut h),
            None => id.hash(&mut h),
        }
    }
    let mut labels: Vec<_> = sample
        .label
        .iter()
        .map(|l| (string(l.key), string(l.str), l.num, string(l.num_unit)))
        .collect();
    labels.sort();
    labels.hash(&mut h);
    h.finish()
}
