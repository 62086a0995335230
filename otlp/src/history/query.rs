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

/// Unfiltered sums of the shown range, for the filters' choices.
struct FacetSums {
    processes: Vec<u64>,
    threads: Vec<u64>,
    stacks: Vec<u64>,
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

    fn row_passes(&self, query: &FlameQuery, row: &Row, process_ok: &[bool]) -> bool {
        process_ok[row.process as usize]
            && query
                .tid
                .is_none_or(|tid| self.tables.threads[row.thread as usize].tid == tid)
    }

    /// The path of a stack the query sees: frames of the chosen types only.
    fn view_path(&self, query: &FlameQuery, stack: u32) -> std::borrow::Cow<'_, [NameId]> {
        let path = &self.tables.stacks[stack as usize].path;
        match &query.types {
            None => std::borrow::Cow::Borrowed(path),
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

    /// Answers a query: one pass over the kind's rows sums them per stack
    /// (shown range, baseline, and unfiltered for the filters' choices) and
    /// per slot (the timeline); the stacks with samples are then sorted by
    /// path and summed into the tree in one walk.
    pub fn query(&self, query: &FlameQuery) -> Result<FlameView, QueryError> {
        let range = self.resolve(query)?;
        let weighted = query.kind != "cpu";
        let tables = &self.tables;
        let process_ok: Vec<bool> = tables
            .processes
            .iter()
            .map(|p| query.keeps_process(p))
            .collect();
        let stacks = tables.stacks.len();
        let mut shown = vec![0u64; stacks];
        let mut base = vec![0u64; if query.baseline.is_some() { stacks } else { 0 }];
        let mut sums = FacetSums {
            processes: vec![0; tables.processes.len()],
            threads: vec![0; tables.threads.len()],
            stacks: vec![0; stacks],
        };
        let mut timeline = Vec::new();
        let (mut covered, mut base_covered) = (None, None);
        for slot in self
            .slots
            .iter()
            .filter(|s| kind_matches(s.kind, &query.kind))
        {
            let in_shown = range.is_some_and(|r| in_range(slot, r));
            let in_base = query.baseline.is_some_and(|r| in_range(slot, r));
            let mut slot_value = 0;
            for row in &slot.rows {
                let value = Self::value(weighted, row);
                if in_shown {
                    sums.processes[row.process as usize] += value;
                    sums.stacks[row.stack as usize] += value;
                    if query
                        .pid
                        .is_none_or(|pid| tables.processes[row.process as usize].pid == pid)
                    {
                        sums.threads[row.thread as usize] += value;
                    }
                }
                if !self.row_passes(query, row, &process_ok) {
                    continue;
                }
                slot_value += value;
                if in_shown {
                    shown[row.stack as usize] += value;
                }
                if in_base {
                    base[row.stack as usize] += value;
                }
            }
            timeline.push(TimelinePoint {
                range: slot.widen(None),
                value: slot_value,
            });
            if in_shown {
                covered = Some(slot.widen(covered));
            }
            if in_base {
                base_covered = Some(slot.widen(base_covered));
            }
        }

        // The stacks with samples, each as the path the query sees.
        let mut entries: Vec<(std::borrow::Cow<'_, [NameId]>, u64, u64)> = Vec::new();
        let (mut total, mut base_total) = (0, 0);
        for (stack, &v) in shown.iter().enumerate() {
            let b = base.get(stack).copied().unwrap_or(0);
            if v == 0 && b == 0 {
                continue;
            }
            let path = self.view_path(query, stack as u32);
            if path.is_empty() {
                continue;
            }
            total += v;
            base_total += b;
            entries.push((path, v, b));
        }
        // The focus: the longest prefix of the one asked for that some
        // stack has, so that a stale link still shows something.
        let matched = entries
            .iter()
            .map(|(path, _, _)| {
                query
                    .focus
                    .iter()
                    .zip(path.iter())
                    .take_while(|(f, id)| *tables.names.get(**id).name == ***f)
                    .count()
            })
            .max()
            .unwrap_or(0);
        let focus: Vec<String> = query.focus[..matched].to_vec();
        let skip = focus.len().saturating_sub(1);
        let mut under: Vec<(&[NameId], &[NameId], u64, u64)> = entries
            .iter()
            .filter(|(path, _, _)| matched == 0 || self.focus_matches(&focus, path))
            .map(|(path, v, b)| (&path[..], &path[skip..], *v, *b))
            .collect();
        under.sort_unstable_by(|a, b| a.1.cmp(b.1));

        let needle = query
            .search
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_lowercase);
        let matching: Vec<bool> = match &needle {
            Some(n) => (0..tables.names.len() as NameId)
                .map(|id| tables.names.get(id).name.to_lowercase().contains(n))
                .collect(),
            None => Vec::new(),
        };
        let mut search = needle.as_ref().map(|term| SearchResult {
            term: term.clone(),
            value: 0,
            base_value: 0,
            matches: matching.iter().filter(|m| **m).count(),
        });
        let mut trie = Trie::new(tables.names.len());
        for &(full, path, v, b) in &under {
            trie.add_sorted(path, v, b);
            if let Some(found) = search.as_mut()
                && full.iter().any(|&id| matching[id as usize])
            {
                found.value += v;
                found.base_value += b;
            }
        }
        let (root, nodes) = trie.to_tree(
            &tables.names,
            !focus.is_empty(),
            query.min_share,
            query.max_nodes,
        );
        let top = trie.top(&tables.names, MAX_FACET_ENTRIES);
        let facets = self.facets(&sums);
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
            all_nodes: trie.len(),
            top,
            search,
            processes: facets[0].clone(),
            threads: facets[1].clone(),
            containers: facets[2].clone(),
            pods: facets[3].clone(),
            services: facets[4].clone(),
            types: facets[5].clone(),
            timeline,
        })
    }

    /// The filters' choices in the shown range, from the unfiltered sums:
    /// processes, threads (of the chosen process, if one is), containers,
    /// pods, services and frame types.
    fn facets(&self, sums: &FacetSums) -> [Vec<Facet>; 6] {
        let tables = &self.tables;
        let mut maps: [HashMap<String, (String, u64)>; 6] = Default::default();
        let mut add = |i: usize, key: &str, label: &dyn Fn() -> String, value: u64| {
            if !key.is_empty() && value > 0 {
                maps[i]
                    .entry(key.to_owned())
                    .or_insert_with(|| (label(), 0))
                    .1 += value;
            }
        };
        for (p, &value) in tables.processes.iter().zip(&sums.processes) {
            add(
                0,
                &p.pid.to_string(),
                &|| format!("{} ({})", p.executable_name, p.pid),
                value,
            );
            add(
                2,
                &p.container_id,
                &|| {
                    if p.container_name.is_empty() {
                        p.container_id.to_string()
                    } else {
                        format!("{} ({:.12})", p.container_name, p.container_id)
                    }
                },
                value,
            );
            add(
                3,
                &p.k8s_pod_uid,
                &|| {
                    if p.k8s.pod.is_empty() {
                        p.k8s_pod_uid.to_string()
                    } else {
                        format!("{}/{}", p.k8s.namespace, p.k8s.pod)
                    }
                },
                value,
            );
            add(4, &p.service_name, &|| p.service_name.to_string(), value);
        }
        for (t, &value) in tables.threads.iter().zip(&sums.threads) {
            add(
                1,
                &t.tid.to_string(),
                &|| format!("{} ({})", t.name, t.tid),
                value,
            );
        }
        let mut by_kind = [0u64; FrameKind::ALL.len()];
        for (entry, &value) in tables.stacks.iter().zip(&sums.stacks) {
            if value == 0 {
                continue;
            }
            for (i, sum) in by_kind.iter_mut().enumerate() {
                if entry.kinds & (1 << i) != 0 {
                    *sum += value;
                }
            }
        }
        for (kind, value) in FrameKind::ALL.iter().zip(by_kind) {
            let name = kind.as_otel_str();
            add(5, name, &|| name.to_owned(), value);
        }
        maps.map(|m| {
            let mut facets: Vec<Facet> = m
                .into_iter()
                .map(|(key, (label, value))| Facet { key, label, value })
                .collect();
            facets.sort_by(|x, y| y.value.cmp(&x.value).then_with(|| x.key.cmp(&y.key)));
            facets.truncate(MAX_FACET_ENTRIES);
            facets
        })
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
        let mut groups: HashMap<(u32, u32, u32), (u64, u64), foldhash::fast::FixedState> =
            HashMap::default();
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
