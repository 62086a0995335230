//! Finding and loading the object's programs.

use aya::{Ebpf, programs::PerfEvent};
use icecore_unwinders::BPF_RUNTIMES;
use tracing::{debug, warn};

use super::{
    REJECT_RUNTIME_ENV,
    errors::{SamplerError, permission_or_program},
};

pub(super) fn perf_program<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut PerfEvent, SamplerError> {
    program(ebpf, name)
}

/// The program `name` of the object, as a `T` (`PerfEvent`, `RawTracePoint`…).
pub(super) fn program<'a, T>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut T, SamplerError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(SamplerError::MissingProgram(name))?
        .try_into()
        .map_err(|source| SamplerError::Program { name, source })
}

pub(super) fn load_program(ebpf: &mut Ebpf, name: &'static str) -> Result<(), SamplerError> {
    let program = perf_program(ebpf, name)?;
    program
        .load()
        .map_err(|source| permission_or_program(name, source))?;
    // How close the program is to the verifier's 1M-instruction limit.
    if let Some(count) = program
        .info()
        .ok()
        .and_then(|info| info.verified_instruction_count())
    {
        debug!(
            program = name,
            verified_instructions = count,
            "BPF program loaded"
        );
    }
    Ok(())
}

/// The program slot [`REJECT_RUNTIME_ENV`] names, or `u32::MAX`.
pub(super) fn rejected_program_for_test() -> u32 {
    let Ok(name) = std::env::var(REJECT_RUNTIME_ENV) else {
        return u32::MAX;
    };
    match BPF_RUNTIMES.iter().find(|r| r.name == name) {
        Some(runtime) => {
            warn!("{REJECT_RUNTIME_ENV}={name}: its BPF program is made to fail verification");
            runtime.program as u32
        }
        None => u32::MAX,
    }
}
