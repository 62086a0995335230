//! BPF time per Java frame, from the kernel's own BPF statistics (harness:
//! `icecore_benches::runtime_cost`).
//!
//! Needs root. Compiles `fixtures/JavaRecurse.java` (a plain recursive
//! method, burning CPU at the bottom, warmed up so its frames are C2's) and
//! runs it under Debian's OpenJDK 17 at several depths, once as the JIT
//! compiles it and once with `-Xint`; each fit's slope is the cost of a
//! compiled Java frame (the segment-map lookup of its blob, its frame
//! size, its return address) or of an interpreted one (its method, bytecode
//! pointer and sender from the frame's fixed slots).
//!
//! `cargo bench -p icecore-benches --bench hotspot_cost`
//!
//! Environment: `HOTSPOT_COST_JDK` (a JDK home instead of Debian's 17),
//! `HOTSPOT_COST_DEPTHS` (e.g. `5,150`), `HOTSPOT_COST_HZ`, `HOTSPOT_COST_ROUNDS`.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use icecore_benches::runtime_cost::{CostBench, Subject};
use icecore_receiver::Counter;

fn main() {
    if !icecore_benches::root_bench_selected("hotspot_cost") {
        return;
    }
    let home = std::env::var_os("HOTSPOT_COST_JDK").map_or_else(
        || PathBuf::from("/usr/lib/jvm/java-17-openjdk-amd64"),
        PathBuf::from,
    );
    let (java, javac) = (home.join("bin/java"), home.join("bin/javac"));
    if !java.exists() || !javac.exists() {
        println!(
            "hotspot_cost: skipped, no JDK at {} (set HOTSPOT_COST_JDK)",
            home.display()
        );
        return;
    }
    let classes = std::env::temp_dir().join(format!("icecore-hotspot-cost-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&classes);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/JavaRecurse.java");
    let compiled = Command::new(&javac)
        .arg("-d")
        .arg(&classes)
        .arg(&source)
        .status()
        .is_ok_and(|s| s.success());
    if !compiled {
        println!(
            "hotspot_cost: skipped, javac failed on {}",
            source.display()
        );
        return;
    }
    let label = home
        .file_name()
        .map_or_else(|| "java".into(), |n| n.to_string_lossy().into_owned());
    // Compiled frames as the JIT leaves them, and interpreted ones under
    // `-Xint`. An inlined method has no frame of its own: BPF reports the
    // physical frame's PC once, and user space expands the inlined methods
    // (`hotspot_symbolize` measures that lookup).
    let subject = |label: String, options: &'static [&'static str]| {
        let (java, class_path) = (java.clone(), classes.clone());
        Subject {
            label,
            command: Box::new(move |depth, seconds| {
                let mut command = Command::new(&java);
                command
                    .args(options)
                    .arg("-cp")
                    .arg(&class_path)
                    .arg("JavaRecurse")
                    .args([depth.to_string(), seconds.to_string()]);
                command
            }),
        }
    };
    let subjects = [
        subject(format!("{label} compiled"), &[]),
        subject(format!("{label} -Xint"), &["-Xint"]),
    ];
    let bench = CostBench {
        env_prefix: "HOTSPOT_COST",
        frame_name: "Java",
        frames: &[Counter::HotSpotFrames],
        cut: &[Counter::UserStackTruncated, Counter::HotSpotStackTruncated],
        depths: &[5, 50, 150],
        rounds: 2,
        frequency_hz: 997,
        warm_up: Duration::from_secs(3),
        measured: Duration::from_secs(4),
    };
    bench.run(&subjects);
    let _ = std::fs::remove_dir_all(&classes);
}
