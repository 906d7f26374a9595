//! What `qbridge cutover advance|rollback` do: read the stored phase,
//! evaluate the gate, change the flag by compare-and-swap with the gate's
//! numbers in the audit log, and — on the way into `decommissioned` — archive
//! and delete the route's Redis keys once every process has seen the flip.

use redis::aio::ConnectionManager;
use serde::Serialize;
use sqlx::PgPool;

use crate::cutover::store::{self, Change, PhaseError, RouteState};
use crate::cutover::watch;
use crate::error::{Error, Result};
use crate::model::Phase;
use crate::ops::backlog;
use crate::ops::decommission::{self, Archived};
use crate::ops::gates::{self, Gate};
use crate::redis::live_guard;
use crate::routes::Route;

/// Who and why.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub by: &'a str,
    pub reason: Option<&'a str>,
    /// Advance although the gate refuses (needs a reason; audited).
    pub force: bool,
    /// Into `postgres_only`: flip only this share of job keys at first.
    pub percent: Option<u8>,
}

impl<'a> Request<'a> {
    /// A change without a gate override or a partial flip: what ramp and
    /// rollback take, and a plain advance.
    pub fn new(by: &'a str, reason: Option<&'a str>) -> Request<'a> {
        Request {
            by,
            reason,
            force: false,
            percent: None,
        }
    }
}

/// What an advance did.
#[derive(Debug, Clone, Serialize)]
pub struct Advanced {
    pub state: RouteState,
    pub gate: Gate,
    pub forced: bool,
    /// Set on the way into `decommissioned`.
    pub archived: Option<Archived>,
    /// On the way into `dual_write`: copies of items without an id that
    /// Redis already held, now counted as mirror copies (`ops::backlog`).
    pub counted_backlog: usize,
}

/// Why an advance did not happen.
#[derive(Debug)]
pub enum Refusal {
    /// The gate failed and `--force` was not given; the gate has the numbers.
    Gate(Box<Gate>),
    /// Anything else (no next phase, a conflict, the database).
    Error(Error),
}

impl From<Error> for Refusal {
    fn from(e: Error) -> Self {
        Refusal::Error(e)
    }
}

impl From<PhaseError> for Refusal {
    fn from(e: PhaseError) -> Self {
        Refusal::Error(e.into())
    }
}

/// The stored state of `route`, registering it from the config if no
/// process has yet.
pub async fn state_of(db: &PgPool, route: &Route, by: &str) -> Result<RouteState> {
    match store::current(db, &route.name).await? {
        Some(state) => Ok(state),
        None => Ok(store::register(db, &route.name, route.config.phase, by).await?),
    }
}

/// Advances `route` one phase if its gate passes (or `force`).
pub async fn advance(
    db: &PgPool,
    mut redis: Option<&mut ConnectionManager>,
    route: &Route,
    req: &Request<'_>,
    payload_limit: usize,
) -> std::result::Result<Advanced, Refusal> {
    let state = state_of(db, route, req.by).await?;
    let gate = gates::evaluate(db, redis.as_deref_mut(), route, &state)
        .await?
        .ok_or_else(|| Error::Refused(format!("route {:?}: no gate", route.name)))?;
    if state.phase == Phase::Decommissioned {
        // Nothing after it: archive what reached Redis since (a producer not
        // behind qbridge, or a run interrupted midway). Idempotent.
        let redis = redis.ok_or_else(no_redis)?;
        let archived = decommission::archive_and_delete(db, redis, route, payload_limit).await?;
        return Ok(Advanced {
            state,
            gate,
            forced: false,
            archived: Some(archived),
            counted_backlog: 0,
        });
    }
    if gate.to == Phase::Decommissioned && redis.is_none() {
        // Checked before the flip: decommissioning without archiving would
        // leave the Redis items behind.
        return Err(no_redis().into());
    }
    let forced = !gate.passed();
    if forced && !req.force {
        return Err(Refusal::Gate(Box::new(gate)));
    }
    let reason = match (req.reason, forced) {
        (Some(r), _) if !r.trim().is_empty() => r.to_string(),
        (_, true) => {
            return Err(Error::InvalidInput(
                "--force needs --reason: the override is audited with it".into(),
            )
            .into())
        }
        (_, false) => "gate passed".to_string(),
    };
    if req.percent.is_some() && gate.to != Phase::PostgresOnly {
        return Err(Error::Refused(format!(
            "--percent applies to the step into postgres_only, not {} → {}",
            gate.from, gate.to
        ))
        .into());
    }
    let mut counted_backlog = 0;
    if (gate.from, gate.to) == (Phase::RedisOnly, Phase::DualWrite) {
        // Before the flip, while nothing is mirrored: see `ops::backlog`.
        let redis = redis.as_deref_mut().ok_or_else(|| {
            Error::Refused(
                "entering dual_write counts the items without an id that Redis already holds: \
                 Redis must be reachable (check --redis-url)"
                    .into(),
            )
        })?;
        counted_backlog = backlog::count_identical(db, redis, route, payload_limit).await?;
    }
    let new_state = store::transition_at(
        db,
        &Change {
            route: &route.name,
            from: state.phase,
            to: gate.to,
            changed_by: req.by,
            reason: &reason,
            forced,
            gates: gate.numbers(),
        },
        req.percent.unwrap_or(100),
    )
    .await?;
    let archived = if gate.to == Phase::Decommissioned {
        let redis = redis.ok_or_else(no_redis)?;
        // Every process polls the flag every INTERVAL: after a few, each has
        // seen the flip. That is not what proves the Redis side idle (a
        // running consumer's heartbeat does, in `archive_and_delete`); it is
        // what makes a consumer that has not beaten yet (one starting right
        // now) see `decommissioned` before it touches a list, so that a
        // missing heartbeat then means a consumer that is gone.
        tokio::time::sleep(watch::FOLLOWED).await;
        Some(decommission::archive_and_delete(db, redis, route, payload_limit).await?)
    } else {
        None
    };
    Ok(Advanced {
        state: new_state,
        gate,
        forced,
        archived,
        counted_backlog,
    })
}

fn no_redis() -> Error {
    Error::Refused(
        "decommissioning archives the route's Redis keys: Redis must be reachable (check --redis-url)"
            .into(),
    )
}

/// Before a change that lets pushes reach Redis again (a rollback out of
/// `postgres_only`, a lowered share), writes every key Postgres holds live
/// into the route's live-key guard, so the Redis side skips a re-push of
/// one from the first push on. Without Redis (a caller that has none) the
/// publisher of the processes with a Redis side writes it within a second.
async fn guard_before_lowering(
    db: &PgPool,
    redis: Option<&mut ConnectionManager>,
    route: &Route,
) -> Result<()> {
    let Some(conn) = redis else {
        return Ok(());
    };
    live_guard::publish_route(db, conn, route)
        .await
        .map_err(|e| {
            Error::Refused(format!(
                "route {:?}: cannot write the live-key guard to Redis ({e}); nothing changed: \
                 a re-push of a job Postgres owns could run on Redis too. Retry when Redis answers",
                route.name
            ))
        })?;
    Ok(())
}

/// Steps `route` back one phase; no gate, a reason is required. With
/// `redis`, the live-key guard is written first (see
/// [`guard_before_lowering`]).
pub async fn rollback(
    db: &PgPool,
    redis: Option<&mut ConnectionManager>,
    route: &Route,
    req: &Request<'_>,
) -> Result<RouteState> {
    let state = state_of(db, route, req.by).await?;
    let to = gates::previous(state.phase).ok_or_else(|| {
        Error::Refused(format!(
            "route {:?} is {}: there is no phase before it",
            route.name, state.phase
        ))
    })?;
    let reason = req
        .reason
        .filter(|r| !r.trim().is_empty())
        .ok_or_else(|| Error::InvalidInput("a rollback needs --reason".into()))?;
    if state.phase == Phase::PostgresOnly {
        guard_before_lowering(db, redis, route).await?;
    }
    Ok(store::transition(
        db,
        &Change {
            route: &route.name,
            from: state.phase,
            to,
            changed_by: req.by,
            reason,
            forced: false,
            gates: serde_json::Value::Null,
        },
    )
    .await?)
}

/// Changes the share of job keys flipped in `postgres_only` (1 → 10 → 100).
/// Lowering it writes the live-key guard first, as a rollback does.
pub async fn ramp(
    db: &PgPool,
    redis: Option<&mut ConnectionManager>,
    route: &Route,
    percent: u8,
    req: &Request<'_>,
) -> Result<RouteState> {
    if percent > 100 {
        return Err(Error::InvalidInput(format!(
            "percent must be 0 to 100, got {percent}"
        )));
    }
    let state = state_of(db, route, req.by).await?;
    let reason = req
        .reason
        .filter(|r| !r.trim().is_empty())
        .ok_or_else(|| Error::InvalidInput("changing the flipped share needs --reason".into()))?;
    if percent < state.percent {
        guard_before_lowering(db, redis, route).await?;
    }
    Ok(store::set_percent(db, &route.name, state.percent, percent, req.by, reason).await?)
}
