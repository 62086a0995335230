//! What host tests of a runtime's BPF-side walk share: the walk
//! (`no_std`, generic over `MemoryReader`) run on the host against a live
//! process of the runtime, reading its memory through `/proc/PID/mem`.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use icecore_unwinders::MemoryReader;

use super::memory::ProcessMemory;

/// How long a runtime may take to start and print its first line.
const FIRST_LINE_TIMEOUT: Duration = Duration::from_secs(30);

/// A runtime's program to run, on the host or in a chroot (Debian sid's
/// interpreters, whose processes are then profiled like a container's).
#[derive(Debug, Clone)]
pub struct Interpreter {
    /// The program, as the chroot (if any) sees it.
    pub program: PathBuf,
    /// The chroot it runs in.
    pub root: Option<PathBuf>,
}

impl Interpreter {
    /// A command running the program (through `chroot` when it has a root).
    pub fn command(&self) -> Command {
        match &self.root {
            Some(root) => {
                let mut command = Command::new("chroot");
                command.arg(root).arg(&self.program);
                command
            }
            None => Command::new(&self.program),
        }
    }
}

impl std::fmt::Display for Interpreter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.root {
            Some(root) => write!(f, "{} in {}", self.program.display(), root.display()),
            None => write!(f, "{}", self.program.display()),
        }
    }
}

/// A live process's memory, as the BPF walk reads it.
pub struct HostMemory(pub ProcessMemory);

impl HostMemory {
    /// The memory of `pid`.
    pub fn open(pid: u32) -> Self {
        HostMemory(ProcessMemory::open(pid).unwrap_or_else(|e| panic!("{e}")))
    }
}

impl MemoryReader for HostMemory {
    fn read_u64(&mut self, address: u64) -> Option<u64> {
        self.0.read_u64(address).ok()
    }
}

/// A process killed (and reaped) when the test is done with it.
pub struct LiveProcess(pub Child);

impl LiveProcess {
    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for LiveProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `command` with its stdout piped and waits for its first line
/// (typically the workload saying it reached the state to walk, with its
/// thread's identity); a runtime that prints nothing fails the test
/// instead of hanging it.
pub fn spawn_and_read_line(command: &mut Command) -> (LiveProcess, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
    let stdout = child.stdout.take().expect("stdout is piped");
    let process = LiveProcess(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(FIRST_LINE_TIMEOUT)
        .unwrap_or_else(|_| panic!("{command:?} printed nothing in {FIRST_LINE_TIMEOUT:?}"));
    (process, line.trim().to_owned())
}
