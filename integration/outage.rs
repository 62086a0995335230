// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! Outages of the push endpoints (OTLP, Parca, Pyroscope), end to end: the
//! real `icecore` profiles a fixture while its three endpoints are down, and
//! what arrives once they are up is decoded by the tests' own decoders and
//! compared with the pprof files the same run wrote (a sink no outage
//! touches) and with the fixture's CPU time at the sampling frequency.
//!
//! Three agents run at once on the same fixture, so the three cases take
//! the time of one:
//!
//! - `down`: every endpoint down for the outage (60 s; `ICECORE_OUTAGE_SECS`
//!   sets it), then up: every sample arrives at every sink, none dropped.
//! - `bounded`: the same outage with a queue bound a few requests hold:
//!   the drops are counted, all as `queue_full`, and received + dropped =
//!   taken for every sink.
//! - `slow`: every endpoint answers each request after 1 s, from the
//!   start: sampling goes on as if they were fast.
//!
//! Needs root (it loads BPF programs); without root it prints why it is
//! skipped and passes. The long form, whose figures go into BENCHMARKS.md:
//!
//!     ICECORE_OUTAGE_SECS=600 sudo -E cargo test --release --test integration -- outage:: --nocapture

use crate::support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::fixture::CpuTracker;
use support::metrics::Metrics;
use support::net::HeldPort;
use support::parca::ParcaStore;
use support::pyroscope::PyroscopeServer;
use support::receiver::OtlpReceiver;
use support::run::{EXIT_GRACE, REPORTER_INTERVAL, Target, base_args_at, duration_args, s};
use support::summary::total;
use support::{HZ, Icecore, otlp, pprof, require_root, serial};

/// The push sinks, as `/metrics` and the final log line name them.
const SINKS: [&str; 3] = ["otlp", "parca", "pyroscope"];
/// The outage of the short form, in seconds.
const DEFAULT_OUTAGE_SECS: u64 = 60;
/// How long the agents run once the endpoints are up: the longest backoff
/// (30 s) and a margin, so that the queues drain while `/metrics` answers.
const AFTER: Duration = Duration::from_secs(45);
/// How long the slow endpoints take to answer each request.
const SLOW: Duration = Duration::from_secs(1);
/// The `bounded` agent's queue bound: a few of the fixture's requests
/// (about 2 KiB each every 2 s), far fewer than an outage makes.
const TINY_QUEUE: &str = "8KiB";

fn outage() -> Duration {
    let secs = match std::env::var("ICECORE_OUTAGE_SECS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("ICECORE_OUTAGE_SECS={v:?}: {e}")),
        Err(_) => DEFAULT_OUTAGE_SECS,
    };
    Duration::from_secs(secs)
}

/// One agent's three endpoints, down until [`Servers::start`].
struct Endpoints {
    otlp: HeldPort,
    parca: HeldPort,
    pyroscope: HeldPort,
}

impl Endpoints {
    fn reserve() -> Endpoints {
        Endpoints {
            otlp: HeldPort::hold(),
            parca: HeldPort::hold(),
            pyroscope: HeldPort::hold(),
        }
    }

    fn args(&self) -> Vec<String> {
        vec![
            s("--otlp-endpoint"),
            format!("http://{}", self.otlp.address),
            s("--parca-endpoint"),
            format!("http://{}", self.parca.address),
            s("--pyroscope-endpoint"),
            format!("http://{}", self.pyroscope.address),
        ]
    }
}

/// The three test endpoints of one agent, serving.
struct Servers {
    otlp: OtlpReceiver,
    parca: ParcaStore,
    _parca_runtime: tokio::runtime::Runtime,
    pyroscope: PyroscopeServer,
}

impl Servers {
    /// Serves on `endpoints`, answering each request `delay` after it came.
    fn start(endpoints: &mut Endpoints, delay: Duration) -> Servers {
        let otlp = OtlpReceiver::start_slow_with(endpoints.otlp.listen(), delay);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let parca = ParcaStore {
            delay,
            ..ParcaStore::default()
        };
        support::parca::serve_with(parca.clone(), &runtime, endpoints.parca.listen());
        let pyroscope = PyroscopeServer::start_slow_with(endpoints.pyroscope.listen(), delay);
        Servers {
            otlp,
            parca,
            _parca_runtime: runtime,
            pyroscope,
        }
    }

    /// The samples each sink received, decoded, in [`SINKS`] order.
    fn received(&self) -> [u64; 3] {
        let otlp = total(&otlp::receive_valid(self.otlp.requests(), HZ).samples);
        let parca = total(&support::parca::samples(
            &self.parca.requests.lock().unwrap(),
        ));
        let pyroscope = total(&crate::pyroscope::pushed_samples(&self.pyroscope.pushes()));
        [otlp, parca, pyroscope]
    }
}

/// One `icecore` with the three push sinks and a pprof directory.
struct Agent {
    name: &'static str,
    icecore: Icecore,
    endpoints: Endpoints,
    pprof_dir: PathBuf,
    /// When it logged that sampling started (Unix ns).
    sampling_from: u64,
}

impl Agent {
    fn spawn(
        name: &'static str,
        target: &Target,
        endpoints: Endpoints,
        extra: &[String],
        run: Duration,
    ) -> Agent {
        let dir = target.make_subdir(name);
        let pprof_dir = dir.join("pprof");
        let mut args = base_args_at(target.pid(), HZ);
        args.extend(endpoints.args());
        args.extend([s("--pprof-dir"), s(pprof_dir.display())]);
        args.extend(extra.iter().cloned());
        args.extend(duration_args(run));
        Agent {
            name,
            icecore: Icecore::spawn(&args, &dir),
            endpoints,
            pprof_dir,
            sampling_from: 0,
        }
    }

    fn wait_sampling(&mut self) {
        self.icecore
            .wait_for_log("sampling started", Duration::from_secs(90));
        self.sampling_from = support::now_unix_nanos();
    }

    /// The samples it took: those of its pprof files.
    fn taken(&self) -> (u64, usize) {
        let written = pprof::read_valid(&self.pprof_dir, HZ);
        (total(&written.samples), written.profiles.len())
    }

    /// `{sink}_samples_dropped` of its final log line.
    fn dropped(&self, sink: &str) -> u64 {
        let field = format!("{sink}_samples_dropped");
        self.icecore.stopped_field(&field).unwrap_or_else(|| {
            panic!(
                "{}: no {field}= in the final line\n{}",
                self.name,
                self.icecore.logs()
            )
        })
    }

    /// Asserts that it took the samples the fixture's CPU time predicts
    /// (a CPU-bound fixture gets HZ samples per CPU second, however busy
    /// the host), that user space got every one BPF emitted, and returns
    /// the samples taken.
    fn assert_took_every_sample(&self, cpu: &CpuTracker) -> u64 {
        let (taken, files) = self.taken();
        let exited = self.icecore.exited_unix_nanos();
        let expected = HZ as f64 * cpu.cpu_seconds_between(self.sampling_from, exited);
        println!(
            "{}: took {taken} samples in {files} pprof files; the fixture's CPU time predicts {expected:.0}",
            self.name
        );
        // One second of samples' slack for the instants the test reads
        // (start from a log line it polls for, end at exit).
        assert!(
            taken as f64 >= 0.9 * expected - HZ as f64
                && taken as f64 <= 1.05 * expected + HZ as f64,
            "{}: took {taken} samples, the fixture's CPU time predicts {expected:.0}",
            self.name
        );
        let reported = self.icecore.assert_every_emitted_sample_reported();
        assert_eq!(reported, taken, "{}: reported and written", self.name);
        taken
    }
}

/// A metric of `sink`: `icecore_{sink}_{name}`.
fn sink_value(m: &Metrics, sink: &str, name: &str) -> u64 {
    m.value(&format!("icecore_{sink}_{name}")) as u64
}

fn dropped_by(m: &Metrics, sink: &str, reason: &str) -> u64 {
    sink_value(
        m,
        sink,
        &format!("dropped_samples_total{{reason=\"{reason}\"}}"),
    )
}

const REASONS: [&str; 4] = ["queue_full", "retries_exhausted", "rejected", "shutdown"];

#[test]
fn samples_survive_outages_bounds_and_slow_endpoints() {
    const TEST: &str = "samples_survive_outages_bounds_and_slow_endpoints";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let outage = outage();
    let run = outage + AFTER;
    // The fixture's own time limit (a guard should the test die) must
    // outlast the long form.
    let lifetime = (run + EXIT_GRACE + Duration::from_secs(120)).as_secs();
    let tmp = support::tmp();
    let exe = support::fixture::build(tmp.path());
    let target = Target::start_exe(tmp, &exe, &[lifetime.to_string()]);
    let cpu = CpuTracker::start(target.pid());
    let token_file = target.dir().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();

    let mut slow_endpoints = Endpoints::reserve();
    let slow_servers = Servers::start(&mut slow_endpoints, SLOW);
    let credentials = [
        s("--otlp-header"),
        s("X-Scope-OrgID=team-a"),
        s("--otlp-bearer-token-file"),
        s(token_file.display()),
    ];
    let mut down = Agent::spawn("down", &target, Endpoints::reserve(), &credentials, run);
    let bound = [s("--export-queue-bytes"), s(TINY_QUEUE)];
    let mut bounded = Agent::spawn("bounded", &target, Endpoints::reserve(), &bound, run);
    let mut slow = Agent::spawn("slow", &target, slow_endpoints, &[], run);
    for agent in [&mut down, &mut bounded, &mut slow] {
        agent.wait_sampling();
    }
    // The outage counts from the last agent's first sample; each agent's
    // `--duration` counts from its own, a few seconds earlier at most.
    let started = Instant::now();
    std::thread::sleep(outage.saturating_sub(Duration::from_secs(1)));
    // The state at the end of the outage: batches queued, nothing dropped
    // within the bound, the slow endpoints served without a retry.
    let at_end = down.icecore.metrics();
    let slow_at_end = slow.icecore.metrics();
    std::thread::sleep(outage.saturating_sub(started.elapsed()));
    let up = Servers::start(&mut down.endpoints, Duration::ZERO);
    let bounded_up = Servers::start(&mut bounded.endpoints, Duration::ZERO);
    let down_for = started.elapsed();
    let batches_in_outage = (outage.as_secs() / REPORTER_INTERVAL.as_secs()).saturating_sub(2);
    for sink in SINKS {
        let (requests, bytes) = (
            sink_value(&at_end, sink, "queue_requests"),
            sink_value(&at_end, sink, "queue_bytes"),
        );
        // The figure BENCHMARKS.md and the README quote.
        println!(
            "down: {sink} queue 1 s before the end of a {down_for:?} outage: {requests} requests, \
             {bytes} bytes ({:.0} bytes a minute)",
            bytes as f64 / requests.max(1) as f64 * 60.0 / REPORTER_INTERVAL.as_secs_f64()
        );
        // The request in hand, being retried, is not in the queue.
        assert!(
            requests + 1 >= batches_in_outage,
            "down: {sink} queued only {requests} requests over the outage"
        );
        for reason in REASONS {
            assert_eq!(
                dropped_by(&at_end, sink, reason),
                0,
                "down: {sink} {reason}"
            );
        }
        assert!(
            sink_value(&slow_at_end, sink, "sent_requests_total") > 0,
            "slow: nothing reached {sink}"
        );
        assert_eq!(
            sink_value(&slow_at_end, sink, "retries_total"),
            0,
            "slow: {sink} retried: 1 s answers are within the timeout"
        );
    }
    assert_eq!(
        slow_at_end.bpf_event("ring_buffer_full"),
        0,
        "slow: ring full"
    );

    // Once the bounded agent's queues are empty again, its drops are final.
    let (_, drained) = bounded.icecore.wait_for_metrics(
        "the bounded agent's queues drained",
        AFTER - Duration::from_secs(5),
        |m| {
            SINKS.iter().all(|sink| {
                sink_value(m, sink, "sent_requests_total") > 0
                    && sink_value(m, sink, "queue_requests") == 0
            })
        },
    );
    for agent in [&mut down, &mut bounded, &mut slow] {
        agent.icecore.wait_success(AFTER + EXIT_GRACE);
    }

    // Down: every sample taken arrived at every sink, none dropped.
    let taken = down.assert_took_every_sample(&cpu);
    let (_, files) = down.taken();
    assert_eq!(
        up.otlp.requests().len(),
        files,
        "down: OTLP requests, pprof files"
    );
    let received = up.received();
    println!("down: received {received:?} of {taken} samples (OTLP, Parca, Pyroscope)");
    for (sink, got) in SINKS.iter().zip(received) {
        assert_eq!(got, taken, "down: {sink} lost samples over the outage");
        assert_eq!(down.dropped(sink), 0, "down: {sink} dropped samples");
    }
    let logs = down.icecore.logs();
    assert!(logs.contains("retrying"), "down: no retry was logged");
    assert!(
        !logs.contains("s3cret-token"),
        "down: the token leaked into the logs"
    );
    // The configured headers go with the retried requests too.
    for request in up.otlp.requests() {
        let header = |name: &str| {
            request
                .headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(header("x-scope-orgid"), Some("team-a"));
        assert_eq!(header("authorization"), Some("Bearer s3cret-token"));
    }

    // Bounded: what did not arrive was dropped and counted, as queue_full.
    let taken = bounded.assert_took_every_sample(&cpu);
    let received = bounded_up.received();
    for (sink, got) in SINKS.iter().zip(received) {
        let dropped = bounded.dropped(sink);
        println!(
            "bounded ({TINY_QUEUE}): {sink} received {got}, dropped {dropped} of {taken} samples"
        );
        assert!(dropped > 0, "bounded: {sink} dropped nothing");
        assert_eq!(
            got + dropped,
            taken,
            "bounded: {sink} lost samples silently"
        );
        assert_eq!(
            dropped_by(&drained, sink, "queue_full"),
            dropped,
            "bounded: {sink} dropped for another reason"
        );
        for reason in &REASONS[1..] {
            assert_eq!(
                dropped_by(&drained, sink, reason),
                0,
                "bounded: {sink} {reason}"
            );
        }
    }

    // Slow: sampling went on as with fast endpoints, and nothing was lost.
    let taken = slow.assert_took_every_sample(&cpu);
    let (_, files) = slow.taken();
    let interval_batches = run.as_secs() / REPORTER_INTERVAL.as_secs();
    assert!(
        files as u64 + 2 >= interval_batches,
        "slow: {files} batches in {run:?}: the drain loop fell behind"
    );
    let received = slow_servers.received();
    println!("slow: received {received:?} of {taken} samples");
    for (sink, got) in SINKS.iter().zip(received) {
        assert_eq!(got, taken, "slow: {sink} lost samples");
        assert_eq!(slow.dropped(sink), 0, "slow: {sink} dropped samples");
    }
}
