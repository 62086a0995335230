use std::{sync::Arc, time::Duration};

use super::*;
use crate::model::{Frame, FrameKind, Line, Mapping, ProcessProfile, SampleGroup};

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_795_324_440 * SEC;

fn frame(name: &str, kind: FrameKind) -> Arc<Frame> {
    Arc::new(Frame {
        kind,
        address: 0x1000 + name.len() as u64,
        mapping: None,
        lines: vec![Line {
            function_name: name.into(),
            system_name: name.into(),
            filename: None,
            line: 1,
            column: 0,
        }],
    })
}

/// A stack from its root-first native function names.
fn stack(root_first: &[&str]) -> Stack {
    root_first
        .iter()
        .rev()
        .map(|n| frame(n, FrameKind::Native))
        .collect()
}

fn process(pid: u32, name: &str) -> ProcessInfo {
    ProcessInfo {
        pid,
        executable_name: name.into(),
        service_name: name.into(),
        ..ProcessInfo::default()
    }
}

/// A 10 s CPU batch starting `at` seconds after T0: (pid, tid, stack,
/// samples) per group.
fn batch(at: u64, groups: &[(u32, u32, &Stack, u64)]) -> ProfileBatch {
    let mut processes: Vec<ProcessProfile> = Vec::new();
    for &(pid, tid, stack, count) in groups {
        let mut group = SampleGroup::timed(
            stack.clone(),
            tid,
            "worker".into(),
            vec![T0 + at * SEC; count as usize],
        );
        group.count = count;
        match processes.iter_mut().find(|p| p.process.pid == pid) {
            Some(p) => p.samples.push(group),
            None => processes.push(ProcessProfile {
                process: process(pid, &format!("app{pid}")),
                samples: vec![group],
            }),
        }
    }
    ProfileBatch {
        kind: ProfileKind::Cpu,
        start_unix_nanos: T0 + at * SEC,
        duration_nanos: 10 * SEC,
        period_nanos: 10_000_000,
        host_name: "host".into(),
        host: HostInfo::default(),
        processes,
    }
}

fn roomy() -> History {
    History::new(HistoryLimits {
        retention: Duration::from_secs(3600),
        max_bytes: 1 << 30,
    })
}

fn child<'a>(node: &'a FlameNode, name: &str) -> &'a FlameNode {
    node.children
        .iter()
        .find(|c| &*c.name == name)
        .unwrap_or_else(|| panic!("no {name} under {}: {node:?}", node.name))
}

fn range(from: u64, to: u64) -> Option<RangeNanos> {
    Some(RangeNanos {
        from: T0 + from * SEC,
        to: T0 + to * SEC,
    })
}

#[test]
fn sums_stacks_into_a_tree_with_self_and_total() {
    let (a, b, g) = (
        stack(&["main", "run", "alpha"]),
        stack(&["main", "run", "beta"]),
        stack(&["main", "gamma"]),
    );
    let mut h = roomy();
    h.ingest(&batch(0, &[(1, 1, &a, 50), (1, 1, &b, 30)]), T0);
    h.ingest(&batch(10, &[(1, 2, &g, 20), (1, 1, &a, 0)]), T0);
    let view = h.query(&FlameQuery::default()).unwrap();
    assert_eq!(view.total, 100);
    assert_eq!(view.unit, "samples");
    let main = child(&view.root, "main");
    assert_eq!((main.total, main.self_value), (100, 0));
    let run = child(main, "run");
    assert_eq!(run.total, 80);
    assert_eq!(child(run, "alpha").self_value, 50);
    assert_eq!(child(main, "gamma").total, 20);
    let top = |name: &str| view.top.iter().find(|r| &*r.name == name).unwrap().clone();
    assert_eq!((top("main").total, top("main").self_value), (100, 0));
    assert_eq!((top("beta").total, top("beta").self_value), (30, 30));
    assert_eq!(view.range, range(0, 20));
    assert_eq!(view.timeline.len(), 2);
    assert_eq!(view.timeline[1].value, 20);
}

#[test]
fn a_recursive_function_counts_once_per_stack_in_the_top_table() {
    let s = stack(&["main", "f", "f", "f"]);
    let mut h = roomy();
    h.ingest(&batch(0, &[(1, 1, &s, 10)]), T0);
    let view = h.query(&FlameQuery::default()).unwrap();
    let f = view.top.iter().find(|r| &*r.name == "f").unwrap();
    assert_eq!((f.total, f.self_value), (10, 10));
}

#[test]
fn ranges_filters_focus_and_search() {
    let (a, b) = (stack(&["main", "alpha"]), stack(&["main", "beta"]));
    let mut h = roomy();
    h.ingest(&batch(0, &[(1, 1, &a, 40), (2, 7, &b, 10)]), T0);
    h.ingest(&batch(10, &[(1, 1, &b, 60)]), T0);
    let q = |f: &dyn Fn(&mut FlameQuery)| {
        let mut query = FlameQuery::default();
        f(&mut query);
        h.query(&query).unwrap()
    };
    assert_eq!(q(&|x| x.range = range(0, 10)).total, 50);
    assert_eq!(q(&|x| x.range = range(10, 20)).total, 60);
    assert_eq!(q(&|x| x.pid = Some(2)).total, 10);
    assert_eq!(q(&|x| x.tid = Some(1)).total, 100);
    assert_eq!(q(&|x| x.service = Some("app2".into())).total, 10);
    // An unknown container matches nothing, not everything.
    assert_eq!(q(&|x| x.container = Some("c0ffee".into())).total, 0);
    let searched = q(&|x| x.search = Some("BET".into()));
    let found = searched.search.unwrap();
    assert_eq!((found.value, found.matches), (70, 1));
    let focused = q(&|x| x.focus = vec!["main".into(), "beta".into(), "gone".into()]);
    assert_eq!(focused.focus, ["main", "beta"]);
    assert_eq!((&*focused.root.name, focused.root.total), ("beta", 70));
    assert_eq!(focused.total, 110);
    // The filters list every choice in the range, whatever is chosen.
    let filtered = q(&|x| x.pid = Some(2));
    assert_eq!(filtered.processes.len(), 2);
    assert_eq!(filtered.processes[0].key, "1");
    assert_eq!(filtered.processes[0].label, "app1 (1)");
    assert_eq!(filtered.threads.len(), 1, "{:?}", filtered.threads);
}

#[test]
fn frame_type_filters_keep_only_those_frames() {
    let mixed: Stack = vec![
        frame("leaf_py", FrameKind::CPython),
        frame("PyEval", FrameKind::Native),
        frame("main_py", FrameKind::CPython),
        frame("_start", FrameKind::Native),
    ]
    .into();
    let native = stack(&["main", "spin"]);
    let mut h = roomy();
    h.ingest(&batch(0, &[(1, 1, &mixed, 5), (1, 1, &native, 3)]), T0);
    let view = h
        .query(&FlameQuery {
            types: Some(vec![FrameKind::CPython]),
            ..FlameQuery::default()
        })
        .unwrap();
    assert_eq!(view.total, 5);
    let main = child(&view.root, "main_py");
    assert_eq!(child(main, "leaf_py").total, 5);
    let types: Vec<(&str, u64)> = view
        .types
        .iter()
        .map(|f| (f.key.as_str(), f.value))
        .collect();
    assert_eq!(types, [("native", 8), ("cpython", 5)]);
    let pprof = h
        .window(&FlameQuery {
            types: Some(vec![FrameKind::CPython]),
            ..FlameQuery::default()
        })
        .unwrap();
    assert_eq!(pprof.sample_count(), 5);
    assert!(
        pprof.processes[0].samples[0]
            .stack
            .iter()
            .all(|f| f.kind == FrameKind::CPython)
    );
}

#[test]
fn a_diff_holds_both_ranges() {
    let (a, b) = (stack(&["main", "alpha"]), stack(&["main", "beta"]));
    let mut h = roomy();
    h.ingest(&batch(0, &[(1, 1, &a, 40)]), T0);
    h.ingest(&batch(10, &[(1, 1, &b, 10)]), T0);
    let view = h
        .query(&FlameQuery {
            range: range(0, 10),
            baseline: range(10, 20),
            ..FlameQuery::default()
        })
        .unwrap();
    assert_eq!((view.total, view.base_total), (40, 10));
    let main = child(&view.root, "main");
    let (alpha, beta) = (child(main, "alpha"), child(main, "beta"));
    assert_eq!((alpha.total, alpha.base_total), (40, 0));
    assert_eq!((beta.total, beta.base_total), (0, 10));
}

#[test]
fn narrow_nodes_are_pruned_and_the_node_cap_keeps_a_tree() {
    let mut h = roomy();
    let names: Vec<String> = (0..100).map(|i| format!("f{i}")).collect();
    let stacks: Vec<Stack> = names.iter().map(|n| stack(&["main", n])).collect();
    let mut groups: Vec<(u32, u32, &Stack, u64)> = vec![(1, 1, &stacks[0], 10_000)];
    groups.extend(stacks[1..].iter().map(|s| (1, 1, s, 1)));
    h.ingest(&batch(0, &groups), T0);
    let view = h
        .query(&FlameQuery {
            min_share: 0.001,
            ..FlameQuery::default()
        })
        .unwrap();
    let main = child(&view.root, "main");
    assert_eq!(main.children.len(), 1);
    assert_eq!(main.hidden_children, 99);
    assert_eq!(view.all_nodes, 102);
    let capped = h
        .query(&FlameQuery {
            min_share: 0.0,
            max_nodes: 3,
            ..FlameQuery::default()
        })
        .unwrap();
    assert_eq!(capped.nodes, 3);
    assert_eq!(&*child(child(&capped.root, "main"), "f0").name, "f0");
}

#[test]
fn old_slots_expire_and_memory_stays_under_the_limit() {
    let mut h = History::new(HistoryLimits {
        retention: Duration::from_secs(60),
        max_bytes: 1 << 30,
    });
    let s = stack(&["main", "alpha"]);
    for i in 0..10 {
        h.ingest(&batch(i * 10, &[(1, 1, &s, 1)]), T0 + (i * 10 + 10) * SEC);
    }
    // Slots ending before 100 s - 60 s are gone: [0, 10) .. [20, 30).
    assert_eq!(h.slots.len(), 7);
    assert_eq!(h.stats().evicted_by_age.load(Relaxed), 3);
    h.expire(T0 + 1000 * SEC);
    assert_eq!(h.slots.len(), 0);
    assert_eq!(h.tables.stacks.len(), 0, "compacted");

    // Memory: distinct stacks per batch, a limit of a few batches.
    let mut h = History::new(HistoryLimits {
        retention: Duration::from_secs(3600),
        max_bytes: 256 << 10,
    });
    let mut peak = 0;
    for i in 0..200u64 {
        let stacks: Vec<Stack> = (0..20)
            .map(|j| stack(&["main", &format!("f{i}_{j}")]))
            .collect();
        let groups: Vec<(u32, u32, &Stack, u64)> = stacks.iter().map(|s| (1, 1, s, 1)).collect();
        h.ingest(&batch(i, &groups), T0 + i * SEC);
        peak = peak.max(h.bytes());
    }
    assert!(peak <= 256 << 10, "{peak}");
    assert!(h.slots.len() > 3, "{}", h.slots.len());
    assert!(h.stats().evicted_by_memory.load(Relaxed) > 100);
    // What is left is consistent after compactions.
    let view = h.query(&FlameQuery::default()).unwrap();
    assert_eq!(view.total, 20 * h.slots.len() as u64);
}

#[test]
fn at_the_memory_cap_the_tables_are_compacted_once_per_eighth() {
    let limit = 1 << 20;
    let mut h = History::new(HistoryLimits {
        retention: Duration::from_secs(3600),
        max_bytes: limit,
    });
    let mut peak = 0;
    for i in 0..1000u64 {
        // Half the stacks recur, half are new.
        let stacks: Vec<Stack> = (0..20)
            .map(|j| match j % 2 {
                0 => stack(&["main", &format!("f{j}")]),
                _ => stack(&["main", &format!("f{i}_{j}")]),
            })
            .collect();
        let groups: Vec<(u32, u32, &Stack, u64)> = stacks.iter().map(|s| (1, 1, s, 1)).collect();
        h.ingest(&batch(i, &groups), T0 + i * SEC);
        peak = peak.max(h.bytes());
    }
    assert!(peak <= limit as usize, "{peak}");
    let evicted = h.stats().evicted_by_memory.load(Relaxed);
    let compactions = h.stats().compactions.load(Relaxed);
    // Per compaction an eighth of the history goes, not one interval.
    assert!(evicted > 300, "{evicted} evicted");
    assert!(
        compactions * 8 < evicted,
        "{compactions} compactions for {evicted} evictions"
    );
    // Rows still point at the right stacks after the compactions.
    let view = h
        .query(&FlameQuery {
            min_share: 0.0,
            ..FlameQuery::default()
        })
        .unwrap();
    assert_eq!(view.total, 20 * h.slots.len() as u64);
    let newest = format!("f{}_1", 999);
    assert_eq!(child(child(&view.root, "main"), &newest).total, 1);
    assert_eq!(
        child(child(&view.root, "main"), "f0").total,
        h.slots.len() as u64
    );
}

#[test]
fn a_batch_larger_than_the_limit_is_counted_and_not_kept() {
    let mut h = History::new(HistoryLimits {
        retention: Duration::from_secs(3600),
        max_bytes: 1024,
    });
    let stacks: Vec<Stack> = (0..100)
        .map(|j| stack(&["main", &format!("f{j}")]))
        .collect();
    let groups: Vec<(u32, u32, &Stack, u64)> = stacks.iter().map(|s| (1, 1, s, 1)).collect();
    h.ingest(&batch(0, &groups), T0);
    assert_eq!(h.slots.len(), 0);
    assert_eq!(h.stats().rejected_batches.load(Relaxed), 1);
    assert!(h.bytes() <= 1024);
}

#[test]
fn unsymbolized_frames_are_named_after_their_file() {
    let mapping = Arc::new(Mapping {
        memory_start: 0,
        memory_limit: 0x1000,
        file_offset: 0,
        filename: "/usr/lib/libc.so.6".into(),
        build_id: None,
    });
    let bare = |address| {
        Arc::new(Frame {
            kind: FrameKind::Native,
            address,
            mapping: Some(mapping.clone()),
            lines: Vec::new(),
        })
    };
    let one: Stack = vec![bare(1), frame("main", FrameKind::Native)].into();
    let two: Stack = vec![bare(2), frame("main", FrameKind::Native)].into();
    let mut h = roomy();
    h.ingest(&batch(0, &[(1, 1, &one, 1), (1, 1, &two, 2)]), T0);
    let view = h.query(&FlameQuery::default()).unwrap();
    assert_eq!(child(child(&view.root, "main"), "[libc.so.6]").total, 3);
}

#[test]
fn bad_queries_are_refused() {
    let h = roomy();
    let err = h.query(&FlameQuery {
        kind: "heap".into(),
        ..FlameQuery::default()
    });
    assert!(matches!(err, Err(QueryError::UnknownKind(_))));
    let err = h.query(&FlameQuery {
        range: range(10, 10),
        ..FlameQuery::default()
    });
    assert_eq!(err, Err(QueryError::EmptyRange));
    // An empty history answers with an empty tree.
    let view = h.query(&FlameQuery::default()).unwrap();
    assert_eq!((view.total, view.root.children.len()), (0, 0));
}

#[test]
fn equal_stacks_in_new_allocations_are_one_stack() {
    let mut h = roomy();
    // `stack` makes new frame allocations each call.
    h.ingest(&batch(0, &[(1, 1, &stack(&["main", "alpha"]), 2)]), T0);
    h.ingest(&batch(10, &[(1, 1, &stack(&["main", "alpha"]), 3)]), T0);
    h.ingest(&batch(20, &[(1, 1, &stack(&["main", "beta"]), 1)]), T0);
    assert_eq!(h.tables.stacks.len(), 2);
    let view = h.query(&FlameQuery::default()).unwrap();
    assert_eq!(child(child(&view.root, "main"), "alpha").total, 5);
}

#[test]
fn one_code_in_many_processes_is_one_stack() {
    // The same two functions of one file, loaded at a different address in
    // each of 100 short-lived processes.
    let at = |start: u64, offset: u64, name: &str| {
        Arc::new(Frame {
            kind: FrameKind::Native,
            address: start + offset,
            mapping: Some(Arc::new(Mapping {
                memory_start: start,
                memory_limit: start + 0x10000,
                file_offset: 0x1000,
                filename: "/usr/bin/worker".into(),
                build_id: Some("ab12".into()),
            })),
            lines: vec![Line {
                function_name: name.into(),
                system_name: name.into(),
                filename: None,
                line: 0,
                column: 0,
            }],
        })
    };
    let mut h = roomy();
    for pid in 0..100u32 {
        let start = 0x5500_0000_0000 + u64::from(pid) * 0x10_0000;
        let s: Stack = vec![at(start, 0x20, "work"), at(start, 0x10, "main")].into();
        h.ingest(&batch(u64::from(pid), &[(pid + 1, pid + 1, &s, 1)]), T0);
    }
    assert_eq!(h.tables.stacks.len(), 1);
    assert_eq!(
        h.tables.frames.len(),
        2,
        "another process's frames are not kept"
    );
    let view = h.query(&FlameQuery::default()).unwrap();
    assert_eq!(child(child(&view.root, "main"), "work").total, 100);
    // Another instruction of the same line is the same place...
    let start = 0x5600_0000_0000;
    let s: Stack = vec![at(start, 0x24, "work"), at(start, 0x10, "main")].into();
    h.ingest(&batch(100, &[(500, 500, &s, 1)]), T0);
    assert_eq!(h.tables.stacks.len(), 1);
    // ...but without lines, an address is all that tells frames apart.
    let bare = |offset: u64| {
        let mut f = (*at(start, offset, "")).clone();
        f.lines.clear();
        Arc::new(f)
    };
    for (i, offset) in [0x30, 0x34, 0x30].into_iter().enumerate() {
        let s: Stack = vec![bare(offset), at(start, 0x10, "main")].into();
        h.ingest(&batch(101 + i as u64, &[(500, 500, &s, 1)]), T0);
    }
    assert_eq!(h.tables.stacks.len(), 3);
}
