//! Offsets in the kernel's `struct task_struct` that the BPF programs read,
//! from the kernel's BTF.

use tracing::warn;

use super::errors::SamplerError;
use crate::kernel_btf;

/// The offsets, 0 where unknown (the programs then do without).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct TaskOffsets {
    /// `stack`: the user registers of a thread in the kernel.
    pub stack: u64,
    /// `thread.fsbase`: the thread's TLS, for interpreters.
    pub fsbase: u64,
    /// `pid` (the thread id), for off-CPU sampling.
    pub pid: u64,
    /// `flags`, for off-CPU sampling.
    pub flags: u64,
    /// `__state` (`state` before Linux 5.14), for off-CPU sampling.
    pub state: u64,
}

impl TaskOffsets {
    /// Reads the offsets; those off-CPU sampling needs (`off_cpu`) must be
    /// found, the others are warned about when missing.
    pub(super) fn read(off_cpu: bool) -> Result<Self, SamplerError> {
        let stack = task_member("stack")
            .map_err(|e| warn!("no user stacks for samples taken in kernel mode: {e}"))
            .unwrap_or(0);
        let fsbase = task_fsbase_offset()
            .map_err(|e| warn!("no interpreter stacks (the thread's FS base is unknown): {e}"))
            .unwrap_or(0);
        let mut offsets = TaskOffsets {
            stack,
            fsbase,
            ..TaskOffsets::default()
        };
        if off_cpu {
            offsets.pid = off_cpu_member("pid")?;
            offsets.flags = off_cpu_member("flags")?;
            // Renamed in Linux 5.14.
            offsets.state = off_cpu_member("__state").or_else(|_| off_cpu_member("state"))?;
        }
        Ok(offsets)
    }
}

fn task_member(member: &str) -> Result<u64, kernel_btf::BtfError> {
    kernel_btf::member_offset_in_file(
        std::path::Path::new(kernel_btf::VMLINUX_BTF),
        "task_struct",
        member,
    )
    .map(u64::from)
}

/// Offset of `member` in `struct task_struct`, which off-CPU sampling reads.
fn off_cpu_member(member: &str) -> Result<u64, SamplerError> {
    task_member(member).map_err(|e| {
        SamplerError::OffCpu(format!(
            "the offset of task_struct.{member} is unknown: {e}"
        ))
    })
}

/// Offset of `thread.fsbase` in `struct task_struct`, from the kernel's BTF.
fn task_fsbase_offset() -> Result<u64, kernel_btf::BtfError> {
    let btf = std::path::Path::new(kernel_btf::VMLINUX_BTF);
    let thread = kernel_btf::member_offset_in_file(btf, "task_struct", "thread")?;
    let fsbase = kernel_btf::member_offset_in_file(btf, "thread_struct", "fsbase")?;
    Ok(u64::from(thread) + u64::from(fsbase))
}
