//! PHP 8.0–8.5 (the Zend engine): the user-space half of the PHP unwinder.
//!
//! - [`detect`]: which mapped file is the engine, its version, where
//!   `executor_globals` and `execute_ex` are.
//! - [`layouts`]: per-version struct offsets, as data.
//! - [`objects`]: functions, classes, strings and line tables, read from
//!   the process.
//! - [`plugin`]: the [`RuntimePlugin`](super::RuntimePlugin).
//!
//! BPF (`ebpf/src/runtimes/php.rs`, walk in `icecore_unwinders::php`)
//! reports each frame of the `zend_execute_data` chain as its function and
//! `opline`; the plugin reads names, files and line tables once per
//! function through `/proc/PID/mem` and puts each `execute_ex` invocation's
//! frames where its `execute_ex` frame is on the native stack. Opcache's JIT
//! code runs on `execute_ex`'s frame, so BPF unwinds it as that frame.

pub mod detect;
pub mod layouts;
pub mod objects;
pub mod plugin;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod walk_tests;

pub use plugin::PhpPlugin;
