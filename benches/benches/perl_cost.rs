//! BPF time per Perl frame, from the kernel's own BPF statistics (harness:
//! `icecore_benches::runtime_cost`).
//!
//! Needs root. Runs `fixtures/perl_recurse.pl` (a plain recursive Perl sub,
//! burning CPU at the bottom) under Debian's perl at several Perl depths:
//! Perl calls Perl without a new C frame, so the native part stays the same
//! at every depth and the fit's slope is the cost of a Perl frame (one read
//! of its 80-byte context); the fixed cost is finding the interpreter
//! through the thread's TLS and its stack info.
//!
//! `cargo bench -p icecore-benches --bench perl_cost`
//!
//! Environment: `PERL_COST_PERL` (interpreter instead of `/usr/bin/perl`),
//! `PERL_COST_DEPTHS` (e.g. `5,150`), `PERL_COST_HZ`, `PERL_COST_ROUNDS`.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use icecore_benches::runtime_cost::{CostBench, Subject};
use icecore_receiver::Counter;

fn main() {
    if !icecore_benches::root_bench_selected("perl_cost") {
        return;
    }
    let perl = std::env::var_os("PERL_COST_PERL")
        .map_or_else(|| PathBuf::from("/usr/bin/perl"), PathBuf::from);
    if !perl.exists() {
        println!(
            "perl_cost: skipped, no {} (set PERL_COST_PERL)",
            perl.display()
        );
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/perl_recurse.pl");
    let subjects = [Subject {
        label: perl.display().to_string(),
        command: Box::new(move |depth, seconds| {
            let mut command = Command::new(&perl);
            command
                .arg(&script)
                .args([depth.to_string(), seconds.to_string()]);
            command
        }),
    }];
    let bench = CostBench {
        env_prefix: "PERL_COST",
        frame_name: "Perl",
        frames: &[Counter::PerlFrames],
        cut: &[Counter::UserStackTruncated, Counter::PerlStackTruncated],
        depths: &[5, 50, 150],
        rounds: 2,
        frequency_hz: 997,
        warm_up: Duration::from_secs(2),
        measured: Duration::from_secs(4),
    };
    bench.run(&subjects);
}
