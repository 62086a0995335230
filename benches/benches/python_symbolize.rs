//! User-space cost of symbolizing CPython frames: reading a code object the
//! plugin has not seen (name, file name and line table, through
//! `/proc/PID/mem`) plus its line look-up, paid once per code object since
//! the plugin caches the result; and the line look-up alone, on a code
//! object already read.
//!
//! Starts a pyenv CPython 3.12 (skipped without one) that defines 2000
//! distinct functions, prints their code objects' addresses and sleeps;
//! the benchmark reads them round-robin, so every read is of a code object
//! not read just before. Reading another process's memory needs ptrace
//! rights over it: the benchmark's own child qualifies.
//!
//! `cargo bench -p icecore-benches --bench python_symbolize -- --warm-up-time 1 --measurement-time 3`

#![expect(
    clippy::expect_used,
    reason = "a benchmark harness: failed setup should abort with its message"
)]

use std::{
    hint::black_box,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use icecore_receiver::{
    process_maps::ProcessMappings,
    runtimes::{
        memory::ProcessMemory,
        python::{
            code::{line_of, read_code},
            detect::{inspect, version_from_name},
            layouts::PythonLayout,
        },
    },
};

const FUNCTIONS: usize = 2000;

/// Defines `FUNCTIONS` functions of a few lines each, prints the address of
/// each one's code object, then `READY`, and waits.
const SCRIPT: &str = r#"
import sys, time
n = int(sys.argv[1])
source = "".join(
    f"def handler_{i}_{'x' * (i % 13)}(request, limit={i}):\n"
    f"    total = request + {i}\n"
    f"    for k in range(limit % 7):\n"
    f"        total += k * {i % 11 + 1}\n"
    f"    return total - {i}\n\n"
    for i in range(n)
)
namespace = {}
exec(compile(source, "/srv/app/generated_handlers.py", "exec"), namespace)
functions = [v for k, v in namespace.items() if k.startswith("handler_")]
for f in functions:
    print(id(f.__code__))
print("READY", flush=True)
time.sleep(3600)
"#;

/// The child process, killed when the benchmark ends.
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pyenv_python312() -> Option<PathBuf> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")))?;
    let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("3.12."))
        .map(|e| e.path().join("bin/python3.12"))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.pop()
}

/// Starts the script; returns the child and its code objects' addresses.
fn start(python: &Path) -> (Target, Vec<u64>) {
    let child = Command::new(python)
        .args(["-c", SCRIPT, &FUNCTIONS.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn python");
    let mut target = Target(child);
    let stdout = target.0.stdout.take().expect("piped stdout");
    let mut codes = Vec::with_capacity(FUNCTIONS);
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read python's output");
        if line == "READY" {
            break;
        }
        codes.push(line.trim().parse().expect("a code object's address"));
    }
    assert_eq!(
        codes.len(),
        FUNCTIONS,
        "python printed too few code objects"
    );
    (target, codes)
}

/// The CPython file mapped by `pid`: its layout and `PyCode_Type`'s address.
fn find_python(pid: u32) -> (PythonLayout, Option<u64>) {
    let mappings = ProcessMappings::read(pid).expect("read python's mappings");
    mappings
        .executable()
        .find_map(|m| {
            let binary = inspect(Path::new(&*m.path), version_from_name(&m.path)?).ok()?;
            let bias = binary.load_bias(m.start, m.file_offset)?;
            Some((binary.layout, binary.code_type.map(|t| t + bias)))
        })
        .expect("no usable CPython among python's mappings")
}

/// Where a frame at the first instruction of `code` points.
fn first_instruction(layout: &PythonLayout, code: u64) -> u64 {
    layout
        .code_code_adaptive
        .map_or(0, |offset| code + u64::from(offset))
}

fn bench(c: &mut Criterion) {
    let Some(python) = pyenv_python312() else {
        println!("python_symbolize: skipped, no pyenv CPython 3.12");
        return;
    };
    let (target, codes) = start(&python);
    let pid = target.0.id();
    let (layout, code_type) = find_python(pid);
    let layout = &layout;
    let memory = ProcessMemory::open(pid).expect("open python's memory");
    let first = codes[0];
    let info = read_code(&memory, layout, first, code_type).expect("read a code object");
    // Two instructions in: the function's first line rather than its `def`.
    let instr = first_instruction(layout, first) + 4;
    println!(
        "python_symbolize: {} in {} line {}, {} code objects in pid {pid}",
        info.name,
        info.filename,
        line_of(layout, &info, first, instr),
        codes.len()
    );

    let mut group = c.benchmark_group("python_symbolize");
    group.throughput(Throughput::Elements(1));
    let mut next = 0;
    group.bench_function("cold code object", |b| {
        b.iter(|| {
            let code = codes[next];
            next = (next + 1) % codes.len();
            let info = read_code(&memory, layout, code, code_type).expect("read code object");
            black_box(line_of(
                layout,
                &info,
                code,
                first_instruction(layout, code),
            ))
        });
    });
    group.bench_function("line lookup", |b| {
        b.iter(|| line_of(layout, black_box(&info), black_box(first), black_box(instr)));
    });
    group.finish();
    drop(target);
}

criterion_group!(benches, bench);
criterion_main!(benches);
