//! The runtime walks BPF runs on a sampled thread (`icecore_unwinders`'s
//! `python`, `ruby`, `hotspot`, `v8`, `php` and `perl` modules), fed
//! arbitrary bytes as the process's memory. Another process's memory is
//! the least trusted input icecore reads: an interpreter's structures may
//! be half-written when the sample lands, freed, or hostile. Each walk
//! runs as its BPF program drives it (`ebpf/src/runtimes/`): the start
//! (interpreter, thread state or execution context, through the FS base
//! and the DTV where the runtime keeps them in TLS), then step after step
//! through the same windowed reader, within the program's bounds (frames
//! per program times tail calls, the record's user words, the runtime's
//! own frame and context limits), until the walk ends, fails to read or
//! reaches a bound. A panic (an overflow, an index out of bounds, a shift
//! too wide: the fuzz build has debug assertions), a word of the walk that
//! lacks the runtime's tag, or a walk past its bounds is a crash.
//!
//! The input:
//!
//! - byte 0: the runtime (modulo 6: CPython, CRuby, HotSpot, V8, PHP, Perl);
//! - then the runtime's per-process descriptor as BPF's map holds it
//!   (`PythonProcess` and the others, `#[repr(C)]`; bytes past the input's
//!   end are zero): the layout offsets and addresses user space would have
//!   found;
//! - then three little-endian words: the thread's FS base (CPython: its
//!   `pthread_self()`), or for HotSpot and V8, which take over from the
//!   native unwinder at a frame, its registers `ip`, `sp` and `bp`;
//! - the rest: the process's memory at [`BASE`]. Reads outside it fail, as
//!   a page that vanished does.

use icecore_unwinders::hotspot::{HotSpotProcess, HotSpotStep};
use icecore_unwinders::memory::{BlockReader, STACK_WINDOW_WORDS};
use icecore_unwinders::perl::{MAX_PERL_CONTEXTS, MAX_PERL_FRAMES, PerlProcess, PerlStep};
use icecore_unwinders::perl::{PerlWalkState, TAGS as PERL_TAGS};
use icecore_unwinders::php::{MAX_PHP_FRAMES, PhpProcess, PhpStep, TAGS as PHP_TAGS};
use icecore_unwinders::python::{CPYTHON, PythonProcess, PythonStep};
use icecore_unwinders::ruby::{
    ControlFrames, MAX_RUBY_FRAMES, RubyProcess, RubyStep, TAGS as RUBY_TAGS, more,
};
use icecore_unwinders::runtime::TagRange;
use icecore_unwinders::sample::MAX_USER_FRAMES;
use icecore_unwinders::v8::{V8, V8Process, V8Step, word as v8_word};
use icecore_unwinders::{
    MAX_TAIL_CALLS, MemoryReader, Registers, StackWindow, WindowedReader, hotspot::HOTSPOT,
};

/// Where the input's memory image starts in the fuzzed address space.
pub const BASE: u64 = 0x10_0000;

/// The runtimes, in the order byte 0 picks them.
pub const RUNTIMES: [&str; 6] = ["python", "ruby", "hotspot", "v8", "php", "perl"];

/// Steps one BPF program runs before it tail-calls itself (the largest
/// `FRAMES_PER_PROGRAM` / `CONTEXTS_PER_PROGRAM` of `ebpf/src/runtimes/`),
/// times the tail calls a sample may use: no walk can go further in BPF.
const MAX_STEPS: usize = 32 * MAX_TAIL_CALLS as usize;

/// Window refills of the runtimes' programs (`READ_BLOCK_BYTES`).
const PYTHON_BLOCK: u32 = 192;
const RUBY_BLOCK: u32 = 1024;
const PHP_BLOCK: u32 = 512;

/// The process memory of one input: `bytes` at [`BASE`].
#[derive(Clone, Copy)]
pub struct Image<'a> {
    bytes: &'a [u8],
}

impl<'a> Image<'a> {
    /// `bytes` mapped at [`BASE`].
    pub fn new(bytes: &'a [u8]) -> Self {
        Image { bytes }
    }

    /// `len` bytes at `address`, if all of them are in the image.
    fn slice(&self, address: u64, len: usize) -> Option<&'a [u8]> {
        let start = usize::try_from(address.checked_sub(BASE)?).ok()?;
        self.bytes.get(start..start.checked_add(len)?)
    }
}

impl MemoryReader for Image<'_> {
    fn read_u64(&mut self, address: u64) -> Option<u64> {
        let bytes = self.slice(address, 8)?;
        let mut word = [0u8; 8];
        word.copy_from_slice(bytes);
        Some(u64::from_le_bytes(word))
    }
}

impl BlockReader for Image<'_> {
    fn read_block(&mut self, address: u64, dst: &mut [u64; STACK_WINDOW_WORDS], len: u32) -> bool {
        // The contract WindowedReader keeps; BPF's verifier would refuse more.
        assert!(
            len.is_multiple_of(8) && len as usize <= STACK_WINDOW_WORDS * 8,
            "window read of {len} bytes"
        );
        let Some(bytes) = self.slice(address, len as usize) else {
            return false;
        };
        for (word, chunk) in dst.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            *word = u64::from_le_bytes(w);
        }
        true
    }
}

/// A descriptor from the input's bytes (zero past its end), as user space
/// would have written it to BPF's map: any bytes at all.
fn descriptor<T: aya::Pod>(bytes: &[u8]) -> T {
    let size = core::mem::size_of::<T>();
    let mut buffer = vec![0u8; size];
    let n = bytes.len().min(size);
    buffer[..n].copy_from_slice(&bytes[..n]);
    // SAFETY: `T: Pod` (plain integers, `#[repr(C)]`): any bytes are a valid
    // value; `buffer` holds `size_of::<T>()` of them, read unaligned.
    unsafe { core::ptr::read_unaligned(buffer.as_ptr().cast::<T>()) }
}

/// Words of one walk, checked against the record's room and the runtime's tags.
struct Record {
    tags: TagRange,
    words: usize,
}

impl Record {
    fn new(tags: TagRange) -> Self {
        Record { tags, words: 0 }
    }

    /// Whether `n` more words fit (`has_room`).
    fn has_room(&self, n: usize) -> bool {
        self.words + n <= MAX_USER_FRAMES
    }

    fn push(&mut self, word: u64) {
        assert!(
            self.tags.local_tag(word).is_some(),
            "word {word:#x} lacks the runtime's tag"
        );
        assert!(self.has_room(1), "the walk overflowed the record");
        self.words += 1;
    }
}

/// The input split into descriptor, three words and memory.
fn split(data: &[u8], descriptor_size: usize) -> (&[u8], [u64; 3], &[u8]) {
    let descriptor_end = descriptor_size.min(data.len());
    let (descriptor, rest) = data.split_at(descriptor_end);
    let mut words = [0u64; 3];
    for (i, word) in words.iter_mut().enumerate() {
        let mut bytes = [0u8; 8];
        if let Some(chunk) = rest.get(i * 8..i * 8 + 8) {
            bytes.copy_from_slice(chunk);
        }
        *word = u64::from_le_bytes(bytes);
    }
    let memory = rest.get(24..).unwrap_or(&[]);
    (descriptor, words, memory)
}

/// Runs one input; see the module's documentation.
pub fn run(data: &[u8]) {
    let _ = walk(data);
}

/// Runs one input's walk; the words it produced (for the seeds' test).
pub fn walk(data: &[u8]) -> usize {
    let Some((&runtime, rest)) = data.split_first() else {
        return 0;
    };
    match runtime % 6 {
        0 => python(rest),
        1 => ruby(rest),
        2 => hotspot(rest),
        3 => v8(rest),
        4 => php(rest),
        _ => perl(rest),
    }
}

fn python(data: &[u8]) -> usize {
    let (d, [thread, _, _], memory) = split(data, core::mem::size_of::<PythonProcess>());
    let process: PythonProcess = descriptor(d);
    let mut image = Image::new(memory);
    let Some(mut frame) = process
        .thread_state(thread, &mut image)
        .and_then(|tstate| process.current_frame(tstate, &mut image))
    else {
        return 0;
    };
    let mut window = StackWindow::new();
    let mut memory = WindowedReader::with_block(&mut window, image, PYTHON_BLOCK);
    let mut record = Record::new(CPYTHON.tags);
    for _ in 0..MAX_STEPS {
        if frame == 0 || !record.has_room(2) {
            break;
        }
        if process.frames_on_stack != 0 {
            memory.prefetch_below(frame, u64::from(process.frame_span));
        }
        match process.step(&mut frame, &mut memory) {
            PythonStep::Frame { code_word, instr } => {
                record.push(code_word);
                record.push(instr);
            }
            PythonStep::Boundary(word) => record.push(word),
            PythonStep::ReadFailed => break,
        }
    }
    record.words
}

fn ruby(data: &[u8]) -> usize {
    let (d, [fs_base, _, _], memory) = split(data, core::mem::size_of::<RubyProcess>());
    let process: RubyProcess = descriptor(d);
    let mut image = Image::new(memory);
    let Some(mut frames) = process
        .execution_context(fs_base, &mut image)
        .and_then(|ec| process.control_frames(ec, &mut image))
    else {
        return 0;
    };
    let mut window = StackWindow::new();
    let mut memory = WindowedReader::with_block(&mut window, image, RUBY_BLOCK);
    let mut record = Record::new(RUBY_TAGS);
    let mut walked = 0u16;
    for _ in 0..MAX_STEPS {
        if frames.next == 0 || !more(&frames) {
            break;
        }
        if walked >= MAX_RUBY_FRAMES || !record.has_room(3) {
            break;
        }
        let before: ControlFrames = frames;
        let step = process.step(&mut frames, &mut memory);
        assert!(
            frames.next > before.next,
            "the walk did not move to an older frame"
        );
        match step {
            RubyStep::Iseq {
                iseq_word,
                pc_word,
                method_word,
            } => {
                walked += 1;
                record.push(iseq_word);
                record.push(pc_word);
                if method_word != 0 {
                    record.push(method_word);
                }
            }
            RubyStep::Cfunc(word) => {
                walked += 1;
                record.push(word);
            }
            RubyStep::Skipped => {}
            RubyStep::ReadFailed => break,
        }
    }
    record.words
}

fn hotspot(data: &[u8]) -> usize {
    let (d, [ip, sp, bp], memory) = split(data, core::mem::size_of::<HotSpotProcess>());
    let process: HotSpotProcess = descriptor(d);
    let mut window = StackWindow::new();
    let mut memory = WindowedReader::new(&mut window, Image::new(memory));
    let mut regs = Registers { ip, sp, bp };
    let mut record = Record::new(HOTSPOT.tags);
    for _ in 0..MAX_STEPS {
        if !record.has_room(2) {
            break;
        }
        let top = record.words == 0;
        match process.step(&mut regs, top, &mut memory) {
            HotSpotStep::Compiled {
                blob_word, pc_word, ..
            } => {
                record.push(blob_word);
                record.push(pc_word);
            }
            HotSpotStep::Interpreted {
                method_word,
                bcp_word,
            } => {
                record.push(method_word);
                record.push(bcp_word);
            }
            HotSpotStep::Stub(word) => record.push(word),
            HotSpotStep::CallStub
            | HotSpotStep::Native
            | HotSpotStep::Unknown
            | HotSpotStep::ReadFailed => break,
        }
    }
    record.words
}

fn v8(data: &[u8]) -> usize {
    let (d, [ip, sp, bp], memory) = split(data, core::mem::size_of::<V8Process>());
    let process: V8Process = descriptor(d);
    let mut window = StackWindow::new();
    let mut memory = WindowedReader::new(&mut window, Image::new(memory));
    let mut regs = Registers { ip, sp, bp };
    let mut record = Record::new(V8.tags);
    for _ in 0..MAX_STEPS {
        if !record.has_room(3) {
            break;
        }
        let top = record.words == 0;
        match process.step(&mut regs, top, &mut memory) {
            V8Step::Interpreted {
                shared,
                bytecode_offset,
            } => {
                record.push(V8.tags.word(v8_word::SHARED, shared));
                record.push(
                    V8.tags
                        .word(v8_word::BYTECODE_OFFSET, u64::from(bytecode_offset)),
                );
            }
            V8Step::Compiled {
                shared,
                function,
                pc,
            } => {
                let pc_tag = if top { v8_word::TOP_PC } else { v8_word::PC };
                record.push(V8.tags.word(v8_word::SHARED, shared));
                record.push(V8.tags.word(v8_word::FUNCTION, function));
                record.push(V8.tags.word(pc_tag, pc));
            }
            V8Step::Typed { .. } => {}
            V8Step::Entry | V8Step::Native | V8Step::ReadFailed => break,
        }
    }
    record.words
}

fn php(data: &[u8]) -> usize {
    let (d, [fs_base, _, _], memory) = split(data, core::mem::size_of::<PhpProcess>());
    let process: PhpProcess = descriptor(d);
    let mut image = Image::new(memory);
    let Some(mut ex) = process.current_execute_data(fs_base, &mut image) else {
        return 0;
    };
    let mut window = StackWindow::new();
    let mut memory = WindowedReader::with_block(&mut window, image, PHP_BLOCK);
    let mut record = Record::new(PHP_TAGS);
    let mut walked = 0u16;
    for _ in 0..MAX_STEPS {
        if ex == 0 || walked >= MAX_PHP_FRAMES || !record.has_room(2) {
            break;
        }
        let mut next = 0;
        let step = process.step(ex, &mut next, &mut memory);
        assert_ne!(next, ex, "a frame that is its own caller");
        ex = next;
        match step {
            PhpStep::Frame {
                function_word,
                opline_word,
            } => {
                walked += 1;
                record.push(function_word);
                record.push(opline_word);
            }
            PhpStep::Skipped => {}
            PhpStep::ReadFailed => break,
        }
    }
    record.words
}

fn perl(data: &[u8]) -> usize {
    let (d, [fs_base, _, _], memory) = split(data, core::mem::size_of::<PerlProcess>());
    let process: PerlProcess = descriptor(d);
    let mut memory = Image::new(memory);
    let mut walk = PerlWalkState::default();
    walk.reset();
    let started = process
        .interpreter(fs_base, &mut memory)
        .is_some_and(|interpreter| process.start(interpreter, &mut walk, &mut memory));
    if !started {
        return 0;
    }
    let mut record = Record::new(PERL_TAGS);
    for _ in 0..MAX_STEPS {
        if walk.stackinfo == 0 {
            break;
        }
        if walk.frames >= MAX_PERL_FRAMES
            || walk.contexts_read >= MAX_PERL_CONTEXTS
            || !record.has_room(2)
        {
            break;
        }
        match process.step(&mut walk, &mut memory) {
            PerlStep::Frame {
                frame_word,
                cop_word,
            } => {
                walk.frames += 1;
                record.push(frame_word);
                record.push(cop_word);
            }
            PerlStep::StackSwitch(word) => record.push(word),
            PerlStep::Skipped => {}
            PerlStep::Done | PerlStep::ReadFailed => break,
        }
    }
    record.words
}

/// Seeds for `fuzz/corpus/runtime_walk/`: per runtime, a walk of a few
/// frames over layouts like the unit tests' (`unwinders/src/*/tests.rs`),
/// rebased to [`BASE`] (`examples/make_runtime_seeds.rs` writes them).
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("python-3.12", python_seed()),
        ("ruby-3.3", ruby_seed(false)),
        ("ruby-3.3-running-ec", ruby_seed(true)),
        ("hotspot-interpreted", hotspot_seed()),
        ("v8-interpreted", v8_seed()),
        ("php-8", php_seed()),
        ("perl-5.36", perl_seed()),
    ]
}

/// Memory for a seed: words put at addresses from [`BASE`] on.
#[derive(Default)]
struct Seed {
    memory: Vec<u8>,
}

impl Seed {
    /// Puts `value` at `BASE + offset`.
    fn put(&mut self, offset: u64, value: u64) {
        let at = offset as usize;
        if self.memory.len() < at + 8 {
            self.memory.resize(at + 8, 0);
        }
        self.memory[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }

    /// The input: the runtime's byte, its descriptor, three words, the memory.
    fn input<T: aya::Pod>(self, runtime: u8, process: &T, words: [u64; 3]) -> Vec<u8> {
        let size = core::mem::size_of::<T>();
        let mut input = vec![runtime];
        // SAFETY: `T: Pod`: its `size` bytes are initialized plain data.
        let bytes =
            unsafe { core::slice::from_raw_parts((process as *const T).cast::<u8>(), size) };
        input.extend_from_slice(bytes);
        for word in words {
            input.extend_from_slice(&word.to_le_bytes());
        }
        input.extend_from_slice(&self.memory);
        input
    }
}

/// 3.12: cframe indirection, a C-stack shim between two frames.
fn python_seed() -> Vec<u8> {
    use icecore_unwinders::python::entry_kind;
    let p = PythonProcess {
        interpreters_head: BASE + 0x100,
        interp_threads_head: 0x10,
        tstate_next: 0x8,
        tstate_thread_id: 0x20,
        tstate_frame: 0x30,
        cframe_current_frame: 0x8,
        frame_code: 0x0,
        frame_previous: 0x8,
        frame_instr: 0x38,
        entry_offset: 0x46,
        entry_kind: entry_kind::CSTACK_SHIM,
        cstack_owner: 3,
        instr_is_int: 0,
        frames_on_stack: 1,
        frame_span: 72,
        reserved: 0,
    };
    let mut m = Seed::default();
    m.put(0x100, BASE + 0x200); // interpreters.head
    m.put(0x210, BASE + 0x300); // threads.head: another thread
    m.put(0x320, 0x7f00_0011);
    m.put(0x308, BASE + 0x400); // next: the thread sampled
    m.put(0x420, 0x7f00_0012);
    m.put(0x430, BASE + 0x500); // cframe
    m.put(0x508, BASE + 0x600); // current_frame: A
    m.put(0x600, 0xc0dea);
    m.put(0x608, BASE + 0x700);
    m.put(0x638, 0xc0dea + 0x60);
    m.put(0x700, 0x7a4d); // the shim
    m.put(0x708, BASE + 0x800);
    m.put(0x740, 3 << 48);
    m.put(0x800, 0xc0deb);
    m.put(0x808, 0);
    m.put(0x838, 0xc0deb + 0x80);
    m.put(0x840, 0);
    m.input(0, &p, [0x7f00_0012, 0, 0])
}

/// 3.3: the EC through the DTV (or, with `running_ec`, the main ractor's
/// GVL holder, whose native thread is the sampled one), a method frame, a
/// C function, a block.
fn ruby_seed(running_ec: bool) -> Vec<u8> {
    use icecore_unwinders::ruby::{ec_kind, frame_flags};
    const CFP: u64 = 56;
    let p = RubyProcess {
        main_ractor_pointer: if running_ec { BASE + 0x180 } else { 0 },
        tls_module: 1,
        tls_offset: 16,
        running_ec: 0x180,
        control_frame_size: CFP as u16,
        ec_thread: 48,
        thread_pthread: 40,
        native_thread_pthread: 16,
        ec_kind: if running_ec {
            ec_kind::RUNNING_EC
        } else {
            ec_kind::TLS_DTV
        },
        reserved: [0; 5],
    };
    let mut m = Seed::default();
    let fs_base = BASE + 0x100;
    m.put(0x108, BASE + 0x200); // the DTV
    m.put(0x210, BASE + 0x300); // module 1's block
    m.put(0x310, BASE + 0x400); // ruby_current_ec
    m.put(0x180, BASE + 0x500); // ruby_single_main_ractor
    m.put(0x680, BASE + 0x400); // its running_ec
    m.put(0x430, BASE + 0x700); // ec->thread_ptr
    m.put(0x728, BASE + 0x780); // thread->nt
    m.put(0x790, fs_base); // nt->thread_id
    let stack = BASE + 0x1000;
    let words = 0x40;
    let end = stack + words * 8;
    let cfp = end - 5 * CFP;
    m.put(0x400, stack);
    m.put(0x408, words);
    m.put(0x410, cfp);
    let frames = [
        (
            0x5000_0010,
            0x5000_0000,
            frame_flags::LOCAL | frame_flags::FINISH,
        ),
        (0, 0, frame_flags::MAGIC_CFUNC),
        (0x5100_0020, 0x5100_0000, 0),
    ];
    for (i, (pc, iseq, flags)) in frames.into_iter().enumerate() {
        let at = cfp - BASE + i as u64 * CFP;
        let ep = 0x800 + i as u64 * 0x40;
        m.put(at, pc);
        m.put(at + 16, iseq);
        m.put(at + 32, BASE + ep);
        m.put(ep - 16, 0x6000_0000 + i as u64 * 0x40); // me_cref
        m.put(ep, flags);
    }
    m.input(1, &p, [fs_base, 0, 0])
}

/// An interpreted frame called by another, then the call stub.
fn hotspot_seed() -> Vec<u8> {
    use icecore_unwinders::hotspot::{CodeHeapRange, MAX_CODE_HEAPS};
    const LOW: u64 = 0x7f00_0000_0000;
    let mut p = HotSpotProcess {
        heaps: [CodeHeapRange::default(); MAX_CODE_HEAPS],
        interpreter_low: LOW,
        interpreter_high: LOW + 0x1_0000,
        call_stub_return: LOW + 0x2_0010,
        heap_block_size: 16,
        blob_frame_size: 28,
        method_slot: 3,
        bcp_slot: 8,
        code_begin_is_offset: 0,
        frame_complete_bytes: 4,
        blob_code_begin: 8,
        blob_frame_complete: 32,
        nmethod_deopt_handler: 0x80,
        nmethod_orig_pc_offset: 0x130,
        ..HotSpotProcess::default()
    };
    p.heaps[0] = CodeHeapRange {
        low: LOW,
        high: LOW + 0x10_0000,
        segmap: BASE + 0x600,
        log2_segment_size: 7,
        reserved: 0,
    };
    let mut m = Seed::default();
    let stack = BASE + 0x100;
    let fp = stack + 0x100;
    let caller_fp = stack + 0x300;
    for (frame, method, bcp, next_fp, ret) in [
        (fp, 0xaaaa_0000, 0xbbbb_0004, caller_fp, LOW + 0x600),
        (
            caller_fp,
            0xaaaa_1000,
            0xbbbb_1008,
            stack + 0x500,
            p.call_stub_return,
        ),
    ] {
        let at = frame - BASE;
        m.put(at - 24, method);
        m.put(at - 64, bcp);
        m.put(at - 8, frame + 0x10);
        m.put(at, next_fp);
        m.put(at + 8, ret);
    }
    m.put(0x600, 0); // the segment map's first bytes: a blob's start
    m.input(2, &p, [LOW + 0x500, stack, fp])
}

/// An interpreted frame in the builtins' trampoline, called from C++.
fn v8_seed() -> Vec<u8> {
    use icecore_unwinders::v8::V8Range;
    const BLOB: u64 = 0x1a0_0000;
    const TRAMPOLINE: u64 = BLOB + 0x1000;
    let mut p = V8Process {
        bytecode_offset_bias: 63,
        fp_context_or_marker: -8,
        fp_function: -16,
        fp_bytecode_offset: -40,
        frame_entry: 1,
        frame_construct_entry: 2,
        function_shared: 24,
        ..V8Process::default()
    };
    p.code[0] = V8Range {
        low: BLOB,
        high: BLOB + 0x20_0000,
    };
    p.code[1] = V8Range {
        low: 0x7f00_0000_0000,
        high: 0x7f00_0800_0000,
    };
    p.builtin_ranges = 1;
    p.interpreter = V8Range {
        low: TRAMPOLINE - BLOB,
        high: TRAMPOLINE - BLOB + 0x200,
    };
    let mut m = Seed::default();
    let sp = BASE + 0x100;
    let fp = BASE + 0x200;
    let function = BASE + 0x801; // tagged
    m.put(0x200 - 8, BASE + 0x901); // a context, no frame marker
    m.put(0x200 - 16, function);
    m.put(0x200 - 40, 70 << 32); // the bytecode offset, a Smi
    m.put(0x200, BASE + 0x400); // the caller's fp
    m.put(0x208, 0x40_1234); // returns into C++
    m.put(0x800 + 24, BASE + 0xa01); // the SharedFunctionInfo
    m.input(3, &p, [TRAMPOLINE + 0x40, sp, fp])
}

/// A non-thread-safe build: three frames, the oldest a top-level call.
fn php_seed() -> Vec<u8> {
    use icecore_unwinders::php::globals_kind;
    const TOP: u32 = 1 << 17;
    let p = PhpProcess {
        executor_globals: BASE + 0x100,
        vm_body_pc: 0,
        tls_offset: 0,
        call_top: TOP,
        current_execute_data: 0x1e0,
        ex_opline: 0,
        ex_func: 24,
        ex_call_info: 40,
        ex_prev: 48,
        globals_kind: globals_kind::GLOBAL,
        reserved: 0,
    };
    let mut m = Seed::default();
    m.put(0x100 + 0x1e0, BASE + 0x1000);
    let frames = [
        (0x1000, 0xa000, 0x1300, 0, 0x1100),
        (0x1100, 0xa100, 0x1340, 0, 0x1200),
        (0x1200, 0xa200, 0x1380, TOP, 0),
    ];
    for (ex, opline, func, info, prev) in frames {
        m.put(ex, opline);
        m.put(ex + 24, BASE + func);
        m.put(ex + 40, u64::from(info) | (3 << 32));
        m.put(ex + 48, if prev == 0 { 0 } else { BASE + prev });
        m.put(func, 2); // a user function
    }
    m.input(4, &p, [0, 0, 0])
}

/// 5.36, `PL_current_context` in static TLS: subs, a loop, an eval, a
/// `try` on the main stack info, under a sort comparator's stack info.
fn perl_seed() -> Vec<u8> {
    use icecore_unwinders::perl::context_kind;
    const CX: u64 = 104;
    let p = PerlProcess {
        context_at: (-8i64) as u64,
        tls_module: 1,
        interp_curcop: 208,
        interp_curstackinfo: 224,
        si_cxstack: 8,
        si_prev: 16,
        si_cxix: 32,
        context_size: CX as u16,
        cx_oldcop: 16,
        cx_sub_cv: 72,
        si_cxsubix: 40,
        context_kind: context_kind::STATIC_TLS,
        reserved: 0,
    };
    let mut m = Seed::default();
    let fs_base = BASE + 0x100;
    let interp = 0x200;
    let (main_si, sort_si, main_cxs, sort_cxs) = (0x400, 0x480, 0x600, 0xc00);
    m.put(0xf8, BASE + interp);
    m.put(interp + 208, 0xc4);
    m.put(interp + 224, BASE + sort_si);
    let stackinfo = |m: &mut Seed, si: u64, contexts: u64, newest: i32, prev: u64| {
        m.put(si + 8, BASE + contexts);
        m.put(si + 16, if prev == 0 { 0 } else { BASE + prev });
        m.put(si + 32, u64::from(newest as u32) | (64 << 32));
        // Every context pushed completely (si_cxsubix).
        m.put(si + 40, u64::from(newest as u32) | (1 << 32));
    };
    stackinfo(&mut m, main_si, main_cxs, 5, 0);
    stackinfo(&mut m, sort_si, sort_cxs, 1, main_si);
    let context =
        |m: &mut Seed, contexts: u64, index: u64, type_byte: u8, old_cop: u64, cv: u64| {
            let at = contexts + index * CX;
            for word in 0..13 {
                m.put(at + word * 8, 0);
            }
            m.put(at, u64::from(type_byte));
            m.put(at + 16, old_cop);
            m.put(at + 72, cv);
        };
    context(&mut m, main_cxs, 0, 2, 0, 0);
    context(&mut m, main_cxs, 1, 0x29, 0xc1, 0xa0);
    context(&mut m, main_cxs, 2, 0x57, 0, 0);
    context(&mut m, main_cxs, 3, 0x29, 0xc2, 0xb0);
    context(&mut m, main_cxs, 4, 0x4b, 0xc3, 0);
    context(&mut m, main_cxs, 5, 0xcb, 0xc9, 0);
    context(&mut m, sort_cxs, 0, 0x19, 0xc5, 0xd0);
    context(&mut m, sort_cxs, 1, 0x89, 0xc6, 0xe0);
    m.input(5, &p, [fs_base, 0, 0])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each seed walks a frame at least: a seed that fails at its first read
    /// would leave libFuzzer to find the layouts on its own.
    #[test]
    fn every_seed_walks_frames() {
        let walked: Vec<(&str, usize)> = seeds()
            .into_iter()
            .map(|(name, input)| (name, walk(&input)))
            .collect();
        assert!(walked.iter().all(|&(_, n)| n >= 2), "{walked:?}");
    }
}
