// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The flame graph page on `--http-address`, end to end: the agent profiles
//! a program with a known split (and two others), headless Chromium opens
//! the page and does what a person would (read the shares, search, click to
//! zoom, filter by process, diff two ranges), and the JSON API is checked
//! against the pprof files the agent wrote for the same batches, decoded
//! independently.
//!
//! Needs root (BPF), clang, and Chromium with playwright-core
//! (`scripts/browser.sh` installs both).

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::browser::{self, get, get_json};
use support::fixture::build_c;
use support::pprof::{PprofProfile, decode_dir, decode_file};
use support::run::{REPORTER_INTERVAL, SystemWideRun};
use support::{HZ, now_unix_nanos, require_root, serial, tmp};

/// The built-in split of `flame_split split`, in percent of its CPU time.
const SPLIT: [(&str, f64); 3] = [("alpha", 50.0), ("beta", 30.0), ("gamma", 20.0)];
/// How far the page's shares may be from the split.
const TOLERANCE_PP: f64 = 5.0;
/// How long each fixture runs.
const RUN_SECS: u64 = 20;

/// A fixture process, killed on drop.
struct Fixture(Child);

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(exe: &Path, mode: &str, seconds: u64) -> Fixture {
    Fixture(
        Command::new(exe)
            .args([mode, &seconds.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", exe.display())),
    )
}

fn ms(nanos: u64) -> u64 {
    nanos / 1_000_000
}

/// The page's frames named `name`: their summed share of the view.
fn share_of(frames: &Value, name: &str) -> f64 {
    frames
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["name"] == name)
        .map(|f| f["share"].as_f64().unwrap())
        .sum()
}

fn names(frames: &Value) -> BTreeSet<String> {
    frames
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// `rgb(r, g, b)` as numbers.
fn rgb(fill: &str) -> (u32, u32, u32) {
    let inner = fill
        .trim_start_matches("rgb(")
        .trim_end_matches(')')
        .split(',')
        .map(|c| c.trim().parse::<u32>().unwrap_or(0))
        .collect::<Vec<_>>();
    (inner[0], inner[1], inner[2])
}

fn frame<'a>(frames: &'a Value, name: &str) -> &'a Value {
    frames
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no frame {name} drawn: {:?}", names(frames)))
}

#[test]
fn the_page_shows_searches_zooms_filters_and_diffs_a_known_split() {
    const TEST: &str = "the_page_shows_searches_zooms_filters_and_diffs_a_known_split";
    if !require_root(TEST) || !browser::available(TEST) {
        return;
    }
    let _serial = serial();
    let build_dir = tmp();
    let exe = build_c(
        "flame_split.c",
        "flame_split",
        build_dir.path(),
        // No builtins: the fixture names a function `gamma`.
        &["-fno-builtin"],
    );
    let artifacts = browser::artifacts_dir("flamegraph");

    let run = SystemWideRun::spawn(tmp(), HZ, &[]);
    let addr = run.icecore.http_address(Duration::from_secs(10));
    let started = ms(now_unix_nanos());
    let split = spawn(&exe, "split", RUN_SECS);
    let other = spawn(&exe, "other", RUN_SECS);
    let mut phases = spawn(&exe, "phases", RUN_SECS / 2);
    let (split_pid, other_pid, phases_pid) = (split.0.id(), other.0.id(), phases.0.id());
    let mut marks: BTreeMap<String, u64> = BTreeMap::new();
    for line in BufReader::new(phases.0.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some((phase, at)) = line.split_once(' ') {
            marks.insert(phase.to_owned(), at.parse().unwrap());
        }
    }
    let ended = ms(now_unix_nanos());
    // The last batches: two intervals, and one to spare.
    std::thread::sleep(3 * REPORTER_INTERVAL);
    drop((split, other));
    println!(
        "{TEST}: fixtures split={split_pid} other={other_pid} phases={phases_pid}, marks {marks:?}"
    );

    // Whole seconds inside each phase, away from its edges.
    let second = 1000;
    let inside = |from: u64, to: u64| json!([from + 2 * second, to - second]);
    let plan = json!({
        "url": format!("http://{addr}"),
        "artifacts": artifacts,
        "split": inside(started, ended),
        "alpha": inside(marks["alpha"], marks["beta"]),
        "beta": inside(marks["beta"], marks["end"]),
        "pid": split_pid,
        "diff_pid": phases_pid,
        "click": "beta",
        "search": "gamma",
    });
    let seen = browser::run_script("flamegraph_page.mjs", &plan);
    println!("{TEST}: screenshots in {}", artifacts.display());
    let mut failures = Vec::new();

    // 1. Every process, then 2. the split's only.
    let everything = names(&seen["split"]["frames"]);
    for expected in ["alpha", "beta", "gamma", "other_work"] {
        if !everything.contains(expected) {
            failures.push(format!("{expected} is not drawn for every process"));
        }
    }
    let filtered = &seen["process"]["frames"];
    println!(
        "{TEST}: filtered to the split: {}",
        seen["process"]["status"]
    );
    for (name, expected) in SPLIT {
        let shown = share_of(filtered, name);
        let top = seen["process"]["processes_in_top"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .map_or(0.0, |r| r["total"].as_f64().unwrap());
        println!("{TEST}: {name}: drawn {shown:.1}%, top table {top:.1}%, split {expected}%");
        if (shown - expected).abs() > TOLERANCE_PP || (top - expected).abs() > TOLERANCE_PP {
            failures.push(format!(
                "{name}: {shown:.1}% drawn and {top:.1}% in the top table, split {expected}%"
            ));
        }
    }
    let leaked: Vec<String> = names(filtered)
        .into_iter()
        .filter(|n| n == "other_work" || n == "run_phases")
        .collect();
    if !leaked.is_empty() {
        failures.push(format!(
            "the process filter left other processes' frames: {leaked:?}"
        ));
    }
    let options = seen["process_options"].to_string();
    if !options.contains(&format!("\"{split_pid}\""))
        || !options.contains(&format!("\"{other_pid}\""))
    {
        failures.push(format!(
            "the process filter does not offer both processes: {options}"
        ));
    }

    // 3. Search, within the split.
    let found = seen["search"]["share"].as_f64().unwrap_or(0.0);
    println!("{TEST}: search: {}", seen["search"]["text"]);
    if (found - 20.0).abs() > TOLERANCE_PP {
        failures.push(format!(
            "the search for gamma reports {found:.1}%, split 20%"
        ));
    }
    if seen["search"]["highlighted"] != json!(["gamma"]) {
        failures.push(format!(
            "the search highlighted {} (expected gamma only)",
            seen["search"]["highlighted"]
        ));
    }

    // 4. Zoom.
    let crumbs: Vec<&str> = seen["zoom"]["breadcrumb"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let zoomed = &seen["zoom"]["frames"];
    let beta_width = frame(zoomed, "beta")["width"].as_f64().unwrap();
    let chart_width = seen["zoom"]["chart_width"].as_f64().unwrap();
    println!("{TEST}: zoomed: {crumbs:?}, beta {beta_width:.0} px of {chart_width:.0}");
    if crumbs.first() != Some(&"all")
        || crumbs.last() != Some(&"beta")
        || !crumbs.contains(&"run_split")
    {
        failures.push(format!("after clicking beta the breadcrumb is {crumbs:?}"));
    }
    if beta_width < 0.98 * chart_width || names(zoomed).contains("alpha") {
        failures.push(format!(
            "after clicking beta it spans {beta_width:.0} of {chart_width:.0} px, and {:?} are drawn",
            names(zoomed)
        ));
    }
    if seen["unzoomed_breadcrumb"] != json!(["all"]) {
        failures.push(format!(
            "the breadcrumb's root led to {}",
            seen["unzoomed_breadcrumb"]
        ));
    }

    // 5. Diff: alpha only in the shown range (red), beta only in the
    // baseline (blue).
    let diff = &seen["diff"]["frames"];
    let (alpha, beta) = (frame(diff, "alpha"), frame(diff, "beta"));
    let (ar, _, ab) = rgb(alpha["fill"].as_str().unwrap());
    let (br, _, bb) = rgb(beta["fill"].as_str().unwrap());
    println!(
        "{TEST}: diff: alpha {} delta {}, beta {} delta {}",
        alpha["fill"], alpha["delta"], beta["fill"], beta["delta"]
    );
    if !(ar > ab + 60 && bb > br + 60) {
        failures.push(format!(
            "diff colours: alpha {} and beta {} are not red and blue",
            alpha["fill"], beta["fill"]
        ));
    }
    if !(alpha["delta"].as_f64().unwrap() > 90.0 && beta["delta"].as_f64().unwrap() < -90.0) {
        failures.push(format!(
            "diff: alpha changed by {} points, beta by {}",
            alpha["delta"], beta["delta"]
        ));
    }
    if seen["diff"]["toggle"] != json!(true) || seen["diff"]["baseline_row_visible"] != json!(true)
    {
        failures.push("the diff's controls do not show it is on".to_owned());
    }

    // The JSON API against the pprof files of the same batches.
    failures.extend(api_matches_pprof(addr, &run.pprof_dir, started, ended));
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}

/// Stacks containing each function, once per stack, and the total.
fn totals(samples: &[support::summary::DecodedSample]) -> (BTreeMap<String, u64>, u64) {
    let mut by_name = BTreeMap::new();
    let mut all = 0;
    for s in samples {
        all += s.count;
        let names: BTreeSet<&str> = s.stack.iter().map(|f| f.function.as_str()).collect();
        for name in names {
            *by_name.entry(name.to_owned()).or_default() += s.count;
        }
    }
    (by_name, all)
}

/// Picks the pprof files written while the fixtures ran, asks the API for
/// exactly their window, and compares the totals per function; then does
/// the same with the API's own pprof download.
fn api_matches_pprof(
    addr: std::net::SocketAddr,
    pprof_dir: &Path,
    started: u64,
    ended: u64,
) -> Vec<String> {
    let mut failures = Vec::new();
    let files: Vec<PprofProfile> = decode_dir(pprof_dir)
        .into_iter()
        .filter(|p| {
            let from = ms(p.time_nanos as u64);
            from >= started && from + ms(p.duration_nanos as u64) <= ended
        })
        .collect();
    assert!(
        files.len() >= 3,
        "only {} pprof files in the window",
        files.len()
    );
    let from = ms(files[0].time_nanos as u64);
    let last = files.last().unwrap();
    let to = (last.time_nanos + last.duration_nanos) as u64 / 1_000_000 + 1;
    let samples: Vec<_> = files.iter().flat_map(|p| p.samples.clone()).collect();
    let (pprof, pprof_all) = totals(&samples);

    // Totals and the top table only: the tree of a whole host can nest
    // deeper than a JSON parser's recursion limit (serde_json's is 128).
    let api = get_json(
        addr,
        &format!("/api/flamegraph?from={from}&to={to}&max_nodes=1"),
    );
    let api_all = api["total"].as_u64().unwrap();
    let covered = (&api["range"]["from"], &api["range"]["to"]);
    println!(
        "api vs pprof: {} files, {pprof_all} samples in pprof, {api_all} in the API, range {covered:?}",
        files.len()
    );
    if api_all != pprof_all {
        failures.push(format!(
            "the API counts {api_all} samples, the pprof files {pprof_all}"
        ));
    }
    let mut compared = 0;
    for row in api["top"].as_array().unwrap() {
        let name = row["name"].as_str().unwrap();
        if name.starts_with('[') {
            continue; // unsymbolized: named by file here, by address in pprof
        }
        compared += 1;
        let expected = pprof.get(name).copied().unwrap_or(0);
        if row["total"].as_u64() != Some(expected) {
            failures.push(format!(
                "{name}: total {} in the API, {expected} in the pprof files",
                row["total"]
            ));
        }
    }
    println!("api vs pprof: {compared} functions compared");
    for (name, _) in SPLIT {
        if pprof.get(name).copied().unwrap_or(0) == 0 {
            failures.push(format!("{name} is not in the pprof files"));
        }
    }

    let (status, body) = get(addr, &format!("/api/flamegraph.pprof?from={from}&to={to}"));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let dir = tmp();
    let downloaded = decode_file(&browser::save(dir.path(), "view.pb.gz", &body));
    assert!(
        downloaded.violations.is_empty(),
        "{:?}",
        downloaded.violations
    );
    let (download, download_all) = totals(&downloaded.samples);
    if download_all != pprof_all || SPLIT.iter().any(|(n, _)| download.get(*n) != pprof.get(*n)) {
        failures.push(format!(
            "the downloaded pprof has {download_all} samples (files: {pprof_all}); split functions {:?} vs {:?}",
            SPLIT.map(|(n, _)| download.get(n).copied()),
            SPLIT.map(|(n, _)| pprof.get(n).copied()),
        ));
    }

    // Refused clearly, not served wrong.
    for (query, expected) in [
        ("/api/flamegraph?from=5", "from/to needs both ends"),
        ("/api/flamegraph?types=cobol", "expected frame types"),
        ("/api/flamegraph?kind=heap", "unknown profile kind"),
        ("/api/flamegraph?colour=red", "unknown parameter"),
    ] {
        let (status, body) = get(addr, query);
        let body = String::from_utf8_lossy(&body);
        if status != 400 || !body.contains(expected) {
            failures.push(format!("{query}: {status} {body:?}"));
        }
    }
    failures
}
