//! Memory icecore keeps for a Node application of 10,000 functions, and
//! what naming a new function costs in user space: the V8 plugin's caches
//! (functions with their names and position tables, scripts with their
//! line ends) after every function was symbolized once, as a profile that
//! saw each of them would, counted by a counting allocator.
//!
//! Generates 100 modules of 100 small functions each and a main that
//! requires them, calls every function (so each has bytecode), prints each
//! one's SharedFunctionInfo address (`%DebugPrint`, so the benchmark needs
//! no BPF) and waits. Attaches the plugin, then names every function
//! through the words BPF would write (its SharedFunctionInfo and a
//! bytecode offset), twice: cold, then from the caches.
//!
//! `cargo bench -p icecore-benches --bench v8_memory`
//!
//! Environment: `V8_MEMORY_NODE` (a Node binary instead of /usr/bin/node),
//! `V8_MEMORY_FUNCTIONS` (default 10000).

#![expect(
    clippy::expect_used,
    reason = "a benchmark harness: failed setup should abort with its message"
)]

use std::{
    alloc::{GlobalAlloc, Layout, System},
    fmt::Write as _,
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicI64, Ordering},
    time::Instant,
};

use icecore_receiver::{
    process_maps::ProcessMappings,
    runtimes::{RuntimePlugin, services::MemoryProcessMap, v8::plugin::V8Plugin},
};
use icecore_unwinders::v8::{V8, word};

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

const MODULES: usize = 100;

/// The child Node, killed when the benchmark ends.
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes `MODULES` modules of `per_module` functions and a main into
/// `dir`; returns the main's path.
fn write_app(dir: &std::path::Path, per_module: usize) -> PathBuf {
    let mut main = String::from("'use strict';\nconst all = [];\n");
    for m in 0..MODULES {
        let mut module = String::from("'use strict';\n");
        for f in 0..per_module {
            let _ = writeln!(
                module,
                "function m{m}_f{f}(x) {{\n  const y = x * {} + {f};\n  return y ^ (y >>> 3);\n}}",
                31 + m
            );
        }
        let names: Vec<String> = (0..per_module).map(|f| format!("m{m}_f{f}")).collect();
        let _ = writeln!(module, "module.exports = [{}];", names.join(", "));
        std::fs::write(dir.join(format!("m{m}.js")), module).expect("write a module");
        let _ = writeln!(main, "all.push(...require('./m{m}.js'));");
    }
    main.push_str(
        "let sink = 0;\nfor (const f of all) sink ^= f(sink);\n\
         for (const f of all) %DebugPrint(f);\n\
         console.log('ready ' + sink);\nsetInterval(() => {}, 1000);\n",
    );
    let path = dir.join("main.js");
    std::fs::write(&path, main).expect("write the main");
    path
}

fn main() {
    let node = std::env::var_os("V8_MEMORY_NODE")
        .map_or_else(|| PathBuf::from("/usr/bin/node"), PathBuf::from);
    let wanted: usize = std::env::var("V8_MEMORY_FUNCTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    if !node.exists() {
        println!(
            "v8_memory: skipped, no Node at {} (set V8_MEMORY_NODE)",
            node.display()
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let main = write_app(dir.path(), wanted.div_ceil(MODULES));
    let mut child = Command::new(&node)
        .arg("--allow-natives-syntax")
        .arg(&main)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start node");
    let stdout = child.stdout.take().expect("node's stdout");
    let target = Target(child);
    let pid = target.0.id();
    // `- shared_info: 0x… <SharedFunctionInfo m3_f7>` per function.
    let mut shared = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("node's output");
        if line.starts_with("ready") {
            break;
        }
        if let Some(rest) = line.trim().strip_prefix("- shared_info: 0x")
            && rest.contains("<SharedFunctionInfo m")
            && let Some(address) = rest.split(' ').next()
            && let Ok(address) = u64::from_str_radix(address, 16)
        {
            shared.push(address);
        }
    }
    let mappings = ProcessMappings::read(pid).expect("node's mappings");
    let before = LIVE.load(Ordering::Relaxed);
    let mut plugin = V8Plugin::new(Box::new(MemoryProcessMap::default()));
    assert!(
        plugin.attach(pid, &mappings).is_some(),
        "the plugin attaches to node"
    );
    let attached = LIVE.load(Ordering::Relaxed);
    let words: Vec<[u64; 2]> = shared
        .iter()
        .map(|&s| {
            [
                V8.tags.word(word::SHARED, s),
                V8.tags.word(word::BYTECODE_OFFSET, 4),
            ]
        })
        .collect();
    let mut lined = 0usize;
    let cold = Instant::now();
    for w in &words {
        plugin.observe(pid, w);
        lined += plugin
            .frames(pid, w)
            .iter()
            .flatten()
            .filter(|f| f.lines.first().is_some_and(|l| l.line > 0))
            .count();
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
        "v8_memory: {} functions in {MODULES} scripts named, {lined} with their line",
        words.len()
    );
    println!(
        "v8_memory: attach {:.1} KiB; caches after naming them all {:.1} KiB \
         ({:.0} bytes per function)",
        kib(attached - before),
        kib(after - attached),
        (after - attached) as f64 / n as f64
    );
    println!(
        "v8_memory: naming {:.1} us per function cold, {:.2} us cached",
        cold.as_secs_f64() * 1e6 / n as f64,
        warm.as_secs_f64() * 1e6 / n as f64
    );
    drop(plugin);
    drop(target);
}
