//! `qbridge diff --repair`: fills what the diff found missing on one side,
//! idempotently by job key.
//!
//! - Waiting in Redis but never mirrored: stored in Postgres as mirror
//!   copies (a known key is a duplicate, so a second repair adds nothing).
//! - Mirrored but gone from Redis (no Redis outcome, not held): the mirror
//!   copy's original bytes are pushed back to the route's list. A marker
//!   `qbridge:repushed:<route>:<key>` is set in the same Lua step, so a
//!   second repair before the Redis consumer reports the job pushes nothing.
//!
//! Items that ran on Redis without ever being mirrored are not touched: they
//! ran live once, which is the promise; the diff only counts them.

use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use redis::aio::ConnectionManager;
use serde::Serialize;
use sqlx::PgPool;

use crate::config::{PushEnd, RedisSideKind};
use crate::error::Result;
use crate::ingest::{self, Item, Stored, Via};
use crate::model::formats::decode_bytes;
use crate::model::Phase;
use crate::ops::diff::{ONLY_POSTGRES_SQL, UNKNOWN_KEYS_SQL};
use crate::ops::redis_view::{self, RedisView};
use crate::queue::JobCopy;
use crate::redis::keys::RouteKeys;
use crate::routes::Route;

/// How long a re-push marker lives: longer than any sane Redis backlog, so
/// the same loss is never re-pushed twice, short enough to forget.
const MARKER_TTL: Duration = Duration::from_secs(7 * 86400);

/// Sets the marker and pushes, or does nothing if the marker exists.
/// KEYS: list, marker. ARGV: item, ttl seconds, push command.
const REPUSH_LUA: &str = r#"
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[2]) then
  redis.call(ARGV[3], KEYS[1], ARGV[1])
  return 1
end
return 0
"#;

/// What a repair did.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct RepairReport {
    /// Redis items newly stored in Postgres as mirror copies.
    pub mirrored: usize,
    /// Mirror copies pushed back to Redis.
    pub repushed: usize,
    /// Mirror copies a previous repair already pushed back.
    pub already_repushed: usize,
    /// Mirror copies with no outcome and in no list qbridge reads whose
    /// Redis copy may still be running or done where qbridge cannot see
    /// (an outside fleet): not pushed back, listed by the diff.
    pub outcome_unknown: usize,
    /// Why a part was not repaired, if one was not.
    pub skipped: Option<String>,
}

/// Repairs one route. `since` and `held` are those the diff used.
pub async fn repair(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    phase: Phase,
    since: DateTime<Utc>,
    held: &RedisView,
    payload_limit: usize,
) -> Result<RepairReport> {
    let mut report = RepairReport {
        mirrored: mirror_waiting(db, route, held, payload_limit).await?,
        ..RepairReport::default()
    };
    if !matches!(
        phase,
        Phase::DualWrite | Phase::Shadow | Phase::PostgresOnly
    ) {
        report.skipped = Some(format!(
            "nothing is pushed back to Redis in {phase}: the Redis side is not running jobs"
        ));
        return Ok(report);
    }
    let reported: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM qbridge.outcomes \
          WHERE queue = $1 AND side = 'redis' AND recorded_at >= $2)",
    )
    .bind(&route.queue)
    .bind(since)
    .fetch_one(db)
    .await?;
    if !reported {
        report.skipped = Some(
            "the Redis side reported no outcomes in the window: a mirror copy with no report may \
             have run on Redis already, so none is pushed back (report outcomes, or run the Redis \
             consumer, then repair again)"
                .into(),
        );
        return Ok(report);
    }
    let settled = Utc::now()
        - chrono::Duration::from_std(route.config.cutover.diff.settle).unwrap_or_default();
    let first = owed(db, route, since, settled, held).await?;
    if first.is_empty() {
        return Ok(report);
    }
    if route.config.redis_side == RedisSideKind::Fleet {
        // Silence from a fleet qbridge does not run is not evidence of a
        // loss: the job may be held by a worker (BRPOP, an unacked hash, a
        // retry set) or done with its report late or never sent.
        report.outcome_unknown = first.len();
        report.skipped = Some(format!(
            "{} mirror copies have no Redis-side outcome, but the Redis side is an outside \
             fleet (redis_side = \"fleet\"): they may be running or done where qbridge cannot \
             see, so none is pushed back (have the fleet report its outcomes)",
            first.len()
        ));
        return Ok(report);
    }
    // Redis is read list by list, and the consumer records an outcome a
    // moment after it acts: an item moving between lists, or just finished,
    // can look unaccounted for in one reading. Only what a second reading a
    // moment later still misses is pushed back (the demo drill caught a
    // running job pushed back without this).
    tokio::time::sleep(RECHECK_AFTER).await;
    let again = redis_view::read(redis, db, route).await?;
    let second = owed(db, route, since, settled, &again).await?;
    let keys: Vec<String> = first.into_iter().filter(|k| second.contains(k)).collect();
    if keys.is_empty() {
        return Ok(report);
    }
    let rows: Vec<(String, Vec<u8>)> = sqlx::query_as(
        "SELECT key, original FROM qbridge.job_keys \
          WHERE queue = $1 AND key = ANY($2::text[]) AND original IS NOT NULL",
    )
    .bind(&route.queue)
    .bind(&keys)
    .fetch_all(db)
    .await?;
    let list = String::from_utf8_lossy(&route.redis_key).into_owned();
    let push = match route.push {
        PushEnd::Lpush => "LPUSH",
        PushEnd::Rpush => "RPUSH",
    };
    let script = redis::Script::new(REPUSH_LUA);
    let keys = RouteKeys::of(route);
    for (key, original) in rows {
        let marker = keys.repushed(&key);
        let pushed: i64 = script
            .key(&list)
            .key(&marker)
            .arg(original)
            .arg(MARKER_TTL.as_secs())
            .arg(push)
            .invoke_async(redis)
            .await?;
        if pushed == 1 {
            report.repushed += 1;
        } else {
            report.already_repushed += 1;
        }
    }
    Ok(report)
}

/// Time between the two readings that must agree before a push-back:
/// longer than the outcome recorder takes to write what it was handed.
const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// Mirror copies unaccounted for on the Redis side given one reading.
async fn owed(
    db: &PgPool,
    route: &Route,
    since: DateTime<Utc>,
    settled: DateTime<Utc>,
    held: &RedisView,
) -> Result<std::collections::HashSet<String>> {
    let keys: Vec<String> = sqlx::query_scalar(ONLY_POSTGRES_SQL)
        .bind(&route.queue)
        .bind(since)
        .bind(settled)
        .bind(held.accounted_keys())
        .fetch_all(db)
        .await?;
    Ok(keys.into_iter().collect())
}

/// Stores the held items Postgres does not know as mirror copies.
async fn mirror_waiting(
    db: &PgPool,
    route: &Route,
    held: &RedisView,
    payload_limit: usize,
) -> Result<usize> {
    let originals: Vec<Bytes> = held
        .waiting
        .iter()
        .chain(&held.processing)
        .map(|h| h.original.clone())
        .collect();
    if originals.is_empty() {
        return Ok(0);
    }
    let keys = held.keys();
    let unknown: Vec<String> = sqlx::query_scalar(UNKNOWN_KEYS_SQL)
        .bind(&route.queue)
        .bind(&keys)
        .fetch_all(db)
        .await?;
    if unknown.is_empty() {
        return Ok(0);
    }
    let unknown: std::collections::HashSet<String> = unknown.into_iter().collect();
    let items: Vec<Item<'_>> = keys
        .iter()
        .zip(originals)
        .filter(|(k, _)| unknown.contains(*k))
        .map(|(_, original)| Item {
            route,
            decoded: decode_bytes(&route.format, original),
            copy: JobCopy::Mirror,
            via: Via::Repair,
        })
        .collect();
    let mut tx = db.begin().await?;
    let stored = ingest::store(&mut tx, items, payload_limit).await?;
    tx.commit().await?;
    Ok(stored
        .iter()
        .filter(|s| matches!(s, Stored::New { .. }))
        .count())
}
