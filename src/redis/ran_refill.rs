//! The ran set written again after Redis lost it.
//!
//! `qbridge:ran:<route>` remembers every job qbridge's consumer ran (the ack
//! and the move to the dead list add the key in the same step), so a
//! client's retry that reaches Redis after the run is dropped unrun. A
//! restart without persistence or a flush takes the set; the consumer then
//! asks Postgres whether the key ran. When Postgres does not answer either,
//! only a ran set known to be whole may answer alone.
//!
//! So every process with a Redis side, once a second, reads the marker
//! `qbridge:ran-through:<route>` of each route qbridge's consumer runs:
//! the `run_id` of the server the set was last written whole on. When it
//! is missing or names another server (first start, a restart, a flush, a
//! failover: a restart that kept part of the data or a replica that lagged
//! lost acks too) it writes every Redis-side run Postgres has on record
//! within the set's retention into the set, then sets the marker to the
//! `run_id` it read first — only if the route's epoch marker is still the
//! one it read first, so a restart in the middle never marks an empty set
//! whole. The consumer, with Postgres silent, trusts the set alone only
//! when the marker names the server it pops from; else the item waits
//! (`redis/consumer/postgres_owns.rs`). A server that denies INFO has no
//! `run_id` to name: its set is never marked, and its items wait while
//! Postgres is silent.
//!
//! What it cannot see: an outcome that reaches Postgres after the refill
//! for a run acknowledged to the server that was lost (its writer was
//! retrying against an absent Postgres). Such a run's retry is judged by
//! Postgres once it answers, and runs on the set alone only if Postgres
//! goes silent again within those seconds.

use redis::aio::ConnectionManager;
use sqlx::PgPool;

use crate::error::Result;
use crate::redis::keys::{RouteKeys, RAN_RETENTION_MS};
use crate::routes::{Route, Routes};

/// Keys read and written per statement.
const PAGE: i64 = 5_000;

/// Redis-side runs of a queue (ok or dead) recorded since a time, in
/// (recorded_at, id) order after a cursor, with their time in ms.
const RAN_SINCE_SQL: &str = r#"
SELECT key, (extract(epoch FROM recorded_at) * 1000)::int8 AS at_ms, recorded_at, id
  FROM qbridge.outcomes
 WHERE queue = $1 AND side = 'redis' AND mode = 'live' AND outcome IN ('ok', 'dead')
   AND (recorded_at, id) > ($2, $3)
 ORDER BY recorded_at, id
 LIMIT $4
"#;

/// Trims what the retention no longer keeps (as the ack does) and sets the
/// marker, only while the epoch marker is the one the refill began with.
/// KEYS: epoch marker, ran-through, ran. ARGV: epoch marker value, the
/// server's run_id, the oldest score kept (ms).
const MARK_LUA: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[3])
redis.call('SET', KEYS[2], ARGV[2])
return 1
"#;

/// Writes `route`'s ran set again when its marker does not name the
/// current server. Returns the keys written, or `None` when the set was
/// whole already (or the server cannot be named, or the epoch marker is
/// not set yet: the epoch observer sets it within a second).
pub async fn refill_route(
    db: &PgPool,
    conn: &mut ConnectionManager,
    route: &Route,
) -> Result<Option<u64>> {
    let keys = RouteKeys::of(route);
    let (info, through, epoch): (String, Option<String>, Option<String>) = redis::pipe()
        .cmd("INFO")
        .arg("server")
        .cmd("GET")
        .arg(keys.ran_through())
        .cmd("GET")
        .arg(keys.epoch())
        .query_async(conn)
        .await?;
    let Some(server) = crate::redis::epoch::run_id_of(&info) else {
        return Ok(None);
    };
    let (Some(epoch), false) = (epoch, through.as_deref() == Some(server)) else {
        return Ok(None);
    };
    let now: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT now()").fetch_one(db).await?;
    let from = now - chrono::Duration::milliseconds(RAN_RETENTION_MS);
    let mut cursor = (from, 0i64);
    let mut written = 0u64;
    loop {
        let rows: Vec<(String, i64, chrono::DateTime<chrono::Utc>, i64)> =
            sqlx::query_as(RAN_SINCE_SQL)
                .bind(&route.queue)
                .bind(cursor.0)
                .bind(cursor.1)
                .bind(PAGE)
                .fetch_all(db)
                .await?;
        let Some(last) = rows.last() else { break };
        cursor = (last.2, last.3);
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(keys.ran());
        for (key, at, _, _) in &rows {
            zadd.arg(*at).arg(key);
        }
        let _: i64 = zadd.query_async(conn).await?;
        written += rows.len() as u64;
        if (rows.len() as i64) < PAGE {
            break;
        }
    }
    let marked: i64 = redis::Script::new(MARK_LUA)
        .key(keys.epoch())
        .key(keys.ran_through())
        .key(keys.ran())
        .arg(&epoch)
        .arg(server)
        .arg(from.timestamp_millis())
        .invoke_async(conn)
        .await?;
    Ok((marked == 1).then_some(written))
}

/// One pass over every route qbridge's consumer runs that is not
/// decommissioned (a fleet keeps its own record of what ran, and nothing
/// trims a set no consumer acks into); a route that fails is left for the
/// next pass.
pub async fn refill_once(db: &PgPool, conn: &mut ConnectionManager, routes: &Routes) {
    for route in routes.iter() {
        let consumed = route.config.redis_consumer.is_some();
        if !consumed || routes.phase(route) == crate::model::Phase::Decommissioned {
            continue;
        }
        match refill_route(db, conn, route).await {
            Ok(Some(keys)) => tracing::info!(route = %route.name, keys,
                "ran set written from the outcomes in Postgres (first start, or Redis lost its data)"),
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(route = %route.name, error = %e, "ran set refill deferred")
            }
        }
    }
}
