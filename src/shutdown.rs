//! When to stop: SIGINT, SIGTERM, or the end of `--duration`.

use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::{info, warn};

/// SIGINT and SIGTERM, listened for from the agent's start: one that
/// arrives while the programs load or privileges are lowered is kept until
/// the profiler runs, which then stops and flushes at once, where the
/// signal's default action would have killed the agent.
pub struct StopSignals {
    terminate: Option<Signal>,
    interrupt: Option<Signal>,
}

impl StopSignals {
    /// Installs the handlers (within the runtime).
    pub fn listen() -> Self {
        let open = |kind, name: &str| {
            signal(kind)
                .map_err(|e| warn!("cannot listen for {name}: {e}"))
                .ok()
        };
        StopSignals {
            terminate: open(SignalKind::terminate(), "SIGTERM"),
            interrupt: open(SignalKind::interrupt(), "SIGINT"),
        }
    }

    /// Completes on SIGINT or SIGTERM (also one received before), or after
    /// `duration` when given.
    pub async fn or_deadline(self, duration: Option<Duration>) {
        let deadline = async {
            match duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let StopSignals {
            terminate,
            interrupt,
        } = self;
        tokio::select! {
            _ = deadline => info!("duration reached; flushing"),
            _ = received(terminate) => info!("SIGTERM; flushing"),
            _ = received(interrupt) => info!("SIGINT; flushing"),
        }
    }
}

/// The next delivery of `signal`; never when it could not be listened for.
async fn received(signal: Option<Signal>) {
    match signal {
        Some(mut s) => {
            s.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}
