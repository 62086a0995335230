//! User-space cost of symbolizing HotSpot frames, paid once per method and
//! per nmethod since the plugin caches both: reading a `Method*` (class,
//! name, signature, source file, line table through `/proc/PID/mem`),
//! reading an nmethod's debug information (PcDescs, scopes, metadata), and
//! finding the methods inlined at a PC in one already read.
//!
//! Starts Debian's OpenJDK 17 (skipped without one) on `JavaRecurse` until
//! the JIT compiled it and part of the JDK, reads the JVM's tables, and
//! takes every compiled method from the code heaps; the benchmark reads
//! them round-robin, so every read is of one not read just before.
//!
//! `cargo bench -p icecore-benches --bench hotspot_symbolize -- --warm-up-time 1 --measurement-time 3`

#![expect(
    clippy::expect_used,
    reason = "a benchmark harness: failed setup should abort with its message"
)]

use std::{
    hint::black_box,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use icecore_receiver::{
    process_maps::ProcessMappings,
    runtimes::{
        hotspot::{
            code_cache::CodeCache,
            detect::{inspect, is_jvm_name, major_version},
            layout::HotSpotLayout,
            names::Methods,
        },
        memory::ProcessMemory,
        services::RuntimeFile,
    },
};

const JDK: &str = "/usr/lib/jvm/java-17-openjdk-amd64";

/// The child JVM, killed when the benchmark ends.
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bench(c: &mut Criterion) {
    let (java, javac) = (
        Path::new(JDK).join("bin/java"),
        Path::new(JDK).join("bin/javac"),
    );
    if !java.exists() || !javac.exists() {
        println!("hotspot_symbolize: skipped, no JDK at {JDK}");
        return;
    }
    let classes = tempfile::tempdir().expect("tempdir");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/JavaRecurse.java");
    let status = Command::new(&javac)
        .arg("-d")
        .arg(classes.path())
        .arg(&source)
        .status()
        .expect("run javac");
    assert!(status.success(), "javac failed");
    let child = Command::new(&java)
        .arg("-cp")
        .arg(classes.path())
        .args(["JavaRecurse", "20", "600"])
        .stdout(Stdio::null())
        .spawn()
        .expect("start java");
    let target = Target(child);
    // Long enough for C1 and C2 to compile the fixture and JDK methods.
    std::thread::sleep(Duration::from_secs(5));
    let pid = target.0.id();
    let mappings = ProcessMappings::read(pid).expect("read the JVM's mappings");
    let (binary, bias) = mappings
        .executable()
        .filter(|m| is_jvm_name(&m.path))
        .find_map(|m| {
            let binary = inspect(Path::new(&*m.path)).ok()?;
            Some((binary.clone(), binary.load_bias(m.start, m.file_offset)?))
        })
        .expect("libjvm.so among the mappings");
    let memory = ProcessMemory::open(pid).expect("open the JVM's memory");
    let vm = binary.vm_structs(&memory, bias).expect("the JVM's tables");
    let major = major_version(&vm, &memory).expect("the JDK's version");
    let layout = HotSpotLayout::new(&vm, major).expect("the layout");
    let cache = CodeCache::read(&memory, layout).expect("the code cache");
    let blobs: Vec<_> = cache
        .blobs()
        .into_iter()
        .filter(|b| b.is_java_nmethod())
        .collect();
    let nmethods: Vec<_> = blobs.iter().filter_map(|b| cache.nmethod(b)).collect();
    let methods: Vec<u64> = nmethods.iter().map(|n| n.method).collect();
    let names = Methods::new(&memory, layout);
    // A compiled PC with scopes: the first PcDesc that has one.
    let (probe, offset) = nmethods
        .iter()
        .find_map(|n| {
            n.pc_descs.chunks_exact(16).find_map(|d| {
                let pc = i32::from_le_bytes(d[0..4].try_into().ok()?);
                let scope = u32::from_le_bytes(d[4..8].try_into().ok()?);
                (pc >= 0 && scope != 0).then_some((n, pc as u32))
            })
        })
        .expect("an nmethod with a scope");
    let debug_bytes: usize = nmethods
        .iter()
        .map(|n| n.pc_descs.len() + n.scopes.len() + 8 * n.metadata.len())
        .sum();
    println!(
        "hotspot_symbolize: JDK {major}, {} nmethods ({debug_bytes} bytes of debug information \
         read, {:.0} per nmethod); {:?} at a PC",
        nmethods.len(),
        debug_bytes as f64 / nmethods.len().max(1) as f64,
        probe
            .frames_at(offset, true, layout.unsigned5_base())
            .iter()
            .filter_map(|&(m, bci)| names.method(m).map(|j| (j.qualified_name(), j.line(bci))))
            .collect::<Vec<_>>()
    );

    let mut group = c.benchmark_group("hotspot_symbolize");
    group.throughput(Throughput::Elements(1));
    let mut next = 0;
    group.bench_function("cold method", |b| {
        b.iter(|| {
            let method = methods[next];
            next = (next + 1) % methods.len();
            black_box(names.method(method))
        });
    });
    let mut next = 0;
    group.bench_function("cold nmethod debug info", |b| {
        b.iter(|| {
            let blob = &blobs[next];
            next = (next + 1) % blobs.len();
            black_box(cache.nmethod(blob))
        });
    });
    group.bench_function("inlined methods at a pc", |b| {
        b.iter(|| black_box(probe.frames_at(black_box(offset), true, layout.unsigned5_base())));
    });
    group.finish();
    drop(target);
}

criterion_group!(benches, bench);
criterion_main!(benches);
