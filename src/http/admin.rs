//! The admin API: what `qbridge cutover`, `qbridge diff --repair` and
//! `qbridge dlq requeue` do, over HTTP, behind the bearer token
//! ([`super::auth`]). The logic is the CLI's (`cutover::operate`,
//! `shadow::repair`, `queue::dlq`); this file only reads requests and shapes
//! answers.
//!
//! - `GET  /v1/routes`: every route's stored phase and its next gate.
//! - `POST /v1/routes/{route}/advance` `{"reason", "force", "percent", "by"}`
//! - `POST /v1/routes/{route}/rollback` `{"reason", "by"}` (reason required)
//! - `POST /v1/routes/{route}/percent` `{"percent", "reason", "by"}`
//! - `POST /v1/routes/{route}/repair` `{"since", "assume_lost": [keys],
//!   "assume_lost_before", "reason"}`: the diff and its repair (an
//!   assumption is the operator's audited decision, as in the CLI); the
//!   outcome spools on this host are brought in first, as the CLI does.
//! - `POST /v1/dlq/requeue` `{"ids", "queue", "error", "all", "rate"}`
//!
//! Phase changes are the same compare-and-swap with the same audit row as
//! the CLI's; `changed_by` is `by` (if given) followed by the caller's
//! address, so an HTTP change is always traceable to where it came from.
//! Answers are JSON; a gate refusal is 409 with the failing checks; a
//! request the route's current state does not allow (a lost race, no phase
//! before, Redis needed) is 409; bad input is 400; Postgres or Redis down
//! is 503; each error is one line `{"error": …}`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Caller;
use super::enqueue::service_error;
use super::{error_reply, AppState, Reply};
use crate::error::Error;
use crate::ops::gates;
use crate::ops::operate::{self, Refusal, Request};
use crate::ops::repair;
use crate::queue::dlq::{self, Selector};
use crate::redis::producer::Producer;
use crate::routes::Route;

type Failure = (StatusCode, Json<Value>);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AdvanceBody {
    reason: Option<String>,
    #[serde(default)]
    force: bool,
    percent: Option<u8>,
    by: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RollbackBody {
    reason: Option<String>,
    by: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PercentBody {
    percent: Option<u8>,
    reason: Option<String>,
    by: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RepairBody {
    since: Option<String>,
    /// The operator's decision that these jobs are lost (audited; needs a
    /// reason), as `qbridge diff --repair --assume-lost`.
    #[serde(default)]
    assume_lost: Vec<String>,
    assume_lost_before: Option<String>,
    reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RequeueBody {
    ids: Option<Vec<i64>>,
    queue: Option<String>,
    /// Substring of the last error, like `qbridge dlq requeue --error`.
    error: Option<String>,
    #[serde(default)]
    all: bool,
    /// Jobs per second (default 100), so a replay cannot starve live work.
    rate: Option<u32>,
}

/// A JSON body, or the type's default for an empty one.
fn body<T: DeserializeOwned + Default>(body: Result<Bytes, BytesRejection>) -> Result<T, Failure> {
    let body = body.map_err(|e| error_reply(e.status(), &e.body_text()))?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&body).map_err(|e| {
        error_reply(
            StatusCode::BAD_REQUEST,
            &format!("body is not the expected JSON object: {e}"),
        )
    })
}

fn bad(message: &str) -> Failure {
    error_reply(StatusCode::BAD_REQUEST, message)
}

/// Errors of `operate`: a refusal by the route's current state is 409, bad
/// input 400, the rest (Postgres or Redis down) 503.
fn refused(e: Error) -> Failure {
    match e {
        Error::Refused(m) => error_reply(StatusCode::CONFLICT, &m),
        other => service_error(other),
    }
}

fn producer(state: &AppState) -> Result<&Producer, Failure> {
    state
        .producer
        .as_ref()
        .ok_or_else(|| error_reply(StatusCode::NOT_FOUND, "this process has no routes"))
}

fn route(state: &AppState, name: &str) -> Result<Arc<Route>, Failure> {
    producer(state)?
        .routes()
        .by_name(name)
        .cloned()
        .ok_or_else(|| error_reply(StatusCode::NOT_FOUND, &format!("no route named {name:?}")))
}

/// `changed_by` for the audit log (see the module docs).
fn changed_by(by: Option<&str>, caller: &Caller) -> String {
    match by.map(str::trim).filter(|b| !b.is_empty()) {
        Some(by) => format!("{by} ({})", caller.0),
        None => caller.0.clone(),
    }
}

fn reason_given(reason: &Option<String>) -> bool {
    reason.as_deref().is_some_and(|r| !r.trim().is_empty())
}

pub(super) async fn list_routes(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Reply {
    let producer = producer(&state)?;
    let mut redis = producer.redis().cloned();
    let mut routes = Vec::new();
    for route in producer.routes().iter() {
        let current = operate::state_of(&state.db, route, &caller.0)
            .await
            .map_err(service_error)?;
        let gate = gates::evaluate(&state.db, redis.as_mut(), route, &current)
            .await
            .map_err(service_error)?;
        routes.push(json!({ "state": current, "gate": gate }));
    }
    Ok((StatusCode::OK, Json(json!({ "routes": routes }))))
}

pub(super) async fn advance(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Reply {
    let req: AdvanceBody = body(raw)?;
    let route = route(&state, &name)?;
    if req.force && !reason_given(&req.reason) {
        return Err(bad("force needs a reason: the override is audited with it"));
    }
    if req.percent.is_some_and(|p| p > 100) {
        return Err(bad("percent must be 0 to 100"));
    }
    let by = changed_by(req.by.as_deref(), &caller);
    let request = Request {
        by: &by,
        reason: req.reason.as_deref(),
        force: req.force,
        percent: req.percent,
    };
    let mut redis = producer(&state)?.redis().cloned();
    match operate::advance(
        &state.db,
        redis.as_mut(),
        &route,
        &request,
        state.payload_limit,
    )
    .await
    {
        Ok(done) => Ok((StatusCode::OK, Json(json!(done)))),
        Err(Refusal::Gate(gate)) => {
            let failing: Vec<_> = gate.checks.iter().filter(|c| !c.passed).collect();
            let error = format!(
                "gate {} → {} refused for route {:?} ({} of {} checks failed); wait and retry, or force with a reason",
                gate.from,
                gate.to,
                route.name,
                failing.len(),
                gate.checks.len()
            );
            Err((
                StatusCode::CONFLICT,
                Json(json!({ "error": error, "failing": failing, "gate": gate })),
            ))
        }
        Err(Refusal::Error(e)) => Err(refused(e)),
    }
}

pub(super) async fn rollback(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Reply {
    let req: RollbackBody = body(raw)?;
    let route = route(&state, &name)?;
    if !reason_given(&req.reason) {
        return Err(bad(
            "a rollback needs a reason (it goes into the audit log)",
        ));
    }
    let by = changed_by(req.by.as_deref(), &caller);
    let request = Request::new(&by, req.reason.as_deref());
    let mut redis = producer(&state)?.redis().cloned();
    let done = operate::rollback(&state.db, redis.as_mut(), &route, &request)
        .await
        .map_err(refused)?;
    Ok((StatusCode::OK, Json(json!({ "state": done }))))
}

pub(super) async fn percent(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Reply {
    let req: PercentBody = body(raw)?;
    let route = route(&state, &name)?;
    let percent = match req.percent {
        Some(p) if p <= 100 => p,
        _ => return Err(bad("percent must be given, 0 to 100")),
    };
    if !reason_given(&req.reason) {
        return Err(bad("changing the flipped share needs a reason"));
    }
    let by = changed_by(req.by.as_deref(), &caller);
    let request = Request::new(&by, req.reason.as_deref());
    let mut redis = producer(&state)?.redis().cloned();
    let done = operate::ramp(&state.db, redis.as_mut(), &route, percent, &request)
        .await
        .map_err(refused)?;
    Ok((StatusCode::OK, Json(json!({ "state": done }))))
}

pub(super) async fn repair(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Reply {
    let req: RepairBody = body(raw)?;
    let assume = match (req.assume_lost.is_empty(), &req.assume_lost_before) {
        (true, None) => None,
        _ => {
            let before = match &req.assume_lost_before {
                Some(text) => {
                    Some(crate::ops::window::parse_since(text).map_err(|e| bad(&e.to_string()))?)
                }
                None => None,
            };
            let assume = repair::Assumption {
                keys: req.assume_lost.clone(),
                before,
                by: caller.0.clone(),
                reason: req.reason.clone().unwrap_or_default(),
            };
            assume.check().map_err(|e| bad(&e.to_string()))?;
            Some(assume)
        }
    };
    let route = route(&state, &name)?;
    let Some(redis) = producer(&state)?.redis() else {
        return Err(error_reply(
            StatusCode::CONFLICT,
            "every route is decommissioned: there is no Redis side to repair",
        ));
    };
    let mut redis = redis.clone();
    let since = match &req.since {
        Some(text) => Some(crate::ops::window::parse_since(text).map_err(|e| bad(&e.to_string()))?),
        None => None,
    };
    let spools = super::bring_in_spools(&state)
        .await
        .map_err(service_error)?;
    let brought_in = spools.as_ref().map_or(0, |b| b.inserted);
    let (diff, report) = repair::diff_and_repair(
        &state.db,
        &mut redis,
        &route,
        &caller.0,
        since,
        assume.as_ref(),
        state.payload_limit,
    )
    .await
    .map_err(service_error)?;
    tracing::info!(route = %route.name, by = %caller.0, brought_in, mirrored = report.mirrored, repushed = report.repushed, not_judged = report.not_judged, read_while_moving = report.read_while_moving, "repair over HTTP");
    Ok((
        StatusCode::OK,
        Json(json!({
            "diff": diff,
            "repair": report,
            // A wrong or empty state_dir shows as a folder not found.
            "spools": spools.map(|b| json!({
                "folder": b.folder.display().to_string(),
                "found": b.found,
                "brought_in": b.inserted,
            })),
        })),
    ))
}

pub(super) async fn requeue(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    raw: Result<Bytes, BytesRejection>,
) -> Reply {
    let req: RequeueBody = body(raw)?;
    if let Some(q) = &req.queue {
        crate::queue::validate::queue_name(q).map_err(|e| bad(&e.to_string()))?;
    }
    let sel = Selector {
        ids: req.ids.filter(|ids| !ids.is_empty()),
        queue: req.queue,
        error_contains: req.error.filter(|e| !e.is_empty()),
    };
    if sel.is_empty() && !req.all {
        return Err(bad(
            "requeue needs ids, queue or error, or \"all\": true to requeue every dead job",
        ));
    }
    let rate = req.rate.unwrap_or(100);
    if rate == 0 {
        return Err(bad("rate must be at least 1 job/s"));
    }
    let total = dlq::count(&state.db, &sel).await.map_err(service_error)?;
    let moved = dlq::requeue(&state.db, &sel, rate, |_| {})
        .await
        .map_err(service_error)?;
    let left = (total as u64).saturating_sub(moved);
    tracing::info!(by = %caller.0, requeued = moved, left_in_dlq = left, "dead-letter requeue over HTTP");
    Ok((
        StatusCode::OK,
        Json(json!({ "requeued": moved, "left_in_dlq": left })),
    ))
}
