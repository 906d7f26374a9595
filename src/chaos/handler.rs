//! The fault suite's job handler: an HTTP endpoint whose one side effect is a
//! row in `chaos.ledger` — job key, job id, attempt, lease token, the worker
//! holding the lease and its expiry as Postgres saw them at call time,
//! live/shadow, and what it answered. The oracle reads the ledger, so "ran
//! twice" means two committed side effects, exactly what a real handler's
//! users would see.
//!
//! It answers 503 on the first attempt of every tenth key (a deterministic
//! handler failure, so retries are part of every scenario) and whenever its
//! ledger write fails (Postgres down): no side effect, no success.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use sqlx::PgPool;

use crate::demo::handler::header_text;

/// Time each call takes, so batches are in flight when a fault lands.
const WORK: Duration = Duration::from_millis(15);

const RECORD_SQL: &str = r#"
INSERT INTO chaos.ledger (key, job_id, attempt, lease, worker, lease_until, mode, ok)
SELECT $1, $2, $3, $4, j.locked_by, j.lease_until, $5, $6
  FROM (SELECT 1) one
  LEFT JOIN qbridge.jobs j ON j.id = $2 AND j.lease = $4
"#;

/// Serves the handler on a free local port; returns its URL.
pub async fn serve(db: PgPool) -> std::io::Result<String> {
    let app = axum::Router::new()
        .route("/jobs", axum::routing::post(call))
        .with_state(db);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}/jobs"))
}

/// Whether this attempt is one the handler fails on purpose.
pub fn fails_on_purpose(key: &str, attempt: i32) -> bool {
    attempt == 1 && crate::model::bucket(key).is_multiple_of(10)
}

async fn call(State(db): State<PgPool>, headers: HeaderMap) -> StatusCode {
    let text = |name: &str| header_text(&headers, name);
    let number = |name: &str| text(name).parse::<i64>().unwrap_or(0);
    let key = text("qbridge-job-key");
    let attempt = i32::try_from(number("qbridge-attempt")).unwrap_or(0);
    tokio::time::sleep(WORK).await;
    let ok = !fails_on_purpose(&key, attempt);
    let recorded = sqlx::query(RECORD_SQL)
        .bind(&key)
        .bind(number("qbridge-job-id"))
        .bind(attempt)
        .bind(number("qbridge-lease"))
        .bind(text("qbridge-mode"))
        .bind(ok)
        .execute(&db)
        .await;
    match (recorded, ok) {
        (Ok(_), true) => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}
