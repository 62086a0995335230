// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! Shared machinery of the native-unwinding tests (`integration/native.rs`):
//! their constants, fixture builds, sample analysis, the pid-filtered
//! measurement and the BPF-map churn of the baseline test.

pub mod analysis;
pub mod churn;
pub mod measure;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::build;
use crate::support::now_unix_nanos;

/// Sampling frequency of the unwinding tests: prime (no aliasing with the
/// fixtures' 40 ms cycle) and high enough for thousands of samples per test.
pub const NATIVE_HZ: u32 = 499;

/// Samples are evaluated from this long after the fixture was described to BPF.
pub const WARM_UP: Duration = Duration::from_millis(500);

/// How long samples are evaluated after the warm-up.
pub const MEASURE: Duration = Duration::from_secs(5);

/// Most distribution code: optimized, no frame pointers.
pub const C_FLAGS: &[&str] = &["-O2", "-fomit-frame-pointer", "-g"];

/// C_FLAGS plus no sibling calls: a non-tail recursion must keep every frame.
pub const C_FLAGS_NO_SIBLING: &[&str] = &[
    "-O2",
    "-fomit-frame-pointer",
    "-fno-optimize-sibling-calls",
    "-g",
];

/// Longest wait for icecore's next batch (its metrics are refreshed per batch).
pub const BATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Inclusive-share tolerance, in percentage points.
pub const SHARE_TOLERANCE: f64 = 4.0;

/// Minimum share of the evaluated samples that must reach `main`.
pub const REACH_MAIN_PCT: f64 = 97.0;

/// Evaluating `MEASURE` at `NATIVE_HZ` of a CPU-bound fixture gives about
/// `NATIVE_HZ * MEASURE` samples; demand half (the machine may be loaded).
pub fn min_samples() -> u64 {
    (NATIVE_HZ as f64 * MEASURE.as_secs_f64() * 0.5) as u64
}

/// A fresh temp dir for a test's fixtures (icecore's logs go there too).
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Builds the C fixture `native.c` (linked with `-ldl`) with `flags` into
/// `dir/output`.
pub fn compile_native_c(flags: &[&str], dir: &Path, output: &str) -> PathBuf {
    build::compile("gcc", flags, "native.c", &["-ldl"], dir, output)
}

/// Builds the Rust fixture `native_rust.rs` at opt-level=2 without frame
/// pointers, with line tables, crate name `fixture`, into `dir/native_rust`.
pub fn compile_native_rust(dir: &Path) -> PathBuf {
    build::compile(
        "rustc",
        &[
            "--edition",
            "2024",
            "--crate-name",
            "fixture",
            "-C",
            "opt-level=2",
            "-C",
            "force-frame-pointers=no",
            "-C",
            "debuginfo=1",
            "-C",
            "panic=abort",
        ],
        "native_rust.rs",
        &[],
        dir,
        "native_rust",
    )
}

/// Builds the library fixture `native_lib.c` as a shared object (`-shared
/// -fPIC` added to `flags`) into `dir/output`.
pub fn compile_native_lib(flags: &[&str], dir: &Path, output: &str) -> PathBuf {
    let mut lib_flags = flags.to_vec();
    lib_flags.extend(["-shared", "-fPIC"]);
    build::compile("gcc", &lib_flags, "native_lib.c", &[], dir, output)
}

/// Builds `native.c` with `C_FLAGS` and a `FIXTURE_TAG` unique to this call: a
/// binary of its own (unique content, so a table of its own) that nothing else
/// runs.
pub fn compile_unique_native_c(dir: &Path, output: &str) -> PathBuf {
    let tag = format!("-DFIXTURE_TAG=\"{output}-{}\"", now_unix_nanos());
    let mut flags = C_FLAGS.to_vec();
    flags.push(&tag);
    compile_native_c(&flags, dir, output)
}
