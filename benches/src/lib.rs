//! Criterion benchmarks live in benches/benches/; this is what the root-only
//! BPF cost benchmarks share.

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
