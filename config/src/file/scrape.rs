//! `scrape_configs`: a list of Parca-shaped scrape jobs. An error names the
//! job by its position (from 1) and, once known, its `job_name`.

use std::time::Duration;

use serde_norway::{Mapping, Value};

use super::{Reader, describe, scalar_text};
use crate::ConfigError;
use crate::scrape::{
    PprofEntry, ScrapeConfig, ScrapeError, ScrapeScheme, ScrapeSpec, ScrapeTarget, check_jobs,
};
use crate::validate::Invalid;

const KEY: &str = "scrape_configs";
const EXPECTED_JOBS: &str = "a list of scrape jobs";
const EXPECTED_JOB: &str = "a scrape job";
const JOB_KEYS: &str = "job_name, scrape_interval, scrape_timeout, scheme, tls_config, static_configs, profiling_config";

impl Reader<'_> {
    /// `scrape_configs`: each job read, defaulted and checked.
    pub(super) fn scrape_configs(&self) -> Result<Option<Vec<ScrapeConfig>>, ConfigError> {
        let Some(value) = self.get(KEY) else {
            return Ok(None);
        };
        let Value::Sequence(items) = value else {
            return Err(self.invalid(KEY, value, &Invalid::new(EXPECTED_JOBS)));
        };
        let job_error = |index: usize, item: &Value, detail: String| {
            self.invalid(
                KEY,
                item,
                &Invalid::because(EXPECTED_JOB, format!("job {index}{}", detail)),
            )
        };
        let mut jobs = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let index = i + 1;
            let spec = job_spec(item).map_err(|e| job_error(index, item, format!(": {e}")))?;
            let name = spec.job_name.clone().unwrap_or_default();
            let job = ScrapeConfig::new(spec)
                .map_err(|e| job_error(index, item, format!(" ({name:?}): {e}")))?;
            jobs.push(job);
        }
        check_jobs(&jobs)
            .map_err(|(index, e)| job_error(index, &items[index - 1], format!(": {e}")))?;
        Ok(Some(jobs))
    }
}

/// The written fields of one job.
fn job_spec(item: &Value) -> Result<ScrapeSpec, String> {
    let fields = mapping(item, "not a mapping")?;
    let mut spec = ScrapeSpec::default();
    for (name, field) in fields {
        let name = key_name(name)?;
        match name {
            "job_name" => spec.job_name = Some(text(field, name)?),
            "scrape_interval" => spec.scrape_interval = Some(duration(field, name)?),
            "scrape_timeout" => spec.scrape_timeout = Some(duration(field, name)?),
            "scheme" => {
                spec.scheme = Some(match text(field, name)?.as_str() {
                    "http" => ScrapeScheme::Http,
                    "https" => ScrapeScheme::Https,
                    other => return Err(format!("scheme {other:?} is not http or https")),
                });
            }
            "tls_config" => {
                for (key, value) in mapping(field, "tls_config is not a mapping")? {
                    match key_name(key)? {
                        "ca_file" => {
                            let path = text(value, "ca_file")?;
                            crate::export::pem_file(&path).map_err(|e| {
                                format!("tls_config.ca_file: {}", e.file_message(&describe(value)))
                            })?;
                            spec.ca_file = Some(path.into());
                        }
                        "insecure_skip_verify" => {
                            spec.insecure_skip_verify = boolean(value, "insecure_skip_verify")?;
                        }
                        other => {
                            return Err(format!(
                                "unknown key tls_config.{other}; expected ca_file, insecure_skip_verify"
                            ));
                        }
                    }
                }
            }
            "static_configs" => {
                let Value::Sequence(groups) = field else {
                    return Err("static_configs is not a list".to_owned());
                };
                for group in groups {
                    spec.targets.extend(static_group(group)?);
                }
            }
            "profiling_config" => profiling(field, &mut spec)?,
            other => return Err(format!("unknown key {other:?}; expected {JOB_KEYS}")),
        }
    }
    Ok(spec)
}

/// One `static_configs` entry: `targets` and the `labels` they share.
fn static_group(group: &Value) -> Result<Vec<ScrapeTarget>, String> {
    let fields = mapping(group, "a static_configs entry is not a mapping")?;
    let mut addresses = Vec::new();
    let mut labels = Vec::new();
    for (key, value) in fields {
        match key_name(key)? {
            "targets" => {
                let Value::Sequence(items) = value else {
                    return Err("static_configs targets is not a list of host:port".to_owned());
                };
                for item in items {
                    addresses.push(text(item, "a target")?);
                }
            }
            "labels" => {
                for (name, label) in mapping(value, "labels is not a mapping")? {
                    labels.push((key_name(name)?.to_owned(), text(label, "a label value")?));
                }
            }
            other => {
                return Err(format!(
                    "unknown key static_configs.{other}; expected targets, labels"
                ));
            }
        }
    }
    Ok(addresses
        .into_iter()
        .map(|address| ScrapeTarget {
            address,
            labels: labels.clone(),
        })
        .collect())
}

/// `profiling_config`: `path_prefix` and `pprof_config`.
fn profiling(field: &Value, spec: &mut ScrapeSpec) -> Result<(), String> {
    for (key, value) in mapping(field, "profiling_config is not a mapping")? {
        match key_name(key)? {
            "path_prefix" => spec.path_prefix = Some(text(value, "path_prefix")?),
            "pprof_config" => {
                for (name, entry) in mapping(value, "pprof_config is not a mapping")? {
                    let name = key_name(name)?.to_owned();
                    spec.pprof.push((name.clone(), pprof_entry(&name, entry)?));
                }
            }
            other => {
                return Err(format!(
                    "unknown key profiling_config.{other}; expected path_prefix, pprof_config"
                ));
            }
        }
    }
    Ok(())
}

fn pprof_entry(name: &str, entry: &Value) -> Result<PprofEntry, String> {
    let mut out = PprofEntry::default();
    if entry.is_null() {
        return Ok(out);
    }
    for (key, value) in mapping(entry, &format!("pprof_config.{name} is not a mapping"))? {
        match key_name(key)? {
            "enabled" => out.enabled = Some(boolean(value, "enabled")?),
            "path" => out.path = Some(text(value, "path")?),
            "delta" => out.delta = Some(boolean(value, "delta")?),
            "seconds" => {
                let seconds = value
                    .as_u64()
                    .and_then(|s| u32::try_from(s).ok())
                    .ok_or_else(|| format!("pprof_config.{name}.seconds is not a whole number"))?;
                if seconds == 0 {
                    return Err(ScrapeError::ZeroSeconds(name.to_owned()).to_string());
                }
                out.seconds = Some(seconds);
            }
            other => {
                return Err(format!(
                    "unknown key pprof_config.{name}.{other}; expected enabled, path, delta, seconds"
                ));
            }
        }
    }
    Ok(out)
}

fn mapping<'v>(value: &'v Value, what: &str) -> Result<&'v Mapping, String> {
    match value {
        Value::Mapping(m) => Ok(m),
        _ => Err(what.to_owned()),
    }
}

fn key_name(key: &Value) -> Result<&str, String> {
    match key {
        Value::String(k) => Ok(k),
        other => Err(format!("key {} is not a string", describe(other))),
    }
}

fn text(value: &Value, what: &str) -> Result<String, String> {
    scalar_text(value).ok_or_else(|| format!("{what} is not a string"))
}

fn boolean(value: &Value, what: &str) -> Result<bool, String> {
    value
        .as_bool()
        .ok_or_else(|| format!("{what} is not true or false"))
}

fn duration(value: &Value, what: &str) -> Result<Duration, String> {
    let written = text(value, what)?;
    humantime::parse_duration(written.trim())
        .map_err(|e| format!("{what} {written:?} is not a duration like 10s: {e}"))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{error, parse_text};

    #[test]
    fn parca_shaped_jobs_are_read() {
        let settings = parse_text(
            "scrape_configs:\n\
             - job_name: shop\n\
             \x20 scrape_interval: 5s\n\
             \x20 static_configs:\n\
             \x20 - targets: ['127.0.0.1:6060', 'cart:6060']\n\
             \x20   labels: {env: prod}\n\
             \x20 profiling_config:\n\
             \x20   pprof_config:\n\
             \x20     memory: {enabled: false}\n\
             \x20     fgprof: {enabled: true}\n",
        )
        .expect("valid jobs");
        let jobs = settings.scrape_configs.expect("jobs");
        assert_eq!(jobs.len(), 1);
        let job = &jobs[0];
        assert_eq!(job.job_name, "shop");
        assert_eq!(job.scrape_timeout.as_secs(), 8);
        assert_eq!(job.targets.len(), 2);
        assert_eq!(
            job.targets[1].labels,
            [("env".to_owned(), "prod".to_owned())]
        );
        let names: Vec<&str> = job.profiles.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["process_cpu", "block", "mutex", "goroutine", "fgprof"]
        );
    }

    #[test]
    fn bad_jobs_are_named() {
        let unknown = error("scrape_configs:\n- job_name: a\n  targets: [x]\n");
        assert!(
            unknown.contains("job 1: unknown key \"targets\""),
            "{unknown}"
        );
        let no_targets = error("scrape_configs:\n- job_name: a\n");
        assert!(
            no_targets.contains("job 1 (\"a\"): static_configs lists no targets"),
            "{no_targets}"
        );
        let duplicate = error(
            "scrape_configs:\n\
             - {job_name: a, static_configs: [{targets: ['x:1']}]}\n\
             - {job_name: a, static_configs: [{targets: ['y:1']}]}\n",
        );
        assert!(duplicate.contains("job 2: job_name \"a\""), "{duplicate}");
        let interval = error(
            "scrape_configs:\n- {job_name: a, scrape_interval: soon, static_configs: [{targets: ['x:1']}]}\n",
        );
        assert!(interval.contains("scrape_interval \"soon\""), "{interval}");
        let seconds = error(
            "scrape_configs:\n- job_name: a\n  static_configs: [{targets: ['x:1']}]\n  profiling_config: {pprof_config: {process_cpu: {seconds: 0}}}\n",
        );
        assert!(seconds.contains("at least 1"), "{seconds}");
    }
}
