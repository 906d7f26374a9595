//! The live-key guard: the job keys Postgres holds live, copied into the
//! route's Redis (`qbridge:live:<route>`, a sorted set scored by when) so
//! that whatever runs the Redis side can ask cheaply, with one `ZSCORE`,
//! whether a fetched item is a re-push of a job Postgres owns.
//!
//! Why it exists: after a rollback below `postgres_only`, or a flipped share
//! lowered, a producer's retry of a job already stored live (a client whose
//! reply was late) is forwarded to Redis. The team's own fleet would run it
//! a second time; the adapters' middleware (Sidekiq, Celery, RQ) and
//! qbridge's own consumer skip it instead and report it as skipped.
//!
//! Who writes it: one publisher per process with a Redis side, every
//! [`PUBLISH_EVERY`], tails `job_keys` by `seen_at` from the watermark
//! `qbridge:live-through:<route>` (with [`OVERLAP`] for transactions that
//! commit late). When the watermark is missing — first start, or Redis lost
//! its data — it writes every live key of the retention again. A rollback
//! or a lowered share publishes before the phase changes ([`publish_route`]
//! from `ops::operate`), so every key live at that moment is in the set
//! before a push can reach Redis again.
//!
//! What it keeps: keys stored live within [`RETENTION`] (or the route's
//! dedup window, when shorter); older members are removed. The guard is
//! for retries that follow their first push, not for a re-push days later
//! (which the dedup window would forget anyway).

use std::time::Duration;

use redis::aio::ConnectionManager;
use sqlx::PgPool;

use crate::error::Result;
use crate::redis::keys::RouteKeys;
use crate::routes::{Route, Routes};

/// How often the publisher tails `job_keys`.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// How far behind the watermark each pass reads again: a transaction that
/// stored a key live commits after its `now()`; one that commits more than
/// this late is caught by the next full write (a rollback publishes too).
pub const OVERLAP: Duration = Duration::from_secs(30);

/// How long a live key stays in the guard (at most the route's dedup window).
pub const RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Keys read and written per statement.
const PAGE: i64 = 5_000;

/// Live keys of a queue from a time on, in (seen_at, key) order after a
/// cursor, with Postgres's clock in ms.
const LIVE_SINCE_SQL: &str = r#"
SELECT key, (extract(epoch FROM seen_at) * 1000)::int8 AS at_ms, seen_at
  FROM qbridge.job_keys
 WHERE queue = $1 AND copy = 'live' AND (seen_at, key) > ($2, $3)
 ORDER BY seen_at, key
 LIMIT $4
"#;

/// What one publishing pass did for a route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Published {
    /// Keys written to the set (re-written ones included).
    pub keys: u64,
    /// The watermark was missing: every live key of the retention was written.
    pub full: bool,
}

/// The retention of `route`'s guard, in ms.
fn retention_ms(route: &Route) -> i64 {
    RETENTION.min(route.config.dedup_window).as_millis() as i64
}

/// Brings `route`'s guard up to date: the keys stored live since its
/// watermark (all of the retention when there is none), then the
/// watermark moved to when this pass began and old members removed.
pub async fn publish_route(
    db: &PgPool,
    conn: &mut ConnectionManager,
    route: &Route,
) -> Result<Published> {
    let keys = RouteKeys::of(route);
    let began: i64 = sqlx::query_scalar("SELECT (extract(epoch FROM now()) * 1000)::int8")
        .fetch_one(db)
        .await?;
    let through: Option<i64> = redis::cmd("GET")
        .arg(keys.live_through())
        .query_async(conn)
        .await?;
    let full = through.is_none();
    let from = match through {
        Some(t) => t - OVERLAP.as_millis() as i64,
        None => began - retention_ms(route),
    };
    let from = chrono::DateTime::from_timestamp_millis(from).unwrap_or_default();
    let mut cursor = (from, String::new());
    let mut written = 0u64;
    loop {
        let rows: Vec<(String, i64, chrono::DateTime<chrono::Utc>)> =
            sqlx::query_as(LIVE_SINCE_SQL)
                .bind(&route.queue)
                .bind(cursor.0)
                .bind(&cursor.1)
                .bind(PAGE)
                .fetch_all(db)
                .await?;
        let Some(last) = rows.last() else { break };
        cursor = (last.2, last.0.clone());
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(keys.live());
        for (key, at, _) in &rows {
            zadd.arg(*at).arg(key);
        }
        let _: i64 = zadd.query_async(conn).await?;
        written += rows.len() as u64;
        if (rows.len() as i64) < PAGE {
            break;
        }
    }
    let _: () = redis::pipe()
        .cmd("ZREMRANGEBYSCORE")
        .arg(keys.live())
        .arg("-inf")
        .arg(format!("({}", began - retention_ms(route)))
        .ignore()
        .cmd("SET")
        .arg(keys.live_through())
        .arg(began)
        .ignore()
        .query_async(conn)
        .await?;
    Ok(Published {
        keys: written,
        full,
    })
}

/// One publishing pass over every route; a route that fails is logged and
/// the others still run. Returns the keys written.
pub async fn publish_once(db: &PgPool, conn: &mut ConnectionManager, routes: &Routes) -> u64 {
    let mut total = 0;
    for route in routes.iter() {
        if routes.phase(route) == crate::model::Phase::Decommissioned {
            // Decommission deleted the guard with the route's other keys.
            continue;
        }
        match publish_route(db, conn, route).await {
            Ok(p) => {
                if p.full && p.keys > 0 {
                    tracing::info!(route = %route.name, keys = p.keys,
                        "live-key guard written in full (first start, or Redis lost its data)");
                }
                total += p.keys;
            }
            Err(e) => {
                tracing::debug!(route = %route.name, error = %e, "live-key guard publishing deferred")
            }
        }
    }
    total
}

/// What the guard says about one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// The key is in the set: Postgres holds it live.
    Live,
    /// Not in the set, and the set is current (its watermark is there).
    Absent,
    /// Not in the set, and the set may be incomplete (no watermark: never
    /// written, or Redis lost its data since). Not evidence either way.
    Unknown,
}

/// Looks `key` up in `route`'s guard (one round trip).
pub async fn check<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    keys: &RouteKeys,
    key: &str,
) -> redis::RedisResult<Guard> {
    let (score, through): (Option<f64>, Option<i64>) = redis::pipe()
        .cmd("ZSCORE")
        .arg(keys.live())
        .arg(key)
        .cmd("GET")
        .arg(keys.live_through())
        .query_async(conn)
        .await?;
    Ok(match (score, through) {
        (Some(_), _) => Guard::Live,
        (None, Some(_)) => Guard::Absent,
        (None, None) => Guard::Unknown,
    })
}
