//! Perl 5.36–5.44: the user-space half of the Perl unwinder.
//!
//! - [`detect`]: which mapped file is Perl, its version, how a thread finds
//!   its interpreter, where the run loops are.
//! - [`layouts`]: per-version struct offsets, as data.
//! - [`objects`]: sub names (CV, GV, stash) and statements (COP) read from
//!   the process.
//! - [`plugin`]: the [`RuntimePlugin`](super::RuntimePlugin).
//!
//! BPF's walk (`icecore_unwinders::perl`) reports each sub call as its CV
//! and the COP its frame is at, and ends with the main program's frame.

pub mod detect;
pub mod layouts;
pub mod objects;
pub mod plugin;
#[cfg(test)]
mod walk_tests;

pub use plugin::PerlPlugin;
