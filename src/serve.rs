//! The accept loop of icecore's listeners (`--otlp-listen`,
//! `--http-address`): HTTP/1.1 and HTTP/2 on one port, with the limits a
//! listener exposed to other hosts needs. Each connection is its own task,
//! and on HTTP/2 each stream too, so a slow peer holds only its own
//! connection; a bounded number of connections keeps a flood of idle ones
//! from taking the file descriptors the profiler needs.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use anyhow::Context;
use http_body::Body;
use hyper::{Request, Response, body::Incoming};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    sync::Semaphore,
};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

/// How a listener treats its peers.
#[derive(Debug, Clone, Copy)]
pub struct ListenerLimits {
    /// Connections open at once; more are closed as soon as accepted.
    pub max_connections: usize,
    /// Time a new connection has to send its first byte, and an HTTP/1.1
    /// request to send its headers.
    pub header_timeout: Duration,
    /// Streams one HTTP/2 connection may have open.
    pub max_streams_per_connection: u32,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            header_timeout: Duration::from_secs(10),
            max_streams_per_connection: 64,
        }
    }
}

/// Binds `address`; `flag` names the setting in the error.
pub async fn bind(address: SocketAddr, flag: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(address)
        .await
        .with_context(|| format!("{flag} {address}: cannot listen"))
}

/// A connection, plain or TLS, as hyper serves it.
trait Connection: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Connection for T {}

/// Serves `handler` on `listener` until the runtime stops, over TLS when
/// `tls` is given (a peer that does not speak TLS is closed after its first
/// bytes fail the handshake). Connections refused at the limit are counted
/// in `refused`.
pub fn spawn<H, F, B>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: ListenerLimits,
    refused: Arc<AtomicU64>,
    name: &'static str,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams_per_connection)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    let builder = Arc::new(builder);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, or the peer reset before accept:
                    // wait a little rather than spin.
                    warn!("{name}: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                refused.fetch_add(1, Relaxed);
                debug!(
                    "{name}: refusing {peer}: {} connections open",
                    limits.max_connections
                );
                drop(stream);
                continue;
            };
            let builder = Arc::clone(&builder);
            let handler = handler.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let _slot = slot;
                // A connection that never sends a byte never reaches hyper's
                // own header timeout (the protocol is not chosen yet).
                // (`readable` may wake spuriously; a peek waits for a byte.)
                let mut first = [0u8; 1];
                match tokio::time::timeout(limits.header_timeout, stream.peek(&mut first)).await {
                    Ok(Ok(n)) if n > 0 => {}
                    _ => {
                        debug!("{name}: {peer} sent nothing; closing");
                        return;
                    }
                }
                let service = hyper::service::service_fn(move |request| {
                    let response = handler(request);
                    async move { Ok::<_, Infallible>(response.await) }
                });
                let connection: Box<dyn Connection> = match tls {
                    None => Box::new(stream),
                    // The handshake shares the header timeout: a peer that
                    // stalls in it holds a slot no longer than one that
                    // stalls in its headers.
                    Some(acceptor) => {
                        match tokio::time::timeout(limits.header_timeout, acceptor.accept(stream))
                            .await
                        {
                            Ok(Ok(tls_stream)) => Box::new(tls_stream),
                            Ok(Err(e)) => {
                                debug!("{name}: TLS handshake with {peer} failed: {e}");
                                return;
                            }
                            Err(_) => {
                                debug!("{name}: TLS handshake with {peer} timed out");
                                return;
                            }
                        }
                    }
                };
                if let Err(e) = builder
                    .serve_connection(TokioIo::new(connection), service)
                    .await
                {
                    debug!("{name}: connection from {peer} ended: {e}");
                }
            });
        }
    });
}
