//! Encodes a [`ProfileBatch`] as one pprof `perftools.profiles.Profile` with
//! two sample types, `samples/count` and `cpu/nanoseconds`. Mapping, location
//! and function IDs are dense (1..N in table order), which Parca requires.

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use flate2::Compression;
use flate2::write::GzEncoder;

use crate::model::{self, ProfileBatch, ProfileKind};

/// The pprof message types, generated from the vendored `proto/profile.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

pub use proto::Profile;
use proto::{Function, Label, Line, Location, Mapping, Sample, ValueType};

/// Numeric sample label: the process ID.
pub const LABEL_PID: &str = "pid";
/// String sample label: the process's executable name.
pub const LABEL_COMM: &str = "comm";
/// String sample label: the thread's name.
pub const LABEL_THREAD: &str = "thread";
/// Numeric sample label: the OS thread ID.
pub const LABEL_THREAD_ID: &str = "thread_id";
/// Numeric sample label: the logical CPU the sample was taken on.
pub const LABEL_CPU: &str = "cpu";
/// String sample label: the container's ID, when the process runs in one.
pub const LABEL_CONTAINER_ID: &str = "container_id";
/// String sample label: the Kubernetes pod's UID, when it runs in one.
pub const LABEL_POD_UID: &str = "pod_uid";

/// Why a pprof profile could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum PprofError {
    /// Gzip-compressing the encoded profile failed.
    #[error("gzip-compressing the pprof profile failed")]
    Gzip(#[source] std::io::Error),
}

/// Builds the pprof profile of `batch`; `sample.value` is `[n, n * period]`.
pub fn encode_profile(batch: &ProfileBatch) -> Profile {
    let mut b = Builder::default();
    b.string("");
    let (time, duration) = crate::otlp_encode::window(batch);
    let samples = ValueType {
        r#type: b.string("samples"),
        unit: b.string("count"),
    };
    // The second value is the time: CPU time (a period per sample), the
    // time waited off CPU (whose period is the context switches one
    // recorded wait stands for), or both for wall-clock time.
    let elapsed = ValueType {
        r#type: b.string(batch.kind.name()),
        unit: b.string("nanoseconds"),
    };
    b.profile.sample_type = vec![samples, elapsed];
    match batch.kind {
        ProfileKind::Cpu | ProfileKind::WallClock => {
            b.profile.period_type = Some(elapsed);
            b.profile.period = batch.period_nanos;
        }
        ProfileKind::OffCpu { one_in } => {
            b.profile.period_type = Some(ValueType {
                r#type: b.string("context_switch"),
                unit: b.string("count"),
            });
            b.profile.period = i64::try_from(one_in).unwrap_or(i64::MAX);
        }
    }
    b.profile.default_sample_type = elapsed.r#type;
    b.profile.time_nanos = i64::try_from(time).unwrap_or(i64::MAX);
    b.profile.duration_nanos = i64::try_from(duration).unwrap_or(i64::MAX);
    b.main_mapping(batch);
    for process in &batch.processes {
        b.add_process(process, batch.period_nanos);
    }
    b.profile
}

/// [`encode_profile`], serialized and gzipped: the on-disk pprof format.
pub fn encode_gzip(batch: &ProfileBatch) -> Result<Vec<u8>, PprofError> {
    gzip_encoded(&encode_profile(batch))
}

/// `profile`, serialized and gzipped.
pub fn gzip_encoded(profile: &Profile) -> Result<Vec<u8>, PprofError> {
    let bytes = prost::Message::encode_to_vec(profile);
    // Fastest level, as Go's pprof writer uses: this runs every batch on the
    // profiled host, and level 6 saves only about a tenth of the size for 3x the time.
    let mut gz = GzEncoder::new(Vec::with_capacity(bytes.len() / 4), Compression::fast());
    gz.write_all(&bytes).map_err(PprofError::Gzip)?;
    gz.finish().map_err(PprofError::Gzip)
}

/// Identity of a merged sample: stack, pid, thread ID, thread name, CPU and
/// the sample's own labels.
type SampleKey = (usize, u32, u32, i64, Option<u32>, model::Labels);
/// Identity of a mapping: start, limit, offset, filename and build ID.
type MappingKey = (u64, u64, u64, i64, i64);
/// Identity of a location: mapping ID, address and (function ID, line) per line.
type LocationKey = (u64, u64, Vec<(u64, i64, i64)>);

/// Profile builder; keys borrow from the batch (`'a`). Pointer caches skip
/// re-deriving frames and mappings the source shares as `Arc`s.
#[derive(Default)]
struct Builder<'a> {
    profile: Profile,
    strings: HashMap<&'a str, i64>,
    functions: HashMap<(i64, i64, i64), u64>,
    mappings: HashMap<MappingKey, u64>,
    locations: HashMap<LocationKey, u64>,
    stacks: HashMap<Vec<u64>, usize>,
    samples: HashMap<SampleKey, usize>,
    // Valid for 'a: the borrowed batch keeps every Arc alive.
    mapping_by_ptr: HashMap<*const model::Mapping, u64>,
    location_by_ptr: HashMap<*const model::Frame, u64>,
}

impl<'a> Builder<'a> {
    /// pprof readers take the first mapping for the profiled program
    /// (`go tool pprof` prints it as `File:`). With one process, that is its
    /// executable's mapping; a profile of several processes has no one
    /// program, so its first mapping is an empty placeholder rather than
    /// whichever binary happened to come first.
    fn main_mapping(&mut self, batch: &'a ProfileBatch) {
        match batch.processes.as_slice() {
            [] => {}
            [process] => {
                let executable = &*process.process.executable_path;
                let main = process
                    .samples
                    .iter()
                    .flat_map(|g| g.stack.iter())
                    .filter_map(|f| f.mapping.as_ref())
                    .find(|m| !executable.is_empty() && &*m.filename == executable);
                if let Some(mapping) = main {
                    self.mapping(mapping);
                }
            }
            _ => self.profile.mapping.push(Mapping {
                id: 1,
                ..Mapping::default()
            }),
        }
    }

    fn string(&mut self, s: &'a str) -> i64 {
        let table = &mut self.profile.string_table;
        *self.strings.entry(s).or_insert_with(|| {
            table.push(s.to_owned());
            to_i64(table.len() - 1)
        })
    }

    fn add_process(&mut self, process: &'a model::ProcessProfile, period: i64) {
        let pid = process.process.pid;
        let comm = self.string(&process.process.executable_name);
        for group in &process.samples {
            let n = i64::try_from(group.count).unwrap_or(i64::MAX);
            if n == 0 {
                continue;
            }
            let location_ids: Vec<u64> = group.stack.iter().map(|f| self.location(f)).collect();
            let next_stack = self.stacks.len();
            let stack = *self
                .stacks
                .entry(location_ids.clone())
                .or_insert(next_stack);
            let thread = self.string(&group.thread_name);
            let key = (
                stack,
                pid,
                group.thread_id,
                thread,
                group.cpu,
                group.labels.clone(),
            );
            let nanos = i64::try_from(group.total_nanos(period)).unwrap_or(i64::MAX);
            if let Some(&at) = self.samples.get(&key) {
                let value = &mut self.profile.sample[at].value;
                value[0] = value[0].saturating_add(n);
                value[1] = value[1].saturating_add(nanos);
                continue;
            }
            let mut label = vec![
                Label {
                    key: self.string(LABEL_PID),
                    num: i64::from(pid),
                    ..Label::default()
                },
                Label {
                    key: self.string(LABEL_COMM),
                    str: comm,
                    ..Label::default()
                },
                Label {
                    key: self.string(LABEL_THREAD),
                    str: thread,
                    ..Label::default()
                },
                Label {
                    key: self.string(LABEL_THREAD_ID),
                    num: i64::from(group.thread_id),
                    ..Label::default()
                },
            ];
            if let Some(cpu) = group.cpu {
                label.push(Label {
                    key: self.string(LABEL_CPU),
                    num: i64::from(cpu),
                    ..Label::default()
                });
            }

            let k8s = process
                .process
                .k8s
                .fields()
                .map(|(_, name, value)| (name, value));
            let ids = [
                (LABEL_CONTAINER_ID, &*process.process.container_id),
                ("container_name", &*process.process.container_name),
                (LABEL_POD_UID, &*process.process.k8s_pod_uid),
            ];
            for (key, value) in ids.into_iter().chain(k8s) {
                if !value.is_empty() {
                    label.push(Label {
                        key: self.string(key),
                        str: self.string(value),
                        ..Label::default()
                    });
                }
            }
            // The process's labels, then the samples' own (by thread or
            // CPU), each replacing a label of the same name.
            for (name, value) in process.process.labels.iter().chain(group.labels.iter()) {
                let (key, str) = (self.string(name), self.string(value));
                match label.iter_mut().find(|l| l.key == key) {
                    Some(existing) => {
                        existing.str = str;
                        existing.num = 0;
                    }
                    None => label.push(Label {
                        key,
                        str,
                        ..Label::default()
                    }),
                }
            }
            self.samples.insert(key, self.profile.sample.len());
            self.profile.sample.push(Sample {
                location_id: location_ids,
                value: vec![n, nanos],
                label,
            });
        }
    }

    fn mapping(&mut self, mapping: &'a Arc<model::Mapping>) -> u64 {
        let ptr = Arc::as_ptr(mapping);
        if let Some(&id) = self.mapping_by_ptr.get(&ptr) {
            return id;
        }
        let filename = self.string(&mapping.filename);
        let build_id = mapping.build_id.as_deref().map_or(0, |b| self.string(b));
        let key = (
            mapping.memory_start,
            mapping.memory_limit,
            mapping.file_offset,
            filename,
            build_id,
        );
        let table = &mut self.profile.mapping;
        let id = *self.mappings.entry(key).or_insert_with(|| {
            let id = to_u64(table.len() + 1);
            table.push(Mapping {
                id,
                memory_start: key.0,
                memory_limit: key.1,
                file_offset: key.2,
                filename,
                build_id,
                ..Mapping::default()
            });
            id
        });
        self.mapping_by_ptr.insert(ptr, id);
        id
    }

    fn function(&mut self, line: &'a model::Line) -> u64 {
        let key = (
            self.string(&line.function_name),
            self.string(&line.system_name),
            line.filename.as_deref().map_or(0, |f| self.string(f)),
        );
        let table = &mut self.profile.function;
        *self.functions.entry(key).or_insert_with(|| {
            let id = to_u64(table.len() + 1);
            table.push(Function {
                id,
                name: key.0,
                system_name: key.1,
                filename: key.2,
                start_line: 0,
            });
            id
        })
    }

    fn location(&mut self, frame: &'a Arc<model::Frame>) -> u64 {
        let ptr = Arc::as_ptr(frame);
        if let Some(&id) = self.location_by_ptr.get(&ptr) {
            return id;
        }
        let mapping_id = frame.mapping.as_ref().map_or(0, |m| self.mapping(m));
        // Model lines are innermost first, as pprof wants.
        let lines: Vec<(u64, i64, i64)> = frame
            .lines
            .iter()
            .map(|l| (self.function(l), i64::from(l.line), i64::from(l.column)))
            .collect();
        let key = (mapping_id, frame.address, lines);
        let id = match self.locations.get(&key) {
            Some(&id) => id,
            None => {
                let id = to_u64(self.profile.location.len() + 1);
                self.note_symbols(mapping_id, frame);
                self.profile.location.push(Location {
                    id,
                    mapping_id,
                    address: frame.address,
                    line: key
                        .2
                        .iter()
                        .map(|&(function_id, line, column)| Line {
                            function_id,
                            line,
                            column,
                        })
                        .collect(),
                    is_folded: false,
                });
                self.locations.insert(key, id);
                id
            }
        };
        self.location_by_ptr.insert(ptr, id);
        id
    }

    /// Records on the mapping which symbol information its locations carry,
    /// so pprof tools know whether it still needs symbolizing.
    fn note_symbols(&mut self, mapping_id: u64, frame: &model::Frame) {
        let Some(index) = mapping_id.checked_sub(1) else {
            return;
        };
        let Some(m) = usize::try_from(index)
            .ok()
            .and_then(|i| self.profile.mapping.get_mut(i))
        else {
            return;
        };
        if frame.lines.is_empty() {
            return;
        }
        m.has_functions = true;
        m.has_filenames |= frame.lines.iter().any(|l| l.filename.is_some());
        m.has_line_numbers |= frame.lines.iter().any(|l| l.line != 0);
        m.has_inline_frames |= frame.lines.len() > 1;
    }
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
