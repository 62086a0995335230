//! The BPF walk (`icecore_unwinders::ruby`), run on the host against live
//! CRuby processes: Debian's 3.1 and, in the sid chroot, 3.3 and 3.4. The process is
//! stopped with ptrace (which also gives the thread's FS base, as BPF reads
//! it from the task), walked through `/proc/PID/mem`, and each Ruby frame
//! named from the iseq: labels, file and lines must be the script's.

use std::path::{Path, PathBuf};

use icecore_unwinders::ruby::{
    ControlFrames, MAX_RUBY_FRAMES, PTHREAD_IN_THREAD, RubyProcess, RubyStep, TAGS, ec_kind, more,
};

use icecore_otlp::model::FrameKind;
use icecore_unwinders::Dispatch;

use super::{
    RubyPlugin,
    detect::{RubyBinary, inspect, is_ruby_name},
};
use crate::{
    process_maps::ProcessMappings,
    runtimes::{
        RuntimePlugin,
        host_walk::{
            HostMemory, Interpreter as Ruby, Stopped, host_and_sid, mapped_runtime,
            spawn_and_read_line,
        },
        memory::ProcessMemory,
        services::MemoryProcessMap,
    },
};

/// Spins in a block of `Shop#leaf` (under the C function `Array#cycle`:
/// 3.3 made `Kernel#loop` Ruby code), below a singleton method and two
/// top-level methods, after saying so, while a second Ruby thread sleeps
/// (without the GVL). Lines are the script's.
const SCRIPT: &str = "s = Thread.new { Thread.current.name = 'sleeper'; sleep }; Thread.pass until s.status == 'sleep'
class Shop
  def self.open; new.leaf; end
  def leaf
    $stdout.puts 'ready'; $stdout.flush
    [1].cycle do
      i = 0
      while i < 100_000
        i += 1
      end
    end
  end
end
def mid; Shop.open; end
def top; mid; end
top
";

/// The frames expected, newest first: name, and the lines it may be at (none
/// for a C function). The block may be caught at its `end` (line 11), where
/// it returns to `Array#cycle` once every 100,000 iterations.
const EXPECTED: [(&str, &[u32]); 7] = [
    ("block in Shop#leaf", &[7, 8, 9, 10, 11]),
    ("Array#cycle", &[]),
    ("Shop#leaf", &[6]),
    ("Shop.open", &[3]),
    ("Object#mid", &[14]),
    ("Object#top", &[15]),
    ("<main>", &[16]),
];

/// Debian's ruby3.1, sid's ruby3.3 and experimental's ruby3.4
/// (`scripts/cpython-chroots.sh`).
fn interpreters() -> Vec<Ruby> {
    let in_sid: Vec<String> = [3, 4]
        .iter()
        .map(|m| format!("usr/bin/ruby3.{m}"))
        .collect();
    host_and_sid(
        "/usr/bin/ruby3.1",
        &in_sid,
        "apt-get install ruby3.1; scripts/cpython-chroots.sh",
    )
}

/// The `pthread_t` of the thread whose execution context is `ec`.
fn pthread_of(process: &RubyProcess, ec: Option<u64>, memory: &HostMemory) -> Option<u64> {
    let read = |address: u64| memory.0.read_u64(address).ok();
    let thread = read(ec? + u64::from(process.ec_thread))?;
    let pthread = read(thread + u64::from(process.thread_pthread))?;
    if process.native_thread_pthread == PTHREAD_IN_THREAD {
        Some(pthread)
    } else {
        read(pthread + u64::from(process.native_thread_pthread))
    }
}

/// The thread of `pid` whose name is `name`.
fn thread_named(pid: u32, name: &str) -> u32 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .find(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .and_then(|task| task.file_name().to_str()?.parse().ok())
        .unwrap_or_else(|| panic!("no thread {name} in {pid}"))
}

/// The words the BPF program writes for the walk of `fs_base`'s thread.
fn walk(process: &RubyProcess, fs_base: u64, memory: &mut HostMemory) -> Vec<u64> {
    let ec = process
        .execution_context(fs_base, memory)
        .expect("the main thread's execution context");
    let mut frames: ControlFrames = process.control_frames(ec, memory).expect("its frames");
    let mut words = Vec::new();
    for _ in 0..MAX_RUBY_FRAMES {
        if !more(&frames) {
            break;
        }
        match process.step(&mut frames, memory) {
            RubyStep::Iseq {
                iseq_word,
                pc_word,
                method_word,
            } => {
                words.extend([iseq_word, pc_word]);
                if method_word != 0 {
                    words.push(method_word);
                }
            }
            RubyStep::Cfunc(entry) => words.push(entry),
            RubyStep::Skipped => {}
            RubyStep::ReadFailed => panic!("a frame could not be read"),
        }
    }
    assert!(words.iter().all(|&w| TAGS.local_tag(w).is_some()));
    words
}

#[test]
fn the_bpf_walk_and_the_plugin_name_every_frame_of_live_processes() {
    let mut checked_running_ec = Vec::new();
    for ruby in interpreters() {
        let (child, line) = spawn_and_read_line(ruby.command().args(["-e", SCRIPT]));
        assert_eq!(line, "ready");
        let pid = child.pid();
        let (binary, bias): (RubyBinary, u64) = mapped_runtime(pid, is_ruby_name, inspect);
        let memory = ProcessMemory::open(pid).unwrap();
        let process = binary
            .bpf_process(bias, |a| memory.read_u64(a).ok())
            .expect("a way to the execution context");
        assert_eq!(
            process.ec_kind,
            ec_kind::TLS_DTV,
            "{ruby:?}: TLS slot found"
        );
        let stopped = Stopped::now(pid);
        let fs_base = stopped.registers.fs_base;
        let mut reader = HostMemory(ProcessMemory::open(pid).unwrap());
        let words = walk(&process, fs_base, &mut reader);
        // The sleeping thread has its own context through TLS.
        let by_tls = process.execution_context(fs_base, &mut reader);
        let sleeper = Stopped::now(thread_named(pid, "sleeper"));
        let sleeper_fs_base = sleeper.registers.fs_base;
        let sleeper_ec = process.execution_context(sleeper_fs_base, &mut reader);
        assert!(by_tls.is_some(), "{ruby:?}");
        assert!(sleeper_ec.is_some() && sleeper_ec != by_tls, "{ruby:?}");
        // Each context leads to its thread's pthread_t, its FS base, by the
        // offsets the fallback below uses (every version, exported or not).
        for (ec, thread_fs_base) in [(by_tls, fs_base), (sleeper_ec, sleeper_fs_base)] {
            assert_eq!(
                pthread_of(&process, ec, &reader),
                Some(thread_fs_base),
                "{ruby:?}"
            );
        }
        // Where libruby exports the main ractor (3.1; 3.3 and 3.4 do not),
        // the fallback through it finds the GVL holder's, this thread's,
        // context, and none for the sleeping thread, which does not hold it.
        if let Some(main_ractor) = binary.main_ractor_pointer {
            let running = RubyProcess {
                ec_kind: ec_kind::RUNNING_EC,
                main_ractor_pointer: bias + main_ractor,
                ..process
            };
            assert_eq!(
                running.execution_context(fs_base, &mut reader),
                by_tls,
                "{ruby:?}"
            );
            assert_eq!(
                running.execution_context(sleeper_fs_base, &mut reader),
                None,
                "{ruby:?}"
            );
            checked_running_ec.push(binary.version.clone());
        }
        drop(sleeper);

        // The plugin describes the process as BPF will see it, and names
        // the frames while the process is stopped.
        let map = MemoryProcessMap::default();
        let mut plugin = RubyPlugin::new(Box::new(map.clone()));
        let mappings = ProcessMappings::read(pid).unwrap();
        let claimed = plugin.attach(pid, &mappings).expect("the plugin claims it");
        assert_eq!(map.get(pid), Some(process), "{ruby:?}");
        assert!(
            claimed
                .code
                .iter()
                .all(|c| c.dispatch == Dispatch::Deferred),
            "{claimed:?}"
        );
        let groups = plugin.frames(pid, &words);
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
        println!("{ruby:?} ({}): {frames:?}", binary.version);
        assert_eq!(
            frames.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
            EXPECTED.iter().map(|e| e.0).collect::<Vec<_>>(),
            "{ruby:?}: {frames:?}"
        );
        for ((name, file, line), (_, lines)) in frames.iter().zip(EXPECTED) {
            if lines.is_empty() {
                assert_eq!((file.as_deref(), *line), (None, 0), "{ruby:?}: {name}");
            } else {
                assert!(lines.contains(line), "{ruby:?}: {name} at line {line}");
                assert_eq!(file.as_deref(), Some("-e"), "{ruby:?}: {name}");
            }
        }
        assert!(groups.iter().flatten().all(|f| f.kind == FrameKind::Ruby));
        // One VM invocation for `Array#cycle`'s block, one for the script.
        assert_eq!(
            groups.iter().map(Vec::len).collect::<Vec<_>>(),
            [1, 6],
            "{ruby:?}"
        );
        plugin.detach(pid);
        assert_eq!(map.get(pid), None);
    }
    // Debian's 3.1 exports it: the fallback is checked on a live process.
    assert!(
        !checked_running_ec.is_empty(),
        "no Ruby exports its main ractor"
    );
    println!("the main ractor's GVL holder checked on {checked_running_ec:?}");
}

/// Every libruby of the interpreters tested reads as a supported version,
/// with its `ruby_current_ec` TLS pair found in `rb_thread_current`.
#[test]
fn every_interpreter_found_is_a_supported_version() {
    for ruby in interpreters() {
        let root = ruby.root.clone().unwrap_or_else(|| PathBuf::from("/"));
        let lib_dir = root.join("usr/lib/x86_64-linux-gnu");
        let libs: Vec<PathBuf> = std::fs::read_dir(&lib_dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libruby-") && n.matches('.').count() >= 4)
            })
            .collect();
        assert!(
            !libs.is_empty(),
            "{ruby:?}: no libruby in {}",
            lib_dir.display()
        );
        for lib in libs {
            let binary = inspect(Path::new(&lib)).unwrap_or_else(|e| panic!("{e}"));
            assert!(binary.tls_got_pair.is_some(), "{}", lib.display());
            assert!(binary.global_symbols.is_some(), "{}", lib.display());
            // Where the file still exports it (3.1), `vm_exec` is `rb_vm_exec`.
            let exported = exported_function(&lib, "rb_vm_exec");
            if let Some(exported) = exported {
                assert_eq!(binary.vm_exec, [exported], "{}", lib.display());
            }
            assert!(
                (1..=2).contains(&binary.vm_exec.len()),
                "{}: {:x?}",
                lib.display(),
                binary.vm_exec
            );
            println!(
                "{}: {} {:?}, vm_exec {:x?}",
                lib.display(),
                binary.version,
                binary.layout.version,
                binary.vm_exec
            );
        }
    }
}

/// The address range of the exported function `name` of `path`.
fn exported_function(path: &Path, name: &str) -> Option<std::ops::Range<u64>> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(path).ok()?;
    let elf = object::File::parse(&*data).ok()?;
    elf.dynamic_symbols()
        .find(|s| s.name() == Ok(name) && !s.is_undefined())
        .map(|s| s.address()..s.address() + s.size())
}
