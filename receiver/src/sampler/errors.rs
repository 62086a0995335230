//! Why loading or running the BPF programs failed, told for users.

use std::io;

use crate::sample_rings::SampleRingError;

/// Why sampling could not start.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    /// The process lacks the privileges to load BPF programs and open perf events.
    #[error("icecore needs root, or CAP_BPF + CAP_PERFMON + CAP_SYS_PTRACE")]
    Privileges,
    /// The kernel is older than the oldest one icecore supports.
    #[error("icecore needs Linux 5.8 or newer for the BPF ring buffer (this is {0})")]
    KernelTooOld(String),
    /// The binary was built with AYA_BUILD_SKIP and carries no BPF programs.
    #[error(
        "this icecore binary was built without its BPF programs (AYA_BUILD_SKIP); rebuild it with bpf-linker installed"
    )]
    NoBpfObject,
    /// The kernel refused the BPF object or one of its maps.
    #[error("loading the BPF programs failed: {0}")]
    Load(#[from] aya::EbpfError),
    /// A program named in the object is missing.
    #[error("BPF program {0} missing from the object")]
    MissingProgram(&'static str),
    /// A map named in the object is missing.
    #[error("BPF map {0} missing from the object")]
    MissingMap(&'static str),
    /// The kernel's verifier rejected a program, or attaching it failed.
    #[error("BPF program {name}: {source}")]
    Program {
        /// The program.
        name: &'static str,
        /// What went wrong.
        source: aya::programs::ProgramError,
    },
    /// A map operation failed.
    #[error("BPF map {name}: {source}")]
    Map {
        /// The map.
        name: &'static str,
        /// What went wrong.
        source: aya::maps::MapError,
    },
    /// The online CPUs could not be listed.
    #[error("cannot list online CPUs ({0}): {1}")]
    OnlineCpus(&'static str, io::Error),
    /// Off-CPU sampling cannot run on this kernel.
    #[error("off-CPU sampling: {0}")]
    OffCpu(String),
    /// The per-CPU sample rings could not be set up.
    #[error(transparent)]
    SampleRings(#[from] SampleRingError),
}

fn is_permission_denied(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<io::Error>()
            && io.kind() == io::ErrorKind::PermissionDenied
        {
            return true;
        }
        if e.to_string().contains("Operation not permitted") {
            return true;
        }
        current = e.source();
    }
    false
}

pub(super) fn permission_or<E: std::error::Error + 'static>(
    error: E,
    wrap: impl FnOnce(E) -> SamplerError,
) -> SamplerError {
    if is_permission_denied(&error) {
        SamplerError::Privileges
    } else {
        wrap(error)
    }
}

pub(super) fn permission_or_program(
    name: &'static str,
    source: aya::programs::ProgramError,
) -> SamplerError {
    // The verifier rejects programs with EACCES too; a log means it ran, so
    // privileges were not the problem.
    if let aya::programs::ProgramError::LoadError { verifier_log, .. } = &source
        && !verifier_log.to_string().trim().is_empty()
    {
        return SamplerError::Program { name, source };
    }
    permission_or(source, |source| SamplerError::Program { name, source })
}

/// One line for a (possibly multi-line) load error: its first line, and for
/// a verifier log the line that says why (the last one before the
/// verifier's statistics).
pub(super) fn one_line_reason(message: &str) -> String {
    let first = message.lines().next().unwrap_or("").trim();
    let first = first.split(" Verifier output:").next().unwrap_or(first);
    let why = message.lines().rev().map(str::trim).find(|line| {
        !line.is_empty()
            && !line.starts_with("processed ")
            && !line.starts_with("verification time")
            && !line.starts_with("stack depth")
            && !line.starts_with(": ")
    });
    match why {
        Some(why) if message.contains("Verifier output:") => format!("{first}: {why}"),
        _ => first.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_log_is_told_in_one_line() {
        let log = "BPF program unwind_python: the BPF_PROG_LOAD syscall returned Permission \
                   denied (os error 13). Verifier output: 0: R1=ctx() R10=fp0\n\
                   1: (bf) r6 = r1\nR1 invalid mem access 'scalar'\n\
                   processed 40 insns (limit 1000000)\n: Permission denied (os error 13)";
        assert_eq!(
            one_line_reason(log),
            "BPF program unwind_python: the BPF_PROG_LOAD syscall returned Permission denied \
             (os error 13).: R1 invalid mem access 'scalar'"
        );
        assert_eq!(one_line_reason("one\ntwo"), "one");
    }
}
