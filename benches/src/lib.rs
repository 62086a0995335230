//! Criterion benchmarks live in benches/benches/ and the overhead benchmark
//! in src/bin/overhead/; this is what they share.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles `benches/fixtures/{source}` into `dir` the way distributions
/// build: -O2 without frame pointers, so every frame needs DWARF (and no
/// sibling calls, so recursion keeps its frames). Returns the executable.
pub fn compile_native_fixture(compiler: &str, source: &str, dir: &Path) -> Result<PathBuf, String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(source);
    let exe = dir.join(source.file_stem().unwrap_or_default());
    let out = Command::new(compiler)
        .args([
            "-O2",
            "-fomit-frame-pointer",
            "-fno-optimize-sibling-calls",
            "-o",
        ])
        .arg(&exe)
        .arg(&source)
        .output()
        .map_err(|e| format!("cannot run {compiler}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{compiler} failed on {}: {}",
            source.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(exe)
}

/// Whether a root-only benchmark named `name` should run: prints why not
/// when the process is not root, and stays quiet when `cargo bench` was
/// given a filter naming another benchmark (it passes `--bench` itself).
pub fn root_bench_selected(name: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("{name}: skipped, needs root to load the BPF programs");
        return false;
    }
    !std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && !name.contains(a.as_str()))
}

/// Least-squares line through (x, y): (intercept, slope).
pub fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (my - slope * mx, slope)
}
