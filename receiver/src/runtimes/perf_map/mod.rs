//! JIT code named from the symbol files runtimes write for `perf`: the
//! perf map and jitdump parsers, the cleaning of known name formats, and
//! the plugin that uses them.

pub mod jitdump;
pub mod names;
pub mod parse;
pub mod plugin;

pub use plugin::PerfMapPlugin;
