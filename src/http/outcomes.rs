//! `POST /v1/outcomes`: how a worker fleet qbridge does not run (Sidekiq,
//! Celery) reports what it did with a job, for the shadow comparison. The
//! same as calling `qbridge.report_outcome(queue, key, outcome, detail)` in SQL.
//!
//! Body: `{"queue": "emails", "key": "jid-1", "outcome": "ok"|"failed"|"dead"|"skipped",
//! "detail": "..."}` or a JSON array of those (one transaction). `detail` is
//! digested, never stored. `skipped`: the fleet fetched a re-push of a job
//! Postgres owns and did not run it (the adapters' live-key guard).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::enqueue::service_error;
use super::{error_reply, AppState, Reply};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Reported {
    queue: String,
    key: String,
    outcome: String,
    #[serde(default)]
    detail: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Body {
    Many(Vec<Reported>),
    One(Reported),
}

pub(super) async fn post_outcomes(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Reply {
    let body = body.map_err(|e| error_reply(e.status(), &e.body_text()))?;
    let reported = match serde_json::from_slice::<Body>(&body) {
        Ok(Body::One(r)) => vec![r],
        Ok(Body::Many(list)) => list,
        Err(e) => {
            return Err(error_reply(
                StatusCode::BAD_REQUEST,
                &format!("body is not an outcome or a list of outcomes: {e}"),
            ))
        }
    };
    for (i, r) in reported.iter().enumerate() {
        if !matches!(r.outcome.as_str(), "ok" | "failed" | "dead" | "skipped") {
            return Err(error_reply(
                StatusCode::BAD_REQUEST,
                &format!(
                    "outcome {}: must be ok, failed, dead or skipped, got {:?}",
                    i + 1,
                    r.outcome
                ),
            ));
        }
        if r.queue.is_empty() || r.key.is_empty() {
            return Err(error_reply(
                StatusCode::BAD_REQUEST,
                &format!("outcome {}: queue and key must be non-empty", i + 1),
            ));
        }
    }
    let mut tx = state
        .db
        .begin()
        .await
        .map_err(|e| service_error(e.into()))?;
    for r in &reported {
        sqlx::query("SELECT qbridge.report_outcome($1, $2, $3, $4)")
            .bind(&r.queue)
            .bind(&r.key)
            .bind(&r.outcome)
            .bind(&r.detail)
            .execute(&mut *tx)
            .await
            .map_err(|e| service_error(e.into()))?;
    }
    tx.commit().await.map_err(|e| service_error(e.into()))?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"recorded": reported.len()})),
    ))
}
