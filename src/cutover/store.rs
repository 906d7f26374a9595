//! The stored phase flag: one row per route in `qbridge.route_phases`,
//! changed only by compare-and-swap (`UPDATE … WHERE phase = $expected`),
//! each change appended to `qbridge.phase_audit` (who, when, from, to, why,
//! forced or not, the gate numbers of the moment) and announced with
//! `qbridge.hint('qbridge_phases', route)` (a NOTIFY, skipped when the
//! NOTIFY queue is past half full; every process also polls) — all in one
//! transaction, so a change is never visible without its audit row.
//!
//! Only one step at a time is legal: forward to the next phase (an advance)
//! or back to the previous one (a rollback). Two operators racing on the same
//! step: one wins, the other gets [`PhaseError::Conflict`] naming the phase
//! the route is in now.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;

use crate::error::Error;
use crate::model::Phase;

/// The NOTIFY channel of phase changes.
pub const CHANNEL: &str = "qbridge_phases";

/// A route's stored phase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteState {
    pub route: String,
    pub phase: Phase,
    pub since: DateTime<Utc>,
    pub changed_by: String,
    pub reason: String,
    /// In `postgres_only`, the share of job keys (percent) already produced
    /// Postgres-only (the gradual flip); 100 in every other phase.
    pub percent: u8,
}

/// One requested change.
#[derive(Debug, Clone)]
pub struct Change<'a> {
    pub route: &'a str,
    /// The phase the operator saw; the change applies only if it still is.
    pub from: Phase,
    pub to: Phase,
    pub changed_by: &'a str,
    pub reason: &'a str,
    /// A gate was overridden (`--force`); recorded in the audit log.
    pub forced: bool,
    /// The gate numbers at the time, for the audit log.
    pub gates: Value,
}

/// Why a change was refused. Messages are one line.
#[derive(Debug, thiserror::Error)]
pub enum PhaseError {
    #[error(
        "route {0:?} has no stored phase (is it in the config, and has qbridge run registered it?)"
    )]
    UnknownRoute(String),
    #[error(
        "route {route:?} cannot go from {from} to {to}: only one step forward or back at a time"
    )]
    Illegal {
        route: String,
        from: Phase,
        to: Phase,
    },
    #[error("route {route:?} is in {actual}, not {expected}: someone changed it first; look at `qbridge cutover status` and decide again")]
    Conflict {
        route: String,
        expected: Phase,
        actual: Phase,
    },
    #[error("route {route:?} has {actual}% of its keys flipped, not {expected}%: someone changed it first; look at `qbridge cutover status` and decide again")]
    PercentConflict {
        route: String,
        expected: u8,
        actual: u8,
    },
    #[error("a phase change needs a reason")]
    NoReason,
    #[error(transparent)]
    Db(#[from] Error),
}

impl From<PhaseError> for Error {
    fn from(e: PhaseError) -> Self {
        match e {
            PhaseError::Db(e) => e,
            // A change without a reason is a bad request; the rest are
            // refusals by the route's current state.
            PhaseError::NoReason => Error::InvalidInput(e.to_string()),
            other => Error::Refused(other.to_string()),
        }
    }
}

impl From<sqlx::Error> for PhaseError {
    fn from(e: sqlx::Error) -> Self {
        PhaseError::Db(e.into())
    }
}

/// Whether `from → to` is one legal step (advance or rollback).
pub fn is_legal(from: Phase, to: Phase) -> bool {
    let index = |p: Phase| Phase::ALL.iter().position(|q| *q == p).unwrap_or(0);
    index(from).abs_diff(index(to)) == 1
}

type Row = (String, String, DateTime<Utc>, String, String, i16);
/// A [`Row`] with the flag's revision.
type RevisedRow = (String, String, DateTime<Utc>, String, String, i16, i64);

fn state(row: Row) -> Result<RouteState, PhaseError> {
    let (route, phase, since, changed_by, reason, percent) = row;
    let phase = phase
        .parse()
        .map_err(|e: String| PhaseError::Db(Error::InvalidInput(e)))?;
    Ok(RouteState {
        route,
        phase,
        since,
        changed_by,
        reason,
        percent: percent.clamp(0, 100) as u8,
    })
}

/// Stores `initial` as the route's phase unless it has one already (the
/// stored phase wins over the config from then on); returns the stored state.
pub async fn register(
    pool: &PgPool,
    route: &str,
    initial: Phase,
    by: &str,
) -> Result<RouteState, PhaseError> {
    let mut tx = pool.begin().await?;
    let inserted: Option<Row> = sqlx::query_as(
        "INSERT INTO qbridge.route_phases (route, phase, changed_by, reason) \
         VALUES ($1, $2, $3, 'registered from the config') \
         ON CONFLICT (route) DO NOTHING \
         RETURNING route, phase, since, changed_by, reason, percent",
    )
    .bind(route)
    .bind(initial.as_str())
    .bind(by)
    .fetch_optional(&mut *tx)
    .await?;
    if inserted.is_some() {
        sqlx::query(
            "INSERT INTO qbridge.phase_audit (route, from_phase, to_phase, changed_by, reason) \
             VALUES ($1, NULL, $2, $3, 'registered from the config')",
        )
        .bind(route)
        .bind(initial.as_str())
        .bind(by)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    current(pool, route)
        .await?
        .ok_or_else(|| PhaseError::UnknownRoute(route.to_string()))
}

/// The stored state of one route.
pub async fn current(pool: &PgPool, route: &str) -> Result<Option<RouteState>, PhaseError> {
    let row: Option<Row> = sqlx::query_as(
        "SELECT route, phase, since, changed_by, reason, percent FROM qbridge.route_phases WHERE route = $1",
    )
    .bind(route)
    .fetch_optional(pool)
    .await?;
    row.map(state).transpose()
}

/// Every stored route, by name.
pub async fn all(pool: &PgPool) -> Result<Vec<RouteState>, PhaseError> {
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT route, phase, since, changed_by, reason, percent FROM qbridge.route_phases ORDER BY route",
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(state).collect()
}

/// Every stored route, by name, each with the revision of its flag (bumped
/// by every change of phase or share), read together.
pub async fn all_revised(pool: &PgPool) -> Result<Vec<(RouteState, i64)>, PhaseError> {
    let rows: Vec<RevisedRow> = sqlx::query_as(
        "SELECT route, phase, since, changed_by, reason, percent, revision \
           FROM qbridge.route_phases ORDER BY route",
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(route, phase, since, by, reason, percent, revision)| {
            Ok((state((route, phase, since, by, reason, percent))?, revision))
        })
        .collect()
}

/// Applies one change by compare-and-swap, with its audit row and NOTIFY.
/// Every key goes the new phase's way (percent 100).
pub async fn transition(pool: &PgPool, change: &Change<'_>) -> Result<RouteState, PhaseError> {
    transition_at(pool, change, 100).await
}

/// [`transition`] into `postgres_only` with only `percent` of the job keys
/// flipped at first (the gradual flip); other targets ignore `percent`.
pub async fn transition_at(
    pool: &PgPool,
    change: &Change<'_>,
    percent: u8,
) -> Result<RouteState, PhaseError> {
    let percent = if change.to == Phase::PostgresOnly {
        percent.min(100)
    } else {
        100
    };
    if change.reason.trim().is_empty() {
        return Err(PhaseError::NoReason);
    }
    if !is_legal(change.from, change.to) {
        return Err(PhaseError::Illegal {
            route: change.route.to_string(),
            from: change.from,
            to: change.to,
        });
    }
    let mut tx = pool.begin().await?;
    let updated: Option<Row> = sqlx::query_as(
        "UPDATE qbridge.route_phases \
            SET phase = $3, since = now(), changed_by = $4, reason = $5, percent = $6 \
          WHERE route = $1 AND phase = $2 \
         RETURNING route, phase, since, changed_by, reason, percent",
    )
    .bind(change.route)
    .bind(change.from.as_str())
    .bind(change.to.as_str())
    .bind(change.changed_by)
    .bind(change.reason)
    .bind(i16::from(percent))
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = updated else {
        tx.rollback().await?;
        return Err(match current(pool, change.route).await? {
            None => PhaseError::UnknownRoute(change.route.to_string()),
            Some(now) => PhaseError::Conflict {
                route: change.route.to_string(),
                expected: change.from,
                actual: now.phase,
            },
        });
    };
    sqlx::query(
        "INSERT INTO qbridge.phase_audit \
             (route, from_phase, to_phase, changed_by, reason, forced, gates, percent) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(change.route)
    .bind(change.from.as_str())
    .bind(change.to.as_str())
    .bind(change.changed_by)
    .bind(change.reason)
    .bind(change.forced)
    .bind(&change.gates)
    .bind(i16::from(percent))
    .execute(&mut *tx)
    .await?;
    sqlx::query("SELECT qbridge.hint($1, $2)")
        .bind(CHANNEL)
        .bind(change.route)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    state(row)
}

/// Changes the flipped share of a route in `postgres_only` by
/// compare-and-swap on the share the operator saw, audited and announced
/// like a phase change.
pub async fn set_percent(
    pool: &PgPool,
    route: &str,
    expected: u8,
    percent: u8,
    by: &str,
    reason: &str,
) -> Result<RouteState, PhaseError> {
    if reason.trim().is_empty() {
        return Err(PhaseError::NoReason);
    }
    let percent = percent.min(100);
    let mut tx = pool.begin().await?;
    let updated: Option<Row> = sqlx::query_as(
        "UPDATE qbridge.route_phases SET percent = $3, changed_by = $4, reason = $5 \
          WHERE route = $1 AND phase = 'postgres_only' AND percent = $2 \
         RETURNING route, phase, since, changed_by, reason, percent",
    )
    .bind(route)
    .bind(i16::from(expected))
    .bind(i16::from(percent))
    .bind(by)
    .bind(reason)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = updated else {
        tx.rollback().await?;
        return Err(match current(pool, route).await? {
            None => PhaseError::UnknownRoute(route.to_string()),
            Some(now) if now.phase != Phase::PostgresOnly => PhaseError::Illegal {
                route: route.to_string(),
                from: now.phase,
                to: Phase::PostgresOnly,
            },
            Some(now) => PhaseError::PercentConflict {
                route: route.to_string(),
                expected,
                actual: now.percent,
            },
        });
    };
    sqlx::query(
        "INSERT INTO qbridge.phase_audit (route, from_phase, to_phase, changed_by, reason, percent) \
         VALUES ($1, 'postgres_only', 'postgres_only', $2, $3, $4)",
    )
    .bind(route)
    .bind(by)
    .bind(reason)
    .bind(i16::from(percent))
    .execute(&mut *tx)
    .await?;
    sqlx::query("SELECT qbridge.hint($1, $2)")
        .bind(CHANNEL)
        .bind(route)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    state(row)
}
