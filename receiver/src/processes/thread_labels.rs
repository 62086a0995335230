//! Relabeling by thread and CPU: when the rules read `__meta_thread_comm`,
//! `__meta_thread_id` or `__meta_cpuid`, the samples of each (process image,
//! thread, CPU) of a batch get their own answer, asked once per batch.

use std::collections::HashMap;
use std::sync::Arc;

use icecore_otlp::model::Labels;

use super::ProcessTable;
use crate::metadata::labels::{self, Workload};

/// One thread of one process image on one CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ThreadKey {
    pid: u32,
    image: Option<u64>,
    tid: u32,
    comm: [u8; 16],
    cpu: u32,
}

/// The answers of the current batch.
#[derive(Debug, Default)]
pub(super) struct ThreadLabels {
    answers: HashMap<ThreadKey, Option<Labels>>,
}

impl ThreadLabels {
    pub(super) fn clear(&mut self) {
        self.answers.clear();
    }
}

impl ProcessTable {
    /// Whether samples are labeled per thread and CPU.
    pub fn labels_per_thread(&self) -> bool {
        self.labeler.as_ref().is_some_and(|l| l.per_thread())
    }

    /// The labels of `pid`'s samples taken on thread `tid` (named `comm`) on
    /// `cpu`, in image `image` (the current one when `None`): the labels
    /// relabeling gives them beyond their process's (empty when not
    /// labeling per thread), or `None` when relabeling drops them.
    /// Remembered until [`ProcessTable::end_batch`].
    pub fn thread_labels(
        &mut self,
        pid: u32,
        image: Option<u64>,
        tid: u32,
        comm: &[u8; 16],
        cpu: u32,
    ) -> Option<Labels> {
        let key = ThreadKey {
            pid,
            image,
            tid,
            comm: *comm,
            cpu,
        };
        if let Some(answer) = self.thread_labels.answers.get(&key) {
            return answer.clone();
        }
        let answer = self.ask_thread_labels(key);
        self.thread_labels.answers.insert(key, answer.clone());
        answer
    }

    fn ask_thread_labels(&self, key: ThreadKey) -> Option<Labels> {
        let Some(labeler) = self.labeler.as_ref().filter(|l| l.per_thread()) else {
            return Some(Labels::default());
        };
        let process = match key.image {
            Some(image) => self.image(key.pid, image),
            None => self.processes.peek(&key.pid),
        };
        // A process never learned has no `__meta_*` labels to judge by.
        let Some(process) = process else {
            return Some(Labels::default());
        };
        let (pod, container) = self.workload_records(&process.info);
        let workload = Workload {
            pod: pod.as_deref(),
            docker: container.as_deref(),
        };
        let end = key.comm.iter().position(|&b| b == 0).unwrap_or(16);
        let comm = String::from_utf8_lossy(&key.comm[..end]);
        let meta = labels::with_thread_labels(
            labels::meta_labels(&process.info, &process.facts, workload),
            &comm,
            key.tid,
            key.cpu,
        );
        let answer = labeler.label_thread(meta)?;
        let own = &process.info.labels;
        let extra: Vec<(Arc<str>, Arc<str>)> = answer
            .into_iter()
            .filter(|(name, value)| {
                !name.starts_with("__") && !own.iter().any(|(n, v)| **n == **name && **v == **value)
            })
            .map(|(name, value)| (Arc::from(name), Arc::from(value)))
            .collect();
        Some(extra.into())
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use super::*;
    use crate::metadata::labels::{LabelSet, ProcessLabeler};

    /// Drops thread `gc`, gives every thread its CPU as `core`, and the
    /// process a label of its own.
    #[derive(Debug)]
    struct ByThread;

    impl ProcessLabeler for ByThread {
        fn label(&self, meta: LabelSet) -> Option<LabelSet> {
            let mut out = LabelSet::new();
            out.insert("team".into(), "a".into());
            out.insert("pid_seen".into(), meta["__meta_process_pid"].clone());
            Some(out)
        }
        fn may_exclude(&self) -> bool {
            false
        }
        fn per_thread(&self) -> bool {
            true
        }
        fn label_thread(&self, meta: LabelSet) -> Option<LabelSet> {
            if meta["__meta_thread_comm"] == "gc" {
                return None;
            }
            let mut out = self.label(meta.clone())?;
            out.insert("core".into(), meta["__meta_cpuid"].clone());
            out.insert("tid".into(), meta["__meta_thread_id"].clone());
            Some(out)
        }
    }

    fn comm(name: &str) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[..name.len()].copy_from_slice(name.as_bytes());
        c
    }

    #[test]
    fn threads_are_labeled_beyond_their_process_or_dropped() {
        let mut table = ProcessTable::new(NonZeroUsize::new(4).unwrap());
        assert!(!table.labels_per_thread());
        let me = std::process::id();
        table.set_labeler(Arc::new(ByThread));
        assert!(table.labels_per_thread());
        let (process, _) = table.get_or_learn(me, "test");
        let own = process.info.labels.clone();
        assert!(own.iter().any(|(n, v)| &**n == "team" && &**v == "a"));
        let image = Some(process.image);

        let worker = table
            .thread_labels(me, image, me + 1, &comm("worker"), 3)
            .expect("kept");
        let names: Vec<(&str, &str)> = worker.iter().map(|(n, v)| (&**n, &**v)).collect();
        // Only what the process does not have already.
        assert_eq!(names, [("core", "3"), ("tid", &*(me + 1).to_string())]);
        assert_eq!(table.thread_labels(me, image, 9, &comm("gc"), 0), None);
        // A process never learned is kept, unlabeled.
        assert_eq!(
            table.thread_labels(u32::MAX - 1, None, 1, &comm("x"), 0),
            Some(Labels::default())
        );
        // Answers are remembered for the batch, then asked again.
        assert_eq!(table.thread_labels.answers.len(), 3);
        table.end_batch();
        assert!(table.thread_labels.answers.is_empty());
    }
}
