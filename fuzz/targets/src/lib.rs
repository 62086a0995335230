//! The bodies of icecore's fuzz targets, one module per target, each with a
//! `run(data)` that feeds one input to a parser of untrusted input.
//!
//! They live in a crate of the main workspace rather than in the cargo-fuzz
//! crate (`fuzz/`, nightly and sanitizers, its own lock file) so that the
//! ordinary test build compiles them with the code they call and replays
//! their corpora (`tests/replay.rs`): a target that no longer builds, or a
//! committed input that panics again, fails `cargo test` in CI, where the
//! libFuzzer build (6.5 minutes) does not fit. `fuzz/fuzz_targets/*.rs` are
//! one-line libFuzzer entry points calling the same functions.

mod support;

pub mod config_file;
pub mod elf_symbols;
pub mod elf_unwind_table;
pub mod gopclntab;
pub mod jitdump;
pub mod otlp_receiver;
pub mod otlp_request;
pub mod perf_map;
pub mod pprof_scrape;
pub mod proc_maps;
pub mod relabel;
pub mod runtime_objects;
pub mod runtime_walk;

pub use support::{probe_addresses, remove_scratch_files, scratch_file, scratch_memory};

/// One fuzz target: its name (its `fuzz/corpus/` and `fuzz/regressions/`
/// directory and its cargo-fuzz binary), its body, and the largest input
/// `scripts/fuzz.sh` gives it (`-max_len`).
#[derive(Clone, Copy)]
pub struct Target {
    /// The target's name.
    pub name: &'static str,
    /// Runs one input; panics on a bug.
    pub run: fn(&[u8]),
    /// Largest input, in bytes.
    pub max_len: usize,
}

/// Every target, so that the replay test cannot forget one.
pub const TARGETS: &[Target] = &[
    Target {
        name: "config_file",
        run: config_file::run,
        max_len: 8192,
    },
    Target {
        name: "relabel",
        run: relabel::run,
        max_len: 4096,
    },
    Target {
        name: "proc_maps",
        run: proc_maps::run,
        max_len: 8192,
    },
    Target {
        name: "otlp_request",
        run: otlp_request::run,
        max_len: 16384,
    },
    Target {
        name: "otlp_receiver",
        run: otlp_receiver::run,
        max_len: 16384,
    },
    Target {
        name: "pprof_scrape",
        run: pprof_scrape::run,
        max_len: 16384,
    },
    Target {
        name: "elf_unwind_table",
        run: elf_unwind_table::run,
        max_len: 16384,
    },
    Target {
        name: "elf_symbols",
        run: elf_symbols::run,
        max_len: 16384,
    },
    Target {
        name: "perf_map",
        run: perf_map::run,
        max_len: 8192,
    },
    Target {
        name: "jitdump",
        run: jitdump::run,
        max_len: 8192,
    },
    Target {
        name: "gopclntab",
        run: gopclntab::run,
        max_len: 4096,
    },
    Target {
        name: "runtime_objects",
        run: runtime_objects::run,
        max_len: 16384,
    },
    Target {
        name: "runtime_walk",
        run: runtime_walk::run,
        max_len: 16384,
    },
];
