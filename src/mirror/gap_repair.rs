//! Gap repair: items parked in a route's gap list while Postgres was down
//! are written into Postgres as mirror copies once it is back.
//!
//! Items are read (LRANGE), written, and only then trimmed from the list, so
//! a crash or a failed write leaves them where they were. New items are
//! appended at the tail meanwhile and the trim removes only the head that was
//! written. A short Redis lock per route keeps two processes from writing
//! the same items at once; writing them twice is harmless anyway, also at
//! the same time as a writer keeping them (ids are keys, content-hash items
//! carry write ids: see `redis::gap_entry` and `ingest::writes`).

use std::time::Duration;

use ::redis::aio::ConnectionManager;
use ::redis::AsyncCommands;
use bytes::Bytes;
use sqlx::PgPool;

use crate::error::{Error, Result};
use crate::ingest::{self, Item, Via};
use crate::model::formats::decode_bytes;
use crate::periodic::Pace;
use crate::queue::JobCopy;
use crate::redis::gap_entry;
use crate::redis::keys::RouteKeys;
use crate::routes::{Route, Routes};

/// Items per gap-repair transaction.
const REPAIR_BATCH: usize = 500;

/// How long one process may hold a route's gap repair.
const REPAIR_LOCK: Duration = Duration::from_secs(60);

const RELEASE_LUA: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// What gap repair was doing when Redis failed (part of its error message).
const DOING: &str = "gap repair";

/// Writes up to one batch per route from the gap lists into Postgres (as
/// mirror copies); returns how many items were repaired.
pub async fn repair_gaps_once(
    pool: &PgPool,
    conn: &mut ConnectionManager,
    routes: &Routes,
    payload_limit: usize,
) -> Result<u64> {
    let mut repaired = 0;
    for route in routes.iter() {
        let keys = RouteKeys::of(route);
        let Some(token) = lock(conn, &keys).await? else {
            continue;
        };
        let result = repair_route(pool, conn, route, &keys.gap(), payload_limit).await;
        unlock(conn, &keys, &token).await;
        repaired += result?;
    }
    Ok(repaired)
}

/// Batches [`drain_route`] writes at most before it gives up (the rest
/// is left to the periodic pass).
const DRAIN_BATCHES: usize = 20;

/// What [`drain_route`] found.
pub(super) enum Drained {
    /// Nothing is parked for the route (any more).
    Empty,
    /// Parked copies are left (the reason, one line): another process is
    /// writing them, Postgres failed, or too many are parked.
    Left(String),
    /// Redis did not answer (the reason): whether anything is parked is not
    /// known. The Redis side cannot run the originals through qbridge
    /// either, and Postgres must keep taking live pushes without Redis.
    RedisAway(String),
}

/// How long the gap list's length may take before Redis counts as away.
const LLEN_TIMEOUT: Duration = Duration::from_millis(500);

/// Writes everything parked in `route`'s gap list now, before a live copy
/// of the route is stored: a parked mirror copy not yet in `job_keys` would
/// let a re-push of its key run as a new job while Redis runs the original.
pub(super) async fn drain_route(
    pool: &PgPool,
    conn: &mut ConnectionManager,
    route: &Route,
    payload_limit: usize,
) -> Drained {
    let keys = RouteKeys::of(route);
    let parked: i64 = match tokio::time::timeout(LLEN_TIMEOUT, conn.llen(keys.gap())).await {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => return Drained::RedisAway(e.to_string()),
        Err(_) => return Drained::RedisAway("no answer within 500 ms".into()),
    };
    if parked == 0 {
        return Drained::Empty;
    }
    let token = match lock(conn, &keys).await {
        Ok(Some(token)) => token,
        Ok(None) => {
            return Drained::Left(format!(
                "{parked} mirror copies parked during a Postgres outage are being written by another process"
            ))
        }
        Err(e) => return Drained::RedisAway(e.to_string()),
    };
    let mut result = Drained::Left(format!(
        "{parked} parked mirror copies are still being written"
    ));
    for _ in 0..DRAIN_BATCHES {
        match repair_route(pool, conn, route, &keys.gap(), payload_limit).await {
            Ok(0) => {
                result = Drained::Empty;
                break;
            }
            Ok(_) => {}
            Err(e) => {
                result = Drained::Left(e.to_string());
                break;
            }
        }
    }
    unlock(conn, &keys, &token).await;
    result
}

/// Takes the route's gap repair lock: its token, or `None` if another
/// process holds it.
async fn lock(conn: &mut ConnectionManager, keys: &RouteKeys) -> Result<Option<String>> {
    let token = uuid::Uuid::new_v4().to_string();
    let locked: Option<String> = ::redis::cmd("SET")
        .arg(keys.gap_lock())
        .arg(&token)
        .arg("NX")
        .arg("PX")
        .arg(REPAIR_LOCK.as_millis() as u64)
        .query_async(conn)
        .await
        .map_err(|e| Error::redis(DOING, e))?;
    Ok(locked.map(|_| token))
}

/// Releases the lock, only if still ours (it may have expired and been
/// taken).
async fn unlock(conn: &mut ConnectionManager, keys: &RouteKeys, token: &str) {
    let _: ::redis::RedisResult<i64> = ::redis::Script::new(RELEASE_LUA)
        .key(keys.gap_lock())
        .arg(token)
        .invoke_async(conn)
        .await;
}

async fn repair_route(
    pool: &PgPool,
    conn: &mut ConnectionManager,
    route: &Route,
    key: &str,
    payload_limit: usize,
) -> Result<u64> {
    let taken: Vec<Vec<u8>> = conn
        .lrange(key, 0, REPAIR_BATCH as isize - 1)
        .await
        .map_err(|e| Error::redis(DOING, e))?;
    if taken.is_empty() {
        return Ok(0);
    }
    let items = taken
        .iter()
        .map(|b| {
            let entry = gap_entry::decode(Bytes::copy_from_slice(b));
            let decoded = decode_bytes(&route.format, entry.item);
            let mut item = Item::new(route, decoded, JobCopy::Mirror, Via::Repair);
            item.write = entry.write;
            item
        })
        .collect();
    let mut tx = pool.begin().await?;
    ingest::store(&mut tx, items, payload_limit).await?;
    tx.commit().await?;
    // Written: now drop them from the head. If this trim fails they are
    // written again next pass, and their keys make that a no-op (content-hash
    // items by their write ids: the same write keeps the number it got).
    conn.ltrim::<_, ()>(key, taken.len() as isize, -1)
        .await
        .map_err(|e| Error::redis(DOING, e))?;
    Ok(taken.len() as u64)
}

/// One pass of the gap repair service: quiet unless it repaired something
/// or failed; [`Pace::Again`] when it moved items (more may be waiting).
pub async fn gap_repair_pass(
    pool: &PgPool,
    conn: &mut ConnectionManager,
    routes: &Routes,
    payload_limit: usize,
) -> Pace {
    match repair_gaps_once(pool, conn, routes, payload_limit).await {
        Ok(0) => Pace::Wait,
        Ok(n) => {
            tracing::info!(items = n, "mirrored items parked during a Postgres outage");
            Pace::Again
        }
        Err(e) => {
            tracing::debug!(error = %e, "gap repair deferred");
            Pace::Wait
        }
    }
}
