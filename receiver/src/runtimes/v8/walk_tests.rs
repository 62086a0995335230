//! The BPF-side V8 walk run on the host against live Node processes of
//! every version: the main thread, spinning in JavaScript at the bottom
//! of a recursion, is stopped (ptrace) while its PC is in V8's code (the
//! interpreter's handlers or JIT code, which keep frame pointers), and
//! walked by `icecore_unwinders::v8` until the entry frame hands back to
//! the C++ that called into JavaScript.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use icecore_unwinders::Registers;
use icecore_unwinders::v8::V8Step;

use super::names::V8Objects;
use super::tests::nodes;
use super::{inspect, process::describe, resolve};
use crate::process_maps::ProcessMappings;
use crate::runtimes::host_walk::{HostMemory, spawn_and_read_line};
use crate::test_support::missing_prerequisite;

/// `leaf` and an anonymous function V8 names `ns.deep.mid` (an inferred
/// name) call each other 2 × DEPTH times (cold: interpreted), then the
/// innermost `leaf` spins.
const DEPTH: usize = 12;
const SCRIPT: &str = r#"
function leaf(n) {
  if (n === 0) {
    console.log("ready");
    let x = 0;
    for (;;) { x = (x + 1) % 1000003; }
  }
  return ns.deep.mid(n - 1) + 1;
}
const ns = { deep: {} };
ns.deep.mid = function (n) { return leaf(n) + 1; };
leaf(DEPTH);
"#;

/// Stops thread `tid` (it stays stopped while this thread traces it) at a
/// moment its PC satisfies `wanted`, and returns its registers.
fn stop_where(tid: i32, wanted: impl Fn(u64) -> bool) -> Registers {
    // SAFETY: plain ptrace calls on a child of this test; `regs` is a
    // valid user_regs_struct for PTRACE_GETREGS to fill.
    unsafe {
        assert_eq!(
            libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0),
            0,
            "PTRACE_SEIZE"
        );
        for _ in 0..200 {
            assert_eq!(
                libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0),
                0,
                "PTRACE_INTERRUPT"
            );
            let mut status = 0;
            assert_eq!(libc::waitpid(tid, &mut status, libc::__WALL), tid);
            let mut regs: libc::user_regs_struct = std::mem::zeroed();
            assert_eq!(
                libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &mut regs as *mut _),
                0,
                "PTRACE_GETREGS"
            );
            if wanted(regs.rip) {
                return Registers {
                    ip: regs.rip,
                    sp: regs.rsp,
                    bp: regs.rbp,
                };
            }
            libc::ptrace(libc::PTRACE_CONT, tid, 0, 0);
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
    }
    panic!("thread {tid} never stopped in V8's code")
}

#[test]
fn the_v8_walk_finds_the_javascript_frames_of_live_nodes() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        missing_prerequisite("root, to stop Node threads with ptrace");
        return;
    }
    for (major, node) in nodes() {
        let binary = inspect(&node).unwrap();
        let layout = resolve(&binary).unwrap();
        let script = SCRIPT.replace("DEPTH", &DEPTH.to_string());
        let dir = tempfile::tempdir().unwrap();
        let script_path = dir.path().join("walk.js");
        std::fs::write(&script_path, &script).unwrap();
        let (live, line) = spawn_and_read_line(Command::new(&node).arg(&script_path));
        assert_eq!(line, "ready");
        let pid = live.pid();
        let maps = ProcessMappings::read(pid).unwrap();
        let node_path = std::fs::canonicalize(&node).unwrap();
        let process = describe(&binary, &layout, &maps, |m| {
            std::path::Path::new(&*m.path) == node_path
        })
        .unwrap();
        let mut memory = HostMemory::open(pid);
        let mut regs = stop_where(i32::try_from(pid).unwrap(), |ip| process.in_code(ip));
        let mut steps = Vec::new();
        loop {
            let step = process.step(&mut regs, steps.is_empty(), &mut memory);
            steps.push(step);
            if matches!(step, V8Step::Entry | V8Step::Native | V8Step::ReadFailed) {
                break;
            }
            assert!(steps.len() < 200, "Node {major}: endless walk");
        }
        // The functions of the JavaScript frames, innermost first: the
        // spinning leaf (interpreted, or compiled by on-stack replacement),
        // then its cold callers, all interpreted.
        let objects = V8Objects::new(&layout, &memory.0);
        let functions: Vec<u64> = steps
            .iter()
            .filter_map(|s| match *s {
                V8Step::Interpreted { shared, .. } => Some(shared),
                V8Step::Compiled {
                    shared, function, ..
                } => {
                    assert_eq!(objects.shared_of(function), Some(shared), "Node {major}");
                    Some(shared)
                }
                _ => None,
            })
            .collect();
        let interpreted = steps
            .iter()
            .filter(|s| matches!(s, V8Step::Interpreted { .. }))
            .count();
        println!(
            "Node {major}: {} V8 frames ({interpreted} interpreted), ending {:?}",
            steps.len(),
            steps.last()
        );
        assert_eq!(
            steps.last(),
            Some(&V8Step::Entry),
            "Node {major}: {steps:?}"
        );
        // leaf and mid, alternating, then the script's own function.
        assert!(
            functions.len() > 2 * DEPTH + 1 && interpreted >= 2 * DEPTH,
            "Node {major}: {steps:?}"
        );
        let (leaf, mid) = (functions[0], functions[1]);
        assert_ne!(leaf, mid);
        for (i, function) in functions[..=2 * DEPTH].iter().enumerate() {
            assert_eq!(
                *function,
                if i % 2 == 0 { leaf } else { mid },
                "Node {major}: frame {i}"
            );
        }
        // SharedFunctionInfos, named as V8 names them: one by its own
        // name, one by the inferred one.
        let name = |shared: u64| {
            assert_eq!(
                objects.instance_type(shared),
                Some(layout.shared_function_info_type),
                "Node {major}: {shared:#x} is no SharedFunctionInfo"
            );
            objects.function_name(shared).unwrap()
        };
        assert_eq!(name(leaf), "leaf", "Node {major}");
        assert_eq!(name(mid), "ns.deep.mid", "Node {major}");
        // The callers' lines: the call in each, from the bytecode offset.
        let line_of =
            |needle: &str| 1 + script.lines().position(|l| l.contains(needle)).unwrap() as u32;
        let call_lines = [
            line_of("return ns.deep.mid(n - 1)"),
            line_of("return leaf(n) + 1"),
        ];
        let mut checked = 0;
        for (i, step) in steps.iter().enumerate() {
            let V8Step::Interpreted {
                shared,
                bytecode_offset,
            } = *step
            else {
                continue;
            };
            let Some(expected) = [leaf, mid]
                .iter()
                .position(|&f| f == shared)
                .map(|f| call_lines[f])
            else {
                continue; // the module's own function
            };
            // The spinning leaf itself, stopped in a bytecode handler, is
            // at the offset its frame last saved: its loop's line once a
            // back edge's interrupt check saved it, its last call's (the
            // `console.log`) before that.
            let expected: Vec<u32> = if i == 0 {
                vec![line_of("for (;;)"), line_of("console.log(\"ready\")")]
            } else {
                vec![expected]
            };
            let bytecode = objects.bytecode_of(shared).unwrap();
            let position = objects
                .source_position(bytecode, u64::from(bytecode_offset))
                .unwrap();
            let lines = objects
                .script_lines(objects.script_of(shared).unwrap())
                .unwrap();
            assert_eq!(
                std::path::Path::new(&lines.name),
                script_path,
                "Node {major}: the script's name"
            );
            let line = lines.line_of(position);
            assert!(
                line.is_some_and(|l| expected.contains(&l)),
                "Node {major}: offset {bytecode_offset}: line {line:?}, expected one of {expected:?}"
            );
            checked += 1;
        }
        assert!(
            checked >= 2 * DEPTH - 1,
            "Node {major}: {checked} lines checked"
        );
        // Handed back at C++ in the node binary.
        let back = maps
            .find(regs.ip)
            .expect("the entry frame's caller is mapped");
        assert_eq!(std::path::Path::new(&*back.path), node_path, "Node {major}");
        drop(live);
    }
}
