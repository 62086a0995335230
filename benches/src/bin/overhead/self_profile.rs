//! Where icecore's own CPU time goes: icecore profiles the whole host, itself
//! included, so its pprof files hold its own samples. The functions they end
//! in (self time) show what to optimize when a target is missed.

use std::{collections::HashMap, path::Path};

use icecore_benches::pprof_read;

/// Samples of one process in a directory of gzipped pprof files, by the
/// function each stack ends in (its leaf, inlined frames resolved).
pub struct SelfProfile {
    pub samples: u64,
    /// (function, samples), most first.
    pub leaves: Vec<(String, u64)>,
}

impl SelfProfile {
    pub fn read(dir: &Path, pid: u32) -> anyhow::Result<SelfProfile> {
        Ok(Self::of(&pprof_read::read_dir(dir)?, pid))
    }

    fn of(samples: &[pprof_read::Sample], pid: u32) -> SelfProfile {
        let mut leaves: HashMap<String, u64> = HashMap::new();
        let mut total = 0;
        for sample in samples.iter().filter(|s| s.pid == Some(pid)) {
            total += sample.count;
            let leaf = sample
                .frames
                .first()
                .map(|f| f.function.as_str())
                .filter(|f| !f.is_empty())
                .unwrap_or("(unsymbolized)");
            *leaves.entry(shorten(leaf)).or_default() += sample.count;
        }
        let mut leaves: Vec<_> = leaves.into_iter().collect();
        leaves.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        SelfProfile {
            samples: total,
            leaves,
        }
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
    use icecore_otlp::pprof::{
        Profile,
        proto::{Function, Label, Line, Location, Sample},
    };

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
        let of_42 = SelfProfile::of(&pprof_read::samples_of(&profile), 42);
        assert_eq!(of_42.samples, 3);
        assert_eq!(of_42.leaves, vec![("leaf".to_owned(), 3)]);
    }
}
