// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The Perl interpreters of the machine (Debian 12's 5.36, and trixie's
//! 5.40, sid's 5.42 and experimental's 5.44 unpacked in the sid chroot by
//! `scripts/perl-versions.sh`), the Perl fixture, and Devel::NYTProf as the
//! reference profiler.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::package_dir;

/// A Perl to run the fixture under.
#[derive(Debug, Clone)]
pub struct Perl {
    /// `5.36 (Debian 12)`, `5.44 (Debian experimental, chroot)`.
    pub label: String,
    /// The interpreter, as a process in `root` sees it.
    pub perl: PathBuf,
    /// Its own modules' directory (`-I`): the chroot's `/usr/lib` holds
    /// sid's, which another version's XS modules must not be mixed with.
    pub inc: Option<PathBuf>,
    /// The chroot it runs in, if any: its files are seen by icecore through
    /// `/proc/PID/root`, like a container's.
    pub root: Option<PathBuf>,
}

/// Debian's `/usr/bin/perl`, then the sid chroot's three, those that exist
/// (installed by `scripts/perl-versions.sh` if need be); a missing one is a
/// skip, or a failure under `ICECORE_REQUIRE_ALL=1`.
pub fn interpreters() -> Vec<Perl> {
    let mut found = Vec::new();
    let debian = PathBuf::from("/usr/bin/perl");
    if super::prerequisite(
        "Perl tests",
        debian.exists(),
        "Debian's perl (apt-get install perl)",
    ) {
        found.push(Perl {
            label: "5.36 (Debian 12)".into(),
            perl: debian,
            inc: None,
            root: None,
        });
    }
    let Some(root) = super::python::sid_root() else {
        return found;
    };
    let installed = Command::new(package_dir().join("scripts/perl-versions.sh"))
        .status()
        .is_ok_and(|s| s.success());
    for (minor, suite) in [(40, "trixie"), (42, "sid"), (44, "experimental")] {
        let base = PathBuf::from(format!("/opt/perl-{suite}"));
        let perl = base.join("usr/bin/perl");
        let exists = root.join(perl.strip_prefix("/").unwrap_or(&perl)).exists();
        if super::prerequisite(
            "Perl tests",
            installed && exists,
            &format!(
                "{suite}'s perl 5.{minor} in {} (scripts/perl-versions.sh)",
                root.display()
            ),
        ) {
            found.push(Perl {
                label: format!("5.{minor} (Debian {suite}, chroot)"),
                perl,
                inc: Some(base.join("usr/lib/x86_64-linux-gnu/perl-base")),
                root: Some(root.clone()),
            });
        }
    }
    found
}

/// The fixture script.
pub fn fixture_script() -> PathBuf {
    package_dir().join("integration/fixtures/perl_split.pl")
}

/// The fixture's path as `perl` sees it (copied into its chroot's `/tmp`).
pub fn fixture_in(perl: &Perl) -> PathBuf {
    match &perl.root {
        Some(root) => {
            let inside = Path::new("/tmp/icecore_perl_split.pl");
            super::stage_file(
                &fixture_script(),
                &root.join(inside.strip_prefix("/").unwrap_or(inside)),
            );
            inside.to_path_buf()
        }
        None => fixture_script(),
    }
}

/// The command that runs the fixture in `mode` for `seconds` under `perl`,
/// with `flags` before the script (`-d:NYTProf`).
pub fn fixture_command(perl: &Perl, flags: &[&str], mode: &str, seconds: u32) -> Command {
    let script = fixture_in(perl);
    let mut command = match &perl.root {
        Some(root) => {
            let mut command = Command::new("chroot");
            command.arg(root).arg(&perl.perl);
            command
        }
        None => Command::new(&perl.perl),
    };
    if let Some(inc) = &perl.inc {
        command.arg(format!("-I{}", inc.display()));
    }
    command
        .args(flags)
        .arg(script)
        .args([mode, &seconds.to_string()])
        .stdout(Stdio::null());
    command
}

/// Starts the fixture (see [`fixture_command`]).
pub fn spawn_fixture(perl: &Perl, mode: &str, seconds: u32) -> Child {
    fixture_command(perl, &[], mode, seconds)
        .spawn()
        .unwrap_or_else(|e| panic!("start {} {mode}: {e}", perl.label))
}

/// Devel::NYTProf for Debian's perl, installed if missing; false (a failure
/// under `ICECORE_REQUIRE_ALL=1`) when it cannot be.
pub fn nytprof() -> bool {
    let present = || {
        Command::new("perl")
            .args(["-MDevel::NYTProf::Data", "-e1"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !present() {
        let _ = Command::new("apt-get")
            .args([
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                "libdevel-nytprof-perl",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status();
    }
    super::prerequisite(
        "Perl tests",
        present(),
        "Devel::NYTProf (apt-get install libdevel-nytprof-perl)",
    )
}

/// Runs the fixture's split under Devel::NYTProf (its sub profiler) for
/// `seconds` and returns the inclusive time of `subs`, in seconds.
pub fn nytprof_inclusive(perl: &Perl, seconds: u32, dir: &Path, subs: &[&str]) -> Vec<f64> {
    let out = dir.join("nytprof.out");
    let status = fixture_command(perl, &["-d:NYTProf"], "split", seconds)
        // The sub profiler alone: the statement profiler's cost per
        // statement would weigh on the leaf's loop, not on the split.
        .env(
            "NYTPROF",
            format!("file={}:stmts=0:blocks=0", out.display()),
        )
        .status()
        .expect("run the fixture under NYTProf");
    assert!(status.success(), "NYTProf run: {status}");
    let report = Command::new("perl")
        .args([
            "-MDevel::NYTProf::Data",
            "-e",
            "my $p = Devel::NYTProf::Data->new({filename => shift, quiet => 1}); \
             for (@ARGV) { my $s = $p->subinfo_of($_) or die \"no $_\\n\"; print $s->incl_time, \"\\n\" }",
        ])
        .arg(&out)
        .args(subs)
        .output()
        .expect("read NYTProf's output");
    assert!(
        report.status.success(),
        "NYTProf's data: {}",
        String::from_utf8_lossy(&report.stderr)
    );
    String::from_utf8_lossy(&report.stdout)
        .lines()
        .map(|l| l.trim().parse::<f64>().expect("a time in seconds"))
        .collect()
}
