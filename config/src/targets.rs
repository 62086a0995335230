//! `targets`: which processes are profiled, by what they are rather than by
//! relabel rules. A process is profiled when it matches any target (or when
//! there are none); a target matches when every field it sets matches.
//!
//! Paths and names are shell globs (`*` and `?` stay within one path
//! component, `**` crosses them, `[abc]` and `{a,b}` as in a shell); the
//! agent evaluates targets with relabeling, once per process image and again
//! when the process's container or pod metadata arrives.

use std::fmt;

use globset::{GlobBuilder, GlobMatcher};

/// A shell glob over a path or a name, with the text it was written as.
#[derive(Clone)]
pub struct Glob {
    text: String,
    matcher: GlobMatcher,
}

impl Glob {
    /// Compiles `text`; `*` does not match `/`.
    pub fn new(text: &str) -> Result<Self, TargetError> {
        if text.is_empty() {
            return Err(TargetError::EmptyPattern);
        }
        let glob = GlobBuilder::new(text)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| TargetError::BadGlob(text.to_owned(), e.kind().to_string()))?;
        Ok(Glob {
            text: text.to_owned(),
            matcher: glob.compile_matcher(),
        })
    }

    /// Whether `value` matches the whole glob.
    pub fn is_match(&self, value: &str) -> bool {
        self.matcher.is_match(value)
    }

    /// The glob as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Debug for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.text)
    }
}

impl PartialEq for Glob {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Glob {}

/// Why a target was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// A glob is empty, which would match nothing.
    #[error("the pattern is empty")]
    EmptyPattern,
    /// A glob does not parse.
    #[error("{0:?} is not a glob: {1}")]
    BadGlob(String, String),
    /// A container ID holds other characters than hex digits, or is too short
    /// to name one container.
    #[error("{0:?} is not a container ID (at least 12 hex digits)")]
    BadContainerId(String),
    /// A target sets nothing, so it would match every process.
    #[error("the target names nothing to match (set one of {TARGET_KEYS})")]
    Empty,
    /// A key is not one a target has.
    #[error("unknown key {0:?}; expected one of {TARGET_KEYS}")]
    UnknownKey(String),
    /// A pid is not a positive whole number.
    #[error("{0:?} is not a process ID")]
    BadPid(String),
    /// A pod label is not `NAME=GLOB`.
    #[error("{0:?} is not NAME=GLOB")]
    BadPodLabel(String),
    /// `kubernetes_pod_labels` in the config file is not a mapping.
    #[error("kubernetes_pod_labels is not a mapping of label names to globs")]
    PodLabelsNotAMapping,
    /// A field's value in the config file is a list or a mapping.
    #[error("{0} is not a string")]
    NotAScalar(String),
}

/// What a target is, for error messages.
pub const EXPECTED_TARGET: &str = "a target: KEY=VALUE, KEY one of pid, executable, cgroup, container_id, kubernetes_namespace, kubernetes_pod_label";

/// The keys of a target, as the config file and `--target` spell them.
pub const TARGET_KEYS: &str =
    "pid, executable, cgroup, container_id, kubernetes_namespace, kubernetes_pod_labels";

/// One kind of process to profile. Unset fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    /// The process's ID.
    pub pid: Option<u32>,
    /// The executable: a glob with a `/` matches its full path, one
    /// without matches its file name.
    pub executable: Option<Glob>,
    /// The process's cgroup path (v2, or the first v1 hierarchy's), e.g.
    /// `/system.slice/nginx.service` or `/kubepods.slice/**`.
    pub cgroup: Option<Glob>,
    /// The container's ID, whole or a prefix of at least 12 hex digits as
    /// `docker ps` shows it (lower case).
    pub container_id: Option<String>,
    /// The Kubernetes namespace of the process's pod.
    pub kubernetes_namespace: Option<Glob>,
    /// Labels the pod must have, each matching its glob.
    pub kubernetes_pod_labels: Vec<(String, Glob)>,
}

/// What is known of a process, as targets read it.
pub trait TargetFacts {
    /// Process ID.
    fn pid(&self) -> u32;
    /// Full path of the executable; empty when it has none.
    fn executable_path(&self) -> &str;
    /// File name of the executable.
    fn executable_name(&self) -> &str;
    /// Cgroup path; empty when unknown.
    fn cgroup(&self) -> &str;
    /// Container ID; empty when none.
    fn container_id(&self) -> &str;
    /// Kubernetes namespace; `None` until the pod is known.
    fn kubernetes_namespace(&self) -> Option<&str>;
    /// The value of the pod's label `name`, if the pod has it.
    fn kubernetes_pod_label(&self, name: &str) -> Option<&str>;
}

impl Target {
    /// Whether the process `facts` describes matches every field set.
    pub fn matches(&self, facts: &impl TargetFacts) -> bool {
        self.pid.is_none_or(|pid| pid == facts.pid())
            && self.executable.as_ref().is_none_or(|glob| {
                if glob.as_str().contains('/') {
                    glob.is_match(facts.executable_path())
                } else {
                    glob.is_match(facts.executable_name())
                }
            })
            && self
                .cgroup
                .as_ref()
                .is_none_or(|glob| glob.is_match(facts.cgroup()))
            && self.container_id.as_ref().is_none_or(|id| {
                !facts.container_id().is_empty() && facts.container_id().starts_with(id.as_str())
            })
            && self.kubernetes_namespace.as_ref().is_none_or(|glob| {
                facts
                    .kubernetes_namespace()
                    .is_some_and(|ns| glob.is_match(ns))
            })
            && self.kubernetes_pod_labels.iter().all(|(name, glob)| {
                facts
                    .kubernetes_pod_label(name)
                    .is_some_and(|value| glob.is_match(value))
            })
    }

    /// Whether the target sets nothing.
    pub fn is_empty(&self) -> bool {
        self == &Target::default()
    }

    /// Whether it reads Kubernetes metadata (so it cannot match before the
    /// pod is known).
    pub fn needs_kubernetes(&self) -> bool {
        self.kubernetes_namespace.is_some() || !self.kubernetes_pod_labels.is_empty()
    }

    /// Sets the field `key` from its text, as `--target KEY=VALUE` and the
    /// scalar fields of the config file give it.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), TargetError> {
        match key {
            "pid" => {
                let pid = value
                    .parse::<u32>()
                    .ok()
                    .filter(|&p| p > 0)
                    .ok_or_else(|| TargetError::BadPid(value.to_owned()))?;
                self.pid = Some(pid);
            }
            "executable" => self.executable = Some(Glob::new(value)?),
            "cgroup" => self.cgroup = Some(Glob::new(value)?),
            "container_id" => self.container_id = Some(container_id(value)?),
            "kubernetes_namespace" => self.kubernetes_namespace = Some(Glob::new(value)?),
            "kubernetes_pod_label" | "kubernetes_pod_labels" => {
                let (name, glob) = value
                    .split_once('=')
                    .filter(|(name, _)| !name.is_empty())
                    .ok_or_else(|| TargetError::BadPodLabel(value.to_owned()))?;
                self.add_pod_label(name, glob)?;
            }
            other => return Err(TargetError::UnknownKey(other.to_owned())),
        }
        Ok(())
    }

    /// Requires the pod label `name` to match `glob`.
    pub fn add_pod_label(&mut self, name: &str, glob: &str) -> Result<(), TargetError> {
        self.kubernetes_pod_labels
            .push((name.to_owned(), Glob::new(glob)?));
        Ok(())
    }
}

/// A container ID: 12 to 64 hex digits, lower-cased.
fn container_id(text: &str) -> Result<String, TargetError> {
    let id = text.trim().to_ascii_lowercase();
    if (12..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(id)
    } else {
        Err(TargetError::BadContainerId(text.to_owned()))
    }
}

/// The configured targets; none means every process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Targets {
    targets: Vec<Target>,
}

impl Targets {
    /// Targets from their list; an empty target is refused, with its
    /// position (from 1).
    pub fn new(targets: Vec<Target>) -> Result<Self, (usize, TargetError)> {
        if let Some(index) = targets.iter().position(Target::is_empty) {
            return Err((index + 1, TargetError::Empty));
        }
        Ok(Targets { targets })
    }

    /// Whether the process is profiled: it matches a target, or there are none.
    pub fn selects(&self, facts: &impl TargetFacts) -> bool {
        self.targets.is_empty() || self.targets.iter().any(|t| t.matches(facts))
    }

    /// Whether there are targets (then some processes are not profiled).
    pub fn filters(&self) -> bool {
        !self.targets.is_empty()
    }

    /// The targets, in order.
    pub fn as_slice(&self) -> &[Target] {
        &self.targets
    }
}

#[cfg(test)]
mod tests;
