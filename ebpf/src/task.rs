//! User registers of the current task when a sample interrupted kernel code.
//!
//! On x86-64 the user `pt_regs` sit at the top of the task's kernel stack:
//! `task->stack + THREAD_SIZE - sizeof(pt_regs)`. The offset of
//! `task_struct.stack` varies per kernel build, so user space reads it from BTF
//! and passes it in `TASK_STACK_OFFSET`. THREAD_SIZE is 16 KiB, or 32 KiB with
//! KASAN, and FRED kernels leave 16 bytes above `pt_regs`; each is tried and
//! the user code and stack segment selectors confirm the right one (a kernel
//! thread has neither, and gets no user stack).

use aya_ebpf::helpers::{bpf_probe_read_kernel, generated::bpf_get_current_task};
use icecore_unwinders::Registers;

/// Offset of `stack` in `struct task_struct`; 0 when unknown. Set at load time.
#[unsafe(no_mangle)]
static TASK_STACK_OFFSET: u64 = 0;

const PT_REGS_SIZE: u64 = 21 * 8;
const FRED_PADDING: u64 = 16;
const PT_REGS_RBP: u64 = 4 * 8;
const PT_REGS_RIP: u64 = 16 * 8;
const USER_CS: u64 = 0x33;
const USER_DS: u64 = 0x2b;

/// `rip, cs, eflags, rsp, ss`: the tail of `pt_regs`, read in one go.
#[repr(C)]
struct InterruptFrame {
    ip: u64,
    cs: u64,
    flags: u64,
    sp: u64,
    ss: u64,
}

/// Offset of `thread.fsbase` in `struct task_struct`; 0 when unknown. Set at load time.
#[unsafe(no_mangle)]
static TASK_FSBASE_OFFSET: u64 = 0;

/// The current task's FS base: glibc's and musl's `pthread_self()`.
#[inline(always)]
pub fn fs_base() -> Option<u64> {
    // SAFETY: a plain load of a load-time constant.
    let offset = unsafe { core::ptr::read_volatile(&TASK_FSBASE_OFFSET) };
    if offset == 0 {
        return None;
    }
    // SAFETY: no arguments; the read below tolerates bad addresses.
    let task = unsafe { bpf_get_current_task() };
    unsafe { bpf_probe_read_kernel((task + offset) as *const u64) }.ok()
}

#[inline(always)]
pub fn user_registers() -> Option<Registers> {
    // SAFETY: a plain load of a load-time constant.
    let offset = unsafe { core::ptr::read_volatile(&TASK_STACK_OFFSET) };
    if offset == 0 {
        return None;
    }
    // SAFETY: bpf_get_current_task has no arguments; every dereference below
    // goes through bpf_probe_read_kernel, which tolerates bad addresses.
    let task = unsafe { bpf_get_current_task() };
    let stack: u64 = unsafe { bpf_probe_read_kernel((task + offset) as *const u64) }.ok()?;
    if stack == 0 {
        return None;
    }
    // Kernels with FRED support (6.9+, CONFIG_X86_FRED) keep 16 bytes
    // free above `pt_regs` (TOP_OF_KERNEL_STACK_PADDING).
    for top in [
        16 * 1024u64,
        16 * 1024 - FRED_PADDING,
        32 * 1024,
        32 * 1024 - FRED_PADDING,
    ] {
        let regs = stack + top - PT_REGS_SIZE;
        let Ok(frame) =
            (unsafe { bpf_probe_read_kernel((regs + PT_REGS_RIP) as *const InterruptFrame) })
        else {
            continue;
        };
        if frame.cs == USER_CS && frame.ss == USER_DS {
            let bp: u64 =
                unsafe { bpf_probe_read_kernel((regs + PT_REGS_RBP) as *const u64) }.ok()?;
            return Some(Registers {
                ip: frame.ip,
                sp: frame.sp,
                bp,
            });
        }
    }
    None
}
