//! The labels of one process's series, as the pprof push sinks (Parca,
//! Pyroscope) send them: `__name__`, then the process's identity, all valid
//! Prometheus label names, then the labels relabeling gave it (which win,
//! but for `__name__`).

use crate::model::{ProcessProfile, ProfileBatch, ProfileKind};
use crate::pprof::encode_gzip;
use crate::scrape::ScrapedProfile;

/// The `__name__` of icecore's series: on-CPU profiles, as Parca and
/// Pyroscope name them.
pub const PROFILE_NAME: &str = "process_cpu";
/// The `__name__` of off-CPU series.
pub const OFF_CPU_PROFILE_NAME: &str = "off_cpu";
/// The `__name__` of wall-clock series.
pub const WALL_CLOCK_PROFILE_NAME: &str = "wall";

/// The `__name__` of a batch's series.
pub fn profile_name(kind: ProfileKind) -> &'static str {
    match kind {
        ProfileKind::Cpu => PROFILE_NAME,
        ProfileKind::OffCpu { .. } => OFF_CPU_PROFILE_NAME,
        ProfileKind::WallClock => WALL_CLOCK_PROFILE_NAME,
    }
}

/// `process`'s series labels in `batch`, `__name__` first.
pub(crate) fn labels(batch: &ProfileBatch, process: &ProcessProfile) -> Vec<(String, String)> {
    let info = &process.process;
    let mut labels = vec![
        label("__name__", profile_name(batch.kind)),
        label("pid", &info.pid.to_string()),
        label("comm", &info.executable_name),
        label("service_name", &info.service_name),
    ];
    if !info.executable_path.is_empty() {
        labels.push(label("executable", &info.executable_path));
    }
    if !info.container_id.is_empty() {
        labels.push(label("container_id", &info.container_id));
    }
    if !info.container_name.is_empty() {
        labels.push(label("container_name", &info.container_name));
    }
    if !info.k8s_pod_uid.is_empty() {
        labels.push(label("pod_uid", &info.k8s_pod_uid));
    }
    for (_, name, value) in info.k8s.fields() {
        labels.push(label(name, value));
    }
    if !batch.host_name.is_empty() {
        labels.push(label("node", &batch.host_name));
    }
    for (name, value) in info.labels.iter() {
        match labels.iter_mut().find(|(n, _)| n == &**name) {
            Some(existing) if &**name != "__name__" => existing.1 = value.to_string(),
            Some(_) => {}
            None => labels.push(label(name, value)),
        }
    }
    labels
}

/// A scraped profile's series labels: `__name__` (the profile's name),
/// then its labels (`job`, `instance`, the target's).
pub(crate) fn scraped_labels(scraped: &ScrapedProfile) -> Vec<(String, String)> {
    std::iter::once(label("__name__", &scraped.name))
        .chain(scraped.labels.iter().cloned())
        .collect()
}

fn label(name: &str, value: &str) -> (String, String) {
    (name.to_owned(), value.to_owned())
}

/// One series per process of `batch` with samples: `make` gets the
/// process and its profile as gzipped pprof. A process whose profile
/// cannot be encoded is left out, with a warning.
pub(crate) fn per_process<T>(
    batch: &ProfileBatch,
    make: impl Fn(&ProcessProfile, Vec<u8>) -> T,
) -> Vec<T> {
    batch
        .processes
        .iter()
        .filter(|p| p.samples.iter().any(|s| s.count > 0))
        .filter_map(|process| match encode_gzip(&one_process(batch, process)) {
            Ok(raw_profile) => Some(make(process, raw_profile)),
            Err(e) => {
                tracing::warn!(pid = process.process.pid, "pprof encoding failed: {e}");
                None
            }
        })
        .collect()
}

/// `batch` cut down to `process`: the profile of one series.
fn one_process(batch: &ProfileBatch, process: &ProcessProfile) -> ProfileBatch {
    ProfileBatch {
        kind: batch.kind,
        start_unix_nanos: batch.start_unix_nanos,
        duration_nanos: batch.duration_nanos,
        period_nanos: batch.period_nanos,
        host_name: batch.host_name.clone(),
        host: batch.host.clone(),
        processes: vec![process.clone()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_cpu_series_have_a_name_of_their_own() {
        let cpu = crate::test_fixtures::batch();
        let off_cpu = crate::test_fixtures::off_cpu_batch();
        let name = |batch: &ProfileBatch| labels(batch, &batch.processes[0])[0].clone();
        assert_eq!(
            name(&cpu),
            ("__name__".to_string(), PROFILE_NAME.to_string())
        );
        assert_eq!(
            name(&off_cpu),
            ("__name__".to_string(), OFF_CPU_PROFILE_NAME.to_string())
        );
    }
}
