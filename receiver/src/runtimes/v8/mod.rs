//! V8 (Node.js 18 to 24, and any binary exporting `v8dbg_*` constants):
//! JavaScript frames without any Node flag.
//!
//! - [`introspection`] and [`layout`]: what each binary says of its frames
//!   and objects, with the few missing values as per-version data.
//! - [`process`]: a process described to the BPF walk
//!   (`icecore_unwinders::v8`): its builtins (and each isolate's copy),
//!   its JIT code ranges, the interpreter's trampolines.
//! - [`plugin`]: the runtime plugin (detection, BPF map, JIT ranges
//!   followed as V8 commits them).
//! - [`names`], [`positions`], [`code`], [`symbols`]: functions named as
//!   `--cpu-prof` names them, scripts and lines from bytecode offsets,
//!   Sparkplug's offset tables and optimized code's position tables with
//!   its inlined functions, cached per SharedFunctionInfo and per code
//!   range.

pub mod code;
pub mod introspection;
pub mod layout;
pub mod names;
pub mod plugin;
pub mod positions;
pub mod process;
pub mod symbols;
#[cfg(test)]
mod symbols_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod walk_tests;

pub use introspection::{InspectError, V8Binary, V8Version, inspect};
pub use layout::{MissingConstant, V8Layout, resolve};
