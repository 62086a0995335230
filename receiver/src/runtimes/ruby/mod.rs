//! CRuby 3.1–3.4, first part: finding the interpreter and the running
//! thread's execution context ([`detect`]), the per-version layouts
//! ([`layouts`]), and reading iseqs, Strings and line tables ([`objects`]).
//! The BPF walk itself is `icecore_unwinders::ruby`; `walk_tests.rs` runs it
//! against live processes. The BPF program and the plugin that wires these
//! into the profiler come next.

pub mod detect;
pub mod layouts;
pub mod objects;
#[cfg(test)]
mod walk_tests;
