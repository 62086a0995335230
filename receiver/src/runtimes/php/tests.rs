//! The PHP builds of the machine, for the plugin's tests: Debian's 8.2 on
//! the host, and sid's 8.4 and experimental's 8.5 in the sid chroot
//! (`scripts/php.sh` installs them).

use std::path::PathBuf;

use crate::runtimes::host_walk::Interpreter;

/// One PHP build.
#[derive(Debug, Clone)]
pub struct Php {
    /// `8.2 (Debian)`.
    pub label: String,
    /// How to run it.
    pub interpreter: Interpreter,
    /// The executable, from the host.
    pub binary: PathBuf,
    /// Its version (`PHP_VERSION`).
    pub version: String,
}

/// Debian's php8.2, sid's php8.4 and experimental's php8.5, those present;
/// a missing one is a skip, or a failure under `ICECORE_REQUIRE_ALL=1`.
pub fn interpreters() -> Vec<Php> {
    let sid = crate::test_support::sid_root();
    let mut found = Vec::new();
    for (minor, root, suite) in [
        (2, None, "Debian"),
        (4, Some(sid.clone()), "Debian sid, chroot"),
        (5, Some(sid.clone()), "Debian experimental, chroot"),
    ] {
        let program = PathBuf::from(format!("/usr/bin/php8.{minor}"));
        let binary = match &root {
            Some(root) => root.join(program.strip_prefix("/").unwrap_or(&program)),
            None => program.clone(),
        };
        if !binary.exists() {
            crate::test_support::missing_prerequisite(&format!(
                "PHP 8.{minor} at {} (scripts/php.sh)",
                binary.display()
            ));
            continue;
        }
        let interpreter = Interpreter { program, root };
        let output = interpreter
            .command()
            .args(["-n", "-r", "echo PHP_VERSION;"])
            .output()
            .unwrap_or_else(|e| panic!("run {interpreter}: {e}"));
        found.push(Php {
            label: format!("8.{minor} ({suite})"),
            interpreter,
            binary,
            version: String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        });
    }
    found
}
