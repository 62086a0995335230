//! Queries of the history: the flame graph of a time range (optionally
//! against a baseline range), filtered by process, thread, container, pod,
//! service and frame type, with its top functions, a search's share, the
//! filters' choices and a timeline. Everything is summed from the rows;
//! only the tree is pruned, to what a screen can show.

use std::collections::HashMap;

use super::view::{
    Facet, FlameQuery, FlameView, QueryError, RangeNanos, SearchResult, TimelinePoint,
};
use super::{History, Row, Slot, names::NameId, tree::Trie};
use crate::model::{FrameKind, ProcessInfo, ProfileKind};

/// The window shown when a query names none: the last five minutes.
pub const DEFAULT_WINDOW_NANOS: u64 = 5 * 60 * 1_000_000_000;
/// Most entries per filter list and top table.
const MAX_FACET_ENTRIES: usize = 200;

/// Unfiltered sums of the shown range, for the filters' choices.
struct FacetSums {
    processes: Vec<u64>,
    threads: Vec<u64>,
    stacks: Vec<u64>,
}

/// The profile kind's name as [`ProfileKind::name`] gives it.
pub(super) fn kind_matches(kind: ProfileKind, name: &str) -> bool {
    kind.name() == name
}

impl FlameQuery {
    pub(super) fn keeps_process(&self, process: &ProcessInfo) -> bool {
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
    pub(super) fn widen(&self, covered: Option<RangeNanos>) -> RangeNanos {
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
pub(super) fn in_range(slot: &Slot, range: RangeNanos) -> bool {
    let mid = slot.start + (slot.end.saturating_sub(slot.start)) / 2;
    (range.from..range.to).contains(&mid)
}

impl History {
    pub(super) fn value(weighted: bool, row: &Row) -> u64 {
        if weighted { row.nanos } else { row.count }
    }

    /// The range a query means: its own, or the last five minutes of the
    /// kind's slots.
    pub(super) fn resolve(&self, query: &FlameQuery) -> Result<Option<RangeNanos>, QueryError> {
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

    pub(super) fn row_passes(&self, query: &FlameQuery, row: &Row, process_ok: &[bool]) -> bool {
        process_ok[row.process as usize]
            && query
                .tid
                .is_none_or(|tid| self.tables.threads[row.thread as usize].tid == tid)
    }

    /// The path of a stack the query sees: frames of the chosen types only.
    pub(super) fn view_path(
        &self,
        query: &FlameQuery,
        stack: u32,
    ) -> std::borrow::Cow<'_, [NameId]> {
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
    pub(super) fn focus_matches(&self, focus: &[String], path: &[NameId]) -> bool {
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
}
