//! The OTLP receiver end to end, below the HTTP server: one request handed
//! to `ProfilesReceiver::http` (OTLP/HTTP) or `ProfilesReceiver::grpc`, its
//! body read in chunks under the memory budget, inflated when gzipped,
//! framed (gRPC), costed, decoded, validated and converted, and the
//! accepted request taken off the sink channel.
//!
//! The first byte picks how the rest is sent:
//! - bits 0-1: 0 OTLP/HTTP, 1 OTLP/HTTP gzip, 2 gRPC, 3 gRPC with
//!   `grpc-encoding: gzip` (the gRPC body carries its 5-byte prefix);
//! - bit 2: whether the body declares its length (an exact size hint);
//! - bits 3-7: the chunk size (0: one chunk; n: n * 97 bytes).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use icecore_otlp::receive::{
    GRPC_EXPORT_PATH, HTTP_PATH, ProfilesReceiver, ReceiveLimits, ReceivedProfiles, ReceiverAuth,
    ReceiverOptions,
};
use tokio::sync::mpsc;

/// A request body arriving in chunks.
struct Chunked {
    chunks: VecDeque<Bytes>,
    len: u64,
    exact: bool,
}

impl Body for Chunked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.chunks.pop_front().map(|c| Ok(Frame::data(c))))
    }

    fn size_hint(&self) -> SizeHint {
        if self.exact {
            SizeHint::with_exact(self.len)
        } else {
            SizeHint::default()
        }
    }
}

struct Harness {
    runtime: tokio::runtime::Runtime,
    receiver: ProfilesReceiver,
    accepted: Mutex<mpsc::Receiver<ReceivedProfiles>>,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                eprintln!("no tokio runtime: {e}");
                std::process::exit(2);
            }
        };
        let (sink, accepted) = mpsc::channel(4);
        // The defaults but a 4 MiB message: a gzip bomb of libFuzzer's
        // size stops there rather than at 16 MiB (the same code path).
        let options = ReceiverOptions {
            limits: ReceiveLimits {
                max_message_bytes: 4 << 20,
                ..ReceiveLimits::default()
            },
            body_timeout: Duration::from_secs(5),
            decode_wait: Duration::from_secs(5),
            ..ReceiverOptions::default()
        };
        let receiver = ProfilesReceiver::new(sink, ReceiverAuth::default(), options);
        Harness {
            runtime,
            receiver,
            accepted: Mutex::new(accepted),
        }
    })
}

/// Runs one input through the entry points above; panics are the bugs
/// looked for (errors are expected answers to bad input).
pub fn run(data: &[u8]) {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let grpc = mode & 2 != 0;
    let gzip = mode & 1 != 0;
    let exact = mode & 4 != 0;
    let chunk = usize::from(mode >> 3) * 97;
    let body = Bytes::copy_from_slice(body);
    let mut chunks = VecDeque::new();
    if chunk == 0 || body.is_empty() {
        chunks.push_back(body.clone());
    } else {
        let mut at = 0;
        while at < body.len() {
            let end = (at + chunk).min(body.len());
            chunks.push_back(body.slice(at..end));
            at = end;
        }
    }
    let body = Chunked {
        chunks,
        len: body.len() as u64,
        exact,
    };
    let h = harness();
    let mut request = Request::post(if grpc { GRPC_EXPORT_PATH } else { HTTP_PATH });
    if grpc {
        request = request.header("content-type", "application/grpc");
        if gzip {
            request = request.header("grpc-encoding", "gzip");
        }
    } else {
        request = request.header("content-type", "application/x-protobuf");
        if gzip {
            request = request.header("content-encoding", "gzip");
        }
    }
    let Ok(request) = request.body(body) else {
        return;
    };
    let response = h.runtime.block_on(async {
        if grpc {
            h.receiver.grpc(request).await
        } else {
            h.receiver.http(request).await
        }
    });
    let _ = response.status();
    // The sinks' side: take what was accepted (and free its reservation).
    if let Ok(mut accepted) = h.accepted.lock() {
        while let Ok(received) = accepted.try_recv() {
            drop(received);
        }
    }
}
