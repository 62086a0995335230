//! HotSpot (OpenJDK 8–27), first part: what the unwinder will read, read
//! from a live JVM through its own introspection tables.
//!
//! - [`detect`]: the mapped `libjvm.so`, its exported tables, the JDK version.
//! - [`vmstructs`]: the tables (`gHotSpotVMStructs`, …) read from the
//!   process; [`layout`]: the offsets and sizes the unwinder needs, taken
//!   from them, per version shape.
//! - [`code_cache`]: the code heaps' ranges, the blob at an address (the
//!   segment map), an nmethod's PcDescs, scopes and metadata.
//! - [`compressed`]: UNSIGNED5, line tables, scope records, PcDesc lookup.
//! - [`names`]: `package.Class.method`, signature, source file and lines.
//!
//! `walk_tests.rs` checks all of it against live JDK 17 and 25 processes,
//! inlined methods included. The BPF program, the frame walk and the
//! plugin come next (`shared/notes/hotspot-internals.md` has the facts).

pub mod code_cache;
pub mod compressed;
pub mod detect;
pub mod layout;
pub mod names;
pub mod plugin;
pub mod vmstructs;
#[cfg(test)]
mod walk_tests;
