//! User-space cost of symbolizing Perl frames: reading a sub the plugin has
//! not seen (its CV, its glob or name, its package's stash name, through
//! `/proc/PID/mem`) and a statement (its COP's line and file), each paid
//! once per sub or statement since the plugin caches them, and again at
//! most once a second while sampled.
//!
//! Starts Debian's perl on a generated script of 2000 subs calling each
//! other in a chain down to a spin; the benchmark finds them by walking the
//! context stack with the BPF walk's code and reads them round-robin, so
//! every read is of a sub not read just before. Reading another process's
//! memory needs ptrace rights over it: the benchmark's own child qualifies.
//!
//! `cargo bench -p icecore-benches --bench perl_symbolize -- --warm-up-time 1 --measurement-time 3`

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
        perl::{
            detect::{PerlBinary, inspect, is_perl_name},
            objects::PerlObjects,
        },
        services::RuntimeFile,
    },
};
use icecore_unwinders::{
    MemoryReader,
    perl::{CALLERS_STATEMENT, PerlStep, PerlWalkState, TAGS, word},
    runtime::PAYLOAD_MASK,
};

const SUBS: usize = 2000;
const PERL: &str = "/usr/bin/perl";

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

/// `SUBS` subs in packages of 100, each calling the next, the last spinning.
fn script() -> String {
    let mut source = String::new();
    for i in 0..SUBS {
        let next = if i + 1 < SUBS {
            format!(
                "Handlers{}::handler_{}($request + {i})",
                (i + 1) / 100,
                i + 1
            )
        } else {
            "main::spin()".into()
        };
        let _ = write!(
            source,
            "package Handlers{};\nsub handler_{i} {{\n    my ($request) = @_;\n    \
             my $total = $request + {i};\n    return {next} + $total;\n}}\n",
            i / 100
        );
    }
    source.push_str(
        "package main;\nsub spin {\n    $| = 1; print \"READY\\n\";\n    my $x = 0;\n    \
         while (1) { $x = ($x + 1) % 1000003 }\n}\nHandlers0::handler_0(1);\n",
    );
    source
}

/// Starts the script and waits until it spins.
fn start() -> Target {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("generated_handlers.pl");
    std::fs::write(&path, script()).expect("write the script");
    let child = Command::new(PERL)
        .arg(&path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn perl");
    let mut target = Target(child, dir);
    let stdout = target.0.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read perl's output");
    assert_eq!(line.trim(), "READY");
    target
}

/// The Perl `pid` maps and its load bias.
fn find_perl(pid: u32) -> (PerlBinary, u64) {
    let mappings = ProcessMappings::read(pid).expect("read perl's mappings");
    mappings
        .executable()
        .filter(|m| is_perl_name(&m.path))
        .find_map(|m| {
            let binary = inspect(Path::new(&*m.path)).ok()?;
            let bias = binary.load_bias(m.start, m.file_offset)?;
            Some((binary, bias))
        })
        .expect("no usable Perl among perl's mappings")
}

/// Process memory as the BPF walk reads it.
struct Memory<'a>(&'a ProcessMemory);

impl MemoryReader for Memory<'_> {
    fn read_u64(&mut self, address: u64) -> Option<u64> {
        self.0.read_u64(address).ok()
    }
}

/// The (CV, COP) pairs of the running chain, found with the BPF walk's
/// code from the global interpreter (the main thread's).
fn frames(binary: &PerlBinary, bias: u64, memory: &ProcessMemory) -> Vec<(u64, u64)> {
    let curinterp = binary.curinterp.expect("PL_curinterp");
    let process = binary.layout.bpf_process();
    let mut reader = Memory(memory);
    let interpreter = memory.read_u64(bias + curinterp).expect("the interpreter");
    let mut state = PerlWalkState::default();
    state.reset();
    assert!(process.start(interpreter, &mut state, &mut reader));
    let mut found = Vec::new();
    loop {
        match process.step(&mut state, &mut reader) {
            PerlStep::Frame {
                frame_word,
                cop_word,
            } => {
                if TAGS.local_tag(frame_word) == Some(word::SUB) {
                    let cop = cop_word & PAYLOAD_MASK & !CALLERS_STATEMENT;
                    found.push((frame_word & PAYLOAD_MASK, cop));
                }
            }
            PerlStep::Done | PerlStep::ReadFailed => break,
            PerlStep::Skipped | PerlStep::StackSwitch(_) => {}
        }
    }
    found
}

fn bench(c: &mut Criterion) {
    if !Path::new(PERL).exists() {
        println!("perl_symbolize: skipped, no {PERL}");
        return;
    }
    let target = start();
    let pid = target.0.id();
    let (binary, bias) = find_perl(pid);
    let memory = ProcessMemory::open(pid).expect("open perl's memory");
    let frames = frames(&binary, bias, &memory);
    let objects = PerlObjects {
        layout: &binary.layout,
        memory: &memory,
    };
    let named: Vec<_> = frames
        .iter()
        .filter_map(|&(cv, _)| objects.sub_name(cv).ok())
        .filter(|s| s.name.contains("::handler_"))
        .collect();
    assert_eq!(named.len(), SUBS, "the chain's handlers");
    let statement = objects.statement(frames[7].1).expect("a statement");
    println!(
        "perl_symbolize: {} frames in pid {pid}, e.g. {} at {}:{}",
        frames.len(),
        named[7].name,
        statement.file,
        statement.line
    );

    let mut group = c.benchmark_group("perl_symbolize");
    group.throughput(Throughput::Elements(1));
    let mut next = 0;
    group.bench_function("cold sub", |b| {
        b.iter(|| {
            let (cv, _) = frames[next];
            next = (next + 1) % frames.len();
            black_box(objects.sub_name(cv).ok())
        });
    });
    group.bench_function("cold statement", |b| {
        b.iter(|| {
            let (_, cop) = frames[next];
            next = (next + 1) % frames.len();
            black_box(objects.statement(cop).ok())
        });
    });
    group.finish();
    drop(target);
}

criterion_group!(benches, bench);
criterion_main!(benches);
