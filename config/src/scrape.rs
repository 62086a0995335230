//! `scrape_configs`: applications' pprof HTTP endpoints that the agent
//! pulls, in Parca's shape (`job_name`, `scrape_interval`, `scrape_timeout`,
//! `scheme`, `static_configs`, `profiling_config.pprof_config`).
//!
//! Two departures from Parca, both towards what a user means: an entry for
//! a known profile (`process_cpu: {path: /x}`) keeps the default's `delta`
//! unless it sets its own (Parca resets it to false), and a scrape timeout
//! need only exceed the longest `seconds` a delta profile asks for, not the
//! whole interval.

use std::time::Duration;

use crate::relabel::is_label_name;

/// Default `scrape_interval`, as in Parca.
pub const DEFAULT_SCRAPE_INTERVAL: Duration = Duration::from_secs(10);
/// What a default `scrape_timeout` adds to the interval, as in Parca.
pub const DEFAULT_TIMEOUT_MARGIN: Duration = Duration::from_secs(3);
/// Shortest accepted `scrape_interval`.
pub const MIN_SCRAPE_INTERVAL: Duration = Duration::from_secs(1);
/// Longest accepted `scrape_interval`.
pub const MAX_SCRAPE_INTERVAL: Duration = Duration::from_secs(3600);
/// Most (target, profile) pairs over all jobs: each holds a scrape task and,
/// for cumulative profiles, the previous profile's values.
pub const MAX_SCRAPES: usize = 1000;

/// The profiles every job scrapes unless told otherwise: name (`__name__`),
/// path, whether it asks the target for a delta over the interval
/// (`?seconds=`), and whether it is on by default. As Parca's and Grafana
/// Alloy's defaults; `fgprof` (wall-clock, from the `fgprof` package) is off.
pub const DEFAULT_PROFILES: [(&str, &str, bool, bool); 6] = [
    ("process_cpu", "/debug/pprof/profile", true, true),
    ("memory", "/debug/pprof/allocs", false, true),
    ("block", "/debug/pprof/block", false, true),
    ("mutex", "/debug/pprof/mutex", false, true),
    ("goroutine", "/debug/pprof/goroutine", false, true),
    ("fgprof", "/debug/fgprof", true, false),
];

/// `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScrapeScheme {
    /// Plain HTTP (the default).
    #[default]
    Http,
    /// HTTPS, checked against the system's roots (or `tls_config.ca_file`).
    Https,
}

impl ScrapeScheme {
    /// `http` or `https`.
    pub fn as_str(self) -> &'static str {
        match self {
            ScrapeScheme::Http => "http",
            ScrapeScheme::Https => "https",
        }
    }
}

/// One scrape job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeConfig {
    /// The `job` label of every profile the job scrapes.
    pub job_name: String,
    /// How often each target is scraped.
    pub scrape_interval: Duration,
    /// How long one scrape may take, the profile's own duration included.
    pub scrape_timeout: Duration,
    /// How targets are reached.
    pub scheme: ScrapeScheme,
    /// CA file for `https` targets, if not the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// Whether `https` targets' certificates go unchecked.
    pub insecure_skip_verify: bool,
    /// The targets, each with its labels.
    pub targets: Vec<ScrapeTarget>,
    /// The enabled profiles.
    pub profiles: Vec<PprofEndpoint>,
}

/// One `host:port` of a `static_configs` group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeTarget {
    /// `host:port`, as written (becomes the `instance` label).
    pub address: String,
    /// The group's `labels`, checked label names.
    pub labels: Vec<(String, String)>,
}

/// One enabled profile of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PprofEndpoint {
    /// The profile's name (`__name__`): `process_cpu`, `memory`...
    pub name: String,
    /// The URL path, `path_prefix` included.
    pub path: String,
    /// `?seconds=N` is sent: the target profiles N seconds (CPU) or answers
    /// with the difference over N seconds (Go's allocs, block, mutex).
    pub seconds: Option<u32>,
}

/// A `profiling_config.pprof_config` entry as written; `None` is unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PprofEntry {
    /// `enabled`.
    pub enabled: Option<bool>,
    /// `path`.
    pub path: Option<String>,
    /// `delta`.
    pub delta: Option<bool>,
    /// `seconds`.
    pub seconds: Option<u32>,
}

/// A job as written, before defaults and checks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrapeSpec {
    /// `job_name`.
    pub job_name: Option<String>,
    /// `scrape_interval`.
    pub scrape_interval: Option<Duration>,
    /// `scrape_timeout`.
    pub scrape_timeout: Option<Duration>,
    /// `scheme`.
    pub scheme: Option<ScrapeScheme>,
    /// `tls_config.ca_file`.
    pub ca_file: Option<std::path::PathBuf>,
    /// `tls_config.insecure_skip_verify`.
    pub insecure_skip_verify: bool,
    /// `static_configs`, flattened.
    pub targets: Vec<ScrapeTarget>,
    /// `profiling_config.path_prefix`.
    pub path_prefix: Option<String>,
    /// `profiling_config.pprof_config`, in the order written.
    pub pprof: Vec<(String, PprofEntry)>,
}

/// What is wrong with a scrape job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScrapeError {
    /// `job_name` is missing or empty.
    #[error("job_name is missing")]
    NoJobName,
    /// Two jobs have the same `job_name`.
    #[error("job_name {0:?} is used by an earlier job")]
    DuplicateJob(String),
    /// `scrape_interval` is outside 1s..=1h.
    #[error("scrape_interval must be from 1s to 1h")]
    BadInterval,
    /// The timeout would cut off a profile the job asks for.
    #[error(
        "scrape_timeout ({timeout:?}) must be longer than the {seconds} s the {profile} profile takes"
    )]
    TimeoutTooShort {
        /// The timeout.
        timeout: Duration,
        /// The profile.
        profile: String,
        /// Its `seconds`.
        seconds: u32,
    },
    /// `scrape_timeout` is zero.
    #[error("scrape_timeout must be above 0")]
    ZeroTimeout,
    /// No `static_configs` target.
    #[error("static_configs lists no targets")]
    NoTargets,
    /// A target is not `host:port`.
    #[error("target {0:?} is not host:port (the scheme goes in `scheme`, the path in `path`)")]
    BadAddress(String),
    /// A label name is not a Prometheus label name, or is reserved.
    #[error("label {0:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)")]
    BadLabel(String),
    /// A profile name is not a label value icecore can use as `__name__`.
    #[error("profile name {0:?} is not [a-zA-Z_][a-zA-Z0-9_]*")]
    BadProfileName(String),
    /// A custom profile has no `path`.
    #[error("profile {0:?} is not one of the defaults, so it needs a path")]
    NoPath(String),
    /// A path or prefix does not start with `/`, or has a query.
    #[error("{0:?} is not an absolute URL path without a query")]
    BadPath(String),
    /// `seconds` is 0.
    #[error("seconds of profile {0:?} must be at least 1")]
    ZeroSeconds(String),
    /// Every profile is disabled.
    #[error("every profile is disabled")]
    NoProfiles,
    /// TLS options on an `http` job.
    #[error("tls_config is set but scheme is http")]
    TlsWithoutHttps,
    /// Too many (target, profile) pairs over all jobs.
    #[error("the jobs scrape {0} target profiles; at most {MAX_SCRAPES} are allowed")]
    TooMany(usize),
}

impl ScrapeConfig {
    /// Applies the defaults to `spec` and checks it.
    pub fn new(spec: ScrapeSpec) -> Result<Self, ScrapeError> {
        let job_name = spec
            .job_name
            .filter(|n| !n.trim().is_empty())
            .ok_or(ScrapeError::NoJobName)?;
        let scrape_interval = spec.scrape_interval.unwrap_or(DEFAULT_SCRAPE_INTERVAL);
        if !(MIN_SCRAPE_INTERVAL..=MAX_SCRAPE_INTERVAL).contains(&scrape_interval) {
            return Err(ScrapeError::BadInterval);
        }
        let scrape_timeout = spec
            .scrape_timeout
            .unwrap_or(scrape_interval + DEFAULT_TIMEOUT_MARGIN);
        if scrape_timeout.is_zero() {
            return Err(ScrapeError::ZeroTimeout);
        }
        let scheme = spec.scheme.unwrap_or_default();
        if scheme == ScrapeScheme::Http && (spec.ca_file.is_some() || spec.insecure_skip_verify) {
            return Err(ScrapeError::TlsWithoutHttps);
        }
        if spec.targets.is_empty() {
            return Err(ScrapeError::NoTargets);
        }
        for target in &spec.targets {
            check_address(&target.address)?;
            for (name, _) in &target.labels {
                if !is_label_name(name) || name.starts_with("__") {
                    return Err(ScrapeError::BadLabel(name.clone()));
                }
            }
        }
        let prefix = match spec.path_prefix.as_deref() {
            None | Some("") => "",
            Some(p) => {
                check_path(p)?;
                p.trim_end_matches('/')
            }
        };
        let profiles = profiles(&spec.pprof, prefix, scrape_interval)?;
        if let Some(longest) = profiles
            .iter()
            .filter(|p| p.seconds.is_some())
            .max_by_key(|p| p.seconds)
            && let Some(seconds) = longest.seconds
            && scrape_timeout <= Duration::from_secs(u64::from(seconds))
        {
            return Err(ScrapeError::TimeoutTooShort {
                timeout: scrape_timeout,
                profile: longest.name.clone(),
                seconds,
            });
        }
        Ok(ScrapeConfig {
            job_name,
            scrape_interval,
            scrape_timeout,
            scheme,
            ca_file: spec.ca_file,
            insecure_skip_verify: spec.insecure_skip_verify,
            targets: spec.targets,
            profiles,
        })
    }
}

/// Checks the jobs together: names unique, the total bounded.
pub fn check_jobs(jobs: &[ScrapeConfig]) -> Result<(), (usize, ScrapeError)> {
    for (i, job) in jobs.iter().enumerate() {
        if jobs[..i].iter().any(|j| j.job_name == job.job_name) {
            return Err((i + 1, ScrapeError::DuplicateJob(job.job_name.clone())));
        }
    }
    let total: usize = jobs
        .iter()
        .map(|j| j.targets.len() * j.profiles.len())
        .sum();
    if total > MAX_SCRAPES {
        return Err((jobs.len(), ScrapeError::TooMany(total)));
    }
    Ok(())
}

/// The enabled profiles: the defaults, with the written entries over them.
fn profiles(
    written: &[(String, PprofEntry)],
    prefix: &str,
    interval: Duration,
) -> Result<Vec<PprofEndpoint>, ScrapeError> {
    let interval_seconds = u32::try_from(interval.as_secs().max(1)).unwrap_or(u32::MAX);
    let mut out = Vec::new();
    let defaults = DEFAULT_PROFILES
        .iter()
        .map(|&(name, path, delta, enabled)| {
            let entry = written.iter().find(|(n, _)| n == name).map(|(_, e)| e);
            (
                name.to_owned(),
                Some((path, delta, enabled)),
                entry.cloned(),
            )
        });
    let custom = written
        .iter()
        .filter(|(name, _)| !DEFAULT_PROFILES.iter().any(|d| d.0 == name))
        .map(|(name, entry)| (name.clone(), None, Some(entry.clone())));
    for (name, default, entry) in defaults.chain(custom) {
        if !is_label_name(&name) {
            return Err(ScrapeError::BadProfileName(name));
        }
        let entry = entry.unwrap_or_default();
        let enabled = entry.enabled.unwrap_or(default.is_none_or(|(_, _, on)| on));
        if !enabled {
            continue;
        }
        let path = match (entry.path, default) {
            (Some(path), _) => path,
            (None, Some((path, _, _))) => path.to_owned(),
            (None, None) => return Err(ScrapeError::NoPath(name)),
        };
        check_path(&path)?;
        let delta = entry
            .delta
            .unwrap_or(default.is_some_and(|(_, delta, _)| delta));
        if entry.seconds == Some(0) {
            return Err(ScrapeError::ZeroSeconds(name));
        }
        let seconds = delta.then(|| entry.seconds.unwrap_or(interval_seconds));
        out.push(PprofEndpoint {
            name,
            path: format!("{prefix}{path}"),
            seconds,
        });
    }
    if out.is_empty() {
        return Err(ScrapeError::NoProfiles);
    }
    Ok(out)
}

fn check_path(path: &str) -> Result<(), ScrapeError> {
    if !path.starts_with('/') || path.contains(['?', '#', ' ']) {
        return Err(ScrapeError::BadPath(path.to_owned()));
    }
    Ok(())
}

/// `host:port` or `host` (port 80 or 443 by scheme); `[v6]:port` too.
fn check_address(address: &str) -> Result<(), ScrapeError> {
    let bad = || ScrapeError::BadAddress(address.to_owned());
    if address.is_empty() || address.contains(['/', '?', '#', '@', ' ']) {
        return Err(bad());
    }
    let (host, port) = match address.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') || host.ends_with(']') => (host, Some(port)),
        _ => (address, None),
    };
    if host.is_empty() || host.contains(':') && !host.starts_with('[') {
        return Err(bad());
    }
    if let Some(port) = port
        && !matches!(port.parse::<u16>(), Ok(p) if p != 0)
    {
        return Err(bad());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn spec(targets: &[&str]) -> ScrapeSpec {
        ScrapeSpec {
            job_name: Some("app".to_owned()),
            targets: targets
                .iter()
                .map(|a| ScrapeTarget {
                    address: (*a).to_owned(),
                    labels: Vec::new(),
                })
                .collect(),
            ..ScrapeSpec::default()
        }
    }

    #[test]
    fn defaults_follow_parca() {
        let job = ScrapeConfig::new(spec(&["localhost:6060"])).unwrap();
        assert_eq!(job.scrape_interval, Duration::from_secs(10));
        assert_eq!(job.scrape_timeout, Duration::from_secs(13));
        let names: Vec<&str> = job.profiles.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["process_cpu", "memory", "block", "mutex", "goroutine"]
        );
        assert_eq!(job.profiles[0].path, "/debug/pprof/profile");
        assert_eq!(job.profiles[0].seconds, Some(10));
        assert_eq!(job.profiles[1].seconds, None);
    }

    #[test]
    fn entries_override_defaults_and_add_profiles() {
        let mut s = spec(&["[::1]:6060", "app"]);
        s.scrape_interval = Some(Duration::from_secs(5));
        s.path_prefix = Some("/prefix/".to_owned());
        s.pprof = vec![
            (
                "process_cpu".to_owned(),
                PprofEntry {
                    path: Some("/cpu".to_owned()),
                    ..PprofEntry::default()
                },
            ),
            (
                "memory".to_owned(),
                PprofEntry {
                    enabled: Some(false),
                    ..PprofEntry::default()
                },
            ),
            (
                "fgprof".to_owned(),
                PprofEntry {
                    enabled: Some(true),
                    seconds: Some(3),
                    ..PprofEntry::default()
                },
            ),
            (
                "heap".to_owned(),
                PprofEntry {
                    path: Some("/debug/pprof/heap".to_owned()),
                    ..PprofEntry::default()
                },
            ),
        ];
        let job = ScrapeConfig::new(s).unwrap();
        let got: Vec<(&str, &str, Option<u32>)> = job
            .profiles
            .iter()
            .map(|p| (p.name.as_str(), p.path.as_str(), p.seconds))
            .collect();
        assert_eq!(
            got,
            [
                ("process_cpu", "/prefix/cpu", Some(5)),
                ("block", "/prefix/debug/pprof/block", None),
                ("mutex", "/prefix/debug/pprof/mutex", None),
                ("goroutine", "/prefix/debug/pprof/goroutine", None),
                ("fgprof", "/prefix/debug/fgprof", Some(3)),
                ("heap", "/prefix/debug/pprof/heap", None),
            ]
        );
    }

    #[test]
    fn bad_jobs_are_refused_with_the_reason() {
        let check = |s: ScrapeSpec| ScrapeConfig::new(s).unwrap_err();
        assert_eq!(check(ScrapeSpec::default()), ScrapeError::NoJobName);
        assert_eq!(check(spec(&[])), ScrapeError::NoTargets);
        for bad in ["http://a:1", "a:0", "a:99999", "a/b", ":80", "::1"] {
            assert!(
                matches!(check(spec(&[bad])), ScrapeError::BadAddress(_)),
                "{bad}"
            );
        }
        let mut s = spec(&["a:1"]);
        s.scrape_timeout = Some(Duration::from_secs(10));
        assert!(matches!(
            check(s),
            ScrapeError::TimeoutTooShort { seconds: 10, .. }
        ));
        let mut s = spec(&["a:1"]);
        s.pprof = vec![("custom".to_owned(), PprofEntry::default())];
        assert_eq!(check(s), ScrapeError::NoPath("custom".to_owned()));
        let mut s = spec(&["a:1"]);
        s.pprof = vec![("bad-name".to_owned(), PprofEntry::default())];
        assert!(matches!(check(s), ScrapeError::BadProfileName(_)));
        let mut s = spec(&["a:1"]);
        s.targets[0].labels = vec![("__name__".to_owned(), "x".to_owned())];
        assert!(matches!(check(s), ScrapeError::BadLabel(_)));
        let mut s = spec(&["a:1"]);
        s.insecure_skip_verify = true;
        assert_eq!(check(s), ScrapeError::TlsWithoutHttps);
        let mut s = spec(&["a:1"]);
        s.pprof = DEFAULT_PROFILES
            .iter()
            .map(|d| {
                (
                    d.0.to_owned(),
                    PprofEntry {
                        enabled: Some(false),
                        ..PprofEntry::default()
                    },
                )
            })
            .collect();
        assert_eq!(check(s), ScrapeError::NoProfiles);
        let jobs = [
            ScrapeConfig::new(spec(&["a:1"])).unwrap(),
            ScrapeConfig::new(spec(&["b:1"])).unwrap(),
        ];
        assert_eq!(
            check_jobs(&jobs),
            Err((2, ScrapeError::DuplicateJob("app".to_owned())))
        );
    }
}
