//! Types shared by icecore's BPF programs and its user space, and the unwinding
//! step logic that runs in BPF.
//!
//! Everything here is `no_std` and generic over how memory is read
//! ([`MemoryReader`]), so the exact code the BPF programs run is also run by
//! host tests against real stacks. The `user` feature adds the user-space half
//! (`aya::Pod` impls, and `table`: unwind tables built from ELF files,
//! file IDs and a host unwinder).
#![no_std]
#![deny(missing_docs)]

#[cfg(feature = "user")]
extern crate std;

pub mod counters;
pub mod events;
pub mod hotspot;
pub mod memory;
pub mod native;
pub mod perl;
pub mod php;
pub mod programs;
pub mod python;
pub mod ruby;
pub mod runtime;
pub mod sample;
#[cfg(feature = "user")]
pub mod table;
#[cfg(feature = "user")]
mod user;
pub mod v8;

pub use counters::{COUNTER_COUNT, Counter};
pub use memory::{BlockReader, MemoryReader, StackWindow, WindowedReader};
pub use native::{Registers, StepOutcome};
pub use programs::{MAX_TAIL_CALLS, ProgramIndex};
pub use runtime::{BPF_RUNTIMES, BpfRuntime, Dispatch, RuntimeStates};
pub use sample::{SampleHeader, SampleRecord, UnwindScratch, UnwindState};
