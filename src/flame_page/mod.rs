//! The flame graph page on `--http-address`: `/` shows the last minutes of
//! this host from an in-memory history ([`icecore_otlp::history`]);
//! `/api/flamegraph` gives the same data as JSON, and
//! `/api/flamegraph.pprof` as a gzipped pprof. The page and its libraries
//! are compiled into the binary (`assets/`), so it works with no network.

mod api;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{
    Router,
    extract::{RawQuery, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use icecore_otlp::{
    encode_gzip,
    history::{History, HistoryLimits, HistoryStats},
    model::ProfileBatch,
};
use tokio::sync::Semaphore;

/// Queries answered at once; more wait (each can take a CPU for tens of
/// milliseconds on a large history).
const CONCURRENT_QUERIES: usize = 2;
/// How often the history is aged when no batch comes.
const EXPIRE_EVERY: Duration = Duration::from_secs(30);

/// The history the page shows, shared by the sink task (which adds every
/// local batch) and the HTTP handlers.
pub struct FlameHistory {
    history: Mutex<History>,
    queries: Semaphore,
    stats: Arc<HistoryStats>,
}

impl FlameHistory {
    /// A history kept within `limits`; `None` when either limit is 0 (the
    /// page then says the history is off).
    pub fn new(retention: Duration, max_bytes: u64) -> Option<Arc<Self>> {
        if retention.is_zero() || max_bytes == 0 {
            return None;
        }
        let history = History::new(HistoryLimits {
            retention,
            max_bytes,
        });
        let stats = history.stats();
        Some(Arc::new(Self {
            history: Mutex::new(history),
            queries: Semaphore::new(CONCURRENT_QUERIES),
            stats,
        }))
    }

    /// Its counters.
    pub fn stats(&self) -> &HistoryStats {
        &self.stats
    }

    /// The memory limit.
    pub fn max_bytes(&self) -> u64 {
        self.history.lock().map_or(0, |h| h.limits().max_bytes)
    }

    /// Adds a local batch.
    pub fn ingest(&self, batch: &ProfileBatch) {
        if let Ok(mut history) = self.history.lock() {
            history.ingest(batch, now_unix_nanos());
        }
    }

    /// Ages the history every [`EXPIRE_EVERY`], batches or not.
    pub fn spawn_expiry(self: &Arc<Self>) {
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(EXPIRE_EVERY);
            loop {
                every.tick().await;
                let Some(this) = this.upgrade() else { return };
                if let Ok(mut history) = this.history.lock() {
                    history.expire(now_unix_nanos());
                }
            }
        });
    }
}

/// The page's routes, on the agent's HTTP endpoint.
pub fn routes(history: Option<Arc<FlameHistory>>) -> Router {
    Router::new()
        .route("/", get(|| async { asset("index.html") }))
        .route("/ui/{file}", get(ui_file))
        .route("/api/flamegraph", get(flamegraph_json))
        .route("/api/flamegraph.pprof", get(flamegraph_pprof))
        .with_state(history)
}

/// Files under `assets/`, compiled in: (name, content type, bytes).
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("assets/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("assets/app.css"),
    ),
    (
        "d3.v7.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/vendor/d3.v7.min.js"),
    ),
    (
        "d3-flamegraph.umd.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/vendor/d3-flamegraph.umd.min.js"),
    ),
    (
        "d3-flamegraph.css",
        "text/css; charset=utf-8",
        include_bytes!("assets/vendor/d3-flamegraph.css"),
    ),
    (
        "LICENSES.txt",
        "text/plain; charset=utf-8",
        include_bytes!("assets/vendor/LICENSES.txt"),
    ),
];

/// The page may run its own scripts and the libraries' inline styles, and
/// talk to this agent only: names from profiled processes are shown as
/// text, and nothing is fetched from elsewhere.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(name: &str) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, bytes)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *bytes,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such file\n").into_response(),
    }
}

async fn ui_file(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    if file == "index.html" {
        return (StatusCode::NOT_FOUND, "no such file\n").into_response();
    }
    asset(&file)
}

/// Runs a query on the history off the async threads, at most
/// [`CONCURRENT_QUERIES`] at once.
async fn with_history<T: Send + 'static>(
    history: Option<Arc<FlameHistory>>,
    work: impl FnOnce(&History) -> T + Send + 'static,
) -> Result<T, Response> {
    let Some(history) = history else {
        return Err((
            StatusCode::NOT_FOUND,
            "the flame graph history is off (--flamegraph-history or --flamegraph-max-bytes is 0)\n",
        )
            .into_response());
    };
    let _permit = history.queries.acquire().await.map_err(|_| {
        (StatusCode::SERVICE_UNAVAILABLE, "the agent is stopping\n").into_response()
    })?;
    let shared = history.clone();
    let answer = tokio::task::spawn_blocking(move || {
        let mut guard = shared
            .history
            .lock()
            .map_err(|_| "the history's lock is poisoned")?;
        guard.expire(now_unix_nanos());
        Ok::<T, &str>(work(&guard))
    })
    .await;
    match answer {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err((StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()),
        Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()),
    }
}

/// The request's parameters, or a 400 saying what is wrong with them.
fn parse_query(
    query: Option<&str>,
) -> Result<icecore_otlp::history::FlameQuery, (StatusCode, String)> {
    api::parse(query.unwrap_or(""), now_unix_nanos())
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("{e}\n")))
}

async fn flamegraph_json(
    State(history): State<Option<Arc<FlameHistory>>>,
    RawQuery(query): RawQuery,
) -> Response {
    let query = match parse_query(query.as_deref()) {
        Ok(q) => q,
        Err(refused) => return refused.into_response(),
    };
    let answer = with_history(history, move |h| {
        h.query(&query).map(|view| api::to_json(&view, &query))
    })
    .await;
    match answer {
        Ok(Ok(json)) => (
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            json,
        )
            .into_response(),
        Ok(Err(e)) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
        Err(response) => response,
    }
}

async fn flamegraph_pprof(
    State(history): State<Option<Arc<FlameHistory>>>,
    RawQuery(query): RawQuery,
) -> Response {
    let query = match parse_query(query.as_deref()) {
        Ok(q) => q,
        Err(refused) => return refused.into_response(),
    };
    let answer = with_history(history, move |h| {
        h.window(&query)
            .map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))
            .and_then(|batch| {
                encode_gzip(&batch).map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
            })
    })
    .await;
    match answer {
        Ok(Ok(gzipped)) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"icecore.pb.gz\"",
                ),
            ],
            gzipped,
        )
            .into_response(),
        Ok(Err((status, e))) => (status, format!("{e}\n")).into_response(),
        Err(response) => response,
    }
}

fn now_unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
