//! What host tests of a runtime's BPF-side walk share: the walk
//! (`no_std`, generic over `MemoryReader`) run on the host against a live
//! process of the runtime, reading its memory through `/proc/PID/mem`.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use icecore_unwinders::MemoryReader;

use super::{memory::ProcessMemory, services::RuntimeFile};

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

/// The host's `program` and the sid chroot's `in_sid` programs (paths in
/// the chroot, without the leading `/`) that exist; each one missing is a
/// missing prerequisite (`hint` says how to get it).
pub fn host_and_sid(program: &str, in_sid: &[String], hint: &str) -> Vec<Interpreter> {
    let mut found = Vec::new();
    if Path::new(program).exists() {
        found.push(Interpreter {
            program: PathBuf::from(program),
            root: None,
        });
    } else {
        crate::test_support::missing_prerequisite(&format!("{program} ({hint})"));
    }
    let sid = crate::test_support::sid_root();
    for program in in_sid {
        if sid.join(program).exists() {
            found.push(Interpreter {
                program: Path::new("/").join(program),
                root: Some(sid.clone()),
            });
        } else {
            crate::test_support::missing_prerequisite(&format!(
                "{program} in {} ({hint})",
                sid.display()
            ));
        }
    }
    found
}

/// The runtime file `pid` maps (among the files `is_runtime_name` picks)
/// that `inspect` reads, with its load bias.
pub fn mapped_runtime<B: RuntimeFile, E>(
    pid: u32,
    is_runtime_name: impl Fn(&str) -> bool,
    inspect: impl Fn(&Path) -> Result<B, E>,
) -> (B, u64) {
    let mappings = crate::process_maps::ProcessMappings::read(pid).unwrap();
    mappings
        .executable()
        .filter(|m| is_runtime_name(&m.path))
        .find_map(|m| {
            let binary = super::services::mapped_file_paths(pid, m)
                .iter()
                .find_map(|path| inspect(path).ok())?;
            let bias = binary.load_bias(m.start, m.file_offset)?;
            Some((binary, bias))
        })
        .unwrap_or_else(|| panic!("no runtime file among {pid}'s mappings"))
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

/// A thread stopped with ptrace (a tracee of the calling thread until
/// dropped, which lets it run on).
pub struct Stopped {
    tid: i32,
    /// Its registers where it stopped (`fs_base` is the FS base BPF reads
    /// from the task).
    pub registers: libc::user_regs_struct,
}

impl Stopped {
    /// Stops thread `tid` at the first of up to 200 tries (3 ms apart) at
    /// which its registers satisfy `wanted`.
    pub fn when(tid: u32, wanted: impl Fn(&libc::user_regs_struct) -> bool) -> Stopped {
        let tid = tid as libc::pid_t;
        let mut seen = Vec::new();
        // SAFETY: plain ptrace calls on a child of this test; `registers`
        // is a valid user_regs_struct for PTRACE_GETREGS to fill.
        unsafe {
            assert_eq!(libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0), 0, "seize");
            for _ in 0..200 {
                assert_eq!(
                    libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0),
                    0,
                    "interrupt"
                );
                let mut status = 0;
                assert_eq!(libc::waitpid(tid, &mut status, libc::__WALL), tid, "wait");
                let mut registers: libc::user_regs_struct = std::mem::zeroed();
                assert_eq!(
                    libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &mut registers as *mut _),
                    0,
                    "registers"
                );
                if wanted(&registers) {
                    return Stopped { tid, registers };
                }
                if seen.len() < 8 {
                    seen.push(registers.rip);
                }
                libc::ptrace(libc::PTRACE_CONT, tid, 0, 0);
                std::thread::sleep(Duration::from_millis(3));
            }
        }
        panic!("thread {tid} never stopped where the test wanted it (PCs {seen:#x?})")
    }

    /// Stops thread `tid` wherever it is.
    pub fn now(tid: u32) -> Stopped {
        Stopped::when(tid, |_| true)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: detaching the tracee seized above.
        unsafe {
            libc::ptrace(libc::PTRACE_DETACH, self.tid, 0, 0);
        }
    }
}

/// The unwind tables of every executable file `pid` maps, placed where it
/// maps them: the native half of a host walk, as BPF's tables would be.
pub fn address_space(pid: u32) -> icecore_unwinders::table::AddressSpace {
    use icecore_unwinders::table::{AddressSpace, Mapping, UnwindTable, elf_load_bias};
    let mappings = crate::process_maps::ProcessMappings::read(pid)
        .unwrap_or_else(|e| panic!("maps of {pid}: {e}"));
    // Per file: its bytes and table, or None when it cannot be read.
    type Table = Option<(Vec<u8>, std::sync::Arc<UnwindTable>)>;
    let mut tables: std::collections::HashMap<String, Table> = std::collections::HashMap::new();
    let mut space = AddressSpace::new();
    for mapping in mappings.executable() {
        let entry = tables.entry(mapping.path.to_string()).or_insert_with(|| {
            let data = super::services::mapped_file_paths(pid, mapping)
                .iter()
                .find_map(|path| std::fs::read(path).ok())?;
            let table = UnwindTable::from_elf(&data).ok()?;
            Some((data, std::sync::Arc::new(table)))
        });
        let Some((data, table)) = entry else {
            continue;
        };
        if let Some(bias) = elf_load_bias(data, mapping.start, mapping.file_offset) {
            space.insert(Mapping {
                start: mapping.start,
                end: mapping.end,
                bias,
                table: table.clone(),
            });
        }
    }
    space
}
