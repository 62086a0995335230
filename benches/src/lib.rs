//! Criterion benchmarks live in benches/benches/, the overhead and
//! robustness benchmarks in src/bin/; this is what they share.

pub mod agent;
pub mod pprof_read;
pub mod proc;
pub mod runtime_cost;

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

/// `icecore --version` and the commit of this checkout.
pub fn icecore_version(binary: &Path) -> String {
    let version = Command::new(binary)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let commit = Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short",
            "HEAD",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    match commit {
        Some(c) => format!("{version} (commit {c})"),
        None => version,
    }
}

/// Writes `text` as the section `name` of the Markdown file at `path`: the
/// part between `<!-- name:begin -->` and `<!-- name:end -->`, replaced if
/// there, appended if not, so that each benchmark keeps the others' results.
pub fn write_section(path: &Path, name: &str, text: &str) -> std::io::Result<()> {
    let existing = match std::fs::read_to_string(path) {
        Ok(existing) => existing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    std::fs::write(path, with_section(&existing, name, text))
}

fn with_section(existing: &str, name: &str, text: &str) -> String {
    let (begin, end) = (
        format!("<!-- {name}:begin -->"),
        format!("<!-- {name}:end -->"),
    );
    let section = format!("{begin}\n{}\n{end}", text.trim_end());
    match (existing.find(&begin), existing.find(&end)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{section}{}", &existing[..b], &existing[e + end.len()..])
        }
        _ if existing.trim().is_empty() => format!("{section}\n"),
        _ => format!("{}\n\n{section}\n", existing.trim_end()),
    }
}

/// Deterministic xorshift64*, so every run benchmarks the same input.
pub struct Rng(pub u64);

impl Rng {
    /// The next pseudo-random number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

#[cfg(test)]
mod section_tests {
    use super::with_section;

    #[test]
    fn sections_are_replaced_or_appended() {
        let one = with_section("", "a", "first\n");
        assert_eq!(one, "<!-- a:begin -->\nfirst\n<!-- a:end -->\n");
        let two = with_section(&one, "b", "second");
        assert!(two.starts_with(&one.trim_end().to_string()));
        let replaced = with_section(&two, "a", "again");
        assert!(replaced.contains("again") && !replaced.contains("first"));
        assert!(replaced.contains("second"));
    }
}
