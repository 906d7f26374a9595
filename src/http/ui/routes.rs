//! The console's route pages: every route with its phase and next gate
//! (`/ui`), one route in full (`/ui/routes/{route}`: the gate's checks with
//! their measured values and thresholds, the latest diff, what Redis still
//! holds elsewhere, the audit timeline) and its actions — advance (the
//! gate's numbers shown first; a refusal says why), rollback, the flipped
//! share — each with a required reason, audited as `console:<peer>` through
//! `ops::operate`, as the CLI's.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::html::{esc, page, Html};
use super::session::Session;
use super::{html, unavailable};
use crate::http::AppState;
use crate::ops::gates::{self, Gate};
use crate::ops::operate;
use crate::routes::Route;

/// `?msg=` / `?err=`: the outcome of the last action, shown once.
#[derive(Deserialize, Default)]
pub(super) struct Flash {
    msg: Option<String>,
    err: Option<String>,
}

fn flash(f: &Flash, out: &mut Html) {
    if let Some(m) = &f.msg {
        out.raw("<p class=\"flash\" id=\"flash\">")
            .text(m)
            .raw("</p>");
    }
    if let Some(e) = &f.err {
        out.raw("<p class=\"error\" id=\"flash\">")
            .text(e)
            .raw("</p>");
    }
}

fn routes_of(state: &AppState) -> Vec<Arc<Route>> {
    state
        .producer
        .as_ref()
        .map(|p| p.routes().iter().cloned().collect())
        .unwrap_or_default()
}

pub(super) fn find(state: &AppState, name: &str) -> Option<Arc<Route>> {
    state.producer.as_ref()?.routes().by_name(name).cloned()
}

/// The routes table (also the live fragment).
/// The routes table (also the live fragment). The next gate's summary is
/// evaluated (a diff: it reads Redis and Postgres) on a page load, and for
/// the refreshes taken from [`super::Console`]'s cache while under
/// [`GATE_CACHE`] old: open tabs do not run every gate every few seconds.
async fn routes_table(state: &AppState, who: &str, fresh: bool) -> crate::error::Result<String> {
    let mut out = Html::default();
    out.raw("<table id=\"routes\" data-refresh=\"/ui/fragment/routes\"><thead><tr><th>route</th><th>phase</th><th>since</th><th>by</th><th>next gate</th></tr></thead><tbody>");
    let mut redis = state.producer.as_ref().and_then(|p| p.redis().cloned());
    for route in routes_of(state) {
        let current = operate::state_of(&state.db, &route, who).await?;
        let cached = (!fresh)
            .then(|| {
                state
                    .console
                    .gate_summary(&route.name, current.phase, GATE_CACHE)
            })
            .flatten();
        let summary = match cached {
            Some(s) => s,
            None => {
                let gate = gates::evaluate(&state.db, redis.as_mut(), &route, &current).await?;
                let s = gate_summary(gate.as_ref());
                state
                    .console
                    .keep_gate_summary(&route.name, current.phase, s.clone());
                s
            }
        };
        let phase = if current.phase == crate::model::Phase::PostgresOnly && current.percent < 100 {
            format!("{} ({}%)", current.phase, current.percent)
        } else {
            current.phase.to_string()
        };
        let _ = write!(
            out,
            "<tr><td><a href=\"/ui/routes/{0}\">{0}</a></td><td class=\"phase\">{1}</td><td>{2}</td><td>{3}</td><td>{4}</td></tr>",
            esc(&route.name),
            esc(&phase),
            esc(&when(current.since)),
            esc(&current.changed_by),
            summary
        );
    }
    out.raw("</tbody></table>");
    Ok(out.into_string())
}

/// How long a route's next-gate summary is reused by the live refresh.
const GATE_CACHE: std::time::Duration = std::time::Duration::from_secs(30);

fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn gate_summary(gate: Option<&Gate>) -> String {
    match gate {
        None => "<span class=\"muted\">none (last phase)</span>".into(),
        // Decommissioned: the next step archives what reached Redis since.
        Some(g) if g.from == g.to && g.passed() => {
            "<span class=\"pass\">archive check: passes</span>".into()
        }
        Some(g) if g.passed() => format!(
            "<span class=\"pass\">→ {}: passes</span>",
            esc(&g.to.to_string())
        ),
        Some(g) => {
            let failing = g.checks.iter().filter(|c| !c.passed).count();
            format!(
                "<span class=\"fail\">→ {}: {} of {} checks fail</span>",
                esc(&g.to.to_string()),
                failing,
                g.checks.len()
            )
        }
    }
}

pub(super) async fn overview(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Query(f): Query<Flash>,
) -> Response {
    let mut out = Html::default();
    out.raw("<h1>Routes</h1>");
    flash(&f, &mut out);
    match routes_table(&state, &session.who, true).await {
        Ok(table) => {
            out.raw(&table);
            html(
                StatusCode::OK,
                page("Routes", Some(&session.csrf), &out.into_string()),
            )
        }
        Err(e) => unavailable(&session, "the routes", e),
    }
}

pub(super) async fn overview_fragment(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
) -> Response {
    match routes_table(&state, &session.who, false).await {
        Ok(table) => html(StatusCode::OK, table),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("<p class=\"error\">{}</p>", esc(&e.to_string())),
        ),
    }
}

pub(super) async fn detail(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path(name): Path<String>,
    Query(f): Query<Flash>,
) -> Response {
    let Some(route) = find(&state, &name) else {
        return html(
            StatusCode::NOT_FOUND,
            page(
                "No such route",
                Some(&session.csrf),
                &format!("<p class=\"error\">No route named {}.</p>", esc(&name)),
            ),
        );
    };
    match detail_body(&state, &route, &session, &f).await {
        Ok(body) => html(
            StatusCode::OK,
            page(&route.name, Some(&session.csrf), &body),
        ),
        Err(e) => unavailable(&session, "the route", e),
    }
}

async fn detail_body(
    state: &AppState,
    route: &Route,
    session: &Session,
    f: &Flash,
) -> crate::error::Result<String> {
    let current = operate::state_of(&state.db, route, &session.who).await?;
    let mut redis = state.producer.as_ref().and_then(|p| p.redis().cloned());
    let gate = gates::evaluate(&state.db, redis.as_mut(), route, &current).await?;
    let mut out = Html::default();
    out.raw("<h1>Route ").text(&route.name).raw("</h1>");
    flash(f, &mut out);
    let _ = write!(
        out,
        "<p>Redis <code>{}</code> → Postgres queue <code>{}</code> ({} format). Phase <strong id=\"phase\">{}</strong>{} since {}, by {}: {}</p>",
        esc(&String::from_utf8_lossy(&route.redis_key)),
        esc(&route.queue),
        esc(route.format.name()),
        esc(&current.phase.to_string()),
        if current.percent < 100 { format!(" ({}% flipped)", current.percent) } else { String::new() },
        esc(&when(current.since)),
        esc(&current.changed_by),
        esc(&current.reason)
    );
    gate_section(gate.as_ref(), &mut out);
    actions(route, session, gate.as_ref(), &mut out);
    if let Some(diff) = gate.as_ref().and_then(|g| g.diff.as_ref()) {
        diff_section(diff, route, session, &mut out);
    }
    audit(state, route, &mut out).await?;
    Ok(out.into_string())
}

/// The latest diff, what Redis still holds for the route, and repair: what
/// it would do (the diff's repairable and unaccounted jobs, with the
/// evidence and the reason) before the button that does it.
fn diff_section(diff: &crate::ops::diff::Diff, route: &Route, session: &Session, out: &mut Html) {
    out.raw("<h2>Latest diff</h2><p id=\"diff\">")
        .text(&diff.verdict)
        .raw("</p><pre id=\"diff-table\">")
        .text(&crate::ops::diff::table(diff))
        .raw("</pre>");
    let _ = write!(
        out,
        "<h2>What Redis still holds</h2><table id=\"held\"><tbody>\
         <tr><td>waiting in the list</td><td>{}</td></tr><tr><td>in processing lists</td><td>{}</td></tr>\
         <tr><td>parked for the mirror (gap list)</td><td>{}</td></tr>",
        diff.redis_waiting, diff.redis_processing, diff.redis_parked
    );
    for line in crate::ops::structures::non_empty(&diff.redis_elsewhere) {
        out.raw("<tr><td colspan=\"2\">")
            .text(&line)
            .raw("</td></tr>");
    }
    out.raw("</tbody></table><h2>Repair</h2><p id=\"repair-preview\">");
    let _ = write!(
        out,
        "Would mirror {} jobs only on Redis and push back {} lost on evidence; {} unaccounted stay for your decision.",
        diff.only_redis_waiting, diff.repairable, diff.unaccounted
    );
    out.raw("</p>");
    for line in &diff.repair_evidence {
        out.raw("<p class=\"muted\">evidence: ")
            .text(line)
            .raw("</p>");
    }
    if let Some(reason) = &diff.unaccounted_reason {
        out.raw("<p class=\"muted\">unaccounted: ")
            .text(reason)
            .raw("</p>");
    }
    if !diff.sample_unaccounted.is_empty() {
        out.raw("<p>Unaccounted (sample): ")
            .text(&diff.sample_unaccounted.join(", "))
            .raw("</p>");
    }
    let _ = write!(
        out,
        "<form method=\"post\" action=\"/ui/routes/{}/repair\" class=\"inline\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <label>Reason <input name=\"reason\" id=\"repair-reason\" required></label> \
         <button id=\"repair\">Repair on evidence</button></form>\
         <p class=\"muted\">Assuming unaccounted jobs lost is an operator's decision made with the CLI \
         (<code>qbridge diff --repair --assume-lost</code>), audited with its reason.</p>",
        esc(&route.name),
        esc(&session.csrf)
    );
}

fn gate_section(gate: Option<&Gate>, out: &mut Html) {
    let Some(g) = gate else {
        out.raw("<h2>Next gate</h2><p class=\"muted\">None: this is the last phase.</p>");
        return;
    };
    let _ = write!(
        out,
        "<h2>Next gate: {} → {} {}</h2><table id=\"gate\"><thead><tr><th>check</th><th>measured</th><th>needs</th><th></th></tr></thead><tbody>",
        esc(&g.from.to_string()),
        esc(&g.to.to_string()),
        gate_summary(Some(g))
    );
    for c in &g.checks {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td></tr>",
            esc(&c.name),
            esc(&c.value),
            esc(&c.needs),
            if c.passed { "pass" } else { "fail" },
            if c.passed { "pass" } else { "FAIL" }
        );
    }
    out.raw("</tbody></table>");
}

fn actions(route: &Route, session: &Session, gate: Option<&Gate>, out: &mut Html) {
    let name = esc(&route.name);
    out.raw("<h2>Actions</h2>");
    if let Some(g) = gate {
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/ui/routes/{name}/advance\" class=\"inline\" id=\"advance-form\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <label>Reason <input name=\"reason\" id=\"advance-reason\" required></label> \
             <label><input type=\"checkbox\" name=\"force\" value=\"true\"> force past the gate</label> \
             <button id=\"advance\">{label}</button></form>",
            csrf = esc(&session.csrf),
            label = if g.from == g.to {
                "Archive what reached Redis since".to_string()
            } else {
                format!("Advance to {}", esc(&g.to.to_string()))
            }
        );
    }
    let _ = write!(
        out,
        "<form method=\"post\" action=\"/ui/routes/{name}/rollback\" class=\"inline\" id=\"rollback-form\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <label>Reason <input name=\"reason\" id=\"rollback-reason\" required></label> \
         <button id=\"rollback\">Roll back one phase</button></form>\
         <form method=\"post\" action=\"/ui/routes/{name}/percent\" class=\"inline\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <label>Flipped share <input name=\"percent\" type=\"number\" min=\"0\" max=\"100\" required>%</label> \
         <label>Reason <input name=\"reason\" required></label> <button>Set</button></form>",
        csrf = esc(&session.csrf)
    );
}

/// when, by, reason, keys decided, before, pushed back.
type RepairRow = (
    DateTime<Utc>,
    String,
    String,
    i32,
    Option<DateTime<Utc>>,
    i32,
);

/// when, from, to, by, reason, forced, flipped share, the gate's checks.
type AuditRow = (
    DateTime<Utc>,
    Option<String>,
    String,
    String,
    String,
    bool,
    Option<i16>,
    Option<serde_json::Value>,
);

/// The gate's numbers an advance was judged on (its checks as recorded).
fn gate_numbers(gates: Option<&serde_json::Value>) -> String {
    let Some(checks) = gates
        .and_then(|g| g.get("checks"))
        .and_then(|c| c.as_array())
    else {
        return String::new();
    };
    checks
        .iter()
        .map(|c| {
            let s = |k: &str| c.get(k).and_then(|v| v.as_str()).unwrap_or("");
            let passed = c.get("passed").and_then(|p| p.as_bool()) == Some(true);
            let mark = if passed { "pass" } else { "FAIL" };
            format!("{mark} {} {} (needs {})", s("name"), s("value"), s("needs"))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

async fn audit(state: &AppState, route: &Route, out: &mut Html) -> crate::error::Result<()> {
    let rows: Vec<AuditRow> = sqlx::query_as(
        "SELECT changed_at, from_phase, to_phase, changed_by, reason, forced, percent, gates FROM qbridge.phase_audit \
         WHERE route = $1 ORDER BY changed_at DESC, id DESC LIMIT 50",
    )
    .bind(&route.name)
    .fetch_all(&state.db)
    .await?;
    out.raw("<h2>Audit</h2><table id=\"audit\"><thead><tr><th>when</th><th>change</th><th>by</th><th>reason</th><th>gate numbers</th></tr></thead><tbody>");
    for (at, from, to, by, reason, forced, percent, gates) in rows {
        // A change of the flipped share is postgres_only → postgres_only.
        let share = percent
            .filter(|p| *p < 100 || from.as_deref() == Some(to.as_str()))
            .map(|p| format!(" ({p}% flipped)"))
            .unwrap_or_default();
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{} → {}{}{}</td><td>{}</td><td>{}</td><td class=\"muted\">{}</td></tr>",
            esc(&when(at)),
            esc(from.as_deref().unwrap_or("—")),
            esc(&to),
            share,
            if forced {
                " <span class=\"fail\">(forced)</span>"
            } else {
                ""
            },
            esc(&by),
            esc(&reason),
            esc(&gate_numbers(gates.as_ref()))
        );
    }
    out.raw("</tbody></table>");
    let repairs: Vec<RepairRow> = sqlx::query_as(
        "SELECT at, by, reason, coalesce(array_length(keys, 1), 0), before, pushed_back FROM qbridge.repair_audit \
         WHERE route = $1 ORDER BY at DESC, id DESC LIMIT 20",
    )
    .bind(&route.name)
    .fetch_all(&state.db)
    .await?;
    if !repairs.is_empty() {
        out.raw("<h3>Operators' loss decisions (repair --assume-lost)</h3><table id=\"repairs\"><thead><tr><th>when</th><th>by</th><th>decided</th><th>pushed back</th><th>reason</th></tr></thead><tbody>");
        for (at, by, reason, keys, before, pushed) in repairs {
            let decided = match before {
                Some(t) => format!("lost before {}", when(t)),
                None => format!("{keys} keys lost"),
            };
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&when(at)),
                esc(&by),
                esc(&decided),
                pushed,
                esc(&reason)
            );
        }
        out.raw("</tbody></table>");
    }
    Ok(())
}
