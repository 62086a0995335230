//! What host tests of a runtime's BPF-side walk share: the walk
//! (`no_std`, generic over `MemoryReader`) run on the host against a live
//! process of the runtime, reading its memory through `/proc/PID/mem`.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use icecore_unwinders::MemoryReader;

use super::memory::ProcessMemory;

/// How long a runtime may take to start and print its first line.
const FIRST_LINE_TIMEOUT: Duration = Duration::from_secs(30);

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
