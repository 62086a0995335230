//! CRuby 3.1–3.4: the user-space half of the CRuby unwinder.
//!
//! - [`detect`]: which mapped file is CRuby, its version, where the running
//!   thread's execution context is; [`code_facts`]: `vm_exec` and the
//!   symbol table, found from machine code in stripped files.
//! - [`layouts`]: per-version struct offsets, as data.
//! - [`objects`] and [`methods`]: iseqs, Strings, line tables, IDs, method
//!   entries and class names, read from the process.
//! - [`plugin`]: the [`RuntimePlugin`](super::RuntimePlugin).
//!
//! BPF (`ebpf/src/runtimes/ruby.rs`, walk in `icecore_unwinders::ruby`)
//! reports each Ruby frame as an iseq and a `pc` (and a method's own frame
//! its method entry), each C function's frame as its method entry; the
//! plugin reads names, files and lines once per process through
//! `/proc/PID/mem` and puts each VM invocation's frames where its `vm_exec`
//! frame is on the native stack.

pub mod code_facts;
pub mod detect;
pub mod layouts;
pub mod methods;
pub mod objects;
pub mod plugin;
#[cfg(test)]
mod walk_tests;

pub use plugin::RubyPlugin;
