//! The PHP builds of the machine, for the plugin's tests: Debian's 8.2 on
//! the host, sid's 8.4 and experimental's 8.5 in the sid chroot
//! (`scripts/php.sh` installs them), and a thread-safe 8.2 built from
//! Debian's source (`scripts/php-zts.sh`).

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
    /// Whether it has opcache (and so the JIT).
    pub opcache: bool,
}

/// Debian's php8.2, sid's php8.4 and experimental's php8.5, those present;
/// a missing one is a skip, or a failure under `ICECORE_REQUIRE_ALL=1`.
pub fn interpreters() -> Vec<Php> {
    let sid = crate::test_support::sid_root();
    let zts = std::env::var_os("ICECORE_PHP_ZTS")
        .map_or_else(
            || PathBuf::from("/var/cache/icecore/php-zts"),
            PathBuf::from,
        )
        .join("bin/php");
    let mut found = Vec::new();
    for (program, root, label) in [
        ("/usr/bin/php8.2".into(), None, "8.2 (Debian)"),
        (
            "/usr/bin/php8.4".into(),
            Some(sid.clone()),
            "8.4 (Debian sid, chroot)",
        ),
        (
            "/usr/bin/php8.5".into(),
            Some(sid.clone()),
            "8.5 (Debian experimental, chroot)",
        ),
        (zts, None, "8.2 ZTS (Debian's source, scripts/php-zts.sh)"),
    ] {
        let program: PathBuf = program;
        let binary = match &root {
            Some(root) => root.join(program.strip_prefix("/").unwrap_or(&program)),
            None => program.clone(),
        };
        if !binary.exists() {
            crate::test_support::missing_prerequisite(&format!(
                "PHP {label} at {} (scripts/php.sh, scripts/php-zts.sh)",
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
        let opcache = interpreter
            .command()
            .args(["-r", "echo function_exists('opcache_get_status') ? 1 : 0;"])
            .output()
            .is_ok_and(|o| o.stdout == b"1");
        found.push(Php {
            label: label.to_owned(),
            interpreter,
            binary,
            version: String::from_utf8_lossy(&output.stdout).trim().to_owned(),
            opcache,
        });
    }
    found
}
