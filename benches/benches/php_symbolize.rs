//! User-space cost of symbolizing PHP frames: reading a function the
//! plugin has not seen (its name, class, file and line table, through
//! `/proc/PID/mem`), paid once per function since the plugin caches it; and
//! the recheck of a cached function against address reuse (its name,
//! class, opcodes and file pointers), paid at most once a second per
//! function still sampled.
//!
//! Starts Debian's PHP 8.2 (skipped without one) on a generated script of
//! 2000 functions of a few lines each, calling each other in a chain down
//! to a spin; the benchmark finds the 2000 functions by walking the chain
//! with the BPF walk's code and reads them round-robin, so every read is of
//! a function not read just before. Reading another process's memory needs
//! ptrace rights over it: the benchmark's own child qualifies.
//!
//! `cargo bench -p icecore-benches --bench php_symbolize -- --warm-up-time 1 --measurement-time 3`

#![expect(
    clippy::expect_used,
    reason = "a benchmark harness: failed setup should abort with its message"
)]

use std::{
    fmt::Write as _,
    hint::black_box,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use icecore_receiver::{
    process_maps::ProcessMappings,
    runtimes::{
        memory::ProcessMemory,
        php::{
            detect::{Globals, PhpBinary, inspect, is_php_name},
            objects::Objects,
        },
        services::RuntimeFile,
    },
};
use icecore_unwinders::{
    MemoryReader,
    php::{PhpProcess, PhpStep, TAGS, globals_kind},
    runtime::PAYLOAD_MASK,
};

const FUNCTIONS: usize = 2000;
const PHP: &str = "/usr/bin/php8.2";

/// The child process, killed when the benchmark ends, and its script's directory.
struct Target(
    Child,
    #[allow(dead_code, reason = "kept until the child ends")] tempfile::TempDir,
);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `FUNCTIONS` functions, each calling the next, the last spinning.
fn script() -> String {
    let mut source = String::from("<?php\n");
    for i in 0..FUNCTIONS {
        let next = if i + 1 < FUNCTIONS {
            format!("handler_{}($request + {i}, $limit)", i + 1)
        } else {
            "spin()".into()
        };
        let _ = write!(
            source,
            "function handler_{i}(int $request, int $limit = {i}): int\n{{\n    \
             $total = $request + {i};\n    for ($k = 0; $k < $limit % 7; $k++) {{ $total += $k; }}\n    \
             return {next} + $total;\n}}\n"
        );
    }
    source.push_str(
        "function spin(): int {\n    echo \"READY\\n\";\n    $x = 0;\n    \
         while (true) { $x = ($x + 1) % 1000003; }\n}\nhandler_0(1, 3);\n",
    );
    source
}

/// Starts the script and waits until it spins.
fn start() -> Target {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("generated_handlers.php");
    std::fs::write(&path, script()).expect("write the script");
    let child = Command::new(PHP)
        .arg(&path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn php");
    let mut target = Target(child, dir);
    let stdout = target.0.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read php's output");
    assert_eq!(line.trim(), "READY");
    target
}

/// The PHP engine `pid` maps and its load bias.
fn find_php(pid: u32) -> (PhpBinary, u64) {
    let mappings = ProcessMappings::read(pid).expect("read php's mappings");
    mappings
        .executable()
        .filter(|m| is_php_name(&m.path))
        .find_map(|m| {
            let binary = inspect(Path::new(&*m.path)).ok()?;
            let bias = binary.load_bias(m.start, m.file_offset)?;
            Some((binary, bias))
        })
        .expect("no usable PHP among php's mappings")
}

/// Process memory as the BPF walk reads it.
struct Memory<'a>(&'a ProcessMemory);

impl MemoryReader for Memory<'_> {
    fn read_u64(&mut self, address: u64) -> Option<u64> {
        self.0.read_u64(address).ok()
    }
}

/// The functions of the running chain, found with the BPF walk's code.
fn functions(binary: &PhpBinary, bias: u64, memory: &ProcessMemory) -> Vec<u64> {
    let l = &binary.layout;
    let Globals::Global(globals) = binary.globals else {
        panic!("an NTS build");
    };
    let process = PhpProcess {
        executor_globals: globals + bias,
        vm_body_pc: 0,
        tls_offset: 0,
        call_top: l.call_top,
        current_execute_data: l.eg_current_execute_data,
        ex_opline: l.ex_opline,
        ex_func: l.ex_func,
        ex_call_info: l.ex_call_info,
        ex_prev: l.ex_prev,
        globals_kind: globals_kind::GLOBAL,
        reserved: 0,
    };
    let mut reader = Memory(memory);
    let mut ex = process
        .current_execute_data(0, &mut reader)
        .expect("the chain");
    let mut found = Vec::new();
    while ex != 0 {
        let mut next = 0;
        if let PhpStep::Frame { function_word, .. } = process.step(ex, &mut next, &mut reader) {
            let function = function_word & PAYLOAD_MASK;
            assert!(TAGS.local_tag(function_word).is_some());
            if !found.contains(&function) {
                found.push(function);
            }
        }
        ex = next;
    }
    found
}

fn bench(c: &mut Criterion) {
    if !Path::new(PHP).exists() {
        println!("php_symbolize: skipped, no {PHP}");
        return;
    }
    let target = start();
    let pid = target.0.id();
    let (binary, bias) = find_php(pid);
    let memory = ProcessMemory::open(pid).expect("open php's memory");
    let functions = functions(&binary, bias, &memory);
    let objects = Objects::new(&memory, &binary.layout);
    let named: Vec<_> = functions
        .iter()
        .filter_map(|&f| objects.function(f))
        .filter(|f| f.name.as_deref().is_some_and(|n| n.starts_with("handler_")))
        .collect();
    assert_eq!(named.len(), FUNCTIONS, "the chain's handlers");
    println!(
        "php_symbolize: {} functions in pid {pid}, e.g. {:?} in {:?} from line {} ({} opcodes)",
        functions.len(),
        named[7].name,
        named[7].file,
        named[7].line_start,
        named[7].lines.len()
    );

    let mut group = c.benchmark_group("php_symbolize");
    group.throughput(Throughput::Elements(1));
    let mut next = 0;
    group.bench_function("cold function", |b| {
        b.iter(|| {
            let function = functions[next];
            next = (next + 1) % functions.len();
            black_box(objects.function(function))
        });
    });
    group.bench_function("recheck", |b| {
        b.iter(|| {
            let function = functions[next];
            next = (next + 1) % functions.len();
            black_box(objects.fingerprint(function))
        });
    });
    group.finish();
    drop(target);
}

criterion_group!(benches, bench);
criterion_main!(benches);
