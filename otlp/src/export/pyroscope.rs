//! Grafana Pyroscope push: one gzipped pprof per process and interval
//! through `push.v1.PusherService/Push`, sent with the Connect protocol (an
//! HTTP POST of the protobuf message), labelled as Grafana Alloy's eBPF
//! profiler labels its series.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::header::AUTHORIZATION;
use prost::Message;

use super::http_client::HttpTarget;
use super::pipeline::RequestSender;
use super::series;
use super::tls::TlsOptions;
use super::{ExportError, MAX_MESSAGE_BYTES};
use crate::model::{ProcessProfile, ProfileBatch};
use crate::scrape::ScrapedProfile;

/// The push API's messages, generated from `proto/pyroscope/push.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/push.v1.rs"));
}

use proto::{LabelPair, PushRequest, RawProfileSeries, RawSample};

/// Where the Connect protocol serves `Push`.
pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";
/// A Connect unary request's body: the binary protobuf message.
pub const CONNECT_PROTO: &str = "application/proto";
/// Tells Pyroscope a profile holds one interval's samples already, so it
/// does not subtract the previous one.
pub const DELTA_LABEL: &str = "__delta__";

/// How to reach a Pyroscope server.
#[derive(Debug, Clone)]
pub struct PyroscopeOptions {
    /// `http://host:4040` or `https://…` (any path prefix kept).
    pub endpoint: String,
    /// Bounds connecting and each call.
    pub timeout: Duration,
    /// `Basic …`: the `authorization` header value for basic auth.
    pub basic_auth: Option<String>,
    /// File holding a bearer token, re-read every [`super::TOKEN_REFRESH`].
    pub bearer_token_file: Option<std::path::PathBuf>,
    /// Sent as `X-Scope-OrgID`.
    pub tenant_id: Option<String>,
    /// Certificate checks and client certificate for `https://`.
    pub tls: TlsOptions,
}

impl PyroscopeOptions {
    /// Options for `endpoint` with a 10 s timeout.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            timeout: Duration::from_secs(10),
            basic_auth: None,
            bearer_token_file: None,
            tenant_id: None,
            tls: TlsOptions::default(),
        }
    }
}

/// Sends batches to Pyroscope.
#[derive(Debug)]
pub struct PyroscopeExporter {
    target: HttpTarget,
}

impl PyroscopeExporter {
    /// An exporter with the given options; checks the endpoint, TLS and
    /// headers, and reads the token file.
    pub fn new(options: &PyroscopeOptions) -> Result<Self, ExportError> {
        let mut headers = vec![("connect-protocol-version".to_owned(), "1".to_owned())];
        if let Some(tenant) = &options.tenant_id {
            headers.push(("x-scope-orgid".to_owned(), tenant.clone()));
        }
        if let Some(basic) = &options.basic_auth {
            headers.push((AUTHORIZATION.as_str().to_owned(), basic.clone()));
        }
        let target = HttpTarget::new(
            &options.endpoint,
            options.timeout,
            &headers,
            options.bearer_token_file.as_deref(),
            &options.tls,
        )?;
        Ok(Self { target })
    }

    /// The request for `batch`: one series per process with samples.
    pub fn encode(&self, batch: &ProfileBatch) -> PushRequest {
        let series = series::per_process(batch, |process, raw_profile| RawProfileSeries {
            labels: labels(batch, process),
            samples: vec![RawSample {
                raw_profile,
                id: String::new(),
            }],
        });
        PushRequest { series }
    }

    /// The request for a scraped profile: its series labelled as Parca's
    /// are, with `service_name` (the `job` unless a label sets it) and
    /// `__delta__="false"`, since cumulative profiles arrive as deltas.
    pub fn encode_scraped(scraped: &ScrapedProfile) -> PushRequest {
        let mut labels = series::scraped_labels(scraped);
        if !labels.iter().any(|(name, _)| name == "service_name") {
            let service = scraped.label("job").unwrap_or("unspecified").to_owned();
            labels.push(("service_name".to_owned(), service));
        }
        labels.push((DELTA_LABEL.to_owned(), "false".to_owned()));
        PushRequest {
            series: vec![RawProfileSeries {
                labels: labels
                    .into_iter()
                    .map(|(name, value)| LabelPair { name, value })
                    .collect(),
                samples: vec![RawSample {
                    raw_profile: scraped.gzipped.to_vec(),
                    id: String::new(),
                }],
            }],
        }
    }
}

/// The series labels: Parca's (see [`series::labels`]), `__delta__`, and
/// `service_name` as Alloy infers it when relabeling did not set one: the
/// pod's `namespace/container` in Kubernetes, else the process's service
/// name (its executable's, unless configured).
fn labels(batch: &ProfileBatch, process: &ProcessProfile) -> Vec<LabelPair> {
    let info = &process.process;
    let relabeled = info
        .labels
        .iter()
        .any(|(name, _)| &**name == "service_name");
    let mut labels = series::labels(batch, process);
    if !relabeled && !info.k8s.namespace.is_empty() && !info.k8s.container.is_empty() {
        let inferred = format!("{}/{}", info.k8s.namespace, info.k8s.container);
        for (name, value) in &mut labels {
            if name == "service_name" {
                *value = inferred.clone();
            }
        }
    }
    labels.push((DELTA_LABEL.to_owned(), "false".to_owned()));
    labels
        .into_iter()
        .map(|(name, value)| LabelPair { name, value })
        .collect()
}

impl RequestSender for PyroscopeExporter {
    fn encode_batch(&self, batch: &ProfileBatch) -> Bytes {
        Bytes::from(self.encode(batch).encode_to_vec())
    }

    fn send_body(
        &self,
        body: Bytes,
    ) -> Pin<Box<dyn Future<Output = Result<u64, ExportError>> + Send + '_>> {
        Box::pin(async move {
            if body.len() > MAX_MESSAGE_BYTES {
                return Err(ExportError::MessageTooLarge {
                    size: body.len(),
                    limit: MAX_MESSAGE_BYTES,
                });
            }
            self.target.post(PUSH_PATH, CONNECT_PROTO, body).await?;
            Ok(0)
        })
    }

    fn endpoint(&self) -> &str {
        self.target.url()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use super::*;
    use crate::test_fixtures;

    fn label<'a>(series: &'a RawProfileSeries, name: &str) -> Option<&'a str> {
        series
            .labels
            .iter()
            .find(|l| l.name == name)
            .map(|l| l.value.as_str())
    }

    #[test]
    fn series_are_labelled_as_alloy_labels_them() {
        let exporter =
            PyroscopeExporter::new(&PyroscopeOptions::new("http://127.0.0.1:4040")).unwrap();
        let mut batch = test_fixtures::batch();
        let request = exporter.encode(&batch);
        assert!(!request.series.is_empty());
        let first = &request.series[0];
        let service = batch.processes[0].process.service_name.clone();
        assert_eq!(label(first, "__name__"), Some("process_cpu"));
        assert_eq!(label(first, DELTA_LABEL), Some("false"));
        assert_eq!(label(first, "service_name"), Some(&*service));
        assert!(!first.samples[0].raw_profile.is_empty());

        // In a pod: namespace/container, unless relabeling named the service.
        let info = &mut batch.processes[0].process;
        info.k8s = Arc::new(crate::model::K8sNames {
            namespace: Arc::from("shop"),
            container: Arc::from("checkout"),
            ..crate::model::K8sNames::default()
        });
        let request = exporter.encode(&batch);
        assert_eq!(
            label(&request.series[0], "service_name"),
            Some("shop/checkout")
        );
        let info = &mut batch.processes[0].process;
        info.labels = Arc::from(vec![(Arc::from("service_name"), Arc::from("cart"))]);
        let request = exporter.encode(&batch);
        assert_eq!(label(&request.series[0], "service_name"), Some("cart"));
    }
}
