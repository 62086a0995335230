//! BPF time per JavaScript frame, from the kernel's own BPF statistics
//! (harness: `icecore_benches::runtime_cost`).
//!
//! Needs root. Runs `fixtures/js_recurse.js` (a function recursing to a
//! depth, burning CPU at the bottom, over and over) under Node at several
//! depths, once as V8 compiles it and once with `--jitless`; each fit's
//! slope is the cost of a compiled JavaScript frame (its slots, and its
//! SharedFunctionInfo read from the function) or of an interpreted one
//! (the same, plus its bytecode offset).
//!
//! `cargo bench -p icecore-benches --bench v8_cost`
//!
//! Environment: `V8_COST_NODE` (a Node binary instead of /usr/bin/node),
//! `V8_COST_DEPTHS` (e.g. `5,150`), `V8_COST_HZ`, `V8_COST_ROUNDS`.

use std::{path::PathBuf, process::Command, time::Duration};

use icecore_benches::runtime_cost::{CostBench, Subject};
use icecore_receiver::Counter;

fn main() {
    if !icecore_benches::root_bench_selected("v8_cost") {
        return;
    }
    let node = std::env::var_os("V8_COST_NODE")
        .map_or_else(|| PathBuf::from("/usr/bin/node"), PathBuf::from);
    if !node.exists() {
        println!(
            "v8_cost: skipped, no Node at {} (set V8_COST_NODE)",
            node.display()
        );
        return;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/js_recurse.js");
    let subject = |label: &str, options: &'static [&'static str]| {
        let (node, script) = (node.clone(), script.clone());
        Subject {
            label: label.to_owned(),
            command: Box::new(move |depth, seconds| {
                let mut command = Command::new(&node);
                command
                    .args(options)
                    .arg(&script)
                    .args([depth.to_string(), seconds.to_string()]);
                command
            }),
        }
    };
    let subjects = [
        subject("node compiled", &[]),
        subject("node --jitless", &["--jitless"]),
    ];
    let bench = CostBench {
        env_prefix: "V8_COST",
        frame_name: "JavaScript",
        frames: &[Counter::V8Frames],
        cut: &[Counter::UserStackTruncated, Counter::V8StackTruncated],
        depths: &[5, 50, 150],
        rounds: 2,
        frequency_hz: 997,
        warm_up: Duration::from_secs(3),
        measured: Duration::from_secs(4),
    };
    bench.run(&subjects);
}
