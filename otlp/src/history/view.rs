//! What a query asks and what it answers.

use std::sync::Arc;

use crate::model::FrameKind;

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
