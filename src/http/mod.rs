//! The HTTP listener: `/metrics` (Prometheus text), `/livez` (the process
//! answers) and `/readyz` (Postgres reachable and the schema current).

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
    pub prometheus: PrometheusHandle,
}

/// The router; tests drive it without a socket.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
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
