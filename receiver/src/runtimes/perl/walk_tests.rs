//! The BPF walk (`icecore_unwinders::perl`), run on the host against live
//! Perl processes: Debian 12's 5.36 and, in the sid chroot, trixie's 5.40,
//! sid's 5.42 and experimental's 5.44 (`scripts/perl-versions.sh`). The
//! process is stopped with ptrace (which also gives the thread's FS base,
//! as BPF reads it from the task), walked through `/proc/PID/mem` with the
//! layout `detect` picks, and each frame named from its CV and COP: names,
//! files and lines must be the script's, as Perl's `caller` gives them.

use icecore_unwinders::perl::{MAX_PERL_CONTEXTS, PerlStep, PerlWalkState, TAGS, word};

use super::{
    detect::{PerlBinary, inspect, is_perl_name},
    objects::PerlObjects,
};
use crate::runtimes::{
    host_walk::{
        HostMemory, Interpreter as Perl, Stopped, host_and_sid, mapped_runtime, spawn_and_read_line,
    },
    memory::ProcessMemory,
};

/// Spins in `Shop::leaf` under an anonymous sub, a sub of another package,
/// two subs of `main` and an `eval {}`, after saying so; one statement per
/// line, so each frame's line is certain.
const SCRIPT: &str = "package Shop;
sub enter { my $f = sub { Shop::leaf() }; $f->() }
sub leaf { $| = 1; print \"ready\\n\"; my $i = 0; while (1) { $i++ } }
package main;
sub mid { Shop::enter() }
sub top { eval { mid() }; }
top();
";

/// The frames expected, newest first: name and line (file `-e`).
const EXPECTED: [(&str, u32); 7] = [
    ("Shop::leaf", 3),
    ("Shop::__ANON__", 2),
    ("Shop::enter", 2),
    ("main::mid", 5),
    ("(eval)", 6),
    ("main::top", 6),
    ("main", 7),
];

/// Debian 12's perl and the three of `scripts/perl-versions.sh`.
fn interpreters() -> Vec<Perl> {
    let in_sid: Vec<String> = ["trixie", "sid", "experimental"]
        .iter()
        .map(|suite| format!("opt/perl-{suite}/usr/bin/perl"))
        .collect();
    host_and_sid(
        "/usr/bin/perl",
        &in_sid,
        "apt-get install perl; scripts/perl-versions.sh",
    )
}

/// The words the BPF program writes for the walk of `fs_base`'s thread.
fn walk(
    process: &icecore_unwinders::perl::PerlProcess,
    fs_base: u64,
    memory: &mut HostMemory,
) -> Vec<u64> {
    let interpreter = process
        .interpreter(fs_base, memory)
        .expect("the main thread's interpreter");
    let mut state = PerlWalkState::default();
    state.reset();
    assert!(
        process.start(interpreter, &mut state, memory),
        "its stack info"
    );
    let mut words = Vec::new();
    for _ in 0..MAX_PERL_CONTEXTS {
        match process.step(&mut state, memory) {
            PerlStep::Frame {
                frame_word,
                cop_word,
            } => words.extend([frame_word, cop_word]),
            PerlStep::StackSwitch(w) => words.push(w),
            PerlStep::Skipped => {}
            PerlStep::Done => return words,
            PerlStep::ReadFailed => panic!("a context could not be read"),
        }
    }
    panic!("the walk did not end")
}

#[test]
fn the_bpf_walk_and_the_objects_name_every_frame_of_live_processes() {
    let mut minors = Vec::new();
    for perl in interpreters() {
        let (child, line) = spawn_and_read_line(perl.command().args(["-e", SCRIPT]));
        assert_eq!(line, "ready");
        let pid = child.pid();
        let (binary, bias): (PerlBinary, u64) = mapped_runtime(pid, is_perl_name, inspect);
        let memory = ProcessMemory::open(pid).unwrap();
        let process = binary
            .bpf_process(bias, |a| memory.read_u64(a).ok())
            .expect("a way to the interpreter");
        let stopped = Stopped::now(pid);
        let mut reader = HostMemory(ProcessMemory::open(pid).unwrap());
        let words = walk(&process, stopped.registers.fs_base, &mut reader);
        // The global finds the same interpreter for the main thread.
        if let Some(curinterp) = binary.curinterp {
            assert_eq!(
                memory.read_u64(bias + curinterp).ok(),
                process.interpreter(stopped.registers.fs_base, &mut reader),
                "{perl}"
            );
        }
        let objects = PerlObjects {
            layout: &binary.layout,
            memory: &memory,
        };
        let mut frames = Vec::new();
        for pair in words.chunks(2) {
            let [frame, cop] = pair else {
                panic!("{perl}: a lone word in {words:x?}")
            };
            assert_eq!(TAGS.local_tag(*cop), Some(word::COP), "{perl}: {words:x?}");
            let payload = |w: u64| {
                w & icecore_unwinders::runtime::PAYLOAD_MASK
                    & !icecore_unwinders::perl::CALLERS_STATEMENT
            };
            let name = match TAGS.local_tag(*frame) {
                Some(word::SUB) | Some(word::MULTICALL_SUB) => {
                    let cv = payload(*frame);
                    // Every sub of the script is one line: its first
                    // statement is where it is.
                    let first = objects
                        .first_statement(cv)
                        .unwrap_or_else(|e| panic!("{perl}: {e}"));
                    let at = objects
                        .statement(payload(*cop))
                        .unwrap_or_else(|e| panic!("{perl}: {e}"));
                    assert_eq!((&first.file, first.line), (&at.file, at.line), "{perl}");
                    objects
                        .sub_name(cv)
                        .unwrap_or_else(|e| panic!("{perl}: {e}"))
                        .name
                }
                Some(word::EVAL) => "(eval)".to_owned(),
                Some(word::MAIN) => "main".to_owned(),
                other => panic!("{perl}: unexpected word {frame:x} ({other:?})"),
            };
            let statement = objects
                .statement(payload(*cop))
                .unwrap_or_else(|e| panic!("{perl}: {e}"));
            frames.push((name, statement.file, statement.line));
        }
        drop(stopped);
        println!("{perl} ({}): {frames:?}", binary.version);
        let got: Vec<(&str, u32)> = frames.iter().map(|f| (f.0.as_str(), f.2)).collect();
        assert_eq!(got, EXPECTED, "{perl}");
        assert!(frames.iter().all(|f| f.1 == "-e"), "{perl}: {frames:?}");
        minors.push(binary.layout.version.1);
    }
    if std::env::var("ICECORE_REQUIRE_ALL").is_ok_and(|v| v == "1") {
        minors.sort_unstable();
        assert_eq!(minors, [36, 40, 42, 44], "every supported version walked");
    }
}
