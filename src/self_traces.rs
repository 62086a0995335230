//! `--self-traces`: icecore's own spans (start-up, process descriptions,
//! unwind table builds, exports) as OTLP traces, through
//! `tracing-opentelemetry` and the OpenTelemetry SDK's batch processor.
//!
//! The SDK exports from a thread of its own, outside the async runtime, so
//! its exporter only hands each batch, already converted to the OTLP
//! message, to a task on the runtime that sends it with tonic. Best effort:
//! a full hand-over queue or a failed call drops that batch (counted in
//! `/metrics`); it never holds up profiling.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use anyhow::Context;
use icecore_config::{Config, OtlpEndpoint};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, trace_service_client::TraceServiceClient,
};
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tokio::sync::mpsc;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tracing::warn;

/// Batches waiting for the sender task; more are dropped.
const QUEUE: usize = 16;
/// Bounds one export call.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What the self-traces exporter did, for `/metrics`.
#[derive(Debug, Default)]
pub struct SelfTraceStats {
    /// Spans an endpoint accepted.
    pub sent_spans: AtomicU64,
    /// Spans dropped: queue full or call failed.
    pub dropped_spans: AtomicU64,
}

/// The running exporter: the SDK's provider (flushed at shutdown) and its
/// counts.
pub struct SelfTraces {
    provider: SdkTracerProvider,
    sender_task: tokio::task::JoinHandle<()>,
    /// Its counters.
    pub stats: Arc<SelfTraceStats>,
}

impl SelfTraces {
    /// The `tracing` layer that turns spans into OpenTelemetry spans.
    pub fn layer(&self) -> impl tracing_subscriber::Layer<tracing_subscriber::Registry> + use<> {
        use tracing_subscriber::Layer;
        // icecore's own spans only: its dependencies (tonic, hyper, h2)
        // have spans of their own, down to every frame sent.
        let ours =
            tracing_subscriber::filter::Targets::new().with_target("icecore", tracing::Level::INFO);
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("icecore"))
            .with_filter(ours)
    }

    /// Hands over what is pending, stops the SDK's thread, and gives the
    /// sender task up to [`TIMEOUT`] to deliver it.
    pub fn finish(self, runtime: &tokio::runtime::Runtime) {
        if let Err(e) = self.provider.shutdown() {
            warn!("self-traces: shutting down: {e}");
        }
        // The exporter, and with it the queue's sender, goes with the provider.
        drop(self.provider);
        let task = self.sender_task;
        let _ = runtime.block_on(async move { tokio::time::timeout(TIMEOUT, task).await });
    }
}

/// Where self traces go, when `--self-traces` is on: the traces endpoint,
/// else the profiles one.
pub fn endpoint(config: &Config) -> anyhow::Result<Option<&OtlpEndpoint>> {
    if !config.self_traces {
        return Ok(None);
    }
    config
        .traces_endpoint
        .as_ref()
        .or(config.otlp.as_ref())
        .map(Some)
        .context(
            "--self-traces needs an OTLP endpoint: --otlp-endpoint or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        )
}

/// Starts the exporter towards `endpoint` (the runtime must be running:
/// the sender is a task on it). `headers` go with every call.
pub fn start(
    endpoint: &OtlpEndpoint,
    headers: &[(String, String)],
    host_name: &str,
) -> anyhow::Result<SelfTraces> {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.url.clone())
        .with_context(|| format!("self-traces endpoint {}", endpoint.url))?
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT);
    let channel = if endpoint.url.starts_with("https://") {
        channel
            .tls_config(tonic::transport::ClientTlsConfig::new().with_native_roots())
            .with_context(|| format!("self-traces endpoint {}", endpoint.url))?
    } else {
        channel
    }
    .connect_lazy();
    let mut metadata = tonic::metadata::MetadataMap::new();
    let mut pairs: Vec<(String, String)> = headers.to_vec();
    if let Some(basic) = &endpoint.basic_auth {
        pairs.push(("authorization".to_owned(), basic.expose().to_owned()));
    }
    for (name, value) in pairs {
        let key: AsciiMetadataKey = name
            .to_ascii_lowercase()
            .parse()
            .with_context(|| format!("header {name:?}"))?;
        let value: AsciiMetadataValue = value
            .parse()
            .with_context(|| format!("the value of header {name:?}"))?;
        metadata.append(key, value);
    }

    let stats = Arc::new(SelfTraceStats::default());
    let (sender, mut requests) = mpsc::channel::<(ExportTraceServiceRequest, u64)>(QUEUE);
    let task_stats = stats.clone();
    let sender_task = tokio::spawn(async move {
        let mut client = TraceServiceClient::new(channel);
        let mut warned = false;
        while let Some((request, spans)) = requests.recv().await {
            let mut call = tonic::Request::new(request);
            *call.metadata_mut() = metadata.clone();
            match client.export(call).await {
                Ok(_) => {
                    task_stats.sent_spans.fetch_add(spans, Relaxed);
                }
                Err(status) => {
                    task_stats.dropped_spans.fetch_add(spans, Relaxed);
                    if !warned {
                        warn!("self-traces: export failed (logged once): {status}");
                        warned = true;
                    }
                }
            }
        }
    });

    let resource = Resource::builder()
        .with_service_name("icecore")
        .with_attributes([
            opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            opentelemetry::KeyValue::new("host.name", host_name.to_owned()),
        ])
        .build();
    let exporter = HandOver {
        sender,
        resource: ResourceAttributesWithSchema::from(&resource),
        stats: stats.clone(),
    };
    let provider = SdkTracerProvider::builder()
        .with_resource(resource)
        .with_batch_exporter(exporter)
        .build();
    Ok(SelfTraces {
        provider,
        sender_task,
        stats,
    })
}

/// The SDK's exporter: converts a batch and hands it to the sender task.
struct HandOver {
    sender: mpsc::Sender<(ExportTraceServiceRequest, u64)>,
    resource: ResourceAttributesWithSchema,
    stats: Arc<SelfTraceStats>,
}

impl std::fmt::Debug for HandOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandOver").finish_non_exhaustive()
    }
}

impl SpanExporter for HandOver {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let request = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(batch, &self.resource),
        };
        if self.sender.try_send((request, spans)).is_err() {
            self.stats.dropped_spans.fetch_add(spans, Relaxed);
        }
        Ok(())
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = ResourceAttributesWithSchema::from(resource);
    }
}
