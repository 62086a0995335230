//! BPF time per CRuby frame, from the kernel's own BPF statistics
//! (harness: `icecore_benches::runtime_cost`).
//!
//! Needs root. Runs `fixtures/ruby_recurse.rb` (a plain recursive Ruby
//! method, burning CPU at the bottom) under Debian's CRuby 3.1 at several
//! Ruby depths: Ruby calls Ruby without a new C frame, so the native part
//! stays the same at every depth and the fit's slope is the cost of a Ruby
//! control frame (the walk reads the frame, its `ep[-2]` and `ep[0]`).
//!
//! `cargo bench -p icecore-benches --bench ruby_cost`
//!
//! Environment: `RUBY_COST_RUBY` (interpreter instead of `/usr/bin/ruby3.1`),
//! `RUBY_COST_DEPTHS` (e.g. `5,150`), `RUBY_COST_HZ`, `RUBY_COST_ROUNDS`.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use icecore_benches::runtime_cost::{CostBench, Subject};
use icecore_receiver::Counter;

fn main() {
    if !icecore_benches::root_bench_selected("ruby_cost") {
        return;
    }
    let ruby = std::env::var_os("RUBY_COST_RUBY")
        .map_or_else(|| PathBuf::from("/usr/bin/ruby3.1"), PathBuf::from);
    if !ruby.exists() {
        println!(
            "ruby_cost: skipped, no {} (set RUBY_COST_RUBY)",
            ruby.display()
        );
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/ruby_recurse.rb");
    let label = ruby
        .file_name()
        .map_or_else(|| "ruby".into(), |n| n.to_string_lossy().into_owned());
    let subject = Subject {
        label,
        command: Box::new(move |depth, seconds| {
            let mut command = Command::new(&ruby);
            command
                .arg(&script)
                .args([depth.to_string(), seconds.to_string()]);
            command
        }),
    };
    let bench = CostBench {
        env_prefix: "RUBY_COST",
        frame_name: "Ruby",
        frames: &[Counter::RubyFrames],
        cut: &[Counter::UserStackTruncated, Counter::RubyStackTruncated],
        depths: &[5, 50, 150],
        rounds: 2,
        frequency_hz: 997,
        warm_up: Duration::from_secs(2),
        measured: Duration::from_secs(4),
    };
    bench.run(&[subject]);
}
