//! BPF time per PHP frame, from the kernel's own BPF statistics (harness:
//! `icecore_benches::runtime_cost`).
//!
//! Needs root. Runs `fixtures/php_recurse.php` (a plain recursive PHP
//! function, burning CPU at the bottom) under Debian's PHP 8.2, with
//! opcache's JIT off and on, at several PHP depths: PHP calls PHP without a
//! new C frame, so the native part stays the same at every depth and the
//! fit's slope is the cost of a PHP frame (one windowed read of its
//! `zend_execute_data`). With the JIT on, the native walk also hands the
//! JIT frame over once (two more tail calls in the fixed cost).
//!
//! `cargo bench -p icecore-benches --bench php_cost`
//!
//! Environment: `PHP_COST_PHP` (interpreter instead of `/usr/bin/php8.2`),
//! `PHP_COST_DEPTHS` (e.g. `5,150`), `PHP_COST_HZ`, `PHP_COST_ROUNDS`.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use icecore_benches::runtime_cost::{CostBench, Subject};
use icecore_receiver::Counter;

/// Opcache's tracing JIT, on for the CLI.
const JIT: [&str; 6] = [
    "-d",
    "opcache.enable_cli=1",
    "-d",
    "opcache.jit=tracing",
    "-d",
    "opcache.jit_buffer_size=64M",
];

fn main() {
    if !icecore_benches::root_bench_selected("php_cost") {
        return;
    }
    let php = std::env::var_os("PHP_COST_PHP")
        .map_or_else(|| PathBuf::from("/usr/bin/php8.2"), PathBuf::from);
    if !php.exists() {
        println!("php_cost: skipped, no {} (set PHP_COST_PHP)", php.display());
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/php_recurse.php");
    let label = php
        .file_name()
        .map_or_else(|| "php".into(), |n| n.to_string_lossy().into_owned());
    let subjects = [false, true].map(|jit| {
        let (php, script) = (php.clone(), script.clone());
        Subject {
            label: if jit {
                format!("{label} JIT")
            } else {
                label.clone()
            },
            command: Box::new(move |depth, seconds| {
                let mut command = Command::new(&php);
                if jit {
                    command.args(JIT);
                }
                command
                    .arg(&script)
                    .args([depth.to_string(), seconds.to_string()]);
                command
            }),
        }
    });
    let bench = CostBench {
        env_prefix: "PHP_COST",
        frame_name: "PHP",
        frames: &[Counter::PhpFrames],
        cut: &[Counter::UserStackTruncated, Counter::PhpStackTruncated],
        depths: &[5, 50, 150],
        rounds: 2,
        frequency_hz: 997,
        warm_up: Duration::from_secs(2),
        measured: Duration::from_secs(4),
    };
    bench.run(&subjects);
}
