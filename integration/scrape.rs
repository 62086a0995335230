// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! End-to-end test of `scrape_configs`: the real `icecore` binary scrapes a
//! real Go program serving `net/http/pprof` (built here with the Go
//! toolchain `scripts/test.sh` installs) and a dead target. The OTLP
//! requests are read with the generated OTLP types, and the pprof files
//! with `go tool pprof`, Go's own reader. The truth comes from outside:
//! the Go program burns one CPU, so each CPU profile holds about its
//! `seconds` of CPU time, nearly all in the one burning function.
//!
//! Needs root (the agent loads its BPF programs); without root it prints
//! why it is skipped and passes.
//!
//!     sudo -E cargo test --release --test integration -- scrape:: --nocapture

use crate::support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use icecore_otlp::opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use support::pprof::decode_file;
use support::pyroscope::PyroscopeServer;
use support::receiver::OtlpReceiver;
use support::run::{EXIT_GRACE, base_args_at, duration_args, s};
use support::{HZ, Icecore, require_root, serial};

const INTERVAL_SECS: u64 = 2;
const BURN: &str = "main.scrapeFixtureBurn";
const ALLOCATE: &str = "main.scrapeFixtureAllocate";

/// The Go fixture, built and running; killed on drop.
struct GoTarget {
    child: Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl GoTarget {
    fn start(go: &Path) -> GoTarget {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("scrape_target.go");
        std::fs::copy(
            support::package_dir().join("integration/fixtures/scrape_target.go"),
            &source,
        )
        .unwrap();
        let binary = dir.path().join("scrape_target");
        let out = support::go_command(go, dir.path())
            .args(["build", "-o"])
            .arg(&binary)
            .arg(&source)
            .output()
            .expect("run go build");
        assert!(
            out.status.success(),
            "go build failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut child = Command::new(&binary)
            .arg("0")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the Go fixture");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let address = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        GoTarget {
            child,
            address,
            _dir: dir,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for GoTarget {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU seconds process `pid` has used (user and system, all threads).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the parenthesized command name; utime and stime are
    // fields 14 and 15 of the whole line, in clock ticks.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

/// A port nothing listens on.
fn dead_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    address
}

/// One OTLP profile of a scraped series, decoded.
#[derive(Debug)]
struct Decoded {
    scope: String,
    attributes: BTreeMap<String, String>,
    sample_type: (String, String),
    duration_nanos: u64,
    /// (leaf-first function names, value)
    samples: Vec<(Vec<String>, i64)>,
}

fn decode(requests: &[ExportProfilesServiceRequest]) -> Vec<Decoded> {
    let mut out = Vec::new();
    for request in requests {
        let dict = request.dictionary.as_ref().expect("a dictionary");
        let string = |i: i32| dict.string_table[i as usize].clone();
        for resource in &request.resource_profiles {
            let attributes: BTreeMap<String, String> = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .filter_map(|kv| {
                    use icecore_otlp::opentelemetry_proto::tonic::common::v1::any_value::Value;
                    match kv.value.as_ref()?.value.as_ref()? {
                        Value::StringValue(v) => Some((kv.key.clone(), v.clone())),
                        _ => None,
                    }
                })
                .collect();
            if !attributes.contains_key("job") {
                continue; // the agent's own profiles of the host
            }
            for scope in &resource.scope_profiles {
                let name = scope
                    .scope
                    .as_ref()
                    .map(|s| s.name.clone())
                    .unwrap_or_default();
                for profile in &scope.profiles {
                    let t = profile.sample_type.unwrap();
                    let samples = profile
                        .samples
                        .iter()
                        .map(|sample| {
                            let stack = &dict.stack_table[sample.stack_index as usize];
                            let names = stack
                                .location_indices
                                .iter()
                                .flat_map(|&l| &dict.location_table[l as usize].lines)
                                .map(|line| {
                                    string(
                                        dict.function_table[line.function_index as usize]
                                            .name_strindex,
                                    )
                                })
                                .collect();
                            (names, sample.values.iter().sum())
                        })
                        .collect();
                    out.push(Decoded {
                        scope: name.clone(),
                        attributes: attributes.clone(),
                        sample_type: (string(t.type_strindex), string(t.unit_strindex)),
                        duration_nanos: profile.duration_nano,
                        samples,
                    });
                }
            }
        }
    }
    out
}

fn share_with(profile: &Decoded, function: &str) -> f64 {
    let total: i64 = profile.samples.iter().map(|(_, v)| v).sum();
    let with: i64 = profile
        .samples
        .iter()
        .filter(|(names, _)| names.iter().any(|n| n == function))
        .map(|(_, v)| v)
        .sum();
    with as f64 / total.max(1) as f64
}

/// A Go program's CPU and heap profiles are scraped every 2 s and reach
/// OTLP as one profile per sample type, with the program's function names
/// and the target's labels; the heap's cumulative counts arrive as deltas;
/// the pprof files are what `go tool pprof` reads; a dead target is
/// counted in `/metrics` while the live one goes on.
#[test]
fn a_go_program_is_scraped_to_every_sink_and_a_dead_target_is_counted() {
    const TEST: &str = "a_go_program_is_scraped_to_every_sink_and_a_dead_target_is_counted";
    if !require_root(TEST) {
        return;
    }
    let Some(go) = support::required_go(TEST) else {
        return;
    };
    let _serial = serial();
    let target = GoTarget::start(&go);
    let dead = dead_address();
    let receiver = OtlpReceiver::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let parca = support::parca::ParcaStore::default();
    let parca_port = support::parca::serve(parca.clone(), &runtime);
    let pyroscope = PyroscopeServer::start_on("127.0.0.1:0".parse().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let pprof_dir = dir.path().join("pprof");
    std::fs::create_dir(&pprof_dir).unwrap();
    let config = dir.path().join("icecore.yaml");
    std::fs::write(
        &config,
        format!(
            "scrape_configs:\n\
             - job_name: shop\n\
             \x20 scrape_interval: {INTERVAL_SECS}s\n\
             \x20 static_configs:\n\
             \x20 - targets: ['{}', '{dead}']\n\
             \x20   labels: {{env: test}}\n\
             \x20 profiling_config:\n\
             \x20   pprof_config:\n\
             \x20     memory: {{path: /debug/pprof/heap}}\n\
             \x20     block: {{enabled: false}}\n\
             \x20     mutex: {{enabled: false}}\n",
            target.address
        ),
    )
    .unwrap();
    let check = Command::new(Icecore::binary())
        .args(["--config"])
        .arg(&config)
        .arg("--check-config")
        .output()
        .unwrap();
    let check_out = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "{check_out}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        check_out.contains("scrape job shop: 2 targets, 3 profiles every 2s"),
        "{check_out}"
    );

    let mut args = base_args_at(target.pid(), HZ);
    args.extend([
        s("--config"),
        s(config.display()),
        s("--otlp-endpoint"),
        receiver.endpoint(),
        s("--pprof-dir"),
        s(pprof_dir.display()),
        s("--parca-endpoint"),
        format!("http://127.0.0.1:{parca_port}"),
        s("--pyroscope-endpoint"),
        format!("http://{}", pyroscope.address()),
    ]);
    args.extend(duration_args(Duration::from_secs(16)));
    let cpu_before = (cpu_seconds(target.pid()), std::time::Instant::now());
    let mut icecore = Icecore::spawn(&args, dir.path());
    let series = |name: &str, instance: &str, profile: &str| {
        format!("{name}{{job=\"shop\",instance=\"{instance}\",profile=\"{profile}\"")
    };
    let dead_failures = format!(
        "{},reason=\"connect\"}}",
        series("icecore_scrape_failures_total", &dead, "process_cpu")
    );
    let live_up = format!(
        "{}}}",
        series("icecore_scrape_up", &target.address, "memory")
    );
    let (_, metrics) =
        icecore.wait_for_metrics("the dead target counted", Duration::from_secs(14), |m| {
            m.0.get(&dead_failures).is_some_and(|&n| n >= 2.0) && m.0.get(&live_up) == Some(&1.0)
        });
    let live_failures: f64 = metrics
        .0
        .iter()
        .filter(|(k, _)| {
            k.starts_with("icecore_scrape_failures_total") && k.contains(&target.address)
        })
        .map(|(_, v)| v)
        .sum();
    assert_eq!(live_failures, 0.0, "the live target never fails");
    let status = icecore.wait_exit(EXIT_GRACE);
    let used = cpu_seconds(target.pid()) - cpu_before.0;
    let utilization = used / cpu_before.1.elapsed().as_secs_f64();
    assert!(status.success(), "icecore failed\n{}", icecore.logs());

    let requests: Vec<ExportProfilesServiceRequest> =
        receiver.requests().into_iter().map(|r| r.request).collect();
    let profiles = decode(&requests);
    for p in &profiles {
        println!(
            "{} {}/{} over {} ms: {} samples, {:.0} % with {BURN}, {:.0} % with {ALLOCATE}",
            p.scope,
            p.sample_type.0,
            p.sample_type.1,
            p.duration_nanos / 1_000_000,
            p.samples.len(),
            100.0 * share_with(p, BURN),
            100.0 * share_with(p, ALLOCATE)
        );
    }
    assert!(
        profiles
            .iter()
            .all(|p| p.attributes.get("instance") == Some(&target.address)),
        "only the live target sends profiles"
    );
    let first = &profiles
        .first()
        .expect("scraped profiles reach OTLP")
        .attributes;
    assert_eq!(first.get("service.name").map(String::as_str), Some("shop"));
    assert_eq!(first.get("env").map(String::as_str), Some("test"));
    let of = |scope: &str, kind: &str| -> Vec<&Decoded> {
        profiles
            .iter()
            .filter(|p| p.scope == scope && p.sample_type.0 == kind)
            .collect()
    };
    // CPU: Go's own 100 Hz profile of `seconds` = the interval, nearly all
    // of it in BURN; the CPU time the profiles hold per second of profile
    // is the share of a CPU the program used over the run, as the kernel
    // counted it (/proc/PID/stat).
    let cpu = of("process_cpu", "cpu");
    assert!(cpu.len() >= 3, "{} CPU profiles", cpu.len());
    assert!(!of("process_cpu", "samples").is_empty());
    for p in &cpu {
        assert!(
            share_with(p, BURN) > 0.8,
            "{BURN}: {:.2}",
            share_with(p, BURN)
        );
        assert_eq!(p.sample_type.1, "nanoseconds");
        let seconds = p.duration_nanos as f64 / 1e9;
        assert!(
            (0.9 * INTERVAL_SECS as f64..=1.5 * INTERVAL_SECS as f64).contains(&seconds),
            "a CPU profile of {seconds:.2} s"
        );
    }
    let profiled: f64 = cpu
        .iter()
        .flat_map(|p| &p.samples)
        .map(|(_, v)| *v as f64 / 1e9)
        .sum();
    let covered: f64 = cpu.iter().map(|p| p.duration_nanos as f64 / 1e9).sum();
    let profiled_utilization = profiled / covered;
    println!(
        "CPU: the profiles hold {profiled:.2} s in {covered:.2} s ({profiled_utilization:.2} CPUs); \
         the kernel counted {used:.2} s ({utilization:.2} CPUs)"
    );
    assert!(
        (0.75..=1.25).contains(&(profiled_utilization / utilization)),
        "profiled {profiled_utilization:.2} CPUs, the kernel counted {utilization:.2}"
    );
    // Heap: all four sample types; the allocation counts are deltas over
    // about one interval, all from ALLOCATE (64 KiB per loop).
    for kind in [
        "alloc_objects",
        "alloc_space",
        "inuse_objects",
        "inuse_space",
    ] {
        assert!(!of("memory", kind).is_empty(), "no memory {kind} profile");
    }
    let allocated = of("memory", "alloc_space");
    for p in &allocated {
        let interval = p.duration_nanos as f64 / 1e9;
        assert!(
            (0.5 * INTERVAL_SECS as f64..=3.0 * INTERVAL_SECS as f64).contains(&interval),
            "a delta over {interval:.2} s"
        );
        // The rest is the serving program's own allocations (the pprof
        // handler's encoding and gzip): 9-11 % of each 2 s delta here.
        assert!(
            share_with(p, ALLOCATE) > 0.8,
            "{ALLOCATE}: {:.2}",
            share_with(p, ALLOCATE)
        );
    }
    assert!(
        !of("goroutine", "goroutine").is_empty(),
        "the goroutine profile"
    );

    // The pprof files, as Go's reader sees them.
    let files: Vec<PathBuf> = std::fs::read_dir(&pprof_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with("-shop-memory.pb.gz"))
        .collect();
    assert!(!files.is_empty(), "scraped pprof files are written");
    let out = support::go_command(&go, dir.path())
        .args(["tool", "pprof", "-top", "-sample_index=alloc_space"])
        .arg(&files[0])
        .output()
        .unwrap();
    let top = String::from_utf8_lossy(&out.stdout);
    println!("{top}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(top.contains(ALLOCATE), "go tool pprof names {ALLOCATE}");

    // Parca: the series of each scraped profile, labelled as Parca's own
    // scraper labels them, holding the pprof as Go wrote it (deltas aside).
    let written = parca.requests.lock().unwrap().clone();
    let mut parca_names = std::collections::BTreeSet::new();
    for series in written.iter().flat_map(|r| &r.series) {
        let labels = &series.labels.as_ref().unwrap().labels;
        let label = |name: &str| {
            labels
                .iter()
                .find(|l| l.name == name)
                .map(|l| l.value.clone())
        };
        if label("job").as_deref() != Some("shop") {
            continue; // the agent's own profiles of the host
        }
        assert_eq!(label("instance"), Some(target.address.clone()));
        assert_eq!(label("env").as_deref(), Some("test"));
        let name = label("__name__").unwrap();
        let file = dir
            .path()
            .join(format!("parca-{}.pb.gz", parca_names.len()));
        std::fs::write(&file, &series.samples[0].raw_profile).unwrap();
        let decoded = decode_file(&file);
        let expected = match name.as_str() {
            "process_cpu" => Some(BURN),
            "memory" => Some(ALLOCATE),
            _ => None,
        };
        if let Some(function) = expected {
            assert!(
                decoded.samples.iter().any(|s| s.contains(function)),
                "Parca's {name} profile has {function}"
            );
        }
        parca_names.insert(name);
    }
    assert_eq!(
        parca_names.into_iter().collect::<Vec<_>>(),
        ["goroutine", "memory", "process_cpu"]
    );
    // Pyroscope: the same, with service_name and __delta__="false".
    let pushed: Vec<_> = pyroscope
        .pushes()
        .into_iter()
        .flat_map(|p| p.series)
        .filter(|s| s.label("job") == Some("shop"))
        .collect();
    assert!(!pushed.is_empty(), "scraped profiles reach Pyroscope");
    for series in &pushed {
        assert_eq!(series.label("service_name"), Some("shop"));
        assert_eq!(series.label("__delta__"), Some("false"));
    }
    assert!(pushed.iter().any(|s| {
        s.label("__name__") == Some("memory")
            && s.profiles
                .iter()
                .flat_map(|p| &p.samples)
                .any(|x| x.contains(ALLOCATE))
    }));
}
