//! Per-CPU counters, one per outcome or failure mode of the BPF programs.
//!
//! Every sample ends in exactly one of `Emitted`, `Idle`, `FilteredOut`,
//! `UnknownProcess`, `UnwindTablePending`, `ProcessTableChanged`, `ScratchUnavailable`,
//! `RingBufferFull`, `SampleRingMissing` or `TailCallFailed`; the others
//! count degradations of emitted samples (a stack cut short, a read that
//! failed).

/// Index into the `COUNTERS` per-CPU array.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    /// perf events that ran the entry program.
    Samples = 0,
    /// CPU samples written to the ring buffer.
    Emitted = 1,
    /// Samples of the idle task (pid 0), not reported.
    Idle = 2,
    /// Samples of processes outside the `--pid` filter.
    FilteredOut = 3,
    /// The per-CPU scratch record could not be looked up.
    ScratchUnavailable = 4,
    /// The ring buffer had no room; the sample was lost.
    RingBufferFull = 5,
    /// A tail call failed (program slot empty); the sample was lost.
    TailCallFailed = 6,
    /// `bpf_get_stack` failed for the kernel stack.
    KernelStackFailed = 7,
    /// No user registers: a kernel thread, or the user `pt_regs` could not be located.
    NoUserRegisters = 8,
    /// Reading user memory failed mid-walk; the stack ends there.
    UserReadFailed = 9,
    /// A frame pointer broke the stack discipline (not increasing, misaligned); the stack ends there.
    UserFrameInvalid = 10,
    /// The user stack hit the frame or tail-call limit and was cut.
    UserStackTruncated = 11,
    /// The sample interrupted kernel code; user registers came from the task's `pt_regs`.
    UserRegistersFromTask = 12,
    /// Frames unwound with a DWARF table row.
    DwarfFrames = 13,
    /// Frames unwound with frame pointers because no table covered the PC.
    FramePointerFrames = 14,
    /// Samples dropped because BPF has no mapping table for the process
    /// (not described yet, or its image just changed with `exec`): a
    /// frame-pointer guess would pass for a complete stack. User space is
    /// told and describes the process.
    UnknownProcess = 15,
    /// CPython frames walked.
    PythonFrames = 16,
    /// CPython samples whose thread has no `PyThreadState` (a thread CPython
    /// does not know, or more threads than BPF searches).
    PythonNoThreadState = 17,
    /// Reading CPython's memory failed mid-walk; the Python stack ends there.
    PythonReadFailed = 18,
    /// The Python stack hit the record or tail-call limit and was cut.
    PythonStackTruncated = 19,
    /// The native unwinder ran the CPython unwinder for a process that has no `PYTHON_PROCESSES` entry.
    PythonProcessMissing = 20,
    /// The sampling CPU has no ring buffer (it was not online at start); the sample was lost.
    SampleRingMissing = 21,
    /// A mapping named a runtime program whose slot is empty (it failed to
    /// load); its frames were unwound as native code instead.
    RuntimeProgramMissing = 22,
    /// Samples dropped because a frame lies in a file whose unwind table
    /// user space is still building (the first milliseconds of a new file).
    UnwindTablePending = 23,
    /// Samples dropped because user space rewrote the process's mapping
    /// table while BPF walked the stack with it.
    ProcessTableChanged = 24,
    /// CRuby control frames walked.
    RubyFrames = 25,
    /// CRuby samples whose thread has no execution context (a thread that
    /// never ran Ruby, or one not started yet, or, found through the main
    /// ractor, one not holding the GVL).
    RubyNoExecutionContext = 26,
    /// Reading CRuby's memory failed mid-walk; the Ruby stack ends there.
    RubyReadFailed = 27,
    /// The Ruby stack hit the record or tail-call limit (or
    /// [`crate::ruby::MAX_RUBY_FRAMES`]) and was cut.
    RubyStackTruncated = 28,
    /// The native unwinder ran the CRuby unwinder for a process that has no `RUBY_PROCESSES` entry.
    RubyProcessMissing = 29,
    /// HotSpot frames walked (compiled, interpreted and stub frames).
    HotSpotFrames = 30,
    /// A PC in the JIT's code cache but in no code blob (code being
    /// installed or freed); the stack ends there.
    HotSpotUnknownCode = 31,
    /// Reading the JVM's memory failed mid-walk; the stack ends there.
    HotSpotReadFailed = 32,
    /// The Java stack hit the record or tail-call limit and was cut.
    HotSpotStackTruncated = 33,
    /// The native unwinder handed code to the HotSpot unwinder for a
    /// process that has no `HOTSPOT_PROCESSES` entry.
    HotSpotProcessMissing = 34,
    /// Compiled Java frames found pending deoptimization (their return
    /// address replaced by the deoptimization handler), reported at the
    /// call site HotSpot saved in the frame.
    HotSpotDeoptPending = 35,
    /// V8 JavaScript frames walked (interpreted and compiled).
    V8Frames = 36,
    /// A V8 frame could not be read, or was not a frame V8 builds: the
    /// native unwinder takes it over (records its PC, follows its frame
    /// pointer).
    V8ReadFailed = 37,
    /// The record filled, or tail calls ran out, during a V8 walk.
    V8StackTruncated = 38,
    /// The native unwinder handed code to the V8 unwinder for a process
    /// it has no data for (the map entry was removed or not yet written).
    V8ProcessMissing = 39,
    /// PHP frames walked (user and internal functions).
    PhpFrames = 40,
    /// A PHP process's sampled thread had no frame to walk: it runs no PHP
    /// code now (startup, shutdown, a thread of an extension), or its
    /// globals could not be read.
    PhpNoExecuteData = 41,
    /// Reading a PHP frame failed mid-walk; the walk ends there.
    PhpReadFailed = 42,
    /// The PHP stack hit the frame, record or tail-call limit and was cut.
    PhpStackTruncated = 43,
    /// The native unwinder ran the PHP unwinder for a process that has no
    /// `PHP_PROCESSES` entry.
    PhpProcessMissing = 44,
    /// Off-CPU starts written to the ring buffer: a thread blocked, the
    /// switch was picked and its stack taken (CPU samples count as
    /// `Emitted`).
    OffCpuSamples = 45,
    /// Sampled waits shorter than the minimum duration: no end record.
    OffCpuShort = 46,
    /// A sent off-CPU start could not be noted for its end: the update of
    /// the map of threads off CPU failed (an LRU map evicts its least
    /// recently used entry rather than fail, so this is rare).
    OffCpuMapFull = 47,
    /// Off-CPU samples of kernel threads (no user registers), not emitted.
    OffCpuKernelThread = 48,
    /// Off-CPU end records written to the ring buffer.
    OffCpuEnds = 49,
    /// Perl frames walked (subs, evals and the main program).
    PerlFrames = 50,
    /// A Perl process's sampled thread had no interpreter or stack info to
    /// walk (a thread Perl did not start, startup, shutdown), or it could
    /// not be read.
    PerlNoInterpreter = 51,
    /// Reading a Perl context failed mid-walk; the walk ends there.
    PerlReadFailed = 52,
    /// The Perl stack hit the frame, context, record or tail-call limit and
    /// was cut.
    PerlStackTruncated = 53,
    /// The native unwinder ran the Perl unwinder for a process that has no
    /// `PERL_PROCESSES` entry.
    PerlProcessMissing = 54,
}

/// Number of counters (the `COUNTERS` array size).
pub const COUNTER_COUNT: u32 = 55;

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; COUNTER_COUNT as usize] = [
        Counter::Samples,
        Counter::Emitted,
        Counter::Idle,
        Counter::FilteredOut,
        Counter::ScratchUnavailable,
        Counter::RingBufferFull,
        Counter::TailCallFailed,
        Counter::KernelStackFailed,
        Counter::NoUserRegisters,
        Counter::UserReadFailed,
        Counter::UserFrameInvalid,
        Counter::UserStackTruncated,
        Counter::UserRegistersFromTask,
        Counter::DwarfFrames,
        Counter::FramePointerFrames,
        Counter::UnknownProcess,
        Counter::PythonFrames,
        Counter::PythonNoThreadState,
        Counter::PythonReadFailed,
        Counter::PythonStackTruncated,
        Counter::PythonProcessMissing,
        Counter::SampleRingMissing,
        Counter::RuntimeProgramMissing,
        Counter::UnwindTablePending,
        Counter::ProcessTableChanged,
        Counter::RubyFrames,
        Counter::RubyNoExecutionContext,
        Counter::RubyReadFailed,
        Counter::RubyStackTruncated,
        Counter::RubyProcessMissing,
        Counter::HotSpotFrames,
        Counter::HotSpotUnknownCode,
        Counter::HotSpotReadFailed,
        Counter::HotSpotStackTruncated,
        Counter::HotSpotProcessMissing,
        Counter::HotSpotDeoptPending,
        Counter::V8Frames,
        Counter::V8ReadFailed,
        Counter::V8StackTruncated,
        Counter::V8ProcessMissing,
        Counter::PhpFrames,
        Counter::PhpNoExecuteData,
        Counter::PhpReadFailed,
        Counter::PhpStackTruncated,
        Counter::PhpProcessMissing,
        Counter::OffCpuSamples,
        Counter::OffCpuShort,
        Counter::OffCpuMapFull,
        Counter::OffCpuKernelThread,
        Counter::OffCpuEnds,
        Counter::PerlFrames,
        Counter::PerlNoInterpreter,
        Counter::PerlReadFailed,
        Counter::PerlStackTruncated,
        Counter::PerlProcessMissing,
    ];

    /// Stable snake_case name, used in logs and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::Samples => "samples",
            Counter::Emitted => "emitted",
            Counter::Idle => "idle",
            Counter::FilteredOut => "filtered_out",
            Counter::ScratchUnavailable => "scratch_unavailable",
            Counter::RingBufferFull => "ring_buffer_full",
            Counter::TailCallFailed => "tail_call_failed",
            Counter::KernelStackFailed => "kernel_stack_failed",
            Counter::NoUserRegisters => "no_user_registers",
            Counter::UserReadFailed => "user_read_failed",
            Counter::UserFrameInvalid => "user_frame_invalid",
            Counter::UserStackTruncated => "user_stack_truncated",
            Counter::UserRegistersFromTask => "user_registers_from_task",
            Counter::DwarfFrames => "dwarf_frames",
            Counter::FramePointerFrames => "frame_pointer_frames",
            Counter::UnknownProcess => "unknown_process",
            Counter::PythonFrames => "python_frames",
            Counter::PythonNoThreadState => "python_no_thread_state",
            Counter::PythonReadFailed => "python_read_failed",
            Counter::PythonStackTruncated => "python_stack_truncated",
            Counter::PythonProcessMissing => "python_process_missing",
            Counter::SampleRingMissing => "sample_ring_missing",
            Counter::RuntimeProgramMissing => "runtime_program_missing",
            Counter::UnwindTablePending => "unwind_table_pending",
            Counter::ProcessTableChanged => "process_table_changed",
            Counter::RubyFrames => "ruby_frames",
            Counter::RubyNoExecutionContext => "ruby_no_execution_context",
            Counter::RubyReadFailed => "ruby_read_failed",
            Counter::RubyStackTruncated => "ruby_stack_truncated",
            Counter::RubyProcessMissing => "ruby_process_missing",
            Counter::HotSpotFrames => "hotspot_frames",
            Counter::HotSpotUnknownCode => "hotspot_unknown_code",
            Counter::HotSpotReadFailed => "hotspot_read_failed",
            Counter::HotSpotStackTruncated => "hotspot_stack_truncated",
            Counter::HotSpotProcessMissing => "hotspot_process_missing",
            Counter::HotSpotDeoptPending => "hotspot_deopt_pending",
            Counter::V8Frames => "v8_frames",
            Counter::V8ReadFailed => "v8_read_failed",
            Counter::V8StackTruncated => "v8_stack_truncated",
            Counter::V8ProcessMissing => "v8_process_missing",
            Counter::PhpFrames => "php_frames",
            Counter::PhpNoExecuteData => "php_no_execute_data",
            Counter::PhpReadFailed => "php_read_failed",
            Counter::PhpStackTruncated => "php_stack_truncated",
            Counter::PhpProcessMissing => "php_process_missing",
            Counter::OffCpuSamples => "off_cpu_samples",
            Counter::OffCpuShort => "off_cpu_short",
            Counter::OffCpuMapFull => "off_cpu_map_full",
            Counter::OffCpuKernelThread => "off_cpu_kernel_thread",
            Counter::OffCpuEnds => "off_cpu_ends",
            Counter::PerlFrames => "perl_frames",
            Counter::PerlNoInterpreter => "perl_no_interpreter",
            Counter::PerlReadFailed => "perl_read_failed",
            Counter::PerlStackTruncated => "perl_stack_truncated",
            Counter::PerlProcessMissing => "perl_process_missing",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_index_order() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{}", c.name());
        }
    }
}
