//! Request bodies read in full before any decoding, under a deadline and
//! the memory budget, and the one-message response body of both protocols.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use super::budget::Reservation;
use super::outcome::{Outcome, Refusal};

/// Reads all of `body`, holding its bytes in `reservation`.
///
/// The body is consumed as fast as the client sends it: on HTTP/2 that
/// keeps returning flow-control window to the connection, so one request
/// waiting for anything never stalls the others on its connection. Refused
/// at once when over `limit` bytes or over the budget; `timeout` bounds the
/// whole read, so a client sending a few bytes and then nothing gives its
/// memory back.
pub async fn read_body<B>(
    body: B,
    limit: usize,
    timeout: Duration,
    reservation: &mut Reservation,
) -> Result<Vec<u8>, Refusal>
where
    B: Body,
    B::Error: std::fmt::Display,
{
    let too_large = || {
        Refusal::new(
            Outcome::TooLarge,
            format!("the request body is over the {limit}-byte limit"),
        )
    };
    let declared = body.size_hint().exact();
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large());
    }
    let read = async {
        let mut body = std::pin::pin!(body);
        let mut data: Vec<u8> = Vec::new();
        // The reservation covers the vector's capacity.
        let base = reservation.bytes();
        if let Some(len) = declared {
            let len = usize::try_from(len).map_err(|_| too_large())?;
            reservation.resize(base + len).map_err(over_budget)?;
            data.reserve_exact(len);
        }
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                Refusal::new(Outcome::Aborted, format!("reading the request body: {e}"))
            })?;
            let Ok(mut chunk) = frame.into_data() else {
                continue; // trailers
            };
            let len = chunk.remaining();
            let total = data.len().saturating_add(len);
            if total > limit {
                return Err(too_large());
            }
            if total > data.capacity() {
                let wanted = total.max(data.capacity().saturating_mul(2)).min(limit);
                reservation.resize(base + wanted).map_err(over_budget)?;
                data.reserve_exact(wanted - data.len());
            }
            while chunk.has_remaining() {
                let part = chunk.chunk();
                data.extend_from_slice(part);
                let n = part.len();
                chunk.advance(n);
            }
        }
        Ok(data)
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(result) => result,
        Err(_) => Err(Refusal::new(
            Outcome::TimedOut,
            format!(
                "the request body did not arrive within {} s",
                timeout.as_secs_f64()
            ),
        )),
    }
}

/// A refusal for a budget that cannot take a request now, or ever.
pub fn over_budget(e: super::budget::OverBudget) -> Refusal {
    if e.never_fits {
        Refusal::new(
            Outcome::TooLarge,
            format!(
                "the request needs more than the receiver's whole memory budget of {} bytes",
                e.limit
            ),
        )
    } else {
        Refusal::new(
            Outcome::Overloaded,
            "the receiver's memory budget is in use by other requests; retry later",
        )
    }
}

/// A response body of at most one data frame and one trailers frame:
/// what a unary gRPC call or an OTLP/HTTP answer sends.
#[derive(Debug, Default)]
pub struct UnaryBody {
    data: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl UnaryBody {
    /// A body of `data`, then `trailers` if any.
    pub fn new(data: Bytes, trailers: Option<http::HeaderMap>) -> Self {
        Self {
            data: (!data.is_empty()).then_some(data),
            trailers,
        }
    }
}

impl Body for UnaryBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let len = self.data.as_ref().map_or(0, |d| d.len() as u64);
        if self.trailers.is_none() {
            SizeHint::with_exact(len)
        } else {
            let mut hint = SizeHint::new();
            hint.set_lower(len);
            hint
        }
    }
}
