//! The gates of each advance: the measured numbers a route must show before
//! `qbridge cutover advance` moves it one phase forward. Each check carries
//! its value and what it needs, so a refusal prints the failing numbers and
//! the audit log keeps them.
//!
//! - `redis_only → dual_write`: none (nothing is measured before mirroring).
//! - `dual_write → shadow`: mirror completeness over the window, with at
//!   least `min_jobs` Redis-side jobs.
//! - `shadow → postgres_only`: a whole window in `shadow`; ack counts of the
//!   jobs both sides could run within tolerance at 95% confidence (`acks`);
//!   outcome mismatch rate (above the noise baseline) under
//!   its threshold over at least `min_jobs` compared jobs; Postgres
//!   push-to-outcome p99 under its target.
//! - `postgres_only → decommissioned`: the route's Redis lists empty (list,
//!   processing lists, gap list), no Redis push owed, no Redis-side outcome
//!   for `quiet_period`.

use chrono::{DateTime, Utc};
use redis::aio::ConnectionManager;
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::cutover::store::RouteState;
use crate::error::Result;
use crate::model::Phase;
use crate::ops::diff::{self, Diff, DiffInput};
use crate::ops::redis_view;
use crate::routes::Route;

mod acks;
mod completeness;

/// One measured condition.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Check {
    pub name: String,
    pub passed: bool,
    /// What was measured.
    pub value: String,
    /// What the gate needs.
    pub needs: String,
}

/// The gate of one advance.
#[derive(Debug, Clone, Serialize)]
pub struct Gate {
    pub route: String,
    pub from: Phase,
    pub to: Phase,
    pub checks: Vec<Check>,
    /// The diff the checks read, when one was needed.
    pub diff: Option<Diff>,
}

impl Gate {
    /// Every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    /// The numbers for the audit log.
    pub fn numbers(&self) -> Value {
        json!({
            "passed": self.passed(),
            "checks": self.checks,
            "verdict": self.diff.as_ref().map(|d| d.verdict.clone()),
        })
    }

    /// The failing checks, one per line.
    pub fn failures(&self) -> String {
        self.checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| format!("  {}: {} (needs {})", c.name, c.value, c.needs))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn check(name: &str, passed: bool, value: String, needs: String) -> Check {
    Check {
        name: name.into(),
        passed,
        value,
        needs,
    }
}

/// The start of a gate's window: `window` ago, but never before the route
/// entered its phase (what happened in the phase before does not count).
pub fn window_start(route: &Route, state: &RouteState) -> DateTime<Utc> {
    let window = chrono::Duration::from_std(route.config.cutover.gates.window).unwrap_or_default();
    (Utc::now() - window).max(state.since)
}

/// Where a diff with no `--since` starts: the gate window, never before the
/// route entered its phase (the previous phase's jobs are one-sided by
/// design). A route no process registered yet: just the window.
pub async fn default_since(db: &PgPool, route: &Route) -> Result<DateTime<Utc>> {
    Ok(
        match crate::cutover::store::current(db, &route.name).await? {
            Some(state) => window_start(route, &state),
            None => {
                Utc::now()
                    - chrono::Duration::from_std(route.config.cutover.gates.window)
                        .unwrap_or_default()
            }
        },
    )
}

/// The route's diff since `since` (reads Redis, then Postgres).
pub async fn diff_since(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    phase: Phase,
    since: DateTime<Utc>,
) -> Result<(Diff, redis_view::RedisView)> {
    let held = redis_view::read(redis, db, route).await?;
    let diff = diff::compute(
        db,
        DiffInput {
            route,
            phase: phase.as_str(),
            since,
            held: &held,
        },
    )
    .await?;
    Ok((diff, held))
}

/// Evaluates the gate of the next advance from `state` (for a
/// decommissioned route: whether Redis is still empty).
pub async fn evaluate(
    db: &PgPool,
    redis: Option<&mut ConnectionManager>,
    route: &Route,
    state: &RouteState,
) -> Result<Option<Gate>> {
    // A decommissioned route has no next phase; its "gate" only says
    // whether anything landed in Redis since (advance archives it).
    let to = next(state.phase).unwrap_or(state.phase);
    let mut gate = Gate {
        route: route.name.clone(),
        from: state.phase,
        to,
        checks: Vec::new(),
        diff: None,
    };
    let Some(redis) = redis else {
        if state.phase != Phase::RedisOnly {
            gate.checks.push(check(
                "redis reachable",
                false,
                "no Redis connection".into(),
                "redis_url answering".into(),
            ));
        }
        return Ok(Some(gate));
    };
    match state.phase {
        Phase::RedisOnly => {}
        Phase::Decommissioned => {
            decommissioned_checks(redis, route, &mut gate.checks).await?;
        }
        Phase::DualWrite => {
            gate.diff = dual_write_checks(db, redis, route, state, &mut gate.checks).await?;
        }
        Phase::Shadow => {
            gate.diff = shadow_checks(db, redis, route, state, &mut gate.checks).await?;
        }
        Phase::PostgresOnly => {
            gate.diff = postgres_only_checks(db, redis, route, state, &mut gate.checks).await?;
        }
    }
    Ok(Some(gate))
}

/// Nothing landed in Redis since the route was decommissioned.
async fn decommissioned_checks(
    redis: &mut ConnectionManager,
    route: &Route,
    checks: &mut Vec<Check>,
) -> Result<()> {
    let (waiting, processing, parked) = redis_view::count_left(redis, route).await?;
    let left = waiting + processing + parked;
    checks.push(check(
        "nothing in Redis since",
        left == 0,
        format!("{left} items (run `qbridge cutover advance` again to archive them)"),
        "0".into(),
    ));
    Ok(())
}

/// Out of dual_write: enough Redis-side jobs, and the mirror holds them.
async fn dual_write_checks(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    state: &RouteState,
    checks: &mut Vec<Check>,
) -> Result<Option<Diff>> {
    let g = &route.config.cutover.gates;
    let (d, _) = diff_since(db, redis, route, state.phase, window_start(route, state)).await?;
    checks.push(check(
        "redis-side jobs in window",
        d.redis_seen as u64 >= g.min_jobs,
        d.redis_seen.to_string(),
        format!(">= {}", g.min_jobs),
    ));
    checks.push(check(
        "mirror completeness",
        d.mirror_completeness >= g.mirror_completeness,
        completeness::value(&d),
        format!(">= {:.4}%", g.mirror_completeness * 100.0),
    ));
    checks.push(both_sides_check(d.ran_both_sides));
    Ok(Some(d))
}

/// Out of shadow: time in phase, ack counts, jobs compared, mismatches above noise, Postgres lag.
async fn shadow_checks(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    state: &RouteState,
    checks: &mut Vec<Check>,
) -> Result<Option<Diff>> {
    let g = &route.config.cutover.gates;
    let since = window_start(route, state);
    let in_phase = (Utc::now() - state.since).to_std().unwrap_or_default();
    checks.push(check(
        "time in shadow",
        in_phase >= g.window,
        format!("{}s", in_phase.as_secs()),
        format!(">= {}s (gates.window)", g.window.as_secs()),
    ));
    let (d, held) = diff_since(db, redis, route, state.phase, since).await?;
    let settled = Utc::now()
        - chrono::Duration::from_std(route.config.cutover.diff.settle).unwrap_or_default();
    let a = acks::count(db, route, since, settled, &held.ran).await?;
    let allowed = acks::allowed_gap(a.jobs.max(0) as u64, g.ack_tolerance);
    checks.push(check(
        "ack counts",
        a.redis > 0 && a.gap() <= allowed,
        format!(
            "redis {}, postgres {} of {} jobs due before the settle time (gap {})",
            a.redis,
            a.postgres,
            a.jobs,
            a.gap()
        ),
        format!(
            "a gap of at most {allowed} (within {:.3}% at 95% confidence)",
            g.ack_tolerance * 100.0
        ),
    ));
    checks.push(check(
        "jobs compared",
        d.compared as u64 >= g.min_jobs,
        d.compared.to_string(),
        format!(">= {}", g.min_jobs),
    ));
    let excess = (d.mismatch_rate - d.noise_rate).max(0.0);
    checks.push(check(
        "outcome mismatch rate above noise",
        excess <= g.max_mismatch_rate,
        format!(
            "{:.3}% ({} of {}; noise {:.3}%)",
            excess * 100.0,
            d.mismatched,
            d.compared,
            d.noise_rate * 100.0
        ),
        format!("<= {:.3}%", g.max_mismatch_rate * 100.0),
    ));
    let lag = d.postgres.lag_p99.unwrap_or(f64::INFINITY);
    checks.push(check(
        "postgres push-to-outcome p99",
        lag <= g.max_postgres_lag.as_secs_f64(),
        if lag.is_finite() {
            format!("{lag:.3}s")
        } else {
            "no Postgres outcomes".into()
        },
        format!("<= {:.3}s", g.max_postgres_lag.as_secs_f64()),
    ));
    checks.push(both_sides_check(d.ran_both_sides));
    Ok(Some(d))
}

/// Out of postgres_only: every key flipped, Redis empty, no push owed, Redis quiet.
async fn postgres_only_checks(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    state: &RouteState,
    checks: &mut Vec<Check>,
) -> Result<Option<Diff>> {
    let g = &route.config.cutover.gates;
    checks.push(check(
        "keys flipped to Postgres",
        state.percent == 100,
        format!("{}%", state.percent),
        "100% (qbridge cutover percent R 100)".into(),
    ));
    let held = redis_view::read(redis, db, route).await?;
    let in_redis = held.waiting.len() + held.processing.len() + held.parked;
    checks.push(check(
        "items left in Redis",
        in_redis == 0 && !held.truncated,
        format!(
            "{} waiting, {} in processing lists, {} parked",
            held.waiting.len(),
            held.processing.len(),
            held.parked
        ),
        "all empty".into(),
    ));
    let owed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM qbridge.redis_outbox WHERE queue = $1")
            .bind(&route.queue)
            .fetch_one(db)
            .await?;
    checks.push(check(
        "Redis pushes owed",
        owed == 0,
        owed.to_string(),
        "0".into(),
    ));
    // A held re-push waits for the Redis side's word on its original:
    // decommissioning now would strand it (the Redis side goes away).
    let (held_repushes, sample) = crate::ingest::held_count(db, &route.queue, 3).await?;
    checks.push(check(
        "re-pushes held back",
        held_repushes == 0,
        match held_repushes {
            0 => "0".to_string(),
            n => format!("{n} (e.g. {})", sample.join(", ")),
        },
        "0 (settled by the Redis side's reports, or qbridge diff --repair --assume-lost)".into(),
    ));
    checks.push(never_ran_check(db, route, state, &held).await?);
    checks.push(structures_check(&held));
    let last: Option<DateTime<Utc>> = sqlx::query_scalar(
        "SELECT max(recorded_at) FROM qbridge.outcomes WHERE queue = $1 AND side = 'redis'",
    )
    .bind(&route.queue)
    .fetch_one(db)
    .await?;
    let quiet_since = last.map_or(state.since, |t| t.max(state.since));
    let quiet = (Utc::now() - quiet_since).to_std().unwrap_or_default();
    checks.push(check(
        "quiet on Redis",
        quiet >= g.quiet_period,
        format!("{}s since the last Redis-side job", quiet.as_secs()),
        format!(">= {}s (gates.quiet_period)", g.quiet_period.as_secs()),
    ));
    let samples = route.config.cutover.diff.sample_keys;
    let (both, _) = diff::ran_both_sides(
        db,
        &route.queue,
        window_start(route, state),
        &held.ran,
        samples,
    )
    .await?;
    checks.push(both_sides_check(both));
    Ok(None)
}

/// Mirror copies the Redis side never ran and does not hold (repairable
/// or unaccounted, as the diff says): decommissioning would leave them to
/// run nowhere. They are pushed back on evidence by `qbridge diff --repair`
/// (the Redis consumer still drains in `postgres_only`), or on an
/// operator's word with `--assume-lost`.
async fn never_ran_check(
    db: &PgPool,
    route: &Route,
    state: &RouteState,
    held: &redis_view::RedisView,
) -> Result<Check> {
    let settled = Utc::now()
        - chrono::Duration::from_std(route.config.cutover.diff.settle).unwrap_or_default();
    let missing: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM ({}) one_sided",
        diff::ONLY_POSTGRES_SQL
    ))
    .bind(&route.queue)
    .bind(window_start(route, state))
    .bind(settled)
    .bind(held.accounted_keys())
    .bind(held.before.owed())
    .bind(&held.before.texts)
    .bind(&held.before.pushed)
    .bind(held.before.paid_tokens())
    .fetch_one(db)
    .await?;
    Ok(check(
        "mirror copies Redis never ran",
        missing == 0,
        missing.to_string(),
        "0 (qbridge diff --repair pushes back those Redis provably lost; --assume-lost the rest)"
            .into(),
    ))
}

/// Jobs of the route in its framework's other structures (Sidekiq's
/// `schedule`, `retry`, `dead`): decommissioning carries only the route's
/// lists, so they would be stranded.
fn structures_check(held: &redis_view::RedisView) -> Check {
    let left = crate::ops::structures::non_empty(&held.elsewhere);
    check(
        "jobs in the framework's other structures",
        left.is_empty(),
        if left.is_empty() {
            "none".into()
        } else {
            left.join("; ")
        },
        "none (let the fleet run them; --force carries what qbridge can take without the fleet \
         into Postgres and leaves the rest, such as tasks a worker holds, in Redis: \
         docs/src/runbook/frameworks.md)"
            .into(),
    )
}

/// Every gate refuses while a job of the window ran live on both sides:
/// a double run is the one thing a cutover must never do, and advancing
/// would hide it behind the next phase.
fn both_sides_check(ran_both_sides: i64) -> Check {
    check(
        "ran live on both sides",
        ran_both_sides == 0,
        ran_both_sides.to_string(),
        "0".into(),
    )
}

/// The phase after `phase`.
pub fn next(phase: Phase) -> Option<Phase> {
    let i = Phase::ALL.iter().position(|p| *p == phase)?;
    Phase::ALL.get(i + 1).copied()
}

/// The phase before `phase`.
pub fn previous(phase: Phase) -> Option<Phase> {
    let i = Phase::ALL.iter().position(|p| *p == phase)?;
    i.checked_sub(1).map(|i| Phase::ALL[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_walk_the_phase_order() {
        assert_eq!(next(Phase::RedisOnly), Some(Phase::DualWrite));
        assert_eq!(next(Phase::Decommissioned), None);
        assert_eq!(previous(Phase::DualWrite), Some(Phase::RedisOnly));
        assert_eq!(previous(Phase::RedisOnly), None);
    }
}
