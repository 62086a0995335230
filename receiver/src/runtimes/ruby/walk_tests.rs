//! The BPF walk (`icecore_unwinders::ruby`), run on the host against live
//! CRuby processes: Debian's 3.1 and, in the sid chroot, 3.3 and 3.4. The process is
//! stopped with ptrace (which also gives the thread's FS base, as BPF reads
//! it from the task), walked through `/proc/PID/mem`, and each Ruby frame
//! named from the iseq: labels, file and lines must be the script's.

use std::path::{Path, PathBuf};

use icecore_unwinders::{
    ruby::{ControlFrames, MAX_RUBY_FRAMES, RubyProcess, RubyStep, TAGS, ec_kind, more, word},
    runtime::PAYLOAD_MASK,
};

use super::{
    detect::{RubyBinary, inspect, is_ruby_name},
    objects::{IseqLocation, Objects},
};
use crate::{
    process_maps::ProcessMappings,
    runtimes::{
        host_walk::{HostMemory, Interpreter as Ruby, spawn_and_read_line},
        memory::ProcessMemory,
        services::mapped_file_paths,
    },
};

/// Spins in a block of `leaf` (under the C function `Array#cycle`: 3.3 made
/// `Kernel#loop` Ruby code), three Ruby calls below the script, after saying
/// so. Lines are the script's.
const SCRIPT: &str = "def leaf
  $stdout.puts 'ready'; $stdout.flush
  [1].cycle do
    i = 0
    while i < 100_000
      i += 1
    end
  end
end
def mid; leaf; end
def top; mid; end
top
";

/// The Ruby frames expected, newest first: label and the lines it may be at.
const EXPECTED: [(&str, &[u32]); 5] = [
    ("block in leaf", &[4, 5, 6, 7]),
    ("leaf", &[3]),
    ("mid", &[10]),
    ("top", &[11]),
    ("<main>", &[12]),
];

/// Debian's ruby3.1, sid's ruby3.3 and experimental's ruby3.4
/// (`scripts/cpython-chroots.sh`).
fn interpreters() -> Vec<Ruby> {
    let mut found = Vec::new();
    let host = PathBuf::from("/usr/bin/ruby3.1");
    if host.exists() {
        found.push(Ruby {
            program: host,
            root: None,
        });
    } else {
        crate::test_support::missing_prerequisite("Debian ruby3.1 (apt-get install ruby3.1)");
    }
    let sid = crate::test_support::sid_root();
    for minor in [3, 4] {
        let program = format!("usr/bin/ruby3.{minor}");
        if sid.join(&program).exists() {
            found.push(Ruby {
                program: Path::new("/").join(program),
                root: Some(sid.clone()),
            });
        } else {
            crate::test_support::missing_prerequisite(&format!(
                "Debian ruby3.{minor} in {} (scripts/cpython-chroots.sh)",
                sid.display()
            ));
        }
    }
    found
}

/// Stops `pid` (a tracee of this thread until dropped) and reads its FS base.
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> (Stopped, u64) {
        let tid = pid as libc::pid_t;
        // SAFETY: ptrace and waitpid on a child of this process, with a
        // zeroed register struct the kernel fills.
        unsafe {
            assert_eq!(libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0), 0, "seize");
            assert_eq!(
                libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0),
                0,
                "interrupt"
            );
            let mut status = 0;
            assert_eq!(libc::waitpid(tid, &mut status, libc::__WALL), tid, "wait");
            let mut regs: libc::user_regs_struct = std::mem::zeroed();
            assert_eq!(
                libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &mut regs as *mut _),
                0,
                "registers"
            );
            (Stopped(pid), regs.fs_base)
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: detaching the tracee seized above.
        unsafe {
            libc::ptrace(libc::PTRACE_DETACH, self.0 as libc::pid_t, 0, 0);
        }
    }
}

/// The CRuby file the process maps, and its load bias.
fn ruby_binary(pid: u32) -> (RubyBinary, u64) {
    let mappings = ProcessMappings::read(pid).unwrap();
    mappings
        .executable()
        .filter(|m| is_ruby_name(&m.path))
        .find_map(|m| {
            let binary = mapped_file_paths(pid, m)
                .iter()
                .find_map(|path| inspect(path).ok())?;
            let bias = binary.load_bias(m.start, m.file_offset)?;
            Some((binary, bias))
        })
        .unwrap_or_else(|| panic!("no CRuby among {pid}'s mappings"))
}

/// What the walk gave: per step, the frame's location or `None` for a C
/// function's frame.
fn walk(
    process: &RubyProcess,
    fs_base: u64,
    memory: &mut HostMemory,
    objects: &Objects<'_>,
) -> Vec<Option<IseqLocation>> {
    let ec = process
        .execution_context(fs_base, memory)
        .expect("the main thread's execution context");
    let mut frames: ControlFrames = process.control_frames(ec, memory).expect("its frames");
    let mut out = Vec::new();
    for _ in 0..MAX_RUBY_FRAMES {
        if !more(&frames) {
            break;
        }
        match process.step(&mut frames, memory) {
            RubyStep::Iseq { iseq_word, pc_word } => {
                assert!(TAGS.local_tag(iseq_word).is_some());
                let location = objects
                    .location(iseq_word & PAYLOAD_MASK, pc_word & PAYLOAD_MASK)
                    .expect("a readable iseq");
                out.push(Some(location));
            }
            RubyStep::Cfunc(entry) => {
                assert_eq!(TAGS.local_tag(entry), Some(word::CFUNC));
                out.push(None);
            }
            RubyStep::Skipped => {}
            RubyStep::ReadFailed => panic!("a frame could not be read"),
        }
    }
    out
}

#[test]
fn the_bpf_walk_names_every_ruby_frame_of_live_processes() {
    for ruby in interpreters() {
        let (child, line) = spawn_and_read_line(ruby.command().args(["-e", SCRIPT]));
        assert_eq!(line, "ready");
        let pid = child.pid();
        let (binary, bias) = ruby_binary(pid);
        let memory = ProcessMemory::open(pid).unwrap();
        let process = binary
            .bpf_process(bias, |a| memory.read_u64(a).ok())
            .expect("a way to the execution context");
        assert_eq!(
            process.ec_kind,
            ec_kind::TLS_DTV,
            "{ruby:?}: TLS slot found"
        );
        let objects = Objects::new(&memory, binary.layout);
        let (stopped, fs_base) = Stopped::new(pid);
        let mut reader = HostMemory(ProcessMemory::open(pid).unwrap());
        let walked = walk(&process, fs_base, &mut reader, &objects);
        // The GVL holder is this thread: the fallback finds the same context.
        let running = RubyProcess {
            ec_kind: ec_kind::RUNNING_EC,
            main_ractor_pointer: binary.main_ractor_pointer.map_or(0, |p| bias + p),
            ..process
        };
        let by_ractor = running.execution_context(0, &mut reader);
        let by_tls = process.execution_context(fs_base, &mut reader);
        drop(stopped);

        println!("{ruby:?} ({}): {walked:?}", binary.version);
        let ruby_frames: Vec<(&str, u32)> = walked
            .iter()
            .flatten()
            .map(|l| (l.label.as_str(), l.line))
            .collect();
        assert_eq!(
            ruby_frames.iter().map(|f| f.0).collect::<Vec<_>>(),
            EXPECTED.iter().map(|e| e.0).collect::<Vec<_>>(),
            "{ruby:?}: {walked:?}"
        );
        for ((label, line), (_, lines)) in ruby_frames.iter().zip(EXPECTED) {
            assert!(lines.contains(line), "{ruby:?}: {label} at line {line}");
        }
        assert!(walked.iter().flatten().all(|l| l.path == "-e"));
        // `Array#cycle`, a C function, between the block and `leaf`.
        assert_eq!(
            walked.iter().position(Option::is_none),
            Some(1),
            "{walked:?}"
        );
        if binary.main_ractor_pointer.is_some() {
            assert_eq!(by_ractor, by_tls, "{ruby:?}");
        }
    }
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
            println!(
                "{}: {} {:?}",
                lib.display(),
                binary.version,
                binary.layout.version
            );
        }
    }
}
