//! Queries of the history: the flame graph of a time range (optionally
//! against a baseline range), filtered by process, thread, container, pod,
//! service and frame type, with its top functions, a search's share, the
//! filters' choices and a timeline. Everything is summed from the rows;
//! only the tree is pruned, to what a screen can show.

use std::{collections::HashMap, sync::Arc};

use super::{History, Row, Slot, names::NameId, tree::Trie};
use crate::model::{
    FrameKind, ProcessInfo, ProcessProfile, ProfileBatch, ProfileKind, SampleGroup,
};

/// The window shown when a query names none: the last five minutes.
pub const DEFAULT_WINDOW_NANOS: u64 = 5 * 60 * 1_000_000_000;
/// Most entries per filter list and top table.
const MAX_FACET_ENTRIES: usize = 200;

/// `[from, to)` in Unix epoch nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeNanos {
    /// Start, inclusive.
    pub from: u64,
    /// End, exclusive.
    pub to: u64,
}

/// Why a query has no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// `from` is not before `to`.
    #[error("the range's start must be before its end")]
    EmptyRange,
    /// The profile kind is not one the history knows.
    #[error("unknown profile kind {0:?}: expected cpu, off_cpu or wall")]
    UnknownKind(String),
}

/// What to show.
#[derive(Debug, Clone, PartialEq)]
pub struct FlameQuery {
    /// Which profile: `cpu`, `off_cpu` or `wall`.
    pub kind: String,
    /// The range shown; `None`: the last [`DEFAULT_WINDOW_NANOS`] of the
    /// history. Slots count when their midpoint falls inside it.
    pub range: Option<RangeNanos>,
    /// A range to compare with (a diff), if any.
    pub baseline: Option<RangeNanos>,
    /// Only this process.
    pub pid: Option<u32>,
    /// Only this thread.
    pub tid: Option<u32>,
    /// Only processes of this container (its ID or name).
    pub container: Option<String>,
    /// Only processes of this pod (its UID or name).
    pub pod: Option<String>,
    /// Only processes of this service.
    pub service: Option<String>,
    /// Only frames of these types (others are left out of the stacks;
    /// samples with none are left out); `None`: every frame.
    pub types: Option<Vec<FrameKind>>,
    /// Names from the root down to the frame zoomed into; empty: the root.
    pub focus: Vec<String>,
    /// Text whose matching frames' share is asked for (case-insensitive).
    pub search: Option<String>,
    /// Nodes narrower than this share of the shown root are left out.
    pub min_share: f64,
    /// Most nodes in the tree.
    pub max_nodes: usize,
}

impl Default for FlameQuery {
    fn default() -> Self {
        Self {
            kind: "cpu".to_owned(),
            range: None,
            baseline: None,
            pid: None,
            tid: None,
            container: None,
            pod: None,
            service: None,
            types: None,
            focus: Vec::new(),
            search: None,
            min_share: 0.0005,
            max_nodes: 5000,
        }
    }
}

/// One node of the flame graph.
#[derive(Debug, Clone, PartialEq)]
pub struct FlameNode {
    /// The function (or `all` for the root).
    pub name: Arc<str>,
    /// Its frame type; `None` for the root.
    pub kind: Option<FrameKind>,
    /// Samples (or nanoseconds) in it and below it.
    pub total: u64,
    /// Samples (or nanoseconds) in it alone.
    pub self_value: u64,
    /// `total` in the baseline range.
    pub base_total: u64,
    /// `self_value` in the baseline range.
    pub base_self: u64,
    /// Nodes left out below it (too narrow to show).
    pub hidden_children: usize,
    /// Its callees.
    pub children: Vec<FlameNode>,
}

/// A row of the top table.
#[derive(Debug, Clone, PartialEq)]
pub struct TopRow {
    /// The function.
    pub name: Arc<str>,
    /// Its frame type.
    pub kind: FrameKind,
    /// Value where it is the leaf.
    pub self_value: u64,
    /// Value of every stack it is in (once per stack, recursion or not).
    pub total: u64,
}

/// A choice of a filter, with its value in the range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facet {
    /// What to filter on (a pid, a container ID, a type...).
    pub key: String,
    /// What to show.
    pub label: String,
    /// Its value in the range.
    pub value: u64,
}

/// Value of the slots of the queried kind, as a timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelinePoint {
    /// The slot's window.
    pub range: RangeNanos,
    /// Its value, filters applied.
    pub value: u64,
}

/// What a search found.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchResult {
    /// The text searched.
    pub term: String,
    /// Value of the stacks with a matching frame.
    pub value: u64,
    /// The same in the baseline.
    pub base_value: u64,
    /// Matching names.
    pub matches: usize,
}

/// The answer to a query.
#[derive(Debug, Clone, PartialEq)]
pub struct FlameView {
    /// The profile kind.
    pub kind: String,
    /// `samples`, or `nanoseconds` for weighted kinds.
    pub unit: &'static str,
    /// The range the slots shown cover (`None`: no slot in it).
    pub range: Option<RangeNanos>,
    /// The same for the baseline.
    pub baseline: Option<RangeNanos>,
    /// Value after filters, whole (not just the focus).
    pub total: u64,
    /// The same in the baseline.
    pub base_total: u64,
    /// The root shown: `all`, or the focused frame.
    pub root: FlameNode,
    /// The focus path that matched (a prefix of the one asked for).
    pub focus: Vec<String>,
    /// Nodes in the tree sent.
    pub nodes: usize,
    /// Nodes in the whole tree.
    pub all_nodes: usize,
    /// Functions by total, then by self (each at most 200).
    pub top: Vec<TopRow>,
    /// The search's result.
    pub search: Option<SearchResult>,
    /// Processes in the range.
    pub processes: Vec<Facet>,
    /// Threads in the range (of the chosen process, if one is).
    pub threads: Vec<Facet>,
    /// Containers in the range.
    pub containers: Vec<Facet>,
    /// Pods in the range.
    pub pods: Vec<Facet>,
    /// Services in the range.
    pub services: Vec<Facet>,
    /// Frame types in the range, by value of the stacks holding them.
    pub types: Vec<Facet>,
    /// Every slot of the kind in the history.
    pub timeline: Vec<TimelinePoint>,
}

/// The profile kind's name as [`ProfileKind::name`] gives it.
fn kind_matches(kind: ProfileKind, name: &str) -> bool {
    kind.name() == name
}

impl FlameQuery {
    fn keeps_process(&self, process: &ProcessInfo) -> bool {
        self.pid.is_none_or(|pid| process.pid == pid)
            && self.container.as_deref().is_none_or(|c| {
                !c.is_empty() && (&*process.container_id == c || &*process.container_name == c)
            })
            && self.pod.as_deref().is_none_or(|p| {
                !p.is_empty() && (&*process.k8s_pod_uid == p || &*process.k8s.pod == p)
            })
            && self
                .service
                .as_deref()
                .is_none_or(|s| &*process.service_name == s)
    }
}

impl Slot {
    /// `covered` grown to include this slot's window.
    fn widen(&self, covered: Option<RangeNanos>) -> RangeNanos {
        match covered {
            None => RangeNanos {
                from: self.start,
                to: self.end,
            },
            Some(c) => RangeNanos {
                from: c.from.min(self.start),
                to: c.to.max(self.end),
            },
        }
    }
}

/// The slots a range takes: those whose midpoint lies in it.
fn in_range(slot: &Slot, range: RangeNanos) -> bool {
    let mid = slot.start + (slot.end.saturating_sub(slot.start)) / 2;
    (range.from..range.to).contains(&mid)
}

impl History {
    fn value(weighted: bool, row: &Row) -> u64 {
        if weighted { row.nanos } else { row.count }
    }

    /// The range a query means: its own, or the last five minutes of the
    /// kind's slots.
    fn resolve(&self, query: &FlameQuery) -> Result<Option<RangeNanos>, QueryError> {
        if !["cpu", "off_cpu", "wall"].contains(&query.kind.as_str()) {
            return Err(QueryError::UnknownKind(query.kind.clone()));
        }
        for range in [query.range, query.baseline].into_iter().flatten() {
            if range.from >= range.to {
                return Err(QueryError::EmptyRange);
            }
        }
        Ok(query.range.or_else(|| {
            let end = self
                .slots
                .iter()
                .filter(|s| kind_matches(s.kind, &query.kind))
                .map(|s| s.end)
                .max()?;
            Some(RangeNanos {
                from: end.saturating_sub(DEFAULT_WINDOW_NANOS),
                to: end.saturating_add(1),
            })
        }))
    }

    /// Sums the rows of a range that pass the filters, per stack; returns
    /// them and the range the slots cover.
    fn sum_stacks(
        &self,
        query: &FlameQuery,
        range: RangeNanos,
        process_ok: &[bool],
    ) -> (HashMap<u32, u64>, Option<RangeNanos>) {
        let weighted = query.kind != "cpu";
        let mut sums: HashMap<u32, u64> = HashMap::new();
        let mut covered: Option<RangeNanos> = None;
        for slot in self
            .slots
            .iter()
            .filter(|s| kind_matches(s.kind, &query.kind) && in_range(s, range))
        {
            covered = Some(slot.widen(covered));
            for row in slot
                .rows
                .iter()
                .filter(|r| self.row_passes(query, r, process_ok))
            {
                *sums.entry(row.stack).or_default() += Self::value(weighted, row);
            }
        }
        (sums, covered)
    }

    fn row_passes(&self, query: &FlameQuery, row: &Row, process_ok: &[bool]) -> bool {
        process_ok[row.process as usize]
            && query
                .tid
                .is_none_or(|tid| self.tables.threads[row.thread as usize].tid == tid)
    }

    /// The path of a stack the query sees: frames of the chosen types only.
    fn view_path(&self, query: &FlameQuery, stack: u32) -> Vec<NameId> {
        let path = &self.tables.stacks[stack as usize].path;
        match &query.types {
            None => path.to_vec(),
            Some(types) => path
                .iter()
                .copied()
                .filter(|&id| types.contains(&self.tables.names.get(id).kind))
                .collect(),
        }
    }

    /// How many leading names of `path` match the focus (all of it, or the
    /// query's focus does not apply to this path).
    fn focus_matches(&self, focus: &[String], path: &[NameId]) -> bool {
        focus.len() <= path.len()
            && focus
                .iter()
                .zip(path)
                .all(|(f, &id)| *self.tables.names.get(id).name == **f)
    }

    /// Answers a query.
    pub fn query(&self, query: &FlameQuery) -> Result<FlameView, QueryError> {
        let range = self.resolve(query)?;
        let weighted = query.kind != "cpu";
        let process_ok: Vec<bool> = self
            .tables
            .processes
            .iter()
            .map(|p| query.keeps_process(p))
            .collect();
        let (sums, covered) = match range {
            Some(r) => self.sum_stacks(query, r, &process_ok),
            None => (HashMap::new(), None),
        };
        let (base_sums, base_covered) = match query.baseline {
            Some(r) => self.sum_stacks(query, r, &process_ok),
            None => (HashMap::new(), None),
        };

        // The focus: the longest prefix of the one asked for that some
        // stack has, so that a stale link still shows something.
        let paths: HashMap<u32, Vec<NameId>> = sums
            .keys()
            .chain(base_sums.keys())
            .map(|&s| (s, self.view_path(query, s)))
            .collect();
        let mut focus = query.focus.clone();
        while !focus.is_empty() && !paths.values().any(|p| self.focus_matches(&focus, p)) {
            focus.pop();
        }

        let needle = query
            .search
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_lowercase);
        let matching: Vec<bool> = match &needle {
            Some(n) => (0..self.tables.names.len() as NameId)
                .map(|id| self.tables.names.get(id).name.to_lowercase().contains(n))
                .collect(),
            None => Vec::new(),
        };

        let mut trie = Trie::new(self.tables.names.len());
        let mut search = needle.as_ref().map(|term| SearchResult {
            term: term.clone(),
            value: 0,
            base_value: 0,
            matches: matching.iter().filter(|m| **m).count(),
        });
        let (mut total, mut base_total) = (0, 0);
        for (sums, baseline) in [(&sums, false), (&base_sums, true)] {
            for (stack, &value) in sums {
                let path = &paths[stack];
                if path.is_empty() {
                    continue;
                }
                if baseline {
                    base_total += value;
                } else {
                    total += value;
                }
                if !self.focus_matches(&focus, path) {
                    continue;
                }
                let below = &path[focus.len().saturating_sub(1)..];
                let below = if focus.is_empty() { &path[..] } else { below };
                trie.add(below, value, baseline);
                if let Some(found) = search.as_mut()
                    && path.iter().any(|&id| matching[id as usize])
                {
                    if baseline {
                        found.base_value += value;
                    } else {
                        found.value += value;
                    }
                }
            }
        }
        let (root, nodes) = trie.to_tree(
            &self.tables.names,
            focus.last().map(String::as_str),
            query.min_share,
            query.max_nodes,
        );
        let top = trie.top(&self.tables.names, MAX_FACET_ENTRIES);
        let all_nodes = trie.len();
        let (processes, threads, containers, pods, services, types) =
            self.facets(query, range, weighted);
        let timeline = self
            .slots
            .iter()
            .filter(|s| kind_matches(s.kind, &query.kind))
            .map(|slot| TimelinePoint {
                range: RangeNanos {
                    from: slot.start,
                    to: slot.end,
                },
                value: slot
                    .rows
                    .iter()
                    .filter(|r| self.row_passes(query, r, &process_ok))
                    .map(|r| Self::value(weighted, r))
                    .sum(),
            })
            .collect();
        Ok(FlameView {
            kind: query.kind.clone(),
            unit: if weighted { "nanoseconds" } else { "samples" },
            range: covered,
            baseline: base_covered,
            total,
            base_total,
            root,
            focus,
            nodes,
            all_nodes,
            top,
            search,
            processes,
            threads,
            containers,
            pods,
            services,
            types,
            timeline,
        })
    }

    /// The filters' choices in the range: every filter's values, whatever
    /// the other filters (threads: of the chosen process only).
    #[allow(clippy::type_complexity)]
    fn facets(
        &self,
        query: &FlameQuery,
        range: Option<RangeNanos>,
        weighted: bool,
    ) -> (
        Vec<Facet>,
        Vec<Facet>,
        Vec<Facet>,
        Vec<Facet>,
        Vec<Facet>,
        Vec<Facet>,
    ) {
        let mut maps: [HashMap<String, (String, u64)>; 6] = Default::default();
        let Some(range) = range else {
            return Default::default();
        };
        let mut kinds_of_stack: HashMap<u32, Vec<FrameKind>> = HashMap::new();
        for slot in self
            .slots
            .iter()
            .filter(|s| kind_matches(s.kind, &query.kind) && in_range(s, range))
        {
            for row in &slot.rows {
                let value = Self::value(weighted, row);
                let p = &self.tables.processes[row.process as usize];
                let mut add = |i: usize, key: &str, label: String| {
                    if !key.is_empty() {
                        let entry = maps[i].entry(key.to_owned()).or_insert((label, 0));
                        entry.1 += value;
                    }
                };
                add(
                    0,
                    &p.pid.to_string(),
                    format!("{} ({})", p.executable_name, p.pid),
                );
                if query.pid.is_none_or(|pid| pid == p.pid) {
                    let t = &self.tables.threads[row.thread as usize];
                    add(1, &t.tid.to_string(), format!("{} ({})", t.name, t.tid));
                }
                let container = if p.container_name.is_empty() {
                    p.container_id.to_string()
                } else {
                    format!("{} ({:.12})", p.container_name, p.container_id)
                };
                add(2, &p.container_id, container);
                let pod = if p.k8s.pod.is_empty() {
                    p.k8s_pod_uid.to_string()
                } else {
                    format!("{}/{}", p.k8s.namespace, p.k8s.pod)
                };
                add(3, &p.k8s_pod_uid, pod);
                add(4, &p.service_name, p.service_name.to_string());
                let kinds = kinds_of_stack.entry(row.stack).or_insert_with(|| {
                    let mut kinds: Vec<FrameKind> = self.tables.stacks[row.stack as usize]
                        .stack
                        .iter()
                        .map(|f| f.kind)
                        .collect();
                    kinds.sort_unstable();
                    kinds.dedup();
                    kinds
                });
                for kind in kinds.iter() {
                    let name = kind.as_otel_str();
                    let entry = maps[5]
                        .entry(name.to_owned())
                        .or_insert((name.to_owned(), 0));
                    entry.1 += value;
                }
            }
        }
        let [a, b, c, d, e, f] = maps.map(|m| {
            let mut facets: Vec<Facet> = m
                .into_iter()
                .map(|(key, (label, value))| Facet { key, label, value })
                .collect();
            facets.sort_by(|x, y| y.value.cmp(&x.value).then_with(|| x.key.cmp(&y.key)));
            facets.truncate(MAX_FACET_ENTRIES);
            facets
        });
        (a, b, c, d, e, f)
    }

    /// The samples a query shows, as a batch the pprof encoder takes: the
    /// range's rows that pass the filters, summed per (stack, process,
    /// thread), their stacks cut to the frame types chosen and kept only
    /// under the focus. Untimed: the history keeps no timestamps.
    pub fn window(&self, query: &FlameQuery) -> Result<ProfileBatch, QueryError> {
        let range = self.resolve(query)?;
        let weighted = query.kind != "cpu";
        let mut batch = ProfileBatch {
            kind: ProfileKind::default(),
            start_unix_nanos: 0,
            duration_nanos: 0,
            period_nanos: 0,
            host_name: self.host_name.clone(),
            host: self.host.clone(),
            processes: Vec::new(),
        };
        let Some(range) = range else {
            return Ok(batch);
        };
        let process_ok: Vec<bool> = self
            .tables
            .processes
            .iter()
            .map(|p| query.keeps_process(p))
            .collect();
        let mut groups: HashMap<(u32, u32, u32), (u64, u64)> = HashMap::new();
        let mut covered: Option<RangeNanos> = None;
        for slot in self
            .slots
            .iter()
            .filter(|s| kind_matches(s.kind, &query.kind) && in_range(s, range))
        {
            batch.kind = slot.kind;
            batch.period_nanos = slot.period_nanos;
            covered = Some(slot.widen(covered));
            for row in slot
                .rows
                .iter()
                .filter(|r| self.row_passes(query, r, &process_ok))
            {
                let sum = groups
                    .entry((row.process, row.stack, row.thread))
                    .or_default();
                sum.0 += row.count;
                sum.1 += row.nanos;
            }
        }
        if let Some(c) = covered {
            batch.start_unix_nanos = c.from;
            batch.duration_nanos = c.to - c.from;
        }
        let mut by_process: HashMap<u32, Vec<SampleGroup>> = HashMap::new();
        for ((process, stack, thread), (count, nanos)) in groups {
            if !self.focus_matches(&query.focus, &self.view_path(query, stack)) {
                continue;
            }
            let entry = &self.tables.stacks[stack as usize];
            let frames: crate::model::Stack = match &query.types {
                None => entry.stack.clone(),
                Some(types) => entry
                    .stack
                    .iter()
                    .filter(|f| types.contains(&f.kind))
                    .cloned()
                    .collect(),
            };
            if frames.is_empty() {
                continue;
            }
            let t = &self.tables.threads[thread as usize];
            let mut group = SampleGroup::timed(frames, t.tid, t.name.clone(), Vec::new());
            group.count = count;
            if weighted {
                // One weight standing for the group's sum.
                group.weights_nanos = vec![nanos];
            }
            by_process.entry(process).or_default().push(group);
        }
        batch.processes = by_process
            .into_iter()
            .map(|(process, samples)| ProcessProfile {
                process: (*self.tables.processes[process as usize]).clone(),
                samples,
            })
            .collect();
        batch.processes.sort_by_key(|p| p.process.pid);
        Ok(batch)
    }
}
