//! Relabeling as the profiler's process labeler: the config's
//! `relabel_configs` applied to each process's `__meta_*` labels.

use icecore_config::relabel::RelabelRules;
use icecore_receiver::metadata::labels::{LabelSet, ProcessLabeler};

/// The configured rules, applied once per process image.
#[derive(Debug)]
pub struct Relabeler {
    rules: RelabelRules,
}

impl Relabeler {
    /// A labeler applying `rules` in order.
    pub fn new(rules: RelabelRules) -> Self {
        Relabeler { rules }
    }
}

impl ProcessLabeler for Relabeler {
    fn label(&self, meta: LabelSet) -> Option<LabelSet> {
        self.rules.apply(meta)
    }

    fn may_exclude(&self) -> bool {
        self.rules.filters()
    }
}
