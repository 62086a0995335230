//! Where icecore's own CPU time goes: icecore profiles the whole host, itself
//! included, so its pprof files hold its own samples. The functions they end
//! in (self time) show what to optimize when a target is missed.

use std::{collections::HashMap, io::Read, path::Path};

use icecore_otlp::pprof::{LABEL_PID, Profile};
use prost::Message;

/// Samples of one process in a directory of gzipped pprof files, by the
/// function each stack ends in (its leaf, inlined frames resolved).
pub struct SelfProfile {
    pub samples: u64,
    /// (function, samples), most first.
    pub leaves: Vec<(String, u64)>,
}

impl SelfProfile {
    pub fn read(dir: &Path, pid: u32) -> anyhow::Result<SelfProfile> {
        let mut leaves: HashMap<String, u64> = HashMap::new();
        let mut samples = 0;
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            let mut bytes = Vec::new();
            flate2::read::GzDecoder::new(std::fs::File::open(&path)?).read_to_end(&mut bytes)?;
            let profile = Profile::decode(bytes.as_slice())?;
            tally(&profile, pid, &mut samples, &mut leaves);
        }
        let mut leaves: Vec<_> = leaves.into_iter().collect();
        leaves.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Ok(SelfProfile { samples, leaves })
    }
}

fn tally(profile: &Profile, pid: u32, samples: &mut u64, leaves: &mut HashMap<String, u64>) {
    let string = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| profile.string_table.get(i))
            .map_or("", String::as_str)
    };
    let locations: HashMap<u64, _> = profile.location.iter().map(|l| (l.id, l)).collect();
    let functions: HashMap<u64, _> = profile.function.iter().map(|f| (f.id, f)).collect();
    for sample in &profile.sample {
        let of_pid = sample
            .label
            .iter()
            .any(|l| string(l.key) == LABEL_PID && l.num == i64::from(pid));
        if !of_pid {
            continue;
        }
        let count = sample.value.first().copied().unwrap_or(0).max(0) as u64;
        *samples += count;
        // Leaf location first; within it, the innermost inlined line first.
        let leaf = sample
            .location_id
            .first()
            .and_then(|id| locations.get(id))
            .and_then(|l| l.line.first())
            .and_then(|line| functions.get(&line.function_id))
            .map_or("(unsymbolized)", |f| string(f.name));
        *leaves.entry(shorten(leaf)).or_default() += count;
    }
}

/// A Rust path without its generic arguments, which make names unreadably
/// long in a table.
fn shorten(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut depth = 0usize;
    for c in name.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    if out.is_empty() { name.to_owned() } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;
    use icecore_otlp::pprof::proto::{Function, Label, Line, Location, Sample};

    #[test]
    fn shortens_generics() {
        assert_eq!(
            shorten("hashbrown::raw::RawTable<T,A>::find<F>"),
            "hashbrown::raw::RawTable::find"
        );
        assert_eq!(shorten("memcpy"), "memcpy");
    }

    #[test]
    fn tallies_the_leaf_of_one_pid() {
        let profile = Profile {
            string_table: vec!["".into(), "pid".into(), "leaf".into(), "caller".into()],
            function: vec![
                Function {
                    id: 1,
                    name: 2,
                    ..Default::default()
                },
                Function {
                    id: 2,
                    name: 3,
                    ..Default::default()
                },
            ],
            location: vec![Location {
                id: 10,
                line: vec![
                    Line {
                        function_id: 1,
                        ..Default::default()
                    },
                    Line {
                        function_id: 2,
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            sample: vec![
                Sample {
                    location_id: vec![10],
                    value: vec![3, 3000],
                    label: vec![Label {
                        key: 1,
                        num: 42,
                        ..Default::default()
                    }],
                },
                Sample {
                    location_id: vec![10],
                    value: vec![5, 5000],
                    label: vec![Label {
                        key: 1,
                        num: 7,
                        ..Default::default()
                    }],
                },
            ],
            ..Default::default()
        };
        let (mut samples, mut leaves) = (0, HashMap::new());
        tally(&profile, 42, &mut samples, &mut leaves);
        assert_eq!(samples, 3);
        assert_eq!(leaves.get("leaf"), Some(&3));
        assert_eq!(leaves.len(), 1);
    }
}
