//! The HTTP listener, in three groups by who may call:
//!
//! - open: `/metrics` (Prometheus text), `/livez` (the process answers),
//!   `/readyz` (Postgres reachable and the schema current, the wake-up
//!   mode, each route's Redis: [`ready`]);
//! - the write endpoints, each behind its own scoped token once one is set
//!   ([`auth`]): `POST /v1/queues/{queue}/jobs` (enqueue, see [`enqueue`];
//!   the enqueue token, optionally for some queues only) and `POST
//!   /v1/outcomes` (outcomes from outside workers, see [`outcomes`]; the
//!   reporting token, which a fleet gets and which opens nothing else). The
//!   admin token passes both. Without their token they are open, which
//!   only a loopback listener allows;
//! - admin, behind the bearer token ([`auth`]): `GET /v1/routes/{route}/diff`
//!   (the cutover diff, see [`diff`]: it reveals job keys) and the admin API
//!   ([`admin`]: phase changes, repair, dead-letter requeue);
//! - the web console at `/ui` ([`ui`]): the same token, through a login
//!   form and a cookie session with CSRF tokens.
//!
//! The listener binds `127.0.0.1:9187` unless told otherwise; on any other
//! address it refuses to start while a write endpoint would be open
//! ([`auth::open_write_endpoints`]), naming the setting that closes it.

mod admin;
pub mod auth;
mod diff;
mod enqueue;
mod outcomes;
mod ready;
mod ui;

use std::net::SocketAddr;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::config::Config;
use crate::ingest::Via;
use crate::queue::validate::DEFAULT_PAYLOAD_LIMIT;
use crate::redis::producer::Producer;
use crate::secret::Secret;

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
    /// The admin API's bearer token; `None` turns the admin API off (403).
    pub admin_token: Option<Secret>,
    /// Whether enqueue and outcomes need a token even without their own.
    pub enqueue_requires_token: bool,
    /// The reporting token (`POST /v1/outcomes`).
    pub report_token: Option<Secret>,
    /// The enqueue token (`POST /v1/queues/{queue}/jobs`), for the queues
    /// of `enqueue_queues` (empty: every queue).
    pub enqueue_token: Option<Secret>,
    pub enqueue_queues: Vec<String>,
    /// The web console's sessions and requeues (`/ui`).
    pub console: ui::Console,
    /// How Postgres is reached and workers woken, for `/readyz`.
    pub database_mode: String,
    /// Where this host's consumers keep their outcome spools (`state_dir`):
    /// repair brings them in before it judges; `None` for a state with no
    /// config.
    pub state_dir: Option<std::path::PathBuf>,
}

impl AppState {
    /// The state of a process's listener: its config's limits and token,
    /// and the process's producer (recording HTTP as the path items came in by).
    pub fn from_config(cfg: &Config, db: PgPool, producer: Option<Producer>) -> AppState {
        AppState {
            db,
            prometheus: crate::telemetry::prometheus(),
            producer: producer.map(|p| p.with_via(Via::Http)),
            payload_limit: cfg.payload_limit,
            max_body: cfg.http.max_body.0,
            admin_token: cfg.admin_token.clone(),
            enqueue_requires_token: cfg.http.enqueue_requires_token,
            report_token: cfg.report_token.clone(),
            enqueue_token: cfg.enqueue_token.clone(),
            enqueue_queues: cfg.http.enqueue_queues.clone(),
            console: ui::Console::default(),
            database_mode: database_mode(cfg),
            state_dir: Some(cfg.state_dir.clone()),
        }
    }

    /// State with no routes and default limits.
    pub fn new(db: PgPool, prometheus: PrometheusHandle) -> AppState {
        AppState {
            db,
            prometheus,
            producer: None,
            payload_limit: DEFAULT_PAYLOAD_LIMIT,
            max_body: 16 << 20,
            admin_token: None,
            enqueue_requires_token: false,
            report_token: None,
            enqueue_token: None,
            enqueue_queues: Vec::new(),
            console: ui::Console::default(),
            database_mode: "pooler none; wake-ups LISTEN".into(),
            state_dir: None,
        }
    }
}

/// Every outcome spooled on this host into Postgres before a repair judges
/// (the admin API's and the console's, as `qbridge diff --repair` does):
/// the folder read, whether it exists, and how many records came in.
pub(crate) async fn bring_in_spools(
    state: &AppState,
) -> crate::error::Result<Option<crate::shadow::spool::BroughtIn>> {
    match &state.state_dir {
        Some(dir) => Ok(Some(crate::shadow::spool::bring_in(dir, &state.db).await?)),
        None => Ok(None),
    }
}

/// `pooler <mode>; wake-ups LISTEN|polling only`, as `/readyz` shows it.
fn database_mode(cfg: &Config) -> String {
    let wakeups = match cfg.database.listen_url(&cfg.database_url) {
        Some(_) => "LISTEN",
        None => "polling only (no [database] direct_url behind the pooler)",
    };
    format!(
        "pooler {}; wake-ups {wakeups}",
        cfg.database.pooler.as_str()
    )
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
) -> crate::error::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| crate::error::Error::Config(format!("cannot listen on {listen}: {e}")))?;
    tracing::info!(listen = %listen, "http listening");
    let bound = listener.local_addr()?;
    let open = auth::open_write_endpoints(&state);
    if !bound.ip().is_loopback() && !open.is_empty() {
        let (endpoints, settings): (Vec<_>, Vec<_>) = open.into_iter().unzip();
        return Err(crate::error::Error::Config(format!(
            "http.listen {bound} is reachable from other hosts and {} would be open to anyone: set {} (or listen on loopback)",
            endpoints.join(" and "),
            settings.join(", and ")
        )));
    }
    let app = router(state).into_make_service_with_connect_info::<SocketAddr>();
    Ok(tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app)
            .with_graceful_shutdown(async move { token.cancelled().await })
            .await
        {
            tracing::error!(error = %err, "http listener failed");
        }
    }))
}

/// The router. Serve it with `into_make_service_with_connect_info::<SocketAddr>()`
/// so the audit log gets the caller's address (`http:unknown` otherwise).
pub fn router(state: AppState) -> Router {
    let max_body = state.max_body;
    // Each write endpoint behind its own scope (a route layer covers the
    // routes added before it, so one router each).
    let enqueue = Router::new()
        .route("/v1/queues/{queue}/jobs", post(enqueue::post_jobs))
        .route_layer(from_fn_with_state(state.clone(), auth::require_for_enqueue));
    let outcomes = Router::new()
        .route("/v1/outcomes", post(outcomes::post_outcomes))
        .route_layer(from_fn_with_state(
            state.clone(),
            auth::require_for_outcomes,
        ));
    let admin = Router::new()
        .route("/v1/routes", get(admin::list_routes))
        .route("/v1/routes/{route}/diff", get(diff::get_diff))
        .route("/v1/routes/{route}/advance", post(admin::advance))
        .route("/v1/routes/{route}/rollback", post(admin::rollback))
        .route("/v1/routes/{route}/percent", post(admin::percent))
        .route("/v1/routes/{route}/repair", post(admin::repair))
        .route("/v1/dlq/requeue", post(admin::requeue))
        .route_layer(from_fn_with_state(state.clone(), auth::require_admin));
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(ready::readyz))
        .merge(enqueue)
        .merge(outcomes)
        .merge(admin)
        .merge(ui::router(state.clone()))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

async fn metrics(State(state): State<AppState>) -> String {
    state.prometheus.render()
}
