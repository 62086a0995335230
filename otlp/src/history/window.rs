//! A query's samples as a batch of the model, for the pprof download.

use std::collections::HashMap;

use super::History;
use super::query::{in_range, kind_matches};
use super::view::{FlameQuery, QueryError, RangeNanos};
use crate::model::{ProcessProfile, ProfileBatch, ProfileKind, SampleGroup};

impl History {
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
