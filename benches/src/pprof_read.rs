//! icecore's pprof output, read back: every sample of a directory of
//! gzipped files with its process and its frames, for the benchmarks that
//! judge what icecore wrote.

use std::{collections::HashMap, io::Read, path::Path};

use icecore_otlp::pprof::{LABEL_COMM, LABEL_PID, Profile};
use prost::Message;

/// One frame: the innermost function of its location (empty when
/// unsymbolized) and its mapping's file (empty without one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub function: String,
    pub mapping: String,
    pub address: u64,
}

impl Frame {
    /// Whether the frame is kernel code.
    pub fn is_kernel(&self) -> bool {
        self.mapping.starts_with("[kernel")
    }
}

/// One pprof sample.
#[derive(Debug, Clone)]
pub struct Sample {
    pub pid: Option<u32>,
    pub comm: String,
    pub count: u64,
    /// Leaf first.
    pub frames: Vec<Frame>,
}

impl Sample {
    /// The first frame that is not kernel code.
    pub fn user_leaf(&self) -> Option<&Frame> {
        self.frames.iter().find(|f| !f.is_kernel())
    }
}

/// Every sample of every file in `dir`.
pub fn read_dir(dir: &Path) -> anyhow::Result<Vec<Sample>> {
    let mut samples = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "gz") {
            continue;
        }
        let mut bytes = Vec::new();
        flate2::read::GzDecoder::new(std::fs::File::open(&path)?).read_to_end(&mut bytes)?;
        samples.extend(samples_of(&Profile::decode(bytes.as_slice())?));
    }
    Ok(samples)
}

/// The samples of one profile.
pub fn samples_of(profile: &Profile) -> Vec<Sample> {
    let string = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| profile.string_table.get(i))
            .map_or("", String::as_str)
    };
    let locations: HashMap<u64, _> = profile.location.iter().map(|l| (l.id, l)).collect();
    let functions: HashMap<u64, _> = profile.function.iter().map(|f| (f.id, f)).collect();
    let mappings: HashMap<u64, _> = profile.mapping.iter().map(|m| (m.id, m)).collect();
    profile
        .sample
        .iter()
        .map(|sample| {
            let label = |key: &str| sample.label.iter().find(|l| string(l.key) == key);
            let frames = sample
                .location_id
                .iter()
                .filter_map(|id| locations.get(id))
                .map(|location| Frame {
                    function: location
                        .line
                        .first()
                        .and_then(|line| functions.get(&line.function_id))
                        .map_or_else(String::new, |f| string(f.name).to_owned()),
                    mapping: mappings
                        .get(&location.mapping_id)
                        .map_or_else(String::new, |m| string(m.filename).to_owned()),
                    address: location.address,
                })
                .collect();
            Sample {
                pid: label(LABEL_PID).and_then(|l| u32::try_from(l.num).ok()),
                comm: label(LABEL_COMM).map_or_else(String::new, |l| string(l.str).to_owned()),
                count: sample
                    .value
                    .first()
                    .copied()
                    .unwrap_or(0)
                    .max(0)
                    .unsigned_abs(),
                frames,
            }
        })
        .collect()
}
