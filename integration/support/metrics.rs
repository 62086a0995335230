// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The agent's Prometheus `/metrics`, read over plain HTTP/1.1 (std only) from
//! the address icecore logs when it binds `--http-address 127.0.0.1:0`.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::Icecore;

/// One scrape: every sample line, keyed by name with its labels as written
/// (`icecore_bpf_events_total{counter="dwarf_frames"}`).
#[derive(Debug, Clone, Default)]
pub struct Metrics(pub BTreeMap<String, f64>);

impl Metrics {
    /// Parses the Prometheus text exposition format (comments skipped).
    pub fn parse(text: &str) -> Metrics {
        let mut m = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some((key, value)) = line.trim().rsplit_once(' ')
                && let Ok(v) = value.parse::<f64>()
            {
                m.insert(key.to_string(), v);
            }
        }
        Metrics(m)
    }

    /// GET http://ADDR/metrics; None when the agent does not answer.
    pub fn fetch(addr: SocketAddr) -> Option<Metrics> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            stream,
            "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200")
            .then(|| Metrics::parse(body))
    }

    /// A metric without labels (`icecore_processes_described`); panics if absent.
    pub fn value(&self, name: &str) -> f64 {
        *self
            .0
            .get(name)
            .unwrap_or_else(|| panic!("/metrics has no {name}"))
    }

    /// `icecore_bpf_events_total{counter="COUNTER"}`; panics if absent.
    pub fn bpf_event(&self, counter: &str) -> u64 {
        self.value(&format!(
            "icecore_bpf_events_total{{counter=\"{counter}\"}}"
        )) as u64
    }

    /// The unwinder's BPF counters and gauges, for printing.
    pub fn unwinding_summary(&self) -> String {
        format!(
            "dwarf_frames={} frame_pointer_frames={} unknown_process={} unwind_table_pending={} \
             user_stack_truncated={} \
             user_frame_invalid={} user_read_failed={} emitted={} tables_installed={} \
             processes_described={} table_bytes={} map_update_failures={}",
            self.bpf_event("dwarf_frames"),
            self.bpf_event("frame_pointer_frames"),
            self.bpf_event("unknown_process"),
            self.bpf_event("unwind_table_pending"),
            self.bpf_event("user_stack_truncated"),
            self.bpf_event("user_frame_invalid"),
            self.bpf_event("user_read_failed"),
            self.bpf_event("emitted"),
            self.value("icecore_unwind_tables_installed"),
            self.value("icecore_processes_described"),
            self.value("icecore_unwind_table_bytes"),
            self.value("icecore_unwind_map_update_failures_total"),
        )
    }
}

impl Icecore {
    /// The address of the HTTP endpoint, from the "serving /metrics … on
    /// http://ADDR" log line (waits up to `timeout` for it).
    pub fn http_address(&self, timeout: Duration) -> SocketAddr {
        // http:// or, with --http-tls-cert, https://.
        const MARK: &str = "serving /metrics, /healthz and /readyz on ";
        let deadline = Instant::now() + timeout;
        loop {
            let stderr = self.stderr();
            if let Some(at) = stderr.find(MARK) {
                let rest = &stderr[at + MARK.len()..];
                let rest = rest
                    .strip_prefix("http://")
                    .or_else(|| rest.strip_prefix("https://"))
                    .unwrap_or(rest);
                let end = rest
                    .find(|c: char| c.is_whitespace() || c == '\u{1b}')
                    .unwrap_or(rest.len());
                return rest[..end]
                    .parse()
                    .unwrap_or_else(|e| panic!("bad address in {:?}: {e}", &rest[..end]));
            }
            assert!(
                Instant::now() < deadline,
                "icecore did not log its HTTP address within {timeout:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The current `/metrics` (panics if the agent does not answer).
    pub fn metrics(&self) -> Metrics {
        let addr = self.http_address(Duration::from_secs(30));
        Metrics::fetch(addr)
            .unwrap_or_else(|| panic!("no answer from http://{addr}/metrics\n{}", self.logs()))
    }

    /// `/metrics` as of the end of the next reporting interval: icecore refreshes
    /// its metrics when it cuts a batch, so this scrape covers everything
    /// sampled until now.
    pub fn metrics_after_next_batch(&self, timeout: Duration) -> Metrics {
        let batches = self.metrics().value("icecore_batches_total");
        self.wait_for_metrics("the next batch", timeout, |m| {
            m.value("icecore_batches_total") > batches
        })
        .1
    }

    /// Polls `/metrics` every 20 ms until `pred` holds; returns the Unix time
    /// (ns) at which it was first seen to hold, and that scrape.
    pub fn wait_for_metrics(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Metrics) -> bool,
    ) -> (u64, Metrics) {
        let deadline = Instant::now() + timeout;
        loop {
            let m = self.metrics();
            if pred(&m) {
                return (super::now_unix_nanos(), m);
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not seen in /metrics within {timeout:?}; last scrape: {}\n{}",
                m.unwinding_summary(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
