//! The receiver's readers of interpreter objects in another process's
//! memory, fed arbitrary bytes as that memory: what the runtime plugins
//! read to name the frames BPF reported (code objects, strings and line
//! tables of CPython; iseqs, strings, symbols and line tables of CRuby;
//! PHP's functions and their line tables; Perl's subs and statements).
//! The objects' addresses come from BPF's words, the layouts are the real
//! per-version ones (`receiver/src/runtimes/*/layouts.rs`); everything
//! the readers follow from there is the input's.
//!
//! The input:
//!
//! - byte 0: the runtime (modulo 4: CPython, CRuby, PHP, Perl);
//! - byte 1: the version (modulo the runtime's supported ones);
//! - four little-endian words, the values BPF's words carry (56 bits each,
//!   as in a tagged word): per runtime, what its frames name (a code
//!   object and instruction, an iseq and pc, a function and opline, a CV
//!   and COP) and two more objects;
//! - the rest: the process's memory at [`BASE`], read through
//!   `ProcessMemory` from a file holding it at that offset. Reads past its
//!   end fail, as unmapped memory does; reads below [`BASE`] find zeros
//!   (the file's hole).
//!
//! HotSpot's (`hotspot::names::Methods`) and V8's readers need layouts
//! read from the JVM's `VMStructs` or V8's `v8dbg_` symbols, which have no
//! static table: they are not reached.

use icecore_receiver::runtimes::memory::ProcessMemory;
use icecore_receiver::runtimes::{perl, php, python, ruby};

/// Where the input's memory image starts in the fuzzed address space.
pub const BASE: u64 = 0x10_0000;

/// The payload bits of a BPF word (`runtime::PAYLOAD_MASK`).
const PAYLOAD: u64 = icecore_unwinders::runtime::PAYLOAD_MASK;

/// Runs one input; see the module's documentation.
pub fn run(data: &[u8]) {
    let (Some(&runtime), Some(&version)) = (data.first(), data.get(1)) else {
        return;
    };
    let mut words = [0u64; 4];
    for (i, word) in words.iter_mut().enumerate() {
        let mut bytes = [0u8; 8];
        if let Some(chunk) = data.get(2 + i * 8..2 + i * 8 + 8) {
            bytes.copy_from_slice(chunk);
        }
        *word = u64::from_le_bytes(bytes) & PAYLOAD;
    }
    let image = data.get(34..).unwrap_or(&[]);
    let memory = ProcessMemory::from_file(crate::scratch_memory("memory", BASE, image));
    match runtime % 4 {
        0 => python_objects(&memory, version, words),
        1 => ruby_objects(&memory, version, words),
        2 => php_objects(&memory, version, words),
        _ => perl_objects(&memory, version, words),
    }
}

fn python_objects(memory: &ProcessMemory, version: u8, [code, instr, text, _]: [u64; 4]) {
    use python::code::{line_of, read_bytes, read_code, read_string};
    let layouts = python::layouts::LAYOUTS;
    let Some(layout) = layouts.get(usize::from(version) % layouts.len().max(1)) else {
        return;
    };
    match read_code(memory, layout, code, None) {
        Ok(info) => {
            let _ = line_of(layout, &info, code, instr);
            let _ = format!("{info:?}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    let _ = read_string(memory, layout, text);
    let _ = read_bytes(memory, layout, text);
}

fn ruby_objects(memory: &ProcessMemory, version: u8, [iseq, pc, value, id]: [u64; 4]) {
    let minor = 1 + version % 4;
    let Some(layout) = ruby::layouts::layout((3, minor)) else {
        return;
    };
    // `ruby_global_symbols` at the image's start.
    let objects = ruby::objects::Objects::new(memory, layout).with_symbols(Some(BASE));
    if let Some(info) = objects.iseq(iseq) {
        let _ = objects.line(info.body, pc);
        let _ = objects.iseq(info.local_iseq);
    }
    let _ = objects.location(iseq, pc);
    let _ = objects.string(value);
    let _ = objects.array_entry(value, pc & 0xff);
    let _ = objects.id_name(id);
}

fn php_objects(memory: &ProcessMemory, version: u8, [function, opline, other, _]: [u64; 4]) {
    let minor = version % 6;
    let Some(layout) = php::layouts::layout((8, minor)) else {
        return;
    };
    let objects = php::objects::Objects::new(memory, &layout);
    for f in [function, other] {
        let _ = objects.fingerprint(f);
        if let Some(info) = objects.function(f) {
            let _ = info.line_at(opline, u64::from(layout.op_size));
            let _ = format!("{info:?}");
        }
    }
}

fn perl_objects(memory: &ProcessMemory, version: u8, [cv, cop, other, _]: [u64; 4]) {
    let layouts = perl::layouts::LAYOUTS;
    let Some(layout) = layouts.get(usize::from(version) % layouts.len()) else {
        return;
    };
    let objects = perl::objects::PerlObjects { layout, memory };
    for sub in [cv, other] {
        match objects.sub_name(sub) {
            Ok(name) => {
                let _ = format!("{name:?}");
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
        let _ = objects.first_statement(sub);
    }
    let _ = objects.statement(cop);
}

/// Seeds for `fuzz/corpus/runtime_objects/`, one per runtime (at its
/// newest version): synthetic, not real objects. Their memory is words
/// that point back into it, small integers and ASCII text, so that the
/// readers follow pointers, lengths and strings from the start rather
/// than failing at their first read; libFuzzer shapes the rest.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut seeds = Vec::new();
    for (runtime, name, version) in [
        (0u8, "python", 4u8),
        (1, "ruby", 3),
        (2, "php", 5),
        (3, "perl", 3),
    ] {
        let mut input = vec![runtime, version];
        for word in [BASE + 0x100, BASE + 0x40, BASE + 0x200, 0x2a] {
            input.extend_from_slice(&word.to_le_bytes());
        }
        let words = 512u64;
        for i in 0..words {
            let word = match i % 4 {
                0 => BASE + (i * 0x48 + 0x20) % (words * 8),
                1 => i % 24,
                2 => u64::from_le_bytes(*b"icecore_"),
                _ => BASE + (i * 0x18) % (words * 8),
            };
            input.extend_from_slice(&word.to_le_bytes());
        }
        seeds.push((name, input));
    }
    seeds
}
