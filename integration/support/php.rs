// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The PHP builds of the machine (Debian's 8.2 on the host, sid's 8.4 and
//! experimental's 8.5 in the sid chroot, installed by `scripts/php.sh`),
//! the PHP fixture, php-excimer's collapsed stacks, php-fpm and a minimal
//! FastCGI client to keep its workers busy.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::package_dir;

/// Opcache's tracing JIT, on for the CLI.
pub const JIT_FLAGS: [&str; 6] = [
    "-d",
    "opcache.enable_cli=1",
    "-d",
    "opcache.jit=tracing",
    "-d",
    "opcache.jit_buffer_size=64M",
];

/// A PHP build to run the fixture under.
#[derive(Debug, Clone)]
pub struct Php {
    /// `8.2 (Debian)`, `8.5 JIT (Debian experimental, chroot)`.
    pub label: String,
    /// Minor version (2, 4, 5).
    pub minor: u8,
    /// With opcache's tracing JIT.
    pub jit: bool,
    /// The chroot it runs in, if any: its files are seen by icecore through
    /// `/proc/PID/root`, like a container's.
    pub root: Option<PathBuf>,
    /// Whether php-excimer is installed for it.
    pub excimer: bool,
    /// The CLI, as the process sees it, when not Debian's `/usr/bin/php8.N`.
    pub program: Option<PathBuf>,
}

impl Php {
    /// The CLI, as the process sees it.
    pub fn cli(&self) -> PathBuf {
        self.program
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("/usr/bin/php8.{}", self.minor)))
    }

    /// `path` (as the process sees it) from the host.
    pub fn host_path(&self, path: &Path) -> PathBuf {
        match &self.root {
            Some(root) => root.join(path.strip_prefix("/").unwrap_or(path)),
            None => path.to_owned(),
        }
    }

    /// A command running `program` (as the process sees it) in its root.
    fn command(&self, program: &Path) -> Command {
        match &self.root {
            Some(root) => {
                let mut command = Command::new("chroot");
                command.arg(root).arg(program);
                command
            }
            None => Command::new(program),
        }
    }
}

/// Every PHP build, JIT off and on: Debian's 8.2, sid's 8.4 and
/// experimental's 8.5 (in the sid chroot), those present (`scripts/php.sh`
/// installs them), then a thread-safe 8.2 (`scripts/php-zts.sh`). A missing one is a skip, or a failure under
/// `ICECORE_REQUIRE_ALL=1`.
pub fn interpreters() -> Vec<Php> {
    let status = Command::new(package_dir().join("scripts/php.sh"))
        .stdout(Stdio::null())
        .status();
    let ready = status.is_ok_and(|s| s.success());
    super::prerequisite("PHP tests", ready, "scripts/php.sh could not install PHP");
    let sid = super::python::sid_root();
    let mut found = Vec::new();
    for (minor, suite, root) in [
        (2, "Debian", None),
        (4, "Debian sid, chroot", sid.clone()),
        (5, "Debian experimental, chroot", sid.clone()),
    ] {
        for jit in [false, true] {
            let php = Php {
                label: format!("8.{minor}{} ({suite})", if jit { " JIT" } else { "" }),
                minor,
                jit,
                root: root.clone(),
                excimer: false,
                program: None,
            };
            if !super::prerequisite(
                "PHP tests",
                php.host_path(&php.cli()).exists(),
                &format!("PHP 8.{minor} ({suite}; scripts/php.sh)"),
            ) {
                continue;
            }
            // php-excimer crashes 8.2's tracing JIT now and then (SIGSEGV
            // or SIGABRT in 2 of 24 runs of 20 s, with no profiler beside
            // it; 8.2 without JIT, 8.4 and 8.5 with it ran 16 each clean):
            // that row is checked against the built-in split alone.
            let excimer = !(minor == 2 && jit)
                && php
                    .command(&php.cli())
                    .args(["-r", "echo extension_loaded('excimer') ? 'yes' : 'no';"])
                    .output()
                    .is_ok_and(|o| o.stdout == b"yes");
            found.push(Php { excimer, ..php });
        }
    }
    // A thread-safe build (Debian builds none), without opcache.
    let zts_ready = Command::new(package_dir().join("scripts/php-zts.sh"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let zts = std::env::var_os("ICECORE_PHP_ZTS")
        .map_or_else(
            || PathBuf::from("/var/cache/icecore/php-zts"),
            PathBuf::from,
        )
        .join("bin/php");
    if super::prerequisite(
        "PHP tests",
        zts_ready && zts.exists(),
        "a thread-safe PHP (scripts/php-zts.sh)",
    ) {
        found.push(Php {
            label: "8.2 ZTS (Debian's source)".into(),
            minor: 2,
            jit: false,
            root: None,
            excimer: false,
            program: Some(zts),
        });
    }
    found
}

/// The fixture script.
pub fn fixture_script() -> PathBuf {
    package_dir().join("integration/fixtures/php_split.php")
}

/// Where the fixture is, as `php`'s processes see it (copied into the
/// chroot's `/tmp` for a chroot).
pub fn fixture_in(php: &Php) -> PathBuf {
    match &php.root {
        Some(_) => {
            let inside = PathBuf::from("/tmp/icecore_php_split.php");
            super::stage_file(&fixture_script(), &php.host_path(&inside));
            inside
        }
        None => fixture_script(),
    }
}

/// Starts the fixture in `mode` for `seconds`; `extra` follows (the
/// excimer output path, as the process sees it).
pub fn spawn_fixture(php: &Php, mode: &str, seconds: u32, extra: &[&str]) -> Child {
    let mut command = php.command(&php.cli());
    if php.jit {
        command.args(JIT_FLAGS);
    }
    command
        .arg(fixture_in(php))
        .args([mode, &seconds.to_string()])
        .args(extra)
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {} {mode}: {e}", php.label))
}

/// php-excimer's collapsed stacks (`a;b;leaf 12`, root first) as
/// (frames root first, count).
pub fn read_collapsed(path: &Path) -> Vec<(Vec<String>, u64)> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read excimer's output {}: {e}", path.display()));
    text.lines()
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            let frames = stack
                .split(';')
                .filter(|f| !f.is_empty())
                .map(str::to_owned)
                .collect();
            Some((frames, count.parse().ok()?))
        })
        .collect()
}

/// A php-fpm master with a static pool of `workers` serving the fixture
/// on a Unix socket; killed when dropped.
pub struct Fpm {
    master: Child,
    /// The socket, from the host.
    pub socket: PathBuf,
    /// The fixture, as the workers see it.
    pub script: PathBuf,
    dir: PathBuf,
}

impl Fpm {
    /// Starts `php`'s php-fpm with `workers` static workers, configured in
    /// `dir` (as the host sees it; inside the chroot's `/tmp` for a chroot).
    pub fn start(php: &Php, workers: u32) -> Fpm {
        let inside = PathBuf::from(format!("/tmp/icecore-fpm-8{}", php.minor));
        let dir = php.host_path(&inside);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = format!(
            "[global]\nerror_log = {log}\ndaemonize = no\n\n[icecore]\nlisten = {socket}\n\
             pm = static\npm.max_children = {workers}\nclear_env = no\n",
            log = inside.join("fpm.log").display(),
            socket = inside.join("fpm.sock").display(),
        );
        std::fs::write(dir.join("fpm.conf"), config).unwrap();
        let fpm = PathBuf::from(format!("/usr/sbin/php-fpm8.{}", php.minor));
        let master = php
            .command(&fpm)
            .args(["-R", "-F", "-y"])
            .arg(inside.join("fpm.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", fpm.display()));
        let socket = dir.join("fpm.sock");
        let started = Instant::now();
        while !socket.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "php-fpm 8.{} made no socket",
                php.minor
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Fpm {
            master,
            socket,
            script: fixture_in(php),
            dir,
        }
    }

    /// The master's pid.
    pub fn master_pid(&self) -> u32 {
        self.master.id()
    }

    /// The pids of the master's children (the workers).
    pub fn workers(&self) -> Vec<u32> {
        let master = self.master_pid();
        let mut pids: Vec<u32> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| {
                        let rest = s.rsplit_once(')')?.1;
                        rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                    })
                    == Some(master)
            })
            .collect();
        pids.sort_unstable();
        pids
    }

    /// Sends requests of `ms` milliseconds of work from `clients` threads
    /// for `duration`; returns how many were answered.
    pub fn drive(&self, clients: u32, ms: u32, duration: Duration) -> u64 {
        let end = Instant::now() + duration;
        let threads: Vec<_> = (0..clients)
            .map(|_| {
                let socket = self.socket.clone();
                let script = self.script.display().to_string();
                std::thread::spawn(move || {
                    let mut answered = 0;
                    while Instant::now() < end {
                        if fastcgi_get(&socket, &script, &format!("ms={ms}")).is_some() {
                            answered += 1;
                        }
                    }
                    answered
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap_or(0)).sum()
    }
}

impl Drop for Fpm {
    /// Stops the whole pool: SIGKILL would take the master only and leave
    /// its workers waiting on the socket, so the master is asked to quit
    /// (SIGTERM: it stops its workers), and whatever remains is killed.
    fn drop(&mut self) {
        let workers = self.workers();
        // SAFETY: kill(2) on the master's pid, a child of this process.
        unsafe {
            libc::kill(self.master.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(self.master.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.master.kill();
        let _ = self.master.wait();
        for pid in workers {
            // SAFETY: kill(2) on a worker of this pool (already gone, at most
            // an ESRCH).
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One FastCGI record.
fn record(kind: u8, content: &[u8]) -> Vec<u8> {
    let len = u16::try_from(content.len()).expect("short content");
    let mut out = vec![1, kind, 0, 1];
    out.extend(len.to_be_bytes());
    out.extend([0, 0]);
    out.extend(content);
    out
}

/// A FastCGI name-value pair (both shorter than 128 bytes).
fn pair(name: &str, value: &str) -> Vec<u8> {
    let mut out = vec![name.len() as u8, value.len() as u8];
    out.extend(name.as_bytes());
    out.extend(value.as_bytes());
    out
}

/// A GET of `script` with `query` through the FastCGI socket; the body of
/// the answer (headers included), or `None` when the exchange failed.
pub fn fastcgi_get(socket: &Path, script: &str, query: &str) -> Option<Vec<u8>> {
    const BEGIN_REQUEST: u8 = 1;
    const END_REQUEST: u8 = 3;
    const PARAMS: u8 = 4;
    const STDIN: u8 = 5;
    const STDOUT: u8 = 6;
    let mut stream = UnixStream::connect(socket).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    let mut params = Vec::new();
    for (name, value) in [
        ("SCRIPT_FILENAME", script),
        ("SCRIPT_NAME", script),
        ("REQUEST_METHOD", "GET"),
        ("QUERY_STRING", query),
        ("SERVER_PROTOCOL", "HTTP/1.1"),
        ("GATEWAY_INTERFACE", "CGI/1.1"),
    ] {
        params.extend(pair(name, value));
    }
    let mut request = record(BEGIN_REQUEST, &[0, 1, 0, 0, 0, 0, 0, 0]);
    request.extend(record(PARAMS, &params));
    request.extend(record(PARAMS, &[]));
    request.extend(record(STDIN, &[]));
    stream.write_all(&request).ok()?;
    let mut body = Vec::new();
    loop {
        let mut header = [0u8; 8];
        stream.read_exact(&mut header).ok()?;
        let len = usize::from(u16::from_be_bytes([header[4], header[5]]));
        let mut content = vec![0; len + usize::from(header[6])];
        stream.read_exact(&mut content).ok()?;
        match header[1] {
            STDOUT => body.extend(&content[..len]),
            END_REQUEST => return Some(body),
            _ => {}
        }
    }
}
