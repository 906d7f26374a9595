//! The HTTP listener: `/metrics` (Prometheus text), `/livez` (the process
//! answers), `/readyz` (Postgres reachable and the schema current),
//! `POST /v1/queues/{queue}/jobs` (enqueue, see [`enqueue`]) and
//! `POST /v1/outcomes` (outcomes from outside workers, see [`outcomes`]) and
//! `GET /v1/routes/{route}/diff` (the cutover diff, see [`diff`]).

mod diff;
mod enqueue;
mod outcomes;

use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::queue::validate::DEFAULT_PAYLOAD_LIMIT;
use crate::redis::producer::Producer;

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
    pub prometheus: PrometheusHandle,
    /// Enqueues on routed queues; `None` when the process has no routes.
    pub producer: Option<Producer>,
    /// Largest payload accepted for a plain job.
    pub payload_limit: usize,
    /// Largest request body.
    pub max_body: usize,
}

impl AppState {
    /// State with no routes and default limits.
    pub fn new(db: PgPool, prometheus: PrometheusHandle) -> AppState {
        AppState {
            db,
            prometheus,
            producer: None,
            payload_limit: DEFAULT_PAYLOAD_LIMIT,
            max_body: 16 << 20,
        }
    }
}

/// A JSON reply or a JSON error.
type Reply = Result<(StatusCode, Json<Value>), (StatusCode, Json<Value>)>;

/// `{"error": "<one line>"}` with `status`.
fn error_reply(status: StatusCode, message: &str) -> (StatusCode, Json<Value>) {
    let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    (status, Json(json!({ "error": line })))
}

/// Binds `listen` now (a taken port is a start-up error, not a log line) and
/// serves `state` until `token` is cancelled.
pub async fn serve(
    listen: &str,
    state: AppState,
    token: tokio_util::sync::CancellationToken,
) -> crate::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| crate::Error::Config(format!("cannot listen on {listen}: {e}")))?;
    tracing::info!(listen = %listen, "http listening");
    Ok(tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, router(state))
            .with_graceful_shutdown(async move { token.cancelled().await })
            .await
        {
            tracing::error!(error = %err, "http listener failed");
        }
    }))
}

/// The router; tests drive it without a socket.
pub fn router(state: AppState) -> Router {
    let max_body = state.max_body;
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/v1/queues/{queue}/jobs", post(enqueue::post_jobs))
        .route("/v1/outcomes", post(outcomes::post_outcomes))
        .route("/v1/routes/{route}/diff", get(diff::get_diff))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

async fn metrics(State(state): State<AppState>) -> String {
    state.prometheus.render()
}

async fn readyz(State(state): State<AppState>) -> (StatusCode, String) {
    let check =
        tokio::time::timeout(Duration::from_secs(2), crate::db::check_schema(&state.db)).await;
    match check {
        Ok(Ok(())) => (StatusCode::OK, "ready\n".into()),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: Postgres did not answer within 2s\n".into(),
        ),
    }
}
