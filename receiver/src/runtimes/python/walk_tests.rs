//! The BPF walk (`icecore_unwinders::python`), run on the host against live
//! CPython processes of every version on the machine: the same code BPF
//! runs, reading the process's memory through `/proc/PID/mem`.

use std::path::{Path, PathBuf};

use icecore_unwinders::{
    python::{CPYTHON, PythonStep},
    runtime::PAYLOAD_MASK,
};

use super::{
    bpf_process,
    code::read_code,
    detect::{inspect, version_from_name},
    invocations,
};
use crate::{
    process_maps::ProcessMappings,
    runtimes::{
        host_walk::{HostMemory, Interpreter as Python, LiveProcess, spawn_and_read_line},
        memory::ProcessMemory,
        services::MemoryProcessMap,
    },
};

/// Blocks in `leaf`, three Python calls below the module, after printing
/// its `pthread_self()`.
const SCRIPT: &str = "
import threading, time
def leaf():
    print(threading.get_ident(), flush=True)
    time.sleep(120)
def mid():
    leaf()
def top():
    mid()
top()
";

/// Debian's python3.11, pyenv's 3.8–3.13, and Debian sid's 3.13–3.15 in
/// their chroot (`scripts/cpython-chroots.sh`), those present.
fn interpreters() -> Vec<Python> {
    let host = |program: PathBuf| Python {
        program,
        root: None,
    };
    let mut found = vec![host(PathBuf::from("/usr/bin/python3.11"))];
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")));
    if let Some(Ok(dir)) = root.map(|r| std::fs::read_dir(r.join("versions"))) {
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            for minor in 8..=13 {
                if name.starts_with(&format!("3.{minor}.")) {
                    found.push(host(entry.path().join(format!("bin/python3.{minor}"))));
                }
            }
        }
    }
    found.retain(|p| p.program.exists());
    let sid = crate::test_support::sid_root();
    for minor in 13..=15 {
        let program = PathBuf::from(format!("/usr/bin/python3.{minor}"));
        if sid
            .join(program.strip_prefix("/").unwrap_or(&program))
            .exists()
        {
            found.push(Python {
                program,
                root: Some(sid.clone()),
            });
        } else {
            crate::test_support::missing_prerequisite(&format!(
                "Debian python3.{minor} in {} (scripts/cpython-chroots.sh)",
                sid.display()
            ));
        }
    }
    found
}

/// A live fixture and the walk's words for its main thread.
struct Walked {
    child: LiveProcess,
    words: Vec<u64>,
    names: Vec<String>,
    invocations: usize,
    version: (u8, u8),
}

/// Runs the fixture under `python` and walks its main thread.
fn walk(python: &Python) -> Walked {
    let (child, line) = spawn_and_read_line(python.command().args(["-c", SCRIPT]));
    let pid = child.pid();
    let thread: u64 = line.parse().unwrap();

    let mappings = ProcessMappings::read(pid).unwrap();
    let (binary, bias) = mappings
        .executable()
        .find_map(|m| {
            let version = version_from_name(&m.path)?;
            let binary = inspect(Path::new(&*m.path), version).ok()?;
            let bias = binary.load_bias(m.start, m.file_offset)?;
            Some((binary, bias))
        })
        .unwrap_or_else(|| panic!("{python}: no CPython mapping"));
    let layout = binary.layout;
    let process = bpf_process(&layout, binary.runtime + bias);
    let mut memory = HostMemory::open(pid);
    let tstate = process.thread_state(thread, &mut memory).unwrap();
    let mut frame = process.current_frame(tstate, &mut memory).unwrap();
    let mut words = Vec::new();
    for _ in 0..64 {
        if frame == 0 {
            break;
        }
        match process.step(&mut frame, &mut memory) {
            PythonStep::Frame { code_word, instr } => words.extend([code_word, instr]),
            PythonStep::Boundary(word) => words.push(word),
            PythonStep::ReadFailed => panic!("{python}: read failed"),
        }
    }
    let groups = invocations(&words);
    let reader = ProcessMemory::open(pid).unwrap();
    let names = groups
        .iter()
        .flatten()
        .map(|&(code, _)| {
            let code_type = binary.code_type.map(|t| t + bias);
            read_code(&reader, &layout, code, code_type)
                .unwrap()
                .name
                .to_string()
        })
        .collect();
    assert!(
        words
            .first()
            .is_some_and(|&w| CPYTHON.tags.local_tag(w).is_some()),
        "{python}: the walk's first word is not a tagged frame"
    );
    Walked {
        child,
        words,
        names,
        invocations: groups.len(),
        version: (layout.major, layout.minor),
    }
}

#[test]
fn an_old_code_entry_is_read_again_when_sampled_and_its_frames_renamed() {
    use std::time::{Duration, Instant};

    use super::PythonPlugin;
    use crate::runtimes::RuntimePlugin;

    let python = interpreters().pop().expect("a CPython on this machine");
    let walked = walk(&python);
    let pid = walked.child.pid();
    let mut plugin = PythonPlugin::new(Box::new(MemoryProcessMap::default()));
    let mappings = ProcessMappings::read(pid).unwrap();
    assert!(plugin.attach(pid, &mappings).is_some());
    let leaf = walked.words[0] & PAYLOAD_MASK;
    // As if `leaf`'s address had held another code object a minute ago.
    let mut stale = (*plugin.code_info(pid, leaf, false).unwrap()).clone();
    stale.name = "replaced".into();
    plugin.codes.store_read_at(
        pid,
        leaf,
        Some(std::sync::Arc::new(stale)),
        Instant::now().checked_sub(Duration::from_secs(61)).unwrap(),
    );
    let name = |plugin: &mut PythonPlugin| {
        let frames = plugin.frames(pid, &walked.words);
        frames[0][0].lines[0].function_name.to_string()
    };
    assert_eq!(name(&mut plugin), "replaced", "batch time never re-reads");
    plugin.observe(pid, &walked.words);
    assert_eq!(name(&mut plugin), "leaf", "a sample re-reads an old entry");
}

#[test]
fn the_bpf_walk_finds_each_versions_frames_in_a_live_process() {
    let found = interpreters();
    assert!(!found.is_empty(), "no CPython on this machine");
    for python in found {
        let Walked {
            names,
            invocations,
            version,
            ..
        } = walk(&python);
        println!("{python}: {names:?} in {invocations} invocation(s)");
        // The interpreter may run startup code above the module (site, runpy).
        assert_eq!(names[..4], ["leaf", "mid", "top", "<module>"], "{python}");
        if version >= (3, 11) {
            // Python-to-Python calls run inside one _PyEval_EvalFrameDefault.
            assert_eq!(invocations, 1, "{python}");
        } else {
            assert_eq!(invocations, names.len(), "{python}");
        }
    }
}
