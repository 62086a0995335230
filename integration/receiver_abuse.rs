// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! The OTLP receiver (`--otlp-listen`) against clients that are slow,
//! demanding or hostile: slow bodies must not stall anyone else, a
//! connection multiplexing large exports must never deadlock, and a request
//! must cost memory by what it holds, not by the numbers it carries.
//!
//! Needs root (it loads BPF programs); without root it prints why it is
//! skipped and passes.
//!
//!     sudo -E cargo test --release --test integration -- receiver_abuse:: --nocapture

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use support::fixture::Mode;
use support::metrics::Metrics;
use support::run::{Target, base_args_at, s};
use support::{HZ, Icecore, receiver_client, require_root, serial, status_kib};

const TOKEN: &str = "let-me-in";
const GRPC_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";
/// The receiver's body read timeout (its default).
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// icecore with a token-protected receiver, profiling a fixture.
struct Relay {
    icecore: Icecore,
    listen: SocketAddr,
    pprof_dir: PathBuf,
    _target: Target,
}

impl Relay {
    fn start() -> Relay {
        let target = Target::start(Mode::Cycle);
        let pprof_dir = target.make_subdir("pprof");
        let token_file = target.dir().join("listen-token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
        let listen = free_port();
        let mut args = base_args_at(target.pid(), HZ);
        args.extend([
            s("--pprof-dir"),
            s(pprof_dir.display()),
            s("--otlp-listen"),
            s(listen),
            s("--otlp-listen-bearer-token-file"),
            s(token_file.display()),
        ]);
        let mut icecore = Icecore::spawn(&args, target.dir());
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(listen).is_err() {
            assert!(
                Instant::now() < deadline,
                "icecore never listened on {listen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // The port is bound before the BPF programs load (a taken port is
        // reported at once); requests are served once sampling started.
        // What follows measures the receiver, not the start-up.
        icecore.wait_for_log("receiving OTLP profiles", Duration::from_secs(30));
        Relay {
            icecore,
            listen,
            pprof_dir,
            _target: target,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.listen)
    }

    fn rss_kib(&self) -> u64 {
        status_kib(self.icecore.pid(), "VmRSS:")
    }

    fn metrics(&self) -> Metrics {
        let address = self.icecore.http_address(Duration::from_secs(20));
        Metrics::fetch(address).expect("/metrics answers")
    }

    fn outcome(&self, outcome: &str) -> u64 {
        self.metrics().value(&format!(
            "icecore_receiver_requests_total{{outcome=\"{outcome}\"}}"
        )) as u64
    }
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// An HTTP/1.1 request that declares a 1 MB body and sends three bytes of it.
fn slow_http1(listen: SocketAddr, token: Option<&str>) -> TcpStream {
    let mut stream = TcpStream::connect(listen).unwrap();
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "POST /v1development/profiles HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-protobuf\r\n\
         {auth}content-length: 1000000\r\n\r\nabc"
    )
    .unwrap();
    stream
}

/// The status line of the answer on `stream`, read within `within`.
fn http1_status(stream: &mut TcpStream, within: Duration) -> Option<String> {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut answer = [0u8; 512];
    let n = stream.read(&mut answer).ok()?;
    let text = String::from_utf8_lossy(&answer[..n]).to_string();
    text.lines().next().map(str::to_owned)
}

/// A request body that sends its first bytes and then nothing, forever.
struct StalledBody(Option<Bytes>);

impl http_body::Body for StalledBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.0.take() {
            Some(data) => std::task::Poll::Ready(Some(Ok(Frame::data(data)))),
            None => std::task::Poll::Pending,
        }
    }
}

/// A gRPC export on its own HTTP/2 connection whose message prefix
/// promises 1 MB, followed by ten bytes and nothing more.
async fn slow_grpc(
    listen: SocketAddr,
    token: Option<&str>,
) -> tokio::task::JoinHandle<hyper::Result<hyper::Response<hyper::body::Incoming>>> {
    let io = hyper_util::rt::TokioIo::new(tokio::net::TcpStream::connect(listen).await.unwrap());
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .unwrap();
    tokio::spawn(connection);
    let mut first = vec![0u8];
    first.extend_from_slice(&1_000_000u32.to_be_bytes());
    first.extend_from_slice(&[0x0a; 10]);
    let mut request = hyper::Request::post(GRPC_PATH)
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request.body(StalledBody(Some(Bytes::from(first)))).unwrap();
    tokio::spawn(async move { sender.send_request(request).await })
}

/// The gRPC status of a finished (or trailers-only) response.
async fn grpc_status(response: hyper::Response<hyper::body::Incoming>) -> Option<String> {
    if let Some(status) = response.headers().get("grpc-status") {
        return Some(status.to_str().unwrap().to_owned());
    }
    let collected = response.into_body().collect().await.ok()?;
    collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .map(|v| v.to_str().unwrap().to_owned())
}

/// Four slow gRPC streams and four slow HTTP/1.1 bodies, with the token and
/// without, on a token-protected listener: valid exports alongside succeed
/// within a second each, tokenless ones are refused before their body, and
/// the slow ones time out and give their memory back.
#[test]
fn slow_clients_do_not_stall_the_receiver() {
    const TEST: &str = "slow_clients_do_not_stall_the_receiver";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let relay = Relay::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let started = Instant::now();
        // A connection that never sends a byte.
        let mut silent = TcpStream::connect(relay.listen).unwrap();
        let mut slow_grpc_streams = Vec::new();
        for _ in 0..4 {
            slow_grpc_streams.push(slow_grpc(relay.listen, Some(TOKEN)).await);
        }
        let mut slow_http = (0..4)
            .map(|_| slow_http1(relay.listen, Some(TOKEN)))
            .collect::<Vec<_>>();
        // Tokenless slow clients: refused from their headers at once.
        for _ in 0..4 {
            let response = slow_grpc(relay.listen, None).await;
            let answered = tokio::time::timeout(Duration::from_secs(1), response)
                .await
                .expect("a tokenless gRPC call is answered within a second")
                .unwrap()
                .unwrap();
            assert_eq!(
                grpc_status(answered).await.as_deref(),
                Some("16"),
                "UNAUTHENTICATED"
            );
            let mut stream = slow_http1(relay.listen, None);
            let status = http1_status(&mut stream, Duration::from_secs(1));
            assert!(
                status.as_deref().is_some_and(|l| l.contains(" 401 ")),
                "a tokenless HTTP request is answered 401 at once: {status:?}"
            );
        }
        // Valid exports, while the eight slow clients hold their requests open.
        for i in 0..5 {
            let sent = Instant::now();
            let code =
                receiver_client::send(&relay.url(), receiver_client::remote_request(), Some(TOKEN))
                    .await;
            let took = sent.elapsed();
            println!("valid export {i} beside 8 slow clients: {code:?} in {took:?}");
            assert_eq!(code, tonic::Code::Ok);
            assert!(took < Duration::from_secs(1), "export {i} took {took:?}");
        }
        // The slow ones end at the body timeout: 408 and DEADLINE_EXCEEDED.
        for stream in &mut slow_http {
            let wait = (BODY_TIMEOUT + Duration::from_secs(5)).saturating_sub(started.elapsed());
            let status = http1_status(stream, wait.max(Duration::from_secs(1)));
            assert!(
                status.as_deref().is_some_and(|l| l.contains(" 408 ")),
                "a slow HTTP body times out with 408: {status:?}"
            );
        }
        for response in slow_grpc_streams {
            let answered = tokio::time::timeout(Duration::from_secs(10), response)
                .await
                .expect("a slow gRPC call is answered at the body timeout")
                .unwrap()
                .unwrap();
            assert_eq!(
                grpc_status(answered).await.as_deref(),
                Some("4"),
                "DEADLINE_EXCEEDED"
            );
        }
        let ended = started.elapsed();
        println!("slow clients timed out after {ended:?}");
        assert!(ended >= BODY_TIMEOUT - Duration::from_secs(1));
        // The silent connection was closed long before.
        silent
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let read = silent.read(&mut [0u8; 16]);
        assert!(
            matches!(read, Ok(0)),
            "the silent connection is closed: {read:?}"
        );
    });
    assert_eq!(relay.outcome("timed_out"), 8);
    assert_eq!(relay.outcome("unauthenticated"), 8);
    assert_eq!(relay.outcome("accepted"), 5);
    let held = relay.metrics().value("icecore_receiver_memory_bytes");
    assert_eq!(held, 0.0, "every reservation was given back");
}

/// A 1.6 MB request: the remote profile with extra strings.
fn large_request(fill: usize) -> ExportProfilesServiceRequest {
    let mut request = receiver_client::remote_request();
    request
        .dictionary
        .as_mut()
        .unwrap()
        .string_table
        .extend((0..16).map(|i| format!("{i}").repeat(fill / 16)));
    request
}

/// Large valid exports and small ones, all multiplexed on one HTTP/2
/// connection as a client's channel does: each succeeds or is refused with
/// RESOURCE_EXHAUSTED promptly; none waits for its deadline.
#[test]
fn exports_multiplexed_on_one_connection_never_stall() {
    const TEST: &str = "exports_multiplexed_on_one_connection_never_stall";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    let relay = Relay::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (mut ok, mut exhausted) = (0, 0);
    runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(relay.url())
            .unwrap()
            .connect()
            .await
            .unwrap();
        for round in 0..4 {
            let mut calls = Vec::new();
            for i in 0..(8 + 16) {
                let request = if i < 8 {
                    large_request(800_000 + 100_000 * i)
                } else {
                    receiver_client::remote_request()
                };
                let mut client =
                    ProfilesServiceClient::new(channel.clone()).max_encoding_message_size(64 << 20);
                calls.push(tokio::spawn(async move {
                    let mut request = tonic::Request::new(request);
                    request.set_timeout(Duration::from_secs(10));
                    request
                        .metadata_mut()
                        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
                    let sent = Instant::now();
                    let code = match client.export(request).await {
                        Ok(_) => tonic::Code::Ok,
                        Err(status) => status.code(),
                    };
                    (code, sent.elapsed())
                }));
            }
            let mut slowest = Duration::ZERO;
            for call in calls {
                let (code, took) = call.await.unwrap();
                slowest = slowest.max(took);
                match code {
                    tonic::Code::Ok => ok += 1,
                    tonic::Code::ResourceExhausted => exhausted += 1,
                    other => panic!("round {round}: an export ended with {other:?} after {took:?}"),
                }
            }
            println!("round {round}: 24 exports on one connection, slowest {slowest:?}");
            assert!(
                slowest < Duration::from_secs(5),
                "round {round}: an export took {slowest:?}"
            );
        }
    });
    println!("{ok} accepted, {exhausted} refused as RESOURCE_EXHAUSTED");
    assert!(ok >= 24, "most exports got through ({ok})");
    assert_eq!(relay.outcome("accepted"), ok);
}

/// A 346-byte request whose one sample counts two million: 300 of them
/// leave the agent's memory where it was, and every count reaches pprof.
#[test]
fn counted_samples_do_not_become_memory() {
    const TEST: &str = "counted_samples_do_not_become_memory";
    if !require_root(TEST) {
        return;
    }
    let _serial = serial();
    const REQUESTS: u64 = 300;
    const COUNT: i64 = 2_000_000;
    let mut relay = Relay::start();
    let mut request = receiver_client::remote_request();
    let profile = &mut request.resource_profiles[0].scope_profiles[0].profiles[0];
    profile.samples.truncate(1);
    profile.samples[0].timestamps_unix_nano.clear();
    profile.samples[0].values = vec![COUNT];
    let size = prost::Message::encoded_len(&request);
    println!("request of {size} bytes counting {COUNT} samples");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let before = relay.rss_kib();
    runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(relay.url())
            .unwrap()
            .connect()
            .await
            .unwrap();
        for _ in 0..REQUESTS {
            let mut client = ProfilesServiceClient::new(channel.clone());
            let mut call = tonic::Request::new(request.clone());
            call.metadata_mut()
                .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
            client.export(call).await.expect("accepted");
        }
    });
    let peak_during = status_kib(relay.icecore.pid(), "VmHWM:");
    std::thread::sleep(Duration::from_secs(6));
    let after = relay.rss_kib();
    println!(
        "RSS before {} MiB, peak {} MiB, after {} MiB",
        before / 1024,
        peak_during / 1024,
        after / 1024
    );
    assert!(
        after < before + 20 * 1024,
        "{REQUESTS} counted requests grew RSS from {before} to {after} KiB"
    );
    relay.icecore.signal(libc::SIGTERM);
    relay.icecore.wait_success(Duration::from_secs(40));
    let written = support::pprof::all_samples(&support::pprof::decode_dir(&relay.pprof_dir));
    let counted: u64 = written
        .iter()
        .filter(|s| s.contains("remote_leaf") && s.pid == Some(receiver_client::REMOTE_PID))
        .map(|s| s.count)
        .sum();
    assert_eq!(
        counted,
        REQUESTS * COUNT as u64,
        "every count reached pprof"
    );
}
