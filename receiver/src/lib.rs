//! User space of icecore's eBPF source: loads the BPF programs, samples every
//! CPU, tracks processes, symbolizes frames and aggregates samples into the
//! profile model of `icecore-otlp`.
//!
//! - [`sampler`]: BPF loading, perf events and counters.
//! - [`sample_rings`]: the per-CPU ring buffers samples arrive in.
//! - [`map_memory`]: kernel memory of the BPF maps.
//! - [`record`]: decoding ring-buffer records.
//! - [`processes`], [`process_maps`]: what is known of each sampled process.
//! - [`symbolize`]: native (ELF) and kernel (kallsyms) symbolization.
//! - [`aggregate`]: per-interval aggregation into a `ProfileBatch`.
//! - [`profiler`]: the source as a whole, driven by the binary.

pub mod aggregate;
pub mod clock;
pub mod exec_watch;
pub mod host;
pub mod inner_array;
pub mod kernel_btf;
pub mod map_memory;
pub mod metadata;
pub mod native_unwind;
pub mod off_cpu_join;
pub mod process_maps;
pub mod process_pages;
pub mod processes;
pub mod profiler;
pub mod record;
pub mod runtimes;
pub mod sample_rings;
pub mod sampler;
pub mod startup;
pub mod symbolize;
pub mod table_slots;
pub mod unwind_maps;
pub mod unwind_table;

#[cfg(test)]
pub(crate) mod test_support;

pub use icecore_unwinders::Counter;
pub use profiler::{CpuProfiler, OffCpuStats, ProfilerOptions, ProfilerStats};
pub use sampler::{OffCpuOptions, SamplerError, SamplerOptions};
