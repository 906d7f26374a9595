//! The console's queue pages: every queue's counts and lag with a chart of
//! the last hour's completions and the database's health (`/ui/queues`), a
//! job by id or key with both sides' outcomes and its payload
//! (`/ui/jobs`), and the dead letters, filtered by queue and error text,
//! requeued by selection at a bounded rate (`/ui/dead`) through
//! `queue::dlq`, as `qbridge dlq requeue`.

use std::fmt::Write as _;

use axum::extract::{Form, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::html::{esc, page, Html};
use super::session::Session;
use super::{csrf_ok, html, unavailable};
use crate::http::AppState;
use crate::queue::{dlq, stats};

fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// Completions per minute over the last hour, per queue (from the history
/// table, one pass over the hour's rows; its BRIN index on `finished_at`
/// keeps older rows out), oldest minute first: 60 numbers.
async fn last_hour(db: &sqlx::PgPool) -> crate::error::Result<Vec<(String, Vec<i64>)>> {
    // Grouped by the minute as a timestamp (cheap), numbered here.
    let rows: Vec<(String, DateTime<Utc>, DateTime<Utc>, i64)> = sqlx::query_as(
        "SELECT queue, date_trunc('minute', finished_at), date_trunc('minute', now()), count(*) \
           FROM qbridge.jobs_done WHERE finished_at >= date_trunc('minute', now()) - interval '59 minutes' \
          GROUP BY 1, 2",
    )
    .fetch_all(db)
    .await?;
    let mut per_queue: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
    for (queue, minute, now, n) in rows {
        let points = per_queue.entry(queue).or_insert_with(|| vec![0; 60]);
        let ago = (now - minute).num_minutes();
        if (0..60).contains(&ago) {
            points[59 - ago as usize] += n;
        }
    }
    Ok(per_queue.into_iter().collect())
}

/// A 60-point sparkline as inline SVG (numbers only: nothing to escape).
fn sparkline(points: &[i64]) -> String {
    let max = points.iter().copied().max().unwrap_or(0).max(1) as f64;
    let path: Vec<String> = points
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{},{:.1}", i * 2, 20.0 - 20.0 * (*n as f64) / max))
        .collect();
    format!(
        "<svg width=\"120\" height=\"22\" viewBox=\"0 0 120 22\" role=\"img\" aria-label=\"completions per minute, last hour\">\
         <polyline fill=\"none\" stroke=\"#0969da\" stroke-width=\"1.5\" points=\"{}\"/></svg>",
        path.join(" ")
    )
}

pub(super) async fn queues(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
) -> Response {
    let (queues, health, hour) = match tokio::try_join!(
        stats::queues(&state.db),
        stats::db_health(&state.db),
        last_hour(&state.db)
    ) {
        Ok(all) => all,
        Err(e) => return unavailable(&session, "the queues", e),
    };
    let mut out = Html::default();
    out.raw("<h1>Queues</h1><table id=\"queues\"><thead><tr><th>queue</th><th>ready</th><th>running</th><th>scheduled</th><th>dead</th><th>lag</th><th>done per minute, last hour</th></tr></thead><tbody>");
    for q in &queues {
        let spark = hour
            .iter()
            .find(|(name, _)| name == &q.queue)
            .map(|(_, p)| sparkline(p))
            .unwrap_or_default();
        let total: i64 = hour
            .iter()
            .find(|(name, _)| name == &q.queue)
            .map_or(0, |(_, p)| p.iter().sum());
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><a href=\"/ui/dead?queue={}\">{}</a></td><td>{:.1} s</td><td>{} {}</td></tr>",
            esc(&q.queue), q.ready, q.running, q.scheduled, esc(&super::actions::urlencode(&q.queue)), q.dead, q.lag_seconds, spark, total
        );
    }
    out.raw("</tbody></table><h2>Database</h2><table id=\"health\"><tbody>");
    for (name, value, bad) in stats::health_checks(&health) {
        let _ = write!(
            out,
            "<tr><td>{}</td><td class=\"{}\">{}</td></tr>",
            esc(name),
            if bad { "fail" } else { "pass" },
            esc(&value)
        );
    }
    out.raw("</tbody></table>");
    html(
        StatusCode::OK,
        page("Queues", Some(&session.csrf), &out.into_string()),
    )
}

#[derive(Deserialize, Default)]
pub(super) struct Find {
    #[serde(default)]
    q: String,
}

/// side, mode, outcome, error class, digest, attempt, when.
type OutcomeRow = (
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<i32>,
    DateTime<Utc>,
);

/// id, queue, key, state, attempts, max attempts, last error, payload,
/// created, lease.
type JobRow = (
    i64,
    String,
    Option<String>,
    String,
    i32,
    i32,
    Option<String>,
    serde_json::Value,
    DateTime<Utc>,
    String,
);

pub(super) async fn find(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Query(f): Query<Find>,
) -> Response {
    let mut out = Html::default();
    let _ = write!(
        out,
        "<h1>Find a job</h1><form method=\"get\" action=\"/ui/jobs\"><label>Id or key <input name=\"q\" id=\"q\" value=\"{}\"></label> <button id=\"find\">Find</button></form>",
        esc(&f.q)
    );
    let q = f.q.trim();
    if !q.is_empty() {
        match job_sections(&state, q, &mut out).await {
            Ok(0) => {
                out.raw("<p class=\"muted\" id=\"none\">No job with this id or key in the queues, the dead letters, the key records or the outcomes (completed jobs&#39; history is not searched: it has no key index).</p>");
            }
            Ok(_) => {}
            Err(e) => return unavailable(&session, "the job", e),
        }
    }
    html(
        StatusCode::OK,
        page("Jobs", Some(&session.csrf), &out.into_string()),
    )
}

/// The queues a key may be in, each read by a loose index scan (one index
/// probe per queue, never a table scan): queues with waiting jobs (the
/// claim index), dead letters, outcomes or remembered keys. A key is then
/// looked up per queue through each table's `(queue, key)` index.
const KNOWN_QUEUES_SQL: &str = r#"
WITH RECURSIVE j(queue) AS (
    SELECT min(queue) FROM qbridge.jobs WHERE state = 'ready'
    UNION ALL SELECT (SELECT min(queue) FROM qbridge.jobs WHERE state = 'ready' AND queue > j.queue)
      FROM j WHERE j.queue IS NOT NULL),
d(queue) AS (
    SELECT min(queue) FROM qbridge.jobs_dead
    UNION ALL SELECT (SELECT min(queue) FROM qbridge.jobs_dead WHERE queue > d.queue) FROM d WHERE d.queue IS NOT NULL),
o(queue) AS (
    SELECT min(queue) FROM qbridge.outcomes
    UNION ALL SELECT (SELECT min(queue) FROM qbridge.outcomes WHERE queue > o.queue) FROM o WHERE o.queue IS NOT NULL),
k(queue) AS (
    SELECT min(queue) FROM qbridge.job_keys
    UNION ALL SELECT (SELECT min(queue) FROM qbridge.job_keys WHERE queue > k.queue) FROM k WHERE k.queue IS NOT NULL)
SELECT array_agg(DISTINCT queue) FROM (
    SELECT queue FROM j UNION SELECT queue FROM d UNION SELECT queue FROM o UNION SELECT queue FROM k) all_queues
 WHERE queue IS NOT NULL
"#;

/// The job's rows (live table, dead letters) and both sides' outcomes;
/// how many rows were found. Completed jobs' history is not searched (it
/// has no key index, and a lookup must not scan a day of completions).
async fn job_sections(state: &AppState, q: &str, out: &mut Html) -> crate::error::Result<usize> {
    let id: Option<i64> = q.parse().ok();
    let queues: Option<Vec<String>> = sqlx::query_scalar(KNOWN_QUEUES_SQL)
        .fetch_one(&state.db)
        .await?;
    let queues = queues.unwrap_or_default();
    let mut found = 0;
    for (table, title) in [
        ("qbridge.jobs", "In the queue"),
        ("qbridge.jobs_dead", "Dead letter"),
    ] {
        let (st, lease) = if table == "qbridge.jobs" {
            ("state || ' (' || copy || ')'", "'lease ' || lease || coalesce(', held until ' || to_char(lease_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC', '')")
        } else {
            ("'dead'", "'—'")
        };
        // By id, or by key per queue: a live copy's key through the
        // partial unique index (a mirror copy is shown by its key record).
        let by_key = if table == "qbridge.jobs" {
            "queue = ANY($3) AND key = $2 AND key IS NOT NULL AND copy = 'live'"
        } else {
            "queue = ANY($3) AND key = $2"
        };
        let sql = format!(
            "SELECT * FROM ( \
               SELECT id, queue, key, {st}, attempts, max_attempts, last_error, payload, created_at, {lease} FROM {table} WHERE id = $1 \
               UNION \
               SELECT id, queue, key, {st}, attempts, max_attempts, last_error, payload, created_at, {lease} FROM {table} WHERE {by_key}) found \
             ORDER BY id DESC LIMIT 20"
        );
        let rows: Vec<JobRow> = sqlx::query_as(&sql)
            .bind(id.unwrap_or(-1))
            .bind(q)
            .bind(&queues)
            .fetch_all(&state.db)
            .await?;
        for (id, queue, key, st, attempts, max, error, payload, created, lease) in rows {
            found += 1;
            let _ = write!(
                out,
                "<h2>{} #{}</h2><table class=\"job\"><tbody><tr><td>queue</td><td>{}</td></tr><tr><td>key</td><td class=\"key\">{}</td></tr>\
                 <tr><td>state</td><td>{}</td></tr><tr><td>attempts</td><td>{} of {}</td></tr><tr><td>lease</td><td>{}</td></tr>\
                 <tr><td>last error</td><td class=\"last-error\">{}</td></tr>\
                 <tr><td>created</td><td>{}</td></tr></tbody></table><h3>Payload</h3><pre class=\"payload\">{}</pre>",
                esc(title), id, esc(&queue), esc(key.as_deref().unwrap_or("—")), esc(&st), attempts, max, esc(&lease),
                esc(error.as_deref().unwrap_or("—")), esc(&when(created)),
                esc(&serde_json::to_string_pretty(&payload).unwrap_or_default())
            );
        }
    }
    let keys: Vec<(String, String, String, DateTime<Utc>)> = sqlx::query_as(
        "SELECT queue, copy, via, seen_at FROM qbridge.job_keys WHERE queue = ANY($2) AND key = $1 ORDER BY seen_at DESC LIMIT 20",
    )
    .bind(q)
    .bind(&queues)
    .fetch_all(&state.db)
    .await?;
    if !keys.is_empty() {
        found += keys.len();
        out.raw("<h2>Key record</h2><table id=\"key-record\"><thead><tr><th>queue</th><th>copy</th><th>came in by</th><th>first seen</th></tr></thead><tbody>");
        for (queue, copy, via, seen) in keys {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&queue),
                esc(&copy),
                esc(&via),
                esc(&when(seen))
            );
        }
        out.raw("</tbody></table>");
    }
    let outcomes: Vec<OutcomeRow> = sqlx::query_as(
        "SELECT side, mode, outcome, error_class, digest, attempt, recorded_at FROM qbridge.outcomes \
         WHERE queue = ANY($2) AND key = $1 ORDER BY recorded_at DESC, id DESC LIMIT 50",
    )
    .bind(q)
    .bind(&queues)
    .fetch_all(&state.db)
    .await?;
    if !outcomes.is_empty() {
        found += outcomes.len();
        out.raw("<h2>Outcomes, both sides</h2><table id=\"outcomes\"><thead><tr><th>when</th><th>side</th><th>mode</th><th>outcome</th><th>attempt</th><th>digest</th></tr></thead><tbody>");
        for (side, mode, outcome, class, digest, attempt, at) in outcomes {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}{}</td><td>{}</td><td><code>{}</code></td></tr>",
                esc(&when(at)), esc(&side), esc(&mode), esc(&outcome),
                class.map(|c| format!(" ({})", esc(&c))).unwrap_or_default(),
                attempt.map(|a| a.to_string()).unwrap_or_else(|| "—".into()),
                esc(digest.as_deref().map(|d| &d[..d.len().min(16)]).unwrap_or("—"))
            );
        }
        out.raw("</tbody></table>");
    }
    Ok(found)
}

#[derive(Deserialize, Default)]
pub(super) struct DeadFilter {
    #[serde(default)]
    queue: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    msg: Option<String>,
    #[serde(default)]
    requeue: Option<String>,
}

fn selector(queue: &str, error: &str) -> dlq::Selector {
    dlq::Selector {
        ids: None,
        queue: Some(queue.trim().to_string()).filter(|q| !q.is_empty()),
        error_contains: Some(error.trim().to_string()).filter(|e| !e.is_empty()),
    }
}

pub(super) async fn dead(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Query(f): Query<DeadFilter>,
) -> Response {
    let sel = selector(&f.queue, &f.error);
    let (rows, total) =
        match tokio::try_join!(dlq::list(&state.db, &sel, 100), dlq::count(&state.db, &sel)) {
            Ok(all) => all,
            Err(e) => return unavailable(&session, "the dead letters", e),
        };
    let mut out = Html::default();
    out.raw("<h1>Dead letters</h1>");
    if let Some(id) = &f.requeue {
        out.raw(&progress_html(&state, id));
    }
    if let Some(m) = &f.msg {
        out.raw("<p class=\"flash\" id=\"flash\">")
            .text(m)
            .raw("</p>");
    }
    let _ = write!(
        out,
        "<form method=\"get\" action=\"/ui/dead\"><label>Queue <input name=\"queue\" value=\"{}\"></label> \
         <label>Error contains <input name=\"error\" value=\"{}\"></label> <button>Filter</button></form>\
         <p>{} dead letters match; the newest {} are listed.</p>\
         <form method=\"post\" action=\"/ui/dead/requeue\" id=\"requeue-form\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <table id=\"dead\"><thead><tr><th></th><th>id</th><th>queue</th><th>key</th><th>attempts</th><th>last error</th><th>failed</th></tr></thead><tbody>",
        esc(&f.queue), esc(&f.error), total, rows.len(), esc(&session.csrf)
    );
    for d in &rows {
        let _ = write!(
            out,
            "<tr><td><input type=\"checkbox\" name=\"id\" value=\"{0}\" class=\"pick\"></td><td><a href=\"/ui/jobs?q={0}\">{0}</a></td><td>{1}</td><td>{2}</td><td>{3}</td><td class=\"last-error\">{4}</td><td>{5}</td></tr>",
            d.id, esc(&d.queue), esc(d.key.as_deref().unwrap_or("—")), d.attempts,
            esc(d.last_error.as_deref().unwrap_or("—")), esc(&when(d.failed_at))
        );
    }
    out.raw("</tbody></table><label>Rate <input name=\"rate\" type=\"number\" min=\"1\" max=\"1000\" value=\"100\"> jobs/s</label> <button id=\"requeue\">Requeue the selected</button></form>");
    html(
        StatusCode::OK,
        page("Dead letters", Some(&session.csrf), &out.into_string()),
    )
}

pub(super) async fn requeue(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    };
    if let Err(refused) = csrf_ok(&session, field("csrf")) {
        return axum::response::IntoResponse::into_response(refused);
    }
    let ids: Vec<i64> = fields
        .iter()
        .filter(|(k, _)| k == "id")
        .filter_map(|(_, v)| v.parse().ok())
        .collect();
    let rate: u32 = field("rate").parse().unwrap_or(100).clamp(1, 1000);
    if ids.is_empty() {
        let msg = "Nothing selected: tick the dead letters to requeue.";
        return axum::response::IntoResponse::into_response(axum::response::Redirect::to(
            &format!("/ui/dead?msg={}", super::actions::urlencode(msg)),
        ));
    }
    let id = state
        .console
        .requeues
        .start(state.db.clone(), ids, rate, session.who.clone());
    axum::response::IntoResponse::into_response(axum::response::Redirect::to(&format!(
        "/ui/dead?requeue={id}"
    )))
}

/// A requeue's progress, refreshed in place until it is done.
fn progress_html(state: &AppState, id: &str) -> String {
    let Some(p) = state.console.requeues.get(id) else {
        return "<p class=\"muted\" id=\"requeue-progress\">No such requeue (the console remembers the last 100).</p>".into();
    };
    let id = esc(id);
    match (p.done, &p.error) {
        (false, _) => format!(
            "<p class=\"flash\" id=\"requeue-progress\" data-refresh=\"/ui/fragment/requeue/{id}\">Requeuing at {} jobs/s: {} of {} selected moved so far…</p>",
            p.rate, p.moved, p.selected
        ),
        (true, None) => format!(
            "<p class=\"flash\" id=\"requeue-progress\">Requeued {} of {} selected at {} jobs/s (a job whose key is in flight again stays dead).</p>",
            p.moved, p.selected, p.rate
        ),
        (true, Some(e)) => format!(
            "<p class=\"error\" id=\"requeue-progress\">Requeue stopped after {} of {}: {}</p>",
            p.moved, p.selected, esc(e)
        ),
    }
}

pub(super) async fn requeue_progress(
    State(state): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    html(StatusCode::OK, progress_html(&state, &id))
}
