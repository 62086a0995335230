//! The bounded queue of encoded requests waiting to be sent.
//!
//! Requests are held encoded (protobuf bytes, before compression), so the
//! bound is on the memory they really take. When a new request does not fit,
//! the oldest ones are dropped: during an outage, recent profiles are worth
//! more than old ones, and the agent's memory must not grow with the outage.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

/// One encoded `ExportProfilesServiceRequest`.
#[derive(Debug, Clone)]
pub struct QueuedRequest {
    /// The protobuf encoding.
    pub body: Bytes,
    /// Samples it carries, for the counters.
    pub samples: u64,
    /// When it was queued; retries stop `max_elapsed` after this.
    pub queued_at: Instant,
}

/// Limits of an [`ExportQueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Most requests held.
    pub max_requests: usize,
    /// Most encoded bytes held.
    pub max_bytes: usize,
}

impl Default for QueueLimits {
    /// 1024 requests (ten minutes of batches even at a 1 s interval) and
    /// 320 MiB: ten minutes of 10 s batches of a busy host at 19 Hz fit,
    /// from the largest request `benches/benches/encode.rs` measures
    /// (Pyroscope's and Parca's, 4.79 MB; OTLP's is 0.72 MB), 274 MiB for 60.
    /// The agent's `--export-queue-bytes` sets the byte bound.
    fn default() -> Self {
        Self {
            max_requests: 1024,
            max_bytes: 320 << 20,
        }
    }
}

/// What [`ExportQueue::push`] had to drop to make room.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// Requests dropped.
    pub requests: u64,
    /// Samples they carried.
    pub samples: u64,
}

/// FIFO of requests bounded in count and bytes, dropping the oldest.
#[derive(Debug)]
pub struct ExportQueue {
    limits: QueueLimits,
    requests: VecDeque<QueuedRequest>,
    bytes: usize,
}

impl ExportQueue {
    /// An empty queue.
    pub fn new(limits: QueueLimits) -> Self {
        Self {
            limits,
            requests: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Appends `request`, first dropping the oldest requests until it fits.
    /// A request larger than the whole byte limit is itself dropped.
    pub fn push(&mut self, request: QueuedRequest) -> Dropped {
        let mut dropped = Dropped::default();
        if request.body.len() > self.limits.max_bytes || self.limits.max_requests == 0 {
            dropped.requests = 1;
            dropped.samples = request.samples;
            return dropped;
        }
        while self.requests.len() >= self.limits.max_requests
            || self.bytes + request.body.len() > self.limits.max_bytes
        {
            let Some(old) = self.pop() else { break };
            dropped.requests += 1;
            dropped.samples += old.samples;
        }
        self.bytes += request.body.len();
        self.requests.push_back(request);
        dropped
    }

    /// Removes and returns the oldest request.
    pub fn pop(&mut self) -> Option<QueuedRequest> {
        let request = self.requests.pop_front()?;
        self.bytes -= request.body.len();
        Some(request)
    }

    /// Requests held.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// Whether no request is held.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Encoded bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(size: usize, samples: u64) -> QueuedRequest {
        QueuedRequest {
            body: Bytes::from(vec![0u8; size]),
            samples,
            queued_at: Instant::now(),
        }
    }

    #[test]
    fn drops_oldest_beyond_the_request_limit() {
        let mut queue = ExportQueue::new(QueueLimits {
            max_requests: 2,
            max_bytes: 1000,
        });
        assert_eq!(queue.push(request(10, 1)), Dropped::default());
        assert_eq!(queue.push(request(10, 2)), Dropped::default());
        let dropped = queue.push(request(10, 3));
        assert_eq!(
            dropped,
            Dropped {
                requests: 1,
                samples: 1
            }
        );
        assert_eq!(queue.pop().map(|r| r.samples), Some(2));
        assert_eq!(queue.pop().map(|r| r.samples), Some(3));
        assert!(queue.is_empty());
        assert_eq!(queue.bytes(), 0);
    }

    #[test]
    fn drops_oldest_beyond_the_byte_limit() {
        let mut queue = ExportQueue::new(QueueLimits {
            max_requests: 100,
            max_bytes: 100,
        });
        queue.push(request(40, 1));
        queue.push(request(40, 2));
        let dropped = queue.push(request(70, 3));
        assert_eq!(
            dropped,
            Dropped {
                requests: 2,
                samples: 3
            }
        );
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.bytes(), 70);
        // Larger than the whole queue: dropped itself, the queue untouched.
        let dropped = queue.push(request(101, 9));
        assert_eq!(
            dropped,
            Dropped {
                requests: 1,
                samples: 9
            }
        );
        assert_eq!(queue.len(), 1);
    }
}
