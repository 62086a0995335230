//! When to stop: SIGINT, SIGTERM, or the end of `--duration`.

use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

/// Completes on SIGINT or SIGTERM, or after `duration` when given.
pub async fn signal_or_deadline(duration: Option<Duration>) {
    let deadline = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let terminate = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = deadline => info!("duration reached; flushing"),
        _ = terminate => info!("SIGTERM; flushing"),
        r = tokio::signal::ctrl_c() => match r {
            Ok(()) => info!("SIGINT; flushing"),
            Err(e) => {
                warn!("cannot listen for SIGINT: {e}");
                std::future::pending::<()>().await;
            }
        },
    }
}
