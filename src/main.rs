//! icecore: a continuous eBPF CPU profiler exporting OTLP Profiles and pprof.
//!
//! The binary only wires the eBPF source (`icecore-receiver`) to the sinks
//! (`icecore-otlp`) according to the settings (`icecore-config`).

mod allocator;
mod flame_page;
mod http;
mod http_access;
mod labeler;
mod logging;
mod off_cpu_metrics;
mod otlp_listen;
mod privileges;
mod pull;
mod scrape;
mod self_traces;
mod serve;
mod shutdown;
mod sinks;

use std::{process::ExitCode, sync::Arc};

use anyhow::Context;
use icecore_config::{Config, ConfigError};
use icecore_receiver::{CpuProfiler, OffCpuOptions, ProfilerOptions, SamplerOptions};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// Batches waiting for the sinks; the source blocks (and keeps aggregating)
/// when the sinks fall this far behind.
const BATCH_QUEUE: usize = 4;

fn main() -> ExitCode {
    allocator::tune();
    let config = match Config::from_args(std::env::args_os()) {
        Ok(config) => config,
        Err(ConfigError::Cli(e)) => e.exit(),
        Err(e) => {
            eprintln!("icecore: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("icecore: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The traces exporter's sender is a task: started inside the runtime
    // (a dry run only checks that it has somewhere to go).
    let traces = match self_traces::endpoint(&config).and_then(|endpoint| {
        let _inside = runtime.enter();
        endpoint
            .filter(|_| !config.check_only)
            .map(|endpoint| {
                self_traces::start(
                    endpoint,
                    &config.otlp_headers,
                    &icecore_receiver::host::host_name(),
                )
            })
            .transpose()
    }) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("icecore: {e:#}");
            return ExitCode::from(2);
        }
    };
    logging::init(
        &config.log_level,
        config.log_format,
        traces.as_ref().map(|t| t.layer()),
    );
    if config.check_only {
        return match runtime.block_on(check_config(&config)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("icecore: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    let stats = traces.as_ref().map(|t| t.stats.clone());
    let result = runtime.block_on(run(config, stats));
    if let Some(traces) = traces {
        traces.finish(&runtime);
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--check-config`: the settings parsed and checked already; checks what
/// they name (TLS files, tokens, the pprof directory) the way a start
/// would, prints where profiles would go, and touches nothing. Needs no
/// privileges, so it runs wherever the config is written.
async fn check_config(config: &Config) -> anyhow::Result<()> {
    let mut lines = sinks::Sinks::check(config)?;
    lines.extend(scrape::Scrapers::check(&config.scrape_configs)?);
    if let Some(path) = &config.otlp_listen_bearer_token_file {
        sinks::read_token(path)
            .with_context(|| format!("--otlp-listen-bearer-token-file {}", path.display()))?;
    }
    http_access(config)?;
    if let Some(user) = &config.user {
        let user = privileges::User::lookup(user)?;
        lines.push(format!(
            "runs as {} (UID {}) after start-up",
            user.name, user.uid
        ));
    }
    if lines.is_empty() {
        lines.push("no sink configured: pprof files in the default directory".to_owned());
    }
    println!("icecore: the configuration is valid");
    for line in lines {
        println!("  {line}");
    }
    Ok(())
}

async fn run(
    config: Config,
    self_traces: Option<Arc<self_traces::SelfTraceStats>>,
) -> anyhow::Result<()> {
    info!(version = env!("CARGO_PKG_VERSION"), "icecore starting");
    // Before anything slow: a SIGTERM during start-up stops the agent
    // cleanly once it runs rather than killing it.
    let stop = shutdown::StopSignals::listen();
    // Before anything else: without privileges, nothing below can work, and
    // that is the one thing to tell the user.
    icecore_receiver::host::check_privileges()?;
    let sinks = sinks::Sinks::from_config(&config)?;
    for line in sinks.describe() {
        info!("{line}");
    }

    // The user, listeners, tokens and certificates before the BPF programs:
    // a missing user, a port in use or an unreadable file is reported
    // before anything is loaded.
    let mut user = config
        .user
        .as_deref()
        .map(privileges::User::lookup)
        .transpose()?;
    let http_access = http_access(&config)?;
    let http_listener = serve::bind(config.http_address, "--http-address").await?;
    let otlp_listener = match config.otlp_listen {
        Some(address) => {
            let auth = match &config.otlp_listen_bearer_token_file {
                Some(path) => icecore_otlp::receive::ReceiverAuth::bearer(
                    &sinks::read_token(path).with_context(|| {
                        format!("--otlp-listen-bearer-token-file {}", path.display())
                    })?,
                ),
                None => icecore_otlp::receive::ReceiverAuth::default(),
            };
            Some((serve::bind(address, "--otlp-listen").await?, auth))
        }
        None => None,
    };

    let mut sampler = SamplerOptions::new(config.sampling_frequency_hz, config.pids.clone());
    sampler
        .runtimes
        .retain(|name| config.runtimes.iter().any(|enabled| enabled == name));
    sampler.off_cpu = config.off_cpu.map(|off_cpu| OffCpuOptions {
        probability: off_cpu.probability.get(),
        min_duration: off_cpu.min_duration,
    });
    let mut options = ProfilerOptions::new(sampler, config.reporter_interval);
    options.wall_clock = config.wall_clock;
    options.symbolizer.max_debug_bytes = config.debug_info_memory_bytes;
    options.unwind_table_memory =
        usize::try_from(config.unwind_table_memory_bytes).unwrap_or(usize::MAX);
    if !config.relabel_configs.is_empty() || config.targets.filters() {
        options.labeler = Some(Arc::new(labeler::Relabeler::new(
            config.targets.clone(),
            config.relabel_configs.clone(),
        )));
    }
    options.kubernetes = kubernetes_options(&config);
    options.command_lines = config.command_line_attribute;
    options.docker_socket = match &config.docker_socket {
        Some(icecore_config::DockerSocket::Off) => None,
        Some(icecore_config::DockerSocket::Path(path)) => Some(path.clone()),
        None => {
            let default = std::path::Path::new(icecore_receiver::metadata::docker::DEFAULT_SOCKET);
            default.exists().then(|| default.to_path_buf())
        }
    };
    if let (Some(user), Some(socket)) = (user.as_mut(), &options.docker_socket) {
        // The Docker socket is root:docker 0660: the user reaches it
        // through that group rather than through CAP_DAC_OVERRIDE.
        if let Ok(meta) = std::fs::metadata(socket) {
            user.add_group(std::os::unix::fs::MetadataExt::gid(&meta));
        }
    }
    // Loading the programs and describing every running process.
    let profiler = tracing::info_span!("startup")
        .in_scope(|| CpuProfiler::start(&options))
        .context("cannot start sampling")?;
    // Everything needing more privilege is done: the programs are loaded
    // and attached, the perf events open, the listeners bound.
    let plan = privileges::Plan {
        user,
        keep_all: config.keep_capabilities,
    };
    let kept = privileges::lower(&plan).context("cannot lower privileges after start-up")?;
    info!(
        user = plan.user.as_ref().map_or("unchanged", |u| u.name.as_str()),
        capabilities = %if plan.keep_all {
            format!("all it had ({kept:#x}, --keep-capabilities)")
        } else {
            privileges::names(kept)
        },
        no_new_privs = !plan.keep_all,
        "privileges lowered"
    );
    if let (Some(user), Some(dir)) = (&plan.user, &config.pprof_dir) {
        privileges::check_writable(dir, &user.name)?;
    }
    let mut receiver = None;
    let received = match otlp_listener {
        Some((listener, auth)) => {
            let (tx, rx) = mpsc::channel(otlp_listen::FORWARD_QUEUE);
            receiver = Some(otlp_listen::serve(
                listener,
                auth,
                icecore_otlp::receive::ReceiverOptions {
                    memory_bytes: usize::try_from(config.otlp_listen_memory_bytes)
                        .unwrap_or(usize::MAX),
                    ..Default::default()
                },
                tx,
            ));
            Some(rx)
        }
        None => None,
    };
    let (scraped_tx, scraped_rx) = mpsc::channel(scrape::SCRAPED_QUEUE);
    let scrapers = scrape::Scrapers::start(&config.scrape_configs, &scraped_tx)?;
    drop(scraped_tx);
    http::serve(
        http_listener,
        http_access,
        http::Sources {
            profiler: profiler.stats(),
            otlp: sinks.otlp_stats(),
            parca: sinks.parca_stats(),
            pyroscope: sinks.pyroscope_stats(),
            receiver,
            pull: sinks.pull_hub(),
            flame: sinks.flame_history(),
            pprof: sinks.pprof_stats(),
            self_traces,
            scrape: scrapers.stats(),
            http_refused_connections: Arc::default(),
        },
    );
    // Memory freed after a burst (a batch, a large table, received
    // requests) goes back to the kernel within this period.
    tokio::spawn(async {
        let mut every = tokio::time::interval(allocator::TRIM_INTERVAL);
        loop {
            every.tick().await;
            let _ = tokio::task::spawn_blocking(allocator::trim).await;
        }
    });
    let (batches_tx, batches_rx) = mpsc::channel(BATCH_QUEUE);
    let cut_now = sinks.pull_hub().cut_signal();
    let sink_task = tokio::spawn(sinks.run(batches_rx, received, scraped_rx));
    let stats = profiler
        .run(stop.or_deadline(config.duration), batches_tx, cut_now)
        .await;
    scrapers.stop();
    let sink_report = sink_task.await.context("the sink task failed")?;

    let cost = stats.bpf_cost;
    if let Some(off_cpu) = &stats.off_cpu {
        let counter = |c| stats.counters.get(c);
        let switch = off_cpu.bpf_cost;
        info!(
            waits = off_cpu.reported,
            starts_by_bpf = counter(icecore_receiver::Counter::OffCpuSamples),
            ends_by_bpf = counter(icecore_receiver::Counter::OffCpuEnds),
            short_by_bpf = counter(icecore_receiver::Counter::OffCpuShort),
            kernel_threads = counter(icecore_receiver::Counter::OffCpuKernelThread),
            unknown_process = counter(icecore_receiver::Counter::UnknownProcess),
            ring_full = counter(icecore_receiver::Counter::RingBufferFull),
            joined = off_cpu.join.joined,
            unanswered = off_cpu.join.unanswered,
            orphan_ends = off_cpu.join.orphan_ends,
            overflow = off_cpu.join.overflow,
            pending = off_cpu.pending,
            switches = switch.run_count,
            bpf_ns_per_switch = switch
                .run_time_ns
                .checked_div(switch.run_count)
                .unwrap_or(0),
            "off-CPU totals"
        );
    }
    info!(
        samples = stats.samples_reported,
        batches = stats.batches,
        emitted_by_bpf = stats.counters.get(icecore_receiver::Counter::Emitted),
        bpf_ns_per_sample = cost.run_time_ns.checked_div(cost.run_count).unwrap_or(0),
        exported = sink_report.batches_ok,
        export_failures = sink_report.batches_failed,
        otlp_samples_dropped = sink_report.otlp_samples_dropped,
        parca_samples_dropped = sink_report.parca_samples_dropped,
        pyroscope_samples_dropped = sink_report.pyroscope_samples_dropped,
        "icecore stopped"
    );
    if sink_report.batches_failed > 0 {
        warn!(
            "{} deliveries failed (pprof files or export requests)",
            sink_report.batches_failed
        );
    }
    if sink_report.a_sink_got_nothing {
        anyhow::bail!(
            "no profile reached a configured endpoint during the run ({} OTLP, {} Parca and {} Pyroscope samples dropped); see the warnings above",
            sink_report.otlp_samples_dropped,
            sink_report.parca_samples_dropped,
            sink_report.pyroscope_samples_dropped
        );
    }
    Ok(())
}

/// The HTTP endpoints' token and TLS, read now so that a bad file stops
/// the start with its name.
fn http_access(config: &Config) -> anyhow::Result<http_access::Access> {
    let mut access = http_access::Access::default();
    if let Some(path) = &config.http_bearer_token_file {
        let token = sinks::read_token(path)
            .with_context(|| format!("--http-bearer-token-file {}", path.display()))?;
        access.auth = icecore_otlp::receive::BearerAuth::bearer(&token);
    }
    if let Some(tls) = &config.http_tls {
        access.tls = Some(http_access::acceptor(&tls.cert, &tls.key)?);
    }
    Ok(access)
}

/// Where to read this node's pods: the configured kubelet or API server,
/// else the service account's API server when running in a pod, else
/// nowhere.
fn kubernetes_options(
    config: &Config,
) -> Option<icecore_receiver::metadata::kubernetes::KubernetesOptions> {
    use icecore_config::KubernetesApi;
    use icecore_receiver::metadata::kubernetes::{KubernetesOptions, PodSource};
    let node_name = config
        .node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()))
        .unwrap_or_else(icecore_receiver::host::host_name);
    let mut options = match &config.kubernetes_api {
        Some(KubernetesApi::Off) => return None,
        Some(KubernetesApi::Url(api)) => KubernetesOptions {
            api: api.clone(),
            source: PodSource::ApiServer,
            node_name,
            token_file: None,
            ca_file: None,
        },
        Some(KubernetesApi::Kubelet(kubelet)) => KubernetesOptions {
            api: kubelet.clone(),
            source: PodSource::Kubelet,
            node_name,
            token_file: None,
            ca_file: None,
        },
        None => KubernetesOptions::in_cluster(node_name)?,
    };
    if let Some(file) = &config.kubernetes_token_file {
        options.token_file = Some(file.clone());
    }
    if let Some(file) = &config.kubernetes_ca_file {
        options.ca_file = Some(file.clone());
    }
    Some(options)
}
