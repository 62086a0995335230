//! BPF time per sample and per native frame, from the kernel's own BPF
//! statistics (harness: `icecore_benches::runtime_cost`).
//!
//! Needs root. Profiles a recursion fixture built without frame pointers at
//! several depths, so every frame is a DWARF step.
//!
//! `cargo bench -p icecore-benches --bench bpf_cost`
//!
//! Environment: `BPF_COST_DEPTHS` (e.g. `5,280`), `BPF_COST_ROUNDS`,
//! `BPF_COST_HZ` (caches are colder at lower frequencies, and samples dearer).

#![expect(
    clippy::expect_used,
    reason = "a benchmark harness: failed setup should abort with its message"
)]

use std::{process::Command, time::Duration};

use icecore_benches::runtime_cost::{CostBench, Subject};
use icecore_receiver::Counter;

fn main() {
    if !icecore_benches::root_bench_selected("bpf_cost") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = icecore_benches::compile_native_fixture("cc", "recurse.c", dir.path())
        .unwrap_or_else(|e| panic!("cannot build the fixture: {e}"));
    let bench = CostBench {
        env_prefix: "BPF_COST",
        frame_name: "native",
        frames: &[Counter::DwarfFrames, Counter::FramePointerFrames],
        cut: &[Counter::UserStackTruncated],
        depths: &[5, 60, 150, 280],
        rounds: 3,
        frequency_hz: 997,
        warm_up: Duration::from_secs(2),
        measured: Duration::from_secs(4),
    };
    let subject = Subject {
        label: "native".to_owned(),
        command: Box::new(move |depth, seconds| {
            let mut command = Command::new(&exe);
            command.args([depth.to_string(), seconds.to_string()]);
            command
        }),
    };
    bench.run(&[subject]);
    println!("target: 2000 ns fixed + 100 ns per native frame");
}
