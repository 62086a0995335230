//! Memory icecore keeps for a JVM with 20,000 compiled methods, and what it
//! costs to name them: the HotSpot plugin's caches (code blobs with their
//! nmethod's debug information, methods with their names and line tables)
//! after every compiled Java method of the JVM was symbolized once, as a
//! profile that saw each of them would, counted by a counting allocator.
//!
//! Generates `ManyMethods.java` (20 classes of 1,000 small static methods),
//! runs it under Debian's OpenJDK 17 until the JIT has compiled them all
//! (C1 compiles a method after 200 calls; each is called 1,000 times a
//! round), then attaches the plugin and names every nmethod through the
//! words BPF would write (blob, PC), twice: cold, then from the caches.
//!
//! `cargo bench -p icecore-benches --bench hotspot_memory`
//!
//! Environment: `HOTSPOT_MEMORY_JDK` (a JDK home instead of Debian's 17),
//! `HOTSPOT_MEMORY_METHODS` (default 20000).

#![expect(
    clippy::expect_used,
    reason = "a benchmark harness: failed setup should abort with its message"
)]

use std::{
    alloc::{GlobalAlloc, Layout, System},
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicI64, Ordering},
    time::{Duration, Instant},
};

use icecore_receiver::{
    process_maps::ProcessMappings,
    runtimes::{
        RuntimePlugin,
        hotspot::{
            code_cache::CodeCache,
            detect::{inspect, is_jvm_name, major_version},
            layout::HotSpotLayout,
            plugin::HotSpotPlugin,
        },
        memory::ProcessMemory,
        services::MemoryProcessMap,
    },
};
use icecore_unwinders::hotspot::{HOTSPOT, word};

/// Counts the bytes live in this process's heap.
struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards to the system allocator, only counting sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const CLASSES: usize = 20;

/// The child JVM, killed when the benchmark ends.
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Java source of `classes` classes of `per_class` methods, and a main that
/// calls them all, round after round, and says `round N` after each.
fn source(classes: usize, per_class: usize) -> String {
    let mut java = String::new();
    for c in 0..classes {
        let _ = writeln!(java, "class M{c} {{");
        for m in 0..per_class {
            let _ = writeln!(
                java,
                "    static long m{m}(long x) {{ return x * {} + {m}; }}",
                31 + c
            );
        }
        let _ = writeln!(java, "    static long all(long x) {{");
        for m in 0..per_class {
            let _ = writeln!(java, "        x = m{m}(x);");
        }
        let _ = writeln!(java, "        return x;\n    }}\n}}");
    }
    let _ = writeln!(
        java,
        "public class ManyMethods {{\n    static volatile long sink;\n    \
         public static void main(String[] args) throws Exception {{\n        \
         for (int round = 1; ; round++) {{\n            \
         for (int i = 0; i < 1000; i++) {{"
    );
    for c in 0..classes {
        let _ = writeln!(java, "                sink += M{c}.all(i);");
    }
    let _ = writeln!(
        java,
        "            }}\n            System.out.println(\"round \" + round);\n        }}\n    }}\n}}"
    );
    java
}

fn main() {
    let home = std::env::var_os("HOTSPOT_MEMORY_JDK").map_or_else(
        || PathBuf::from("/usr/lib/jvm/java-17-openjdk-amd64"),
        PathBuf::from,
    );
    let wanted: usize = std::env::var("HOTSPOT_MEMORY_METHODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let (java, javac) = (home.join("bin/java"), home.join("bin/javac"));
    if !java.exists() || !javac.exists() {
        println!(
            "hotspot_memory: skipped, no JDK at {} (set HOTSPOT_MEMORY_JDK)",
            home.display()
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ManyMethods.java");
    std::fs::write(&file, source(CLASSES, wanted.div_ceil(CLASSES))).expect("write the source");
    let status = Command::new(&javac)
        .arg("-d")
        .arg(dir.path())
        .arg(&file)
        .status()
        .expect("run javac");
    assert!(status.success(), "javac failed");
    let target = Target(
        Command::new(&java)
            .arg("-cp")
            .arg(dir.path())
            .arg("ManyMethods")
            .stdout(Stdio::null())
            .spawn()
            .expect("start java"),
    );
    let pid = target.0.id();

    let (memory, layout) = jvm(pid);
    // Until the JIT compiled the generated methods.
    let started = Instant::now();
    let generated = |cache: &CodeCache<'_>| {
        let names = icecore_receiver::runtimes::hotspot::names::Methods::new(&memory, layout);
        cache
            .blobs()
            .into_iter()
            .filter(|b| b.is_java_nmethod())
            .filter_map(|b| cache.nmethod(&b).map(|n| (b, n)))
            .filter(|(_, n)| {
                names
                    .method(n.method)
                    .is_some_and(|m| m.class.starts_with('M') && m.name.starts_with('m'))
            })
            .count()
    };
    loop {
        let cache = CodeCache::read(&memory, layout).expect("the code cache");
        let compiled = generated(&cache);
        if compiled >= wanted * 95 / 100 || started.elapsed() > Duration::from_secs(120) {
            println!(
                "hotspot_memory: {compiled} of the {wanted} generated methods compiled after {:.1} s",
                started.elapsed().as_secs_f64()
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }

    let cache = CodeCache::read(&memory, layout).expect("the code cache");
    let words: Vec<[u64; 2]> = cache
        .blobs()
        .into_iter()
        .filter(|b| b.is_java_nmethod())
        .map(|b| {
            [
                HOTSPOT.tags.word(word::COMPILED, b.address),
                HOTSPOT.tags.word(word::PC, b.code_begin + 1),
            ]
        })
        .collect();
    let mappings = ProcessMappings::read(pid).expect("the JVM's mappings");
    let before = LIVE.load(Ordering::Relaxed);
    let mut plugin = HotSpotPlugin::new(Box::new(MemoryProcessMap::default()));
    assert!(
        plugin.attach(pid, &mappings).is_some(),
        "the plugin attaches to the JVM"
    );
    let attached = LIVE.load(Ordering::Relaxed);
    let mut named = 0usize;
    let cold = Instant::now();
    for w in &words {
        plugin.observe(pid, w);
        named += plugin.frames(pid, w).iter().flatten().count();
    }
    let cold = cold.elapsed();
    let after = LIVE.load(Ordering::Relaxed);
    let warm = Instant::now();
    for w in &words {
        std::hint::black_box(plugin.frames(pid, w));
    }
    let warm = warm.elapsed();
    let n = words.len().max(1);
    let kib = |bytes: i64| bytes as f64 / 1024.0;
    println!(
        "hotspot_memory: JDK {}, {} compiled Java methods named ({named} frames)",
        layout.major,
        words.len()
    );
    println!(
        "hotspot_memory: attach {:.1} KiB; caches after naming them all {:.1} KiB \
         ({:.0} bytes per compiled method)",
        kib(attached - before),
        kib(after - attached),
        (after - attached) as f64 / n as f64
    );
    println!(
        "hotspot_memory: naming {:.1} us per compiled method cold, {:.2} us cached",
        cold.as_secs_f64() * 1e6 / n as f64,
        warm.as_secs_f64() * 1e6 / n as f64
    );
    drop(plugin);
    drop(target);
}

/// The JVM's memory and layout, once its tables can be read.
fn jvm(pid: u32) -> (ProcessMemory, HotSpotLayout) {
    let started = Instant::now();
    loop {
        let found = ProcessMappings::read(pid).ok().and_then(|mappings| {
            let (binary, bias) = mappings
                .executable()
                .filter(|m| is_jvm_name(&m.path))
                .find_map(|m| {
                    let binary = inspect(Path::new(&*m.path)).ok()?;
                    let bias = icecore_receiver::runtimes::services::RuntimeFile::load_bias(
                        &binary,
                        m.start,
                        m.file_offset,
                    )?;
                    Some((binary, bias))
                })?;
            let memory = ProcessMemory::open(pid).ok()?;
            let vm = binary.vm_structs(&memory, bias).ok()?;
            let major = major_version(&vm, &memory).ok()?;
            let layout = HotSpotLayout::new(&vm, major).ok()?;
            CodeCache::read(&memory, layout)?;
            Some((memory, layout))
        });
        if let Some(found) = found {
            return found;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the JVM's tables are not readable after 30 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
