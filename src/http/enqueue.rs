//! `POST /v1/queues/{queue}/jobs`: enqueue one job or a batch over HTTP.
//!
//! A queue that belongs to a route is phase-aware like the producer API: the
//! request's payloads become list items (compact JSON, or exact bytes from
//! `item_b64`), keyed by the route's format, written to Postgres, Redis or
//! both by the route's phase. Any other queue takes plain jobs (payload, key,
//! kind, priority, run_at, max_attempts, lock_key) as live copies.
//!
//! Bodies: one job object, a JSON array of them, or `{"jobs": [...]}`.
//! Every error is `{"error": "<one line>"}`: 400 for bad input (nothing is
//! stored), 413 for a body over `http.max_body` or a payload over
//! `payload_limit`, 503 when Postgres or Redis
//! is unavailable.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{error_reply, AppState, Reply};
use crate::error::Error;
use crate::ingest::Stored;
use crate::queue::{enqueue_many, validate, EnqueueOutcome, NewJob};

/// One job as posted.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostedJob {
    #[serde(default)]
    payload: Option<Value>,
    /// Exact item bytes for a routed queue whose items are not JSON.
    #[serde(default)]
    item_b64: Option<String>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    priority: Option<i32>,
    /// RFC 3339 text, parsed by [`run_at`] so a bad one gets a clear error.
    #[serde(default)]
    run_at: Option<String>,
    #[serde(default)]
    max_attempts: Option<i32>,
    #[serde(default)]
    lock_key: Option<String>,
}

/// Most jobs in one request.
const MAX_JOBS: usize = 10_000;

pub(super) async fn post_jobs(
    State(state): State<AppState>,
    Path(queue): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Reply {
    let body = body.map_err(|e| error_reply(e.status(), &e.body_text()))?;
    validate::queue_name(&queue).map_err(bad_request)?;
    let jobs = parse(&body)?;
    let routed = state
        .producer
        .as_ref()
        .and_then(|p| p.routes().by_queue(&queue).map(|r| (p, r.name.clone())));
    match routed {
        Some((producer, route)) => {
            let items = jobs
                .into_iter()
                .enumerate()
                .map(|(i, job)| routed_item(i, job, &route))
                .collect::<Result<Vec<_>, _>>()?;
            let done = producer
                .enqueue(&route, items)
                .await
                .map_err(service_error)?;
            let jobs: Vec<Value> = done
                .stored
                .iter()
                .map(|s| match s {
                    Stored::New { id, key } => json!({"id": id, "key": key, "duplicate": false}),
                    Stored::Duplicate { key } => json!({"id": null, "key": key, "duplicate": true}),
                    // Never for HTTP enqueue (live copies), but total.
                    Stored::Recorded { key } => json!({"id": null, "key": key, "duplicate": false}),
                })
                .collect();
            Ok((
                StatusCode::CREATED,
                Json(json!({
                    "queue": queue, "route": route, "phase": done.phase.as_str(),
                    "jobs": jobs, "pushed": done.pushed, "deferred": done.deferred,
                    "push_error": done.push_error,
                })),
            ))
        }
        None => {
            let jobs = jobs
                .into_iter()
                .enumerate()
                .map(|(i, job)| plain_job(i, job, &queue, state.payload_limit))
                .collect::<Result<Vec<_>, _>>()?;
            let outcomes = enqueue_many(&state.db, &jobs, state.payload_limit)
                .await
                .map_err(service_error)?;
            let listed: Vec<Value> = outcomes
                .iter()
                .zip(&jobs)
                .map(|(o, j)| match o {
                    EnqueueOutcome::Inserted(id) => {
                        json!({"id": id, "key": j.key, "duplicate": false})
                    }
                    EnqueueOutcome::Duplicate(id) => {
                        json!({"id": id, "key": j.key, "duplicate": true})
                    }
                })
                .collect();
            Ok((
                StatusCode::CREATED,
                Json(json!({"queue": queue, "route": null, "phase": null, "jobs": listed})),
            ))
        }
    }
}

/// Reads the body's jobs. The shape is decided first and each job is read on
/// its own, so an error names the job and the field (`job 2: unknown field
/// ...`, `job 1: run_at: ...`) instead of "matches no shape".
fn parse(body: &[u8]) -> Result<Vec<PostedJob>, (StatusCode, Json<Value>)> {
    let bad = |m: &str| error_reply(StatusCode::BAD_REQUEST, m);
    let value: Value =
        serde_json::from_slice(body).map_err(|e| bad(&format!("body is not JSON: {e}")))?;
    let items = match value {
        Value::Array(items) => items,
        Value::Object(mut map) if map.len() == 1 && map.contains_key("jobs") => {
            match map.remove("jobs") {
                Some(Value::Array(items)) => items,
                _ => return Err(bad("\"jobs\" must be a list of jobs")),
            }
        }
        one @ Value::Object(_) => vec![one],
        _ => {
            return Err(bad(
                "body is not a job, a list of jobs or {\"jobs\": [...]}",
            ))
        }
    };
    if items.is_empty() {
        return Err(bad("no jobs in the body"));
    }
    if items.len() > MAX_JOBS {
        return Err(error_reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("{} jobs in one request; at most {MAX_JOBS}", items.len()),
        ));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            serde_json::from_value(item).map_err(|e| bad(&format!("job {}: {e}", i + 1)))
        })
        .collect()
}

/// The list item of a job posted to a routed queue.
fn routed_item(
    i: usize,
    job: PostedJob,
    route: &str,
) -> Result<bytes::Bytes, (StatusCode, Json<Value>)> {
    let refuse = |m: String| error_reply(StatusCode::BAD_REQUEST, &format!("job {}: {m}", i + 1));
    let extra = job.key.is_some()
        || job.kind.is_some()
        || job.priority.is_some()
        || job.run_at.is_some()
        || job.max_attempts.is_some()
        || job.lock_key.is_some();
    if extra {
        return Err(refuse(format!(
            "this queue belongs to route {route:?}: the job key and kind come from the route's format; send only payload or item_b64"
        )));
    }
    match (job.payload, job.item_b64) {
        (Some(payload), None) => serde_json::to_vec(&payload)
            .map(bytes::Bytes::from)
            .map_err(|e| refuse(format!("payload: {e}"))),
        (None, Some(b64)) => BASE64
            .decode(b64.as_bytes())
            .map(bytes::Bytes::from)
            .map_err(|_| refuse("item_b64 is not valid base64".into())),
        _ => Err(refuse("give exactly one of payload and item_b64".into())),
    }
}

fn plain_job(
    i: usize,
    job: PostedJob,
    queue: &str,
    limit: usize,
) -> Result<NewJob, (StatusCode, Json<Value>)> {
    let refuse = |m: String| error_reply(StatusCode::BAD_REQUEST, &format!("job {}: {m}", i + 1));
    if job.item_b64.is_some() {
        return Err(refuse(
            "item_b64 is only for queues that belong to a route".into(),
        ));
    }
    let payload = job
        .payload
        .ok_or_else(|| refuse("payload is missing".into()))?;
    let mut new = NewJob::new(queue, payload);
    new.key = job.key;
    new.kind = job.kind;
    new.priority = job.priority.unwrap_or(0);
    new.run_at = job
        .run_at
        .as_deref()
        .map(run_at)
        .transpose()
        .map_err(refuse)?;
    new.max_attempts = job.max_attempts;
    new.lock_key = job.lock_key;
    validate::job_fields(&new).map_err(|e| refuse(e.to_string()))?;
    validate::payload_value(&new.payload, limit).map_err(|e| match e {
        // Too large is 413 whichever limit it broke (the body's or the payload's).
        Error::PayloadTooLarge { .. } => error_reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("job {}: {e}", i + 1),
        ),
        e => refuse(e.to_string()),
    })?;
    if new.max_attempts.is_some_and(|m| m < 1) {
        return Err(refuse("max_attempts must be at least 1".into()));
    }
    Ok(new)
}

/// An RFC 3339 time with its offset, e.g. `2026-11-21T18:00:00Z`. The text is
/// not echoed back: the reason and an example are enough to fix it.
fn run_at(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("run_at is not an RFC 3339 time ({e}); e.g. 2026-11-21T18:00:00Z"))
}

fn bad_request(e: Error) -> (StatusCode, Json<Value>) {
    error_reply(StatusCode::BAD_REQUEST, &e.to_string())
}

/// Input errors are 400; an unavailable database or Redis is 503.
pub(super) fn service_error(e: Error) -> (StatusCode, Json<Value>) {
    let status = match &e {
        Error::InvalidInput(_) | Error::InvalidQueueName(_) | Error::PayloadNotJson(_) => {
            StatusCode::BAD_REQUEST
        }
        Error::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    error_reply(status, &e.to_string())
}

#[cfg(test)]
mod tests;
