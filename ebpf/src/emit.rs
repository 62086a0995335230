//! Copies the finished sample into its CPU's ring buffer.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::generated::bpf_ringbuf_output,
};
use icecore_unwinders::{
    Counter, SampleRecord, UnwindScratch,
    sample::{MAX_FRAMES, flags},
};

use crate::maps::{OFF_CPU_STARTS, SAMPLE_RINGS, count, count_n};

/// Wake the reader only once this many bytes wait: a wakeup per sample costs
/// about 1 µs of BPF time, and user space polls on a timer anyway. Set at load
/// time to a fraction of the ring buffer's size.
#[unsafe(no_mangle)]
static WAKEUP_BYTES: u64 = 256 * 1024;

/// Each CPU asks how much data waits only every this many samples: the query
/// is a helper call, and the threshold is a quarter of a ring that holds a
/// second of samples, so a few records more before a wakeup are harmless.
const QUERY_EVERY: u16 = 8;

/// [`icecore_unwinders::ProgramIndex::Emit`]'s program.
#[inline(always)]
pub fn emit_program<C: crate::chain::Chain>(_ctx: &C) -> u32 {
    let Some(scratch) = C::scratch_space().get_ptr_mut(0) else {
        count(Counter::ScratchUnavailable);
        return 0;
    };
    // SAFETY: per-CPU value owned by this CPU's tail-call chain.
    emit(unsafe { &mut *scratch });
    0
}

#[inline(always)]
pub fn emit(scratch: &mut UnwindScratch) {
    // Per-frame counts were kept in the scratch space: one update per sample.
    if scratch.state.dwarf_frames != 0 {
        count_n(Counter::DwarfFrames, u64::from(scratch.state.dwarf_frames));
    }
    if scratch.state.frame_pointer_frames != 0 {
        count_n(
            Counter::FramePointerFrames,
            u64::from(scratch.state.frame_pointer_frames),
        );
    }
    let header = &scratch.record.header;
    let mut frames = (header.kernel_frames + header.user_words) as usize;
    if frames > MAX_FRAMES {
        frames = MAX_FRAMES;
    }
    let size = SampleRecord::wire_size(frames) as u64;
    let Some(ring) = SAMPLE_RINGS.get(header.cpu) else {
        count(Counter::SampleRingMissing);
        return;
    };
    let ring = core::ptr::from_ref(ring).cast_mut().cast();
    let mut flags = BPF_RB_NO_WAKEUP;
    scratch.state.samples_since_query = scratch.state.samples_since_query.wrapping_add(1);
    if scratch.state.samples_since_query >= QUERY_EVERY {
        scratch.state.samples_since_query = 0;
        // SAFETY: plain load of a load-time constant; `ring` is the inner
        // map the outer array's lookup returned.
        let wakeup_bytes = unsafe { core::ptr::read_volatile(&WAKEUP_BYTES) };
        let pending = unsafe {
            aya_ebpf::helpers::generated::bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA as u64)
        };
        if pending >= wakeup_bytes {
            flags = BPF_RB_FORCE_WAKEUP;
        }
    }
    let record = &mut scratch.record;
    // SAFETY: `size` is at most size_of::<SampleRecord>(), so the read stays
    // inside the map value.
    let ret =
        unsafe { bpf_ringbuf_output(ring, core::ptr::from_mut(record).cast(), size, flags as u64) };
    if ret < 0 {
        count(Counter::RingBufferFull);
    } else if record.header.flags & flags::OFF_CPU != 0 {
        // The wait gets an end record only now that its start is out: a
        // start dropped on the way (an undescribed process, a full ring)
        // leaves nothing to join.
        if OFF_CPU_STARTS
            .insert(record.header.tid, record.header.ktime_ns, 0)
            .is_err()
        {
            count(Counter::OffCpuMapFull);
        }
        count(Counter::OffCpuSamples);
    } else {
        count(Counter::Emitted);
    }
}
