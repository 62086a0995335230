//! User-space cost of symbolizing CRuby frames: reading an iseq the plugin
//! has not seen (label, path, first line, its method's iseq, through
//! `/proc/PID/mem`) plus its line look-up in the succinct line table, paid
//! once per iseq since the plugin caches frames; and the line look-up
//! alone, on an iseq already read.
//!
//! Starts Debian's CRuby 3.1 (skipped without one) that defines 2000
//! distinct methods, prints their iseqs' addresses (through Fiddle) and
//! sleeps; the benchmark reads them round-robin, so every read is of an
//! iseq not read just before. Reading another process's memory needs ptrace
//! rights over it: the benchmark's own child qualifies.
//!
//! `cargo bench -p icecore-benches --bench ruby_symbolize -- --warm-up-time 1 --measurement-time 3`

#![expect(
    clippy::expect_used,
    reason = "a benchmark harness: failed setup should abort with its message"
)]

use std::{
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
        ruby::{
            detect::{inspect, is_ruby_name},
            layouts::RubyLayout,
            objects::Objects,
        },
    },
};

const METHODS: usize = 2000;
const RUBY: &str = "/usr/bin/ruby3.1";

/// Defines `METHODS` methods of a few lines each, prints the address of each
/// one's iseq (3.1's `RTypedData.data`, 32 bytes into the ISeq wrapper),
/// then `READY`, and waits.
const SCRIPT: &str = r#"
require 'fiddle'
n = Integer(ARGV[0])
source = (0...n).map { |i|
  "def handler_#{i}_#{'x' * (i % 13)}(request, limit = #{i})\n" \
  "  total = request + #{i}\n" \
  "  (limit % 7).times { |k| total += k * #{i % 11 + 1} }\n" \
  "  total - #{i}\n" \
  "end\n"
}.join
eval(source, binding, '/srv/app/generated_handlers.rb', 1)
(0...n).each do |i|
  wrapper = RubyVM::InstructionSequence.of(method(:"handler_#{i}_#{'x' * (i % 13)}"))
  puts Fiddle::Pointer.new(Fiddle.dlwrap(wrapper))[32, 8].unpack1('Q')
end
puts 'READY'
$stdout.flush
sleep 3600
"#;

/// The child process, killed when the benchmark ends.
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the script; returns the child and its iseqs' addresses.
fn start() -> (Target, Vec<u64>) {
    let child = Command::new(RUBY)
        .args(["-e", SCRIPT, &METHODS.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn ruby");
    let mut target = Target(child);
    let stdout = target.0.stdout.take().expect("piped stdout");
    let mut iseqs = Vec::with_capacity(METHODS);
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read ruby's output");
        if line == "READY" {
            break;
        }
        iseqs.push(line.trim().parse().expect("an iseq's address"));
    }
    assert_eq!(iseqs.len(), METHODS, "ruby printed too few iseqs");
    (target, iseqs)
}

/// The layout of the CRuby `pid` maps.
fn find_ruby(pid: u32) -> RubyLayout {
    let mappings = ProcessMappings::read(pid).expect("read ruby's mappings");
    mappings
        .executable()
        .filter(|m| is_ruby_name(&m.path))
        .find_map(|m| inspect(Path::new(&*m.path)).ok())
        .expect("no usable CRuby among ruby's mappings")
        .layout
}

/// A `pc` two instructions into the iseq whose body is `body`.
fn pc_in(memory: &ProcessMemory, layout: &RubyLayout, body: u64) -> u64 {
    memory
        .read_u64(body + layout.body_iseq_encoded)
        .expect("iseq_encoded")
        + 16
}

fn bench(c: &mut Criterion) {
    if !Path::new(RUBY).exists() {
        println!("ruby_symbolize: skipped, no {RUBY}");
        return;
    }
    let (target, iseqs) = start();
    let pid = target.0.id();
    let layout = find_ruby(pid);
    let memory = ProcessMemory::open(pid).expect("open ruby's memory");
    let objects = Objects::new(&memory, layout);
    let info = objects.iseq(iseqs[0]).expect("read an iseq");
    let pc = pc_in(&memory, &layout, info.body);
    println!(
        "ruby_symbolize: {} in {} line {:?}, {} iseqs in pid {pid}",
        info.label,
        info.path,
        objects.line(info.body, pc),
        iseqs.len()
    );

    let mut group = c.benchmark_group("ruby_symbolize");
    group.throughput(Throughput::Elements(1));
    let mut next = 0;
    group.bench_function("cold iseq", |b| {
        b.iter(|| {
            let iseq = iseqs[next];
            next = (next + 1) % iseqs.len();
            let info = objects.iseq(iseq).expect("read an iseq");
            let pc = pc_in(&memory, &layout, info.body);
            black_box(objects.line(info.body, pc))
        });
    });
    group.bench_function("line lookup", |b| {
        b.iter(|| objects.line(black_box(info.body), black_box(pc)));
    });
    group.finish();
    drop(target);
}

criterion_group!(benches, bench);
criterion_main!(benches);
