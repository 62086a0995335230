//! The BPF walk (`icecore_unwinders::php`), run on the host against live
//! PHP processes of every build on the machine, with opcache's JIT off and
//! on. The process is stopped with ptrace in the VM loop (or in JIT code),
//! walked through `/proc/PID/mem` as BPF walks it, and named by the plugin:
//! names, files and lines must be the script's. The native half is checked
//! too: from the stopped registers (a JIT frame unwound as `execute_ex`'s
//! body, as BPF does), the native walk must reach the stack's end through
//! exactly one `execute_ex` frame.

use icecore_otlp::model::FrameKind;
use icecore_unwinders::{
    Dispatch, MemoryReader, Registers, StepOutcome,
    native::dwarf_step,
    php::{MAX_PHP_FRAMES, PhpProcess, PhpStep, TAGS, word},
    table::AddressSpace,
};

use super::{PhpPlugin, tests::interpreters};
use crate::{
    process_maps::ProcessMappings,
    runtimes::{
        RuntimePlugin,
        host_walk::{HostMemory, Stopped, address_space, spawn_and_read_line},
        services::MemoryProcessMap,
    },
};

/// Spins in `leaf`, called from a closure in a method, called from a
/// static method, a function and the script's top level.
const SCRIPT: &str = r#"<?php
class Shop {
    public static function open() { return (new Shop())->total(); }
    public function total() {
        $f = function ($n) { return leaf($n); };
        return $f(1);
    }
}
function leaf($n) {
    echo "ready\n";
    while (true) { $x = 0; for ($i = 0; $i < 100000; $i++) { $x = ($x + $i) % 1000003; } }
}
function mid() { return Shop::open(); }
mid();
"#;

/// Where the script is, in the process's root.
const SCRIPT_PATH: &str = "/tmp/icecore_php_walk.php";

/// The frames expected, newest first: name (a closure's is checked apart)
/// and line.
const EXPECTED: [(&str, u32); 6] = [
    ("leaf", 11),
    ("Shop::{closure}", 5),
    ("Shop::total", 6),
    ("Shop::open", 3),
    ("mid", 13),
    ("<main>", 14),
];

/// Opcache's tracing JIT, on for the script.
const JIT: [&str; 6] = [
    "-d",
    "opcache.enable_cli=1",
    "-d",
    "opcache.jit=tracing",
    "-d",
    "opcache.jit_buffer_size=32M",
];

/// The words the BPF program writes for the thread stopped with `regs`.
fn walk(process: &PhpProcess, regs: &libc::user_regs_struct, memory: &mut HostMemory) -> Vec<u64> {
    let newest = process
        .current_execute_data(regs.fs_base, memory)
        .expect("the thread runs PHP");
    let mut words = Vec::new();
    if regs.r14 == newest {
        words.push(TAGS.word(word::LEAF_OPLINE, regs.r15));
    }
    let mut ex = newest;
    for _ in 0..MAX_PHP_FRAMES {
        let mut next = 0;
        match process.step(ex, &mut next, memory) {
            PhpStep::Frame {
                function_word,
                opline_word,
            } => words.extend([function_word, opline_word]),
            PhpStep::Skipped => {}
            PhpStep::ReadFailed => panic!("a frame could not be read"),
        }
        if next == 0 {
            break;
        }
        ex = next;
    }
    words
}

/// The native walk from `regs`, as BPF's: each frame's PC (`handed` turns
/// a PC a runtime takes over into the one it hands back), and how it ended.
fn native_walk(
    mut regs: Registers,
    memory: &mut HostMemory,
    space: &AddressSpace,
    handed: impl Fn(u64) -> Option<u64>,
) -> (Vec<u64>, StepOutcome) {
    let mut ips = Vec::new();
    for _ in 0..128 {
        if let Some(ip) = handed(regs.ip) {
            regs.ip = ip;
        }
        let caller = !ips.is_empty();
        ips.push(regs.ip);
        let pc = if caller { regs.ip - 1 } else { regs.ip };
        match dwarf_step(&mut regs, space.row_for(pc), memory) {
            StepOutcome::Caller => {}
            end => return (ips, end),
        }
    }
    panic!("no end of stack in 128 frames: {ips:x?}")
}

#[test]
fn the_bpf_walk_and_the_plugin_name_every_frame_of_live_processes() {
    for php in interpreters() {
        for jit in [false, true] {
            if jit && !php.opcache {
                continue;
            }
            let label = format!("{} JIT {}", php.label, if jit { "on" } else { "off" });
            let root = php.interpreter.root.clone().unwrap_or_else(|| "/".into());
            std::fs::write(root.join(&SCRIPT_PATH[1..]), SCRIPT).unwrap();
            let mut command = php.interpreter.command();
            if jit {
                command.args(JIT);
            }
            let (child, line) = spawn_and_read_line(command.arg(SCRIPT_PATH));
            assert_eq!(line, "ready", "{label}");
            let pid = child.pid();
            // Let the tracing JIT compile the loop.
            std::thread::sleep(std::time::Duration::from_millis(1500));

            let map = MemoryProcessMap::default();
            let mut plugin = PhpPlugin::new(Box::new(map.clone()));
            let mappings = ProcessMappings::read(pid).unwrap();
            let claimed = plugin.attach(pid, &mappings).expect("the plugin claims it");
            let process = map.get(pid).expect("described to BPF");
            let vm = claimed
                .code
                .iter()
                .find(|c| c.dispatch == Dispatch::Deferred)
                .copied()
                .expect("execute_ex");
            let jit_code: Vec<_> = claimed
                .code
                .iter()
                .filter(|c| c.dispatch == Dispatch::Handover)
                .copied()
                .collect();
            assert_eq!(!jit_code.is_empty(), jit, "{label}: JIT code {claimed:?}");
            assert!(vm.start < process.vm_body_pc && process.vm_body_pc < vm.end);

            let in_jit = |ip: u64| jit_code.iter().any(|c| c.start <= ip && ip < c.end);
            // With the JIT on, in its code or in a handler it calls.
            let in_vm = |ip: u64| vm.start <= ip && ip < vm.end;
            let stopped = Stopped::when(pid, |regs| in_vm(regs.rip) != jit);
            let regs = stopped.registers;
            let mut memory = HostMemory::open(pid);
            let words = walk(&process, &regs, &mut memory);
            let groups = plugin.frames(pid, &words);

            // The native half, as BPF walks it: a JIT frame is unwound as
            // execute_ex's body.
            let space = address_space(pid);
            let native = native_walk(
                Registers {
                    ip: regs.rip,
                    sp: regs.rsp,
                    bp: regs.rbp,
                },
                &mut memory,
                &space,
                |ip| in_jit(ip).then_some(process.vm_body_pc),
            );
            drop(stopped);

            let frames: Vec<(String, Option<String>, u32)> = groups
                .iter()
                .flatten()
                .map(|f| {
                    let line = &f.lines[0];
                    (
                        line.function_name.to_string(),
                        line.filename.as_deref().map(str::to_owned),
                        line.line,
                    )
                })
                .collect();
            println!(
                "{label} ({}): {frames:?}; leaf opline word: {}; {} native frames",
                php.version,
                words
                    .first()
                    .is_some_and(|&w| TAGS.local_tag(w) == Some(word::LEAF_OPLINE)),
                native.0.len()
            );
            assert_eq!(frames.len(), EXPECTED.len(), "{label}: {frames:?}");
            for ((name, file, line), (want, want_line)) in frames.iter().zip(EXPECTED) {
                if want == "Shop::{closure}" {
                    // 8.4 names a closure after where it is defined.
                    assert!(
                        name == want || name == "Shop::{closure:Shop::total():5}",
                        "{label}: {name}"
                    );
                } else {
                    assert_eq!(name, want, "{label}");
                }
                assert_eq!(*line, want_line, "{label}: {name}");
                assert_eq!(file.as_deref(), Some(SCRIPT_PATH), "{label}: {name}");
            }
            assert!(groups.iter().flatten().all(|f| f.kind == FrameKind::Php));
            assert_eq!(groups.len(), 1, "{label}: one execute_ex invocation");

            let (ips, stop) = native;
            assert_eq!(stop, StepOutcome::EndOfStack, "{label}: {ips:x?}");
            let loops = ips.iter().filter(|&&ip| in_vm(ip)).count();
            assert_eq!(loops, 1, "{label}: execute_ex frames in {ips:x?}");
            assert!(ips.len() >= 4, "{label}: {ips:x?}");

            plugin.detach(pid);
            assert_eq!(map.get(pid), None);
            let _ = memory.read_u64(0);
        }
    }
}
