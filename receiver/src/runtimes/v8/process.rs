//! One V8 process described to the walk: where its builtins run (the
//! binary's text, and the copy each isolate remaps into its JIT code range
//! for short builtin calls, Node 20 and later), its JIT code ranges (one
//! per isolate: the main thread's and each worker's), and the
//! interpreter's trampolines.

use icecore_unwinders::v8::{MAX_V8_RANGES, V8Process, V8Range};

use super::introspection::{AddressRange, V8Binary};
use super::layout::V8Layout;
use crate::process_maps::{MappedFile, ProcessMappings};

/// The builtins an interpreted frame's PC is in: the trampoline its
/// callees return to, and where a deoptimized frame resumes.
const INTERPRETER_BUILTINS: [&str; 3] = [
    "Builtins_InterpreterEntryTrampoline",
    "Builtins_InterpreterEnterAtBytecode",
    "Builtins_InterpreterEnterAtNextBytecode",
];

/// JIT mappings closer than this are one range (V8 reserves one code
/// range, 128 MiB on x86-64, and commits pages of it).
const JIT_GAP: u64 = 256 << 20;

/// Why a process cannot be described.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescribeError {
    /// No executable mapping of the V8 binary holds its embedded builtins.
    #[error("no mapping of the V8 binary holds its embedded builtins")]
    NoBuiltins,
    /// The binary's symbol table does not say where its builtins are (a
    /// stripped binary).
    #[error("the V8 binary's symbol table does not locate its builtins")]
    NoSymbols,
    /// A layout value is out of the range the walk stores.
    #[error("{0} is out of range")]
    Layout(&'static str),
}

/// The walk's description of a process whose mappings are `maps`, where
/// `is_binary` picks the mappings of the file `binary` was read from.
pub fn describe(
    binary: &V8Binary,
    layout: &V8Layout,
    maps: &ProcessMappings,
    is_binary: impl Fn(&MappedFile) -> bool,
) -> Result<V8Process, DescribeError> {
    let blob = binary.embedded_blob.ok_or(DescribeError::NoSymbols)?;
    let trampolines = INTERPRETER_BUILTINS
        .iter()
        .filter_map(|name| binary.builtin(name))
        .reduce(|a, b| AddressRange {
            start: a.start.min(b.start),
            end: a.end.max(b.end),
        })
        .ok_or(DescribeError::NoSymbols)?;
    let mut code = Vec::new();
    for mapping in maps.executable().filter(|m| is_binary(m)) {
        let Some(bias) = binary
            .segments
            .load_bias(mapping.start, mapping.file_offset)
        else {
            continue;
        };
        let within = |range: AddressRange| {
            let low = range.start.wrapping_add(bias).max(mapping.start);
            let high = range.end.wrapping_add(bias).min(mapping.end);
            (low < high).then_some(V8Range { low, high })
        };
        // The whole blob or nothing: trampolines are found by their
        // offset in it.
        if let Some(range) = within(blob)
            && range.high - range.low == blob.end - blob.start
        {
            code.push(range);
        }
    }
    if code.is_empty() {
        return Err(DescribeError::NoBuiltins);
    }
    code.truncate(MAX_V8_RANGES / 2);
    let builtin_ranges = code.len();
    let mut jit: Vec<V8Range> = Vec::new();
    for anon in maps.anonymous_code() {
        match jit.last_mut() {
            Some(last) if anon.start.saturating_sub(last.high) < JIT_GAP => last.high = anon.end,
            _ => jit.push(V8Range {
                low: anon.start,
                high: anon.end,
            }),
        }
    }
    // The largest JIT ranges in the slots the builtins left.
    jit.sort_by_key(|r| std::cmp::Reverse(r.high - r.low));
    code.extend(
        jit.into_iter()
            .take(MAX_V8_RANGES.saturating_sub(code.len())),
    );
    let mut process = V8Process {
        bytecode_offset_bias: i32::try_from(layout.bytecode_offset_bias).unwrap_or(0),
        fp_context_or_marker: slot(layout.fp_context_or_marker),
        fp_function: slot(layout.fp_function),
        fp_bytecode_offset: slot(layout.fp_bytecode_offset),
        frame_entry: u8::try_from(layout.frame_types.entry).unwrap_or(u8::MAX),
        frame_construct_entry: u8::try_from(layout.frame_types.construct_entry).unwrap_or(u8::MAX),
        builtin_ranges: u8::try_from(builtin_ranges.min(MAX_V8_RANGES)).unwrap_or(0),
        function_shared: u8::try_from(layout.js_function_shared)
            .map_err(|_| DescribeError::Layout("JSFunction::shared"))?,
        ..V8Process::default()
    };
    for (slot, range) in process.code.iter_mut().zip(code) {
        *slot = range;
    }
    process.interpreter = V8Range {
        low: trampolines.start.wrapping_sub(blob.start),
        high: trampolines.end.wrapping_sub(blob.start),
    };
    Ok(process)
}

/// A frame slot offset as the walk stores it.
fn slot(offset: i64) -> i8 {
    i8::try_from(offset).unwrap_or(0)
}
