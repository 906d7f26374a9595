//! The console's route actions: advance (a gate's refusal comes back with
//! its failing numbers), rollback, the flipped share and repair — each with
//! a required reason and the session's CSRF token, each through the same
//! functions as the CLI and the admin API (`ops::operate`,
//! `ops::repair::diff_and_repair`), audited as `console:<peer>`. Each
//! answers with a redirect to the route's page carrying the outcome.

use std::sync::Arc;

use axum::extract::{Form, Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use serde::Deserialize;

use super::routes::find;
use super::session::Session;
use super::{csrf_ok, Stop};
use crate::http::AppState;
use crate::ops::operate::{self, Refusal, Request};
use crate::ops::repair;
use crate::routes::Route;

#[derive(Deserialize)]
pub(super) struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    force: Option<String>,
    #[serde(default)]
    percent: Option<String>,
}

/// Back to the route's page with the outcome (see-other: a reload does
/// not post again).
fn back(route: &str, result: Result<String, String>) -> Response {
    let (key, text) = match result {
        Ok(m) => ("msg", m),
        Err(e) => ("err", e),
    };
    Redirect::to(&format!(
        "/ui/routes/{}?{key}={}",
        urlencode(route),
        urlencode(&text)
    ))
    .into_response()
}

/// `s` percent-encoded for a URL's path segment or query value.
pub(super) fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn checked<'a>(
    state: &AppState,
    session: &Session,
    name: &str,
    form: &'a ActionForm,
) -> Result<(Arc<Route>, &'a str), Stop> {
    csrf_ok(session, &form.csrf)?;
    let route = find(state, name)
        .ok_or_else(|| Stop::from(back(name, Err(format!("no route named {name}")))))?;
    let reason = form.reason.trim();
    if reason.is_empty() {
        return Err(Stop::from(back(
            name,
            Err("a reason is required: it goes into the audit log".into()),
        )));
    }
    Ok((route, reason))
}

pub(super) async fn advance(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path(name): Path<String>,
    Form(form): Form<ActionForm>,
) -> Result<Response, Stop> {
    let (route, reason) = checked(&state, &session, &name, &form)?;
    let req = Request {
        by: &session.who,
        reason: Some(reason),
        force: form.force.as_deref() == Some("true"),
        percent: None,
    };
    let mut redis = state.producer.as_ref().and_then(|p| p.redis().cloned());
    let result = match operate::advance(
        &state.db,
        redis.as_mut(),
        &route,
        &req,
        state.payload_limit,
    )
    .await
    {
        Ok(done) => Ok(format!(
            "{} → {}{}",
            done.gate.from,
            done.gate.to,
            if done.forced {
                " (forced)"
            } else {
                " (gate passed)"
            }
        )),
        Err(Refusal::Gate(gate)) => {
            let failing: Vec<String> = gate
                .checks
                .iter()
                .filter(|c| !c.passed)
                .map(|c| format!("{}: {} (needs {})", c.name, c.value, c.needs))
                .collect();
            Err(format!(
                "the gate {} → {} refuses: {}",
                gate.from,
                gate.to,
                failing.join("; ")
            ))
        }
        Err(Refusal::Error(e)) => Err(e.to_string()),
    };
    Ok(back(&route.name, result))
}

pub(super) async fn rollback(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path(name): Path<String>,
    Form(form): Form<ActionForm>,
) -> Result<Response, Stop> {
    let (route, reason) = checked(&state, &session, &name, &form)?;
    let req = Request::new(&session.who, Some(reason));
    let mut redis = state.producer.as_ref().and_then(|p| p.redis().cloned());
    let result = operate::rollback(&state.db, redis.as_mut(), &route, &req)
        .await
        .map(|s| format!("rolled back to {}", s.phase))
        .map_err(|e| e.to_string());
    Ok(back(&route.name, result))
}

pub(super) async fn percent(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path(name): Path<String>,
    Form(form): Form<ActionForm>,
) -> Result<Response, Stop> {
    let (route, reason) = checked(&state, &session, &name, &form)?;
    let Some(percent) = form
        .percent
        .as_deref()
        .and_then(|p| p.trim().parse::<u8>().ok())
        .filter(|p| *p <= 100)
    else {
        return Ok(back(
            &route.name,
            Err("the flipped share must be 0 to 100".into()),
        ));
    };
    let req = Request::new(&session.who, Some(reason));
    let mut redis = state.producer.as_ref().and_then(|p| p.redis().cloned());
    let result = operate::ramp(&state.db, redis.as_mut(), &route, percent, &req)
        .await
        .map(|_| format!("flipped share set to {percent}%"))
        .map_err(|e| e.to_string());
    Ok(back(&route.name, result))
}

pub(super) async fn repair(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path(name): Path<String>,
    Form(form): Form<ActionForm>,
) -> Result<Response, Stop> {
    let (route, reason) = checked(&state, &session, &name, &form)?;
    let Some(mut redis) = state.producer.as_ref().and_then(|p| p.redis().cloned()) else {
        return Ok(back(
            &route.name,
            Err("there is no Redis side to repair".into()),
        ));
    };
    let brought_in = match crate::http::bring_in_spools(&state).await {
        Ok(b) => b.map_or(0, |b| b.inserted),
        Err(e) => return Ok(back(&route.name, Err(format!("repair refused: {e}")))),
    };
    let result = match repair::diff_and_repair(
        &state.db,
        &mut redis,
        &route,
        &session.who,
        None,
        None,
        state.payload_limit,
    )
    .await
    {
        Ok((_, report)) => {
            // The operator's reason goes into the log with the counts; a
            // repair on evidence writes no audit row (only assumptions do,
            // and those stay the CLI's).
            tracing::info!(route = %route.name, by = %session.who, reason = %reason, brought_in, mirrored = report.mirrored, repushed = report.repushed, unaccounted = report.unaccounted, not_judged = report.not_judged, read_while_moving = report.read_while_moving, "repair from the console");
            let busy = if report.not_judged > 0 || report.read_while_moving {
                format!(
                    "; {} not judged, Redis kept changing while it was read: repair again when its consumers are quieter",
                    report.not_judged
                )
            } else {
                String::new()
            };
            Ok(format!(
                "repair: {} mirrored, {} pushed back on evidence, {} unaccounted (left for your decision){busy}",
                report.mirrored, report.repushed, report.unaccounted
            ))
        }
        Err(e) => Err(e.to_string()),
    };
    Ok(back(&route.name, result))
}
