// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end tests of off-CPU profiling (`--off-cpu-threshold`): threads
//! of `fixtures/off_cpu.c` block in named functions (a sleep, a pipe read,
//! a contended mutex) and time each blocking call themselves; the off-CPU
//! profile must put their blocked time on those functions, in total within
//! 5 % of what they measured, with the kernel's wait (`do_nanosleep`,
//! `futex`, `pipe_read`) under them, while the CPU profile stays as it was.
//! A Python thread blocked on `time.sleep` and on a `threading.Lock` shows
//! its Python frames. A context-switch storm at threshold 0.01 checks that
//! every record BPF wrote is accounted for once.
//!
//! Every test loads BPF programs and needs root; without root it prints why
//! it is skipped and passes.
//!
//!     sudo -E cargo test --release --test integration -- off_cpu:: --test-threads=1 --nocapture

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use support::build;
use support::pprof::{PprofProfile, decode_file, dir_entries};
use support::run::{ProfiledRun, Target, s};
use support::summary::DecodedSample;
use support::{require_root, serial, tmp};

const HZ: u32 = 97;
/// How long the fixture's threads run once started.
const FIXTURE_SECS: u32 = 10;
const START_TIMEOUT: Duration = Duration::from_secs(120);

fn off_cpu_args(threshold: &str) -> Vec<String> {
    vec![s("--off-cpu-threshold"), s(threshold)]
}

/// The profiles of a run, by kind.
struct Profiles {
    cpu: Vec<PprofProfile>,
    off_cpu: Vec<PprofProfile>,
    wall: Vec<PprofProfile>,
}

/// Builds the fixture and starts it (waiting for SIGUSR1) with `args`.
fn fixture(args: &[&str]) -> Target {
    let tmp = tmp();
    let exe = build::compile(
        "gcc",
        &["-O2", "-g", "-fno-omit-frame-pointer", "-pthread"],
        "off_cpu.c",
        &[],
        tmp.path(),
        "off_cpu",
    );
    Target::start_exe(tmp, &exe, args)
}

/// Profiles `target` with off-CPU on at `threshold` (and `extra` flags),
/// starts its work once icecore samples, and returns the fixture's result
/// lines (`lines` of them) after stopping icecore.
fn profile(
    target: Target,
    threshold: &str,
    extra: &[&str],
    lines: usize,
) -> (ProfiledRun, Vec<String>) {
    let mut args = off_cpu_args(threshold);
    args.extend(extra.iter().map(s));
    let mut run = ProfiledRun::spawn_on(target, HZ, &args);
    run.icecore
        .wait_for_log("off-CPU sampling started", START_TIMEOUT);
    // SAFETY: a signal to the fixture's pid, which this test owns.
    assert_eq!(unsafe { libc::kill(run.pid() as i32, libc::SIGUSR1) }, 0);
    let results = (0..lines).map(|_| run.target.fixture.read_line()).collect();
    // The last waits end as the threads exit: let a drain see them.
    std::thread::sleep(Duration::from_millis(500));
    run.stop();
    (run, results)
}

/// The pprof files of a run, by kind.
fn pprof_profiles(dir: &Path) -> Profiles {
    let mut profiles = Profiles {
        cpu: Vec::new(),
        off_cpu: Vec::new(),
        wall: Vec::new(),
    };
    for path in dir_entries(dir) {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".pb.gz") {
            continue;
        }
        let profile = decode_file(&path);
        assert!(
            profile.violations.is_empty(),
            "{name}: {:?}",
            profile.violations
        );
        if name.ends_with("-off_cpu.pb.gz") {
            profiles.off_cpu.push(profile);
        } else if name.ends_with("-wall.pb.gz") {
            profiles.wall.push(profile);
        } else {
            profiles.cpu.push(profile);
        }
    }
    profiles
}

fn samples(profiles: &[PprofProfile]) -> Vec<DecodedSample> {
    profiles.iter().flat_map(|p| p.samples.clone()).collect()
}

/// `name=value` fields of a line such as `blocked nap=1 pipe=2 lock=3`.
fn fields(line: &str) -> BTreeMap<String, u64> {
    line.split_whitespace()
        .filter_map(|word| {
            let (name, value) = word.split_once('=')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// A numeric field of icecore's "off-CPU totals" line.
fn totals_field(logs: &str, name: &str) -> u64 {
    let line = logs
        .lines()
        .rev()
        .find(|l| l.contains("off-CPU totals"))
        .unwrap_or_else(|| panic!("no 'off-CPU totals' line\n{logs}"));
    let key = format!("{name}=");
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key.as_str()))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {line}"))
}

fn nanos_where(samples: &[DecodedSample], keep: impl Fn(&DecodedSample) -> bool) -> u64 {
    samples.iter().filter(|s| keep(s)).map(|s| s.nanos).sum()
}

fn thread_is(sample: &DecodedSample, name: &str) -> bool {
    sample.thread_name.as_deref() == Some(name)
}

/// Kernel addresses: pprof has no frame kinds.
const KERNEL_START: u64 = 0xffff_8000_0000_0000;

fn has_kernel_frame(sample: &DecodedSample, part: &str) -> bool {
    sample
        .stack
        .iter()
        .any(|f| f.address >= KERNEL_START && f.function.contains(part))
}

/// Checks that every off-CPU record BPF wrote was read and accounted for
/// once, and returns the joined waits.
fn assert_records_accounted(logs: &str) -> u64 {
    let field = |name| totals_field(logs, name);
    let line = logs
        .lines()
        .rev()
        .find(|l| l.contains("off-CPU totals"))
        .unwrap_or("");
    println!("{line}");
    let (starts, ends) = (field("starts_by_bpf"), field("ends_by_bpf"));
    let (joined, unanswered) = (field("joined"), field("unanswered"));
    let (orphans, overflow, pending) = (field("orphan_ends"), field("overflow"), field("pending"));
    assert_eq!(
        starts,
        joined + unanswered + overflow + pending,
        "every start written is joined, unanswered, dropped at the limit or pending"
    );
    assert!(
        ends >= joined + orphans,
        "more ends joined or dropped ({joined} + {orphans}) than written ({ends})"
    );
    assert_eq!(
        field("waits"),
        joined,
        "a joined wait missing from the profiles"
    );
    joined
}

#[test]
fn blocked_time_goes_to_the_functions_that_blocked() {
    if !require_root("blocked_time_goes_to_the_functions_that_blocked") {
        return;
    }
    let _serial = serial();
    let secs = FIXTURE_SECS.to_string();
    let (run, results) = profile(fixture(&[&secs]), "1", &["--wall-clock"], 2);
    let blocked = fields(&results[0]);
    let spun_ns = fields(&results[1].replace("spun ", "spun="))["spun"];
    println!("fixture: {results:?}");
    let Profiles { cpu, off_cpu, wall } = pprof_profiles(&run.pprof_dir);
    assert!(!off_cpu.is_empty(), "no off-CPU profile written");
    for p in &off_cpu {
        assert_eq!(
            p.sample_types,
            [(s("samples"), s("count")), (s("off_cpu"), s("nanoseconds"))]
        );
        assert_eq!(p.period_type, Some((s("context_switch"), s("count"))));
        assert_eq!(p.period, 1);
    }
    let waits = samples(&off_cpu);
    let pid = i64::from(run.pid());
    assert_records_accounted(&run.icecore.logs());
    assert!(
        waits.iter().all(|w| w.pid == Some(pid)),
        "a wait of another process"
    );

    // Each blocking thread's off-CPU time is in its blocking function, and
    // each function's total matches what the fixture measured.
    for (thread, function, measured, kernel_wait) in [
        ("napper", "nap", blocked["nap"], "nanosleep"),
        ("reader", "wait_on_pipe", blocked["pipe"], "pipe_read"),
        ("locker", "wait_on_lock", blocked["lock"], "futex"),
    ] {
        let of_thread = nanos_where(&waits, |w| thread_is(w, thread));
        let in_function = nanos_where(&waits, |w| thread_is(w, thread) && w.contains(function));
        let with_kernel_wait = nanos_where(&waits, |w| {
            thread_is(w, thread) && w.contains(function) && has_kernel_frame(w, kernel_wait)
        });
        let share = 100.0 * in_function as f64 / of_thread.max(1) as f64;
        let ratio = in_function as f64 / measured as f64;
        println!(
            "{thread}: {:.3} s off CPU, {share:.1} % in {function} ({:.3} s; the fixture measured {:.3} s: ratio {ratio:.3}), {:.1} % under a kernel {kernel_wait} frame",
            of_thread as f64 / 1e9,
            in_function as f64 / 1e9,
            measured as f64 / 1e9,
            100.0 * with_kernel_wait as f64 / in_function.max(1) as f64,
        );
        assert!(share >= 95.0, "{thread}: {share:.1} % in {function}");
        assert!(
            (0.95..=1.05).contains(&ratio),
            "{function}: {in_function} ns in the profile, {measured} ns measured"
        );
        assert!(
            with_kernel_wait as f64 >= 0.95 * in_function as f64,
            "{function}: the kernel's wait ({kernel_wait}) is missing under it"
        );
    }

    // The CPU profile: the CPU samples BPF emitted all reported, as
    // without off-CPU sampling, and the spinning is on CPU, not off it.
    run.icecore.assert_every_emitted_sample_reported();
    let on_cpu = samples(&cpu);
    let spin_samples: u64 = on_cpu
        .iter()
        .filter(|s| s.pid == Some(pid) && thread_is(s, "napper") && s.contains("spin_briefly"))
        .map(|s| s.count)
        .sum();
    let spin_cpu_s = spin_samples as f64 / f64::from(HZ);
    println!(
        "CPU: {spin_samples} samples of the napper in spin_briefly ({spin_cpu_s:.2} s at {HZ} Hz); it spun {:.2} s of thread CPU time",
        spun_ns as f64 / 1e9
    );
    let ratio = spin_cpu_s / (spun_ns as f64 / 1e9);
    assert!(
        (0.75..=1.25).contains(&ratio),
        "spin_briefly: {spin_cpu_s:.2} s sampled against {} ns measured",
        spun_ns
    );
    // The napper blocks in spin_briefly only in the kernel (a page fault,
    // say): such a wait starts with the kernel's frames.
    let in_spin: Vec<&DecodedSample> = waits
        .iter()
        .filter(|w| thread_is(w, "napper") && w.contains("spin_briefly"))
        .collect();
    for w in &in_spin {
        println!("a wait in spin_briefly ({} ns): {}", w.nanos, w.folded());
    }
    assert!(
        in_spin
            .iter()
            .all(|w| w.leaf().is_some_and(|f| f.is_kernel())),
        "an off-CPU wait without the kernel frames it waited in"
    );

    // The wall-clock view: the napper's wall time is its spinning (on CPU)
    // and its naps (off CPU), in one profile, in the fixture's 80/20 split.
    let wall = samples(&wall);
    let napper = nanos_where(&wall, |w| thread_is(w, "napper"));
    let spin = nanos_where(&wall, |w| {
        thread_is(w, "napper") && w.contains("spin_briefly")
    });
    let nap = nanos_where(&wall, |w| thread_is(w, "napper") && w.contains("nap"));
    let share = |part: u64| 100.0 * part as f64 / napper.max(1) as f64;
    println!(
        "wall clock: the napper's {:.2} s: {:.1} % spinning, {:.1} % napping (the fixture ran {FIXTURE_SECS} s, spinning {:.1} %)",
        napper as f64 / 1e9,
        share(spin),
        share(nap),
        100.0 * spun_ns as f64 / (spun_ns + blocked["nap"]) as f64
    );
    let expected_spin = 100.0 * spun_ns as f64 / (spun_ns + blocked["nap"]) as f64;
    assert!((share(spin) - expected_spin).abs() <= 5.0);
    assert!((share(spin) + share(nap) - 100.0).abs() <= 2.0);
    let run_ns = f64::from(FIXTURE_SECS) * 1e9;
    assert!(
        (napper as f64 - run_ns).abs() <= 0.1 * run_ns,
        "the napper's wall time: {napper} ns in a {FIXTURE_SECS} s run"
    );
}

#[test]
fn python_threads_wait_in_their_python_frames() {
    if !require_root("python_threads_wait_in_their_python_frames") {
        return;
    }
    let _serial = serial();
    let script = support::package_dir().join("integration/fixtures/python_off_cpu.py");
    let secs = FIXTURE_SECS.to_string();
    let target = Target::start_exe(
        tmp(),
        Path::new("/usr/bin/python3"),
        &[script.display().to_string(), secs],
    );
    let (run, results) = profile(target, "1", &[], 1);
    let blocked = fields(&results[0]);
    println!("fixture: {results:?}");
    assert_records_accounted(&run.icecore.logs());
    // OTLP carries frame kinds: the Python frames are `cpython` ones.
    let received = support::otlp::receive_valid(run.receiver.requests(), HZ);
    let pid = i64::from(run.pid());
    let waits: Vec<DecodedSample> = received
        .samples
        .into_iter()
        .filter(|s| s.pid == Some(pid) && s.nanos > 0)
        .collect();
    let in_python = |w: &DecodedSample, function: &str| {
        w.stack
            .iter()
            .any(|f| f.function == function && f.kind.as_deref() == Some("cpython"))
    };
    for (function, measured, kernel_wait) in [
        ("py_nap", blocked["nap"], "nanosleep"),
        ("py_wait_lock", blocked["lock"], "futex"),
    ] {
        let profiled = nanos_where(&waits, |w| in_python(w, function));
        let with_kernel_wait = nanos_where(&waits, |w| {
            in_python(w, function)
                && w.stack
                    .iter()
                    .any(|f| f.is_kernel() && f.function.contains(kernel_wait))
        });
        let ratio = profiled as f64 / measured as f64;
        println!(
            "{function}: {:.3} s off CPU under the Python frame; the fixture measured {:.3} s (ratio {ratio:.3}); {:.1} % under a kernel {kernel_wait} frame",
            profiled as f64 / 1e9,
            measured as f64 / 1e9,
            100.0 * with_kernel_wait as f64 / profiled.max(1) as f64
        );
        assert!(
            (0.95..=1.05).contains(&ratio),
            "{function}: {profiled} ns in the profile, {measured} ns measured"
        );
        assert!(with_kernel_wait as f64 >= 0.95 * profiled as f64);
    }
}

/// Runs the storm fixture at `threshold` and returns (the fixture's
/// voluntary context switches, the off-CPU starts BPF wrote, the waits
/// joined), with every record accounted for.
fn storm(threshold: &str) -> (u64, u64, u64, ProfiledRun) {
    let (run, results) = profile(fixture(&["storm", "5"]), threshold, &[], 1);
    let result = fields(&results[0]);
    println!("storm at threshold {threshold}: {results:?}");
    let logs = run.icecore.logs();
    let joined = assert_records_accounted(&logs);
    (
        result["switches"],
        totals_field(&logs, "starts_by_bpf"),
        joined,
        run,
    )
}

#[test]
fn a_context_switch_storm_is_sampled_and_every_record_accounted_for() {
    if !require_root("a_context_switch_storm_is_sampled_and_every_record_accounted_for") {
        return;
    }
    let _serial = serial();
    // Sampled: about one switch in a hundred is recorded.
    let (switches, starts, joined, run) = storm("0.01");
    let expected = switches as f64 * 0.01;
    println!(
        "{starts} starts for {switches} voluntary switches ({expected:.0} expected at 0.01); {joined} joined"
    );
    assert!(
        switches > 20_000,
        "the storm switched only {switches} times"
    );
    assert!(
        (starts as f64 - expected).abs() <= 0.15 * expected,
        "{starts} starts recorded, {expected:.0} expected"
    );
    let off_cpu = pprof_profiles(&run.pprof_dir).off_cpu;
    let waits = samples(&off_cpu);
    let in_storm = waits
        .iter()
        .filter(|w| w.contains("ping") || w.contains("pong"))
        .count();
    assert!(in_storm > 0, "no wait in ping or pong");
    for p in &off_cpu {
        assert_eq!(
            p.period,
            100,
            "{}: one recorded wait stands for 100",
            p.path.display()
        );
    }
    drop(run);

    // Every switch: the rings are under pressure; what they refuse is
    // counted (ring_buffer_full), and the rest still adds up.
    let (switches, starts, joined, run) = storm("1");
    let logs = run.icecore.logs();
    println!("every switch: {starts} starts written of {switches} switches, {joined} joined");
    assert!(starts > 0 && joined > 0);
    assert!(logs.contains("off-CPU totals"));
}
