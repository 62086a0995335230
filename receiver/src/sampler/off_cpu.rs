//! Off-CPU sampling: the `sched_switch` program that notes when a thread of
//! a profiled process blocks (and takes its stack) and when it runs again,
//! and the unwinders built as raw tracepoint programs for its tail-call
//! chain (see `ebpf/src/off_cpu.rs`).

use std::time::Duration;

use aya::{
    Ebpf,
    maps::{MapData, ProgramArray},
    programs::{RawTracePoint, raw_trace_point::RawTracePointLinkId},
};
use icecore_unwinders::{BpfRuntime, ProgramIndex};
use tracing::{info, warn};

use super::{
    ProgramCost, RuntimeLoad,
    errors::{SamplerError, one_line_reason},
};

/// What off-CPU sampling records.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OffCpuOptions {
    /// The share of context switches recorded, in (0, 1].
    pub probability: f64,
    /// Shorter times off CPU are not reported.
    pub min_duration: Duration,
}

impl OffCpuOptions {
    /// `OFF_CPU_THRESHOLD`: a switch is recorded when a random 32-bit value
    /// is below it.
    pub fn threshold(&self) -> u64 {
        let p = self.probability.clamp(0.0, 1.0);
        // At most 2^32, which every 32-bit value is below.
        (p * 4_294_967_296.0).round() as u64
    }

    /// `OFF_CPU_MIN_NS`.
    pub fn min_ns(&self) -> u64 {
        u64::try_from(self.min_duration.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Entries of `OFF_CPU_STARTS`: threads waiting at once whose wait was
/// sampled. An LRU map, so more only forgets the longest-waiting ones.
pub const OFF_CPU_THREADS_MAX: u32 = 65_536;

/// The entry program, on `sched_switch`.
const SWITCH: &str = "off_cpu_switch";
const TRACEPOINT: &str = "sched_switch";

/// The raw tracepoint build of each program of the CPU chain.
fn off_cpu_build(perf_program: &str) -> Option<&'static str> {
    Some(match perf_program {
        "unwind_native" => "off_cpu_unwind_native",
        "unwind_native_resumed" => "off_cpu_unwind_native_resumed",
        "emit_sample" => "off_cpu_emit_sample",
        "unwind_python" => "off_cpu_unwind_python",
        "unwind_ruby" => "off_cpu_unwind_ruby",
        "unwind_hotspot" => "off_cpu_unwind_hotspot",
        "unwind_v8" => "off_cpu_unwind_v8",
        "unwind_php" => "off_cpu_unwind_php",
        "unwind_perl" => "off_cpu_unwind_perl",
        _ => return None,
    })
}

/// The loaded off-CPU programs, and their link while attached.
pub(super) struct OffCpuPrograms {
    // Kept open: the kernel empties a program array with its last reference.
    _programs: ProgramArray<MapData>,
    link: Option<RawTracePointLinkId>,
}

impl OffCpuPrograms {
    /// Loads the chain's programs (the required ones and those of
    /// `runtimes` that loaded for CPU samples) and the entry program.
    pub(super) fn load(
        ebpf: &mut Ebpf,
        runtimes: &[(&'static BpfRuntime, RuntimeLoad)],
    ) -> Result<Self, SamplerError> {
        let loaded_runtimes = runtimes
            .iter()
            .filter(|(_, load)| *load == RuntimeLoad::Loaded)
            .map(|(runtime, _)| (runtime.program, runtime.program_name));
        let map = ebpf
            .take_map("OFF_CPU_PROGRAMS")
            .ok_or(SamplerError::MissingMap("OFF_CPU_PROGRAMS"))?;
        let mut programs = ProgramArray::try_from(map).map_err(|source| SamplerError::Map {
            name: "OFF_CPU_PROGRAMS",
            source,
        })?;
        for (index, perf_name) in ProgramIndex::REQUIRED.into_iter().chain(loaded_runtimes) {
            let name = off_cpu_build(perf_name).ok_or(SamplerError::MissingProgram(perf_name))?;
            let required = ProgramIndex::REQUIRED.iter().any(|(i, _)| *i == index);
            let program = raw_tracepoint(ebpf, name)?;
            if let Err(source) = program.load() {
                let error = program_error(name, source);
                if required {
                    return Err(error);
                }
                // The runtime's frames of off-CPU samples stay native.
                warn!(
                    program = name,
                    "the kernel rejected a runtime's off-CPU program: {}",
                    one_line_reason(&format!("{error:#}"))
                );
                continue;
            }
            let fd = program
                .fd()
                .and_then(|fd| fd.try_clone().map_err(Into::into))
                .map_err(|source| program_error(name, source))?;
            programs
                .set(index as u32, &fd, 0)
                .map_err(|source| SamplerError::Map {
                    name: "OFF_CPU_PROGRAMS",
                    source,
                })?;
        }
        raw_tracepoint(ebpf, SWITCH)?
            .load()
            .map_err(|source| program_error(SWITCH, source))?;
        Ok(OffCpuPrograms {
            _programs: programs,
            link: None,
        })
    }

    /// Attaches the entry program (once).
    pub(super) fn attach(&mut self, ebpf: &mut Ebpf) -> Result<(), SamplerError> {
        if self.link.is_none() {
            let link = raw_tracepoint(ebpf, SWITCH)?
                .attach(TRACEPOINT)
                .map_err(|source| program_error(SWITCH, source))?;
            self.link = Some(link);
            info!("off-CPU sampling started");
        }
        Ok(())
    }

    /// Detaches the entry program: no off-CPU record is written after this
    /// returns (detaching waits for running programs).
    pub(super) fn detach(&mut self, ebpf: &mut Ebpf) -> Result<(), SamplerError> {
        match self.link.take() {
            Some(link) => raw_tracepoint(ebpf, SWITCH)?
                .detach(link)
                .map_err(|source| program_error(SWITCH, source)),
            None => Ok(()),
        }
    }

    /// Kernel-measured cost of the entry program per context switch, the
    /// unwinders it tail-calls included.
    pub(super) fn cost(&self, ebpf: &Ebpf) -> Option<ProgramCost> {
        ProgramCost::of(ebpf.program(SWITCH)?)
    }
}

/// A failure of an off-CPU program: the CPU programs loaded before it, so
/// privileges are not what is missing, and the kernel's reason is kept.
fn program_error(name: &'static str, source: aya::programs::ProgramError) -> SamplerError {
    SamplerError::Program { name, source }
}

fn raw_tracepoint<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut RawTracePoint, SamplerError> {
    super::programs::program(ebpf, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probability_is_a_32_bit_threshold() {
        let options = |probability| OffCpuOptions {
            probability,
            min_duration: Duration::from_micros(1),
        };
        assert_eq!(options(1.0).threshold(), 1 << 32);
        assert_eq!(options(0.5).threshold(), 1 << 31);
        assert_eq!(options(0.0).threshold(), 0);
        assert_eq!(options(7.0).threshold(), 1 << 32);
        assert_eq!(options(1.0).min_ns(), 1000);
    }

    #[test]
    fn every_program_of_the_chain_has_an_off_cpu_build() {
        for (_, name) in ProgramIndex::REQUIRED {
            assert!(off_cpu_build(name).is_some(), "{name}");
        }
        for runtime in icecore_unwinders::BPF_RUNTIMES {
            assert!(
                off_cpu_build(runtime.program_name).is_some(),
                "{}",
                runtime.name
            );
        }
    }
}
