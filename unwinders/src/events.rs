//! Process lifecycle events BPF reports to user space.

/// What happened to a process.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessEventKind {
    /// The thread-group leader exited (the process is gone once its last thread is).
    Exit = 1,
    /// The process replaced its image with `exec`: its mappings are all new.
    Exec = 2,
    /// A sample of a process BPF has no mapping table for was dropped:
    /// user space should describe the process. Sent at most every few
    /// milliseconds per CPU.
    Unknown = 3,
}

/// One lifecycle event: the exit of a process BPF knows (one with a
/// mapping table), the exec of any process within the PID filter, or a
/// sample of a process BPF does not know.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessEvent {
    /// Process ID.
    pub pid: u32,
    /// A [`ProcessEventKind`] value.
    pub kind: u32,
    /// `bpf_ktime_get_ns()` when it happened: samples before an exec belong
    /// to the image it replaced.
    pub ktime_ns: u64,
}

const _: () = assert!(core::mem::size_of::<ProcessEvent>() == 16);

impl ProcessEvent {
    /// The kind, if it is a known one.
    pub const fn kind(&self) -> Option<ProcessEventKind> {
        match self.kind {
            1 => Some(ProcessEventKind::Exit),
            2 => Some(ProcessEventKind::Exec),
            3 => Some(ProcessEventKind::Unknown),
            _ => None,
        }
    }
}
