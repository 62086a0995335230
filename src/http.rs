//! The agent's own HTTP endpoints on `--http-address`: `/healthz` (the
//! process serves), `/readyz` (it samples and its sinks deliver),
//! Prometheus `/metrics` of every part's counters, and the pull endpoint
//! `/debug/pprof/profile?seconds=N` (see `pull`).

use std::{
    fmt::Write,
    sync::{Arc, Mutex, atomic::Ordering::Relaxed},
};

use axum::{
    Router,
    extract::{RawQuery, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use icecore_otlp::{
    ExportStats, PprofDirStats,
    receive::{Outcome, ReceiverStats},
};
use icecore_receiver::{Counter, ProfilerStats, profiler::RuntimeState, runtimes::RuntimeStats};
use tracing::info;

use crate::flame_page::{self, FlameHistory};
use crate::http_access::{self, Access};
use crate::otlp_listen::ReceiverMetrics;
use crate::pull::{PullError, PullHub};
use crate::serve::{self, ListenerLimits};

/// What `/metrics` reports on.
#[derive(Clone)]
pub struct Sources {
    /// The profiler's totals.
    pub profiler: Arc<Mutex<ProfilerStats>>,
    /// The OTLP exporter's counters, when one is configured.
    pub otlp: Option<Arc<ExportStats>>,
    /// The Parca exporter's counters, when one is configured.
    pub parca: Option<Arc<ExportStats>>,
    /// The Pyroscope exporter's counters, when one is configured.
    pub pyroscope: Option<Arc<ExportStats>>,
    /// The OTLP receiver's counters, when it runs.
    pub receiver: Option<ReceiverMetrics>,
    /// Batches for `/debug/pprof/profile`.
    pub pull: Arc<PullHub>,
    /// The flame graph page's history, when it is on.
    pub flame: Option<Arc<FlameHistory>>,
    /// The pprof directory's retention, when pprof files are written.
    pub pprof: Option<Arc<PprofDirStats>>,
    /// The self-traces exporter's counters, with `--self-traces`.
    pub self_traces: Option<Arc<crate::self_traces::SelfTraceStats>>,
    /// The scrape targets' counters (none without `scrape_configs`).
    pub scrape: Arc<crate::scrape::ScrapeStats>,
    /// Connections this endpoint refused at its limit.
    pub http_refused_connections: Arc<std::sync::atomic::AtomicU64>,
}

/// Serves the endpoints on `listener` (bound at start-up, before the BPF
/// programs load) until the runtime shuts down.
pub fn serve(listener: tokio::net::TcpListener, access: Access, stats: Sources) {
    let bound = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    let scheme = if access.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let token = if access.auth.is_required() {
        " (a bearer token required but on /healthz and /readyz)"
    } else {
        ""
    };
    info!(
        "serving /metrics, /healthz and /readyz on {scheme}://{bound} (and the flame graph page at /, /api/flamegraph, /debug/pprof/profile, /debug/pprof/symbol){token}"
    );
    if let Some(flame) = &stats.flame {
        flame.spawn_expiry();
    }
    let refused = stats.http_refused_connections.clone();
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/debug/pprof/profile", get(pprof_profile))
        .route(
            "/debug/pprof/symbol",
            get(pprof_symbol_count).post(pprof_symbol_lookup),
        )
        .with_state(stats.clone())
        .merge(flame_page::routes(stats.flame.clone()));
    let auth = access.auth;
    serve::spawn(
        listener,
        access.tls,
        ListenerLimits::default(),
        refused,
        "HTTP endpoint",
        move |request: hyper::Request<hyper::body::Incoming>| {
            let app = app.clone();
            let allowed = http_access::allowed(&auth, &request);
            async move {
                if !allowed {
                    return (
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer")],
                        "a bearer token is required\n",
                    )
                        .into_response();
                }
                match tower::ServiceExt::oneshot(app, request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                }
            }
        },
    );
}

/// `GET /readyz`: 200 once sampling produced its first batch while no
/// sink's last export failed, else 503 with one line per reason (a
/// DaemonSet's readiness probe; `/healthz` stays 200 meanwhile, so that a
/// backend being down does not restart the agent).
async fn readyz(State(sources): State<Sources>) -> Response {
    let mut unready = Vec::new();
    let batches = sources.profiler.lock().map_or(0, |stats| stats.batches);
    if batches == 0 {
        unready.push("sampling: no batch produced yet".to_owned());
    }
    for (sink, stats) in [
        ("otlp", &sources.otlp),
        ("parca", &sources.parca),
        ("pyroscope", &sources.pyroscope),
    ] {
        if stats
            .as_ref()
            .is_some_and(|s| s.last_export_failed.load(Relaxed))
        {
            unready.push(format!("{sink}: the last export failed"));
        }
    }
    if unready.is_empty() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready:\n{}\n", unready.join("\n")),
        )
            .into_response()
    }
}

/// `GET /debug/pprof/symbol`, as Go's net/http/pprof answers it: symbol
/// look-ups are served.
async fn pprof_symbol_count() -> &'static str {
    "num_symbols: 1\n"
}

/// `POST /debug/pprof/symbol` with `0xADDR+0xADDR…`: what `go tool pprof`
/// asks for the addresses of a pulled profile that have no function. The
/// answer names each address it knows as `0xADDR NAME`; icecore's profiles
/// are symbolized on the host already, and an address left unnamed there
/// (a stripped file, JIT code) has no name here either, so every address
/// is answered by omission and the client keeps it as an address.
async fn pprof_symbol_lookup(body: axum::body::Bytes) -> Response {
    const MAX_QUERY: usize = 1 << 20;
    if body.len() > MAX_QUERY {
        return (StatusCode::PAYLOAD_TOO_LARGE, "too many addresses\n").into_response();
    }
    let well_formed = body
        .split(|&b| b == b'+')
        .filter(|a| !a.is_empty())
        .all(|a| a.trim_ascii().starts_with(b"0x"));
    if !well_formed {
        return (
            StatusCode::BAD_REQUEST,
            "expected addresses like 0x4a5b+0x4a7c\n",
        )
            .into_response();
    }
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "").into_response()
}

async fn pprof_profile(State(sources): State<Sources>, RawQuery(query): RawQuery) -> Response {
    let seconds = query
        .as_deref()
        .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("seconds=")));
    match sources.pull.profile(seconds).await {
        Ok(gzipped) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"profile\"",
                ),
            ],
            gzipped,
        )
            .into_response(),
        Err(e) => {
            let status = match e {
                PullError::BadSeconds => StatusCode::BAD_REQUEST,
                PullError::Busy => StatusCode::TOO_MANY_REQUESTS,
                PullError::NoData | PullError::Lagged => StatusCode::SERVICE_UNAVAILABLE,
                PullError::Encode(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (status, format!("{e}\n")).into_response()
        }
    }
}

async fn metrics(State(sources): State<Sources>) -> impl IntoResponse {
    let snapshot = sources
        .profiler
        .lock()
        .map(|s| s.clone())
        .unwrap_or_default();
    let mut text = render(&snapshot);
    if let Some(otlp) = &sources.otlp {
        render_export(&mut text, "otlp", otlp);
    }
    if let Some(pyroscope) = &sources.pyroscope {
        render_export(&mut text, "pyroscope", pyroscope);
    }
    if let Some(parca) = &sources.parca {
        render_export(&mut text, "parca", parca);
    }
    if let Some(receiver) = &sources.receiver {
        render_receiver(&mut text, receiver);
    }
    crate::scrape::render(&mut text, &sources.scrape);
    if let Some(traces) = &sources.self_traces {
        for (name, help, value) in [
            (
                "sent_spans_total",
                "icecore's own spans an OTLP endpoint accepted (--self-traces).",
                &traces.sent_spans,
            ),
            (
                "dropped_spans_total",
                "icecore's own spans dropped: hand-over queue full or export failed.",
                &traces.dropped_spans,
            ),
        ] {
            let _ = writeln!(
                text,
                "# HELP icecore_self_traces_{name} {help}\n# TYPE icecore_self_traces_{name} counter\nicecore_self_traces_{name} {}",
                value.load(Relaxed)
            );
        }
    }
    if let Some(pprof) = &sources.pprof {
        for (name, help, value) in [
            (
                "icecore_pprof_removed_files_total",
                "pprof files removed, oldest first, to keep the directory within its retention.",
                &pprof.removed_files,
            ),
            (
                "icecore_pprof_removed_bytes_total",
                "Bytes of the pprof files removed for retention.",
                &pprof.removed_bytes,
            ),
        ] {
            let _ = writeln!(
                text,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                value.load(Relaxed)
            );
        }
    }
    if let Some(flame) = &sources.flame {
        render_flame_history(&mut text, flame);
    }
    let refused = sources.http_refused_connections.load(Relaxed);
    let _ = writeln!(
        text,
        "# HELP icecore_http_refused_connections_total Connections to this endpoint closed at once because it had its maximum open.\n# TYPE icecore_http_refused_connections_total counter\nicecore_http_refused_connections_total {refused}"
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// The flame graph page's history: its memory against its limit, and what
/// it dropped.
fn render_flame_history(out: &mut String, flame: &FlameHistory) {
    let stats = flame.stats();
    for (name, kind, help, value) in [
        (
            "icecore_flamegraph_history_bytes",
            "gauge",
            "Heap the flame graph page's history holds (estimate).",
            stats.bytes.load(Relaxed),
        ),
        (
            "icecore_flamegraph_history_limit_bytes",
            "gauge",
            "The history's memory limit (--flamegraph-max-bytes).",
            flame.max_bytes(),
        ),
        (
            "icecore_flamegraph_history_intervals",
            "gauge",
            "Reporting intervals (batches) the history holds.",
            stats.slots.load(Relaxed),
        ),
        (
            "icecore_flamegraph_history_stacks",
            "gauge",
            "Distinct stacks the history holds.",
            stats.stacks.load(Relaxed),
        ),
        (
            "icecore_flamegraph_history_rejected_batches_total",
            "counter",
            "Batches not kept: alone larger than the history's memory limit.",
            stats.rejected_batches.load(Relaxed),
        ),
        (
            "icecore_flamegraph_history_compactions_total",
            "counter",
            "Times the history's tables were rebuilt after intervals were dropped.",
            stats.compactions.load(Relaxed),
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
    let name = "icecore_flamegraph_history_evicted_intervals_total";
    let _ = writeln!(
        out,
        "# HELP {name} Intervals dropped from the history, oldest first, by reason.\n# TYPE {name} counter\n{name}{{reason=\"age\"}} {}\n{name}{{reason=\"memory\"}} {}",
        stats.evicted_by_age.load(Relaxed),
        stats.evicted_by_memory.load(Relaxed)
    );
}

/// Prometheus text exposition of the OTLP receiver's counters.
fn render_receiver(out: &mut String, receiver: &ReceiverMetrics) {
    let stats: &ReceiverStats = &receiver.stats;
    let _ = writeln!(
        out,
        "# HELP icecore_receiver_requests_total OTLP requests received, by outcome.\n# TYPE icecore_receiver_requests_total counter"
    );
    for outcome in Outcome::ALL {
        let _ = writeln!(
            out,
            "icecore_receiver_requests_total{{outcome=\"{}\"}} {}",
            outcome.name(),
            stats.requests(outcome)
        );
    }
    let scalars = [
        (
            "icecore_receiver_samples_total",
            "counter",
            "Samples in accepted OTLP requests.",
            stats.accepted_samples.load(Relaxed),
        ),
        (
            "icecore_receiver_memory_bytes",
            "gauge",
            "Memory held by received requests (read, decoded or waiting for the sinks).",
            receiver.budget.used() as u64,
        ),
        (
            "icecore_receiver_memory_limit_bytes",
            "gauge",
            "The receiver's memory budget.",
            receiver.budget.limit() as u64,
        ),
        (
            "icecore_receiver_refused_connections_total",
            "counter",
            "Connections to the receiver closed at once because it had its maximum open.",
            receiver.refused_connections.load(Relaxed),
        ),
    ];
    for (name, kind, help, value) in scalars {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
}

/// Prometheus text exposition of an exporter's counters, as
/// `icecore_{sink}_…`.
fn render_export(out: &mut String, sink: &str, stats: &ExportStats) {
    let _ = writeln!(
        out,
        "# HELP icecore_{sink}_dropped_samples_total Samples the exporter could not deliver, by reason.\n# TYPE icecore_{sink}_dropped_samples_total counter"
    );
    for (reason, counter) in [
        ("queue_full", &stats.dropped_queue_full),
        ("retries_exhausted", &stats.dropped_retries_exhausted),
        ("rejected", &stats.dropped_rejected),
        ("shutdown", &stats.dropped_at_shutdown),
    ] {
        let _ = writeln!(
            out,
            "icecore_{sink}_dropped_samples_total{{reason=\"{reason}\"}} {}",
            counter.load(Relaxed)
        );
    }
    let scalars = [
        (
            "sent_requests_total",
            "counter",
            "Requests the endpoint accepted.",
            &stats.sent_requests,
        ),
        (
            "sent_samples_total",
            "counter",
            "Samples in accepted requests.",
            &stats.sent_samples,
        ),
        (
            "rejected_profiles_total",
            "counter",
            "Profiles the endpoint reported rejected (partial success).",
            &stats.rejected_profiles,
        ),
        (
            "dropped_requests_total",
            "counter",
            "Requests dropped (queue full, refused, retries exhausted, unsent at shutdown).",
            &stats.dropped_requests,
        ),
        (
            "retries_total",
            "counter",
            "Export attempts repeated after a transient failure.",
            &stats.retries,
        ),
        (
            "queue_requests",
            "gauge",
            "Requests waiting to be sent.",
            &stats.queued_requests,
        ),
        (
            "queue_bytes",
            "gauge",
            "Encoded bytes of the requests waiting to be sent.",
            &stats.queued_bytes,
        ),
    ];
    for (name, kind, help, value) in scalars {
        let _ = writeln!(
            out,
            "# HELP icecore_{sink}_{name} {help}\n# TYPE icecore_{sink}_{name} {kind}\nicecore_{sink}_{name} {}",
            value.load(Relaxed)
        );
    }
}

/// Prometheus text exposition of the profiler's totals.
fn render(stats: &ProfilerStats) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP icecore_bpf_events_total Outcomes of the BPF sampling programs, by counter.\n# TYPE icecore_bpf_events_total counter"
    );
    for counter in Counter::ALL {
        let _ = writeln!(
            out,
            "icecore_bpf_events_total{{counter=\"{}\"}} {}",
            counter.name(),
            stats.counters.get(counter)
        );
    }
    if let Some(off_cpu) = &stats.off_cpu {
        crate::off_cpu_metrics::render(&mut out, off_cpu);
    }
    let native = &stats.native;
    let scalars: [(&str, &str, &str, f64); 25] = [
        (
            "icecore_execs_total",
            "counter",
            "Execs of profiled processes whose new image was read right after.",
            stats.execs as f64,
        ),
        (
            "icecore_execs_gone_total",
            "counter",
            "Execs whose process was gone before its image could be read.",
            stats.execs_gone as f64,
        ),
        (
            "icecore_exec_events_dropped_total",
            "counter",
            "Exec and exit events dropped because the profiler fell behind.",
            stats.exec_events_dropped as f64,
        ),
        (
            "icecore_samples_reported_total",
            "counter",
            "Samples put into batches.",
            stats.samples_reported as f64,
        ),
        (
            "icecore_samples_dropped_total",
            "counter",
            "Samples dropped at the per-interval limit.",
            stats.samples_dropped as f64,
        ),
        (
            "icecore_samples_relabel_dropped_total",
            "counter",
            "Samples relabeling by thread or CPU (__meta_thread_*, __meta_cpuid) dropped.",
            stats.samples_relabel_dropped as f64,
        ),
        (
            "icecore_samples_excluded_total",
            "counter",
            "Samples of processes relabeling excluded, taken before BPF skipped them.",
            stats.samples_excluded as f64,
        ),
        (
            "icecore_malformed_records_total",
            "counter",
            "Ring-buffer records that failed to decode.",
            stats.malformed_records as f64,
        ),
        (
            "icecore_batches_total",
            "counter",
            "Batches produced.",
            stats.batches as f64,
        ),
        (
            "icecore_processes_tracked",
            "gauge",
            "Processes currently tracked.",
            stats.processes_tracked as f64,
        ),
        (
            "icecore_bpf_run_time_seconds_total",
            "counter",
            "Kernel-measured time in the BPF programs.",
            stats.bpf_cost.run_time_ns as f64 / 1e9,
        ),
        (
            "icecore_bpf_runs_total",
            "counter",
            "Runs of the BPF entry program.",
            stats.bpf_cost.run_count as f64,
        ),
        (
            "icecore_unwind_tables_installed",
            "gauge",
            "Unwind tables in BPF maps.",
            native.tables_installed as f64,
        ),
        (
            "icecore_unwind_table_bytes",
            "gauge",
            "Bytes of unwind table rows in BPF maps.",
            native.table_bytes_installed as f64,
        ),
        (
            "icecore_bpf_map_bytes",
            "gauge",
            "Kernel memory of icecore's BPF maps, inner maps included.",
            stats.bpf_map_bytes as f64,
        ),
        (
            "icecore_processes_described",
            "gauge",
            "Processes with a mapping table in BPF.",
            native.processes_described as f64,
        ),
        (
            "icecore_unwind_tables_built_total",
            "counter",
            "Unwind tables built.",
            native.tables_built as f64,
        ),
        (
            "icecore_unwind_tables_unusable_total",
            "counter",
            "Files without a usable unwind table.",
            native.tables_unusable as f64,
        ),
        (
            "icecore_unwind_map_update_failures_total",
            "counter",
            "Failed updates of the unwinder's BPF maps.",
            native.map_update_failures as f64,
        ),
        (
            "icecore_unwind_tables_over_budget_total",
            "counter",
            "Unwind tables left out of BPF because the memory budget was spent by tables sampled in the last 5 s.",
            native.tables_over_budget as f64,
        ),
        (
            "icecore_unwind_tables_evicted_total",
            "counter",
            "Unwind tables taken out of BPF to make room, least recently sampled first.",
            native.tables_evicted as f64,
        ),
        (
            "icecore_unwind_tables_readmitted_total",
            "counter",
            "Unwind tables put back into BPF after a sample went through their file.",
            native.tables_readmitted as f64,
        ),
        (
            "icecore_process_mappings_left_out",
            "gauge",
            "Executable mappings left out of processes' BPF mapping tables (each holds 256) now; the least recently sampled leave first.",
            native.mappings_left_out as f64,
        ),
        (
            "icecore_process_mappings_sampled_left_out_total",
            "counter",
            "Times a sample went through a mapping left out of its process's mapping table, which brings it back.",
            native.mappings_sampled_left_out as f64,
        ),
        (
            "icecore_unwind_table_budget_bytes",
            "gauge",
            "Bytes of unwind table rows BPF may hold (--unwind-table-memory).",
            native.table_budget_bytes as f64,
        ),
    ];
    for (name, kind, help, value) in scalars {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
    render_runtimes(&mut out, &stats.runtimes, &stats.runtime_states);
    out
}

/// A metric family of the runtime plugins: name, type, help, value.
type RuntimeFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&RuntimeStats) -> u64,
);

fn render_runtimes(
    out: &mut String,
    plugins: &[(&str, RuntimeStats)],
    states: &[(&str, RuntimeState)],
) {
    let _ = writeln!(
        out,
        "# HELP icecore_runtime_up Whether a runtime's unwinder runs (0: turned off, or it failed to start; see the log).\n# TYPE icecore_runtime_up gauge"
    );
    for (runtime, state) in states {
        let state_label = match state {
            RuntimeState::Running => "running",
            RuntimeState::Disabled => "disabled",
            RuntimeState::Failed(_) => "failed",
        };
        let _ = writeln!(
            out,
            "icecore_runtime_up{{runtime=\"{runtime}\",state=\"{state_label}\"}} {}",
            u8::from(*state == RuntimeState::Running)
        );
    }
    let families: [RuntimeFamily; 4] = [
        (
            "icecore_runtime_processes",
            "gauge",
            "Processes a runtime's plugin describes.",
            |s| s.processes as u64,
        ),
        (
            "icecore_runtime_attach_failures_total",
            "counter",
            "Runtimes found in a process but not describable (version, symbols, map update).",
            |s| s.attach_failures,
        ),
        (
            "icecore_runtime_frames_total",
            "counter",
            "Runtime frames symbolized.",
            |s| s.frames,
        ),
        (
            "icecore_runtime_frame_errors_total",
            "counter",
            "Runtime frames whose data (a code object, a symbol) could not be read.",
            |s| s.frame_errors,
        ),
    ];
    for (name, kind, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (runtime, stats) in plugins {
            let _ = writeln!(out, "{name}{{runtime=\"{runtime}\"}} {}", value(stats));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_counter() {
        let mut stats = ProfilerStats::default();
        stats.counters.0[Counter::Emitted as usize] = 42;
        stats.samples_reported = 40;
        let text = render(&stats);
        assert!(text.contains("icecore_bpf_events_total{counter=\"emitted\"} 42"));
        assert!(text.contains("icecore_samples_reported_total 40"));
        for counter in Counter::ALL {
            assert!(text.contains(&format!("counter=\"{}\"", counter.name())));
        }
    }

    #[test]
    fn renders_runtime_counts_and_states() {
        let stats = ProfilerStats {
            runtimes: vec![(
                "cpython",
                RuntimeStats {
                    processes: 2,
                    frames: 9,
                    ..Default::default()
                },
            )],
            runtime_states: vec![
                ("cpython", RuntimeState::Running),
                ("perf-map", RuntimeState::Failed("rejected".into())),
            ],
            ..Default::default()
        };
        let text = render(&stats);
        assert!(text.contains("icecore_runtime_processes{runtime=\"cpython\"} 2"));
        assert!(text.contains("icecore_runtime_frames_total{runtime=\"cpython\"} 9"));
        assert!(text.contains("icecore_runtime_up{runtime=\"cpython\",state=\"running\"} 1"));
        assert!(text.contains("icecore_runtime_up{runtime=\"perf-map\",state=\"failed\"} 0"));
    }

    #[test]
    fn renders_export_counters() {
        let stats = ExportStats::default();
        stats.sent_samples.store(7, Relaxed);
        stats.dropped_queue_full.store(3, Relaxed);
        let mut text = String::new();
        render_export(&mut text, "otlp", &stats);
        assert!(text.contains("icecore_otlp_sent_samples_total 7"), "{text}");
        assert!(
            text.contains("icecore_otlp_dropped_samples_total{reason=\"queue_full\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE icecore_otlp_queue_bytes gauge"),
            "{text}"
        );
    }
}
