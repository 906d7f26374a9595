//! Whether Postgres owns a popped item's job: its key is a live copy there
//! (it ran, runs or will run in Postgres). Then the Redis item is a re-push
//! of that job, not a new one, and the consumer drops it unrun.
//!
//! The case (found by the randomized oracle): a key ran live in
//! Postgres during `postgres_only`; after a rollback to `shadow` a client
//! retries its push through the proxy, which forwards it to Redis before the
//! mirror can tell it is a duplicate. Live copies stay live across rollbacks
//! (fixed at enqueue), so "live in `job_keys`" is positive evidence the job
//! is Postgres's. Outside fleets ask the same question of the live-key
//! guard (`redis::live_guard`) through their adapters.
//!
//! The consumer asks the guard first (one round trip to the Redis it pops
//! from), then Postgres. When Postgres does not answer, a guard that is
//! current (its watermark is there) answers alone: while Postgres is down
//! no key can become live, so the guard holds every live key but those of
//! its last second. When neither can say, the item is not run yet: it
//! stays in its processing list and is asked about again.
//!
//! Only id keys are asked: content-hash keys of Redis pops are numbered
//! apart from live copies (`:pg<n>`), so they can never name one.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use sqlx::PgPool;

use crate::model::formats::{Decoded, KeySource};
use crate::redis::keys::RouteKeys;
use crate::redis::live_guard::{self, Guard};

/// How long the consumer waits for Postgres's answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

const LIVE_SQL: &str =
    "SELECT EXISTS (SELECT 1 FROM qbridge.job_keys WHERE queue = $1 AND key = $2 AND copy = 'live')";

/// What the guard and Postgres said about a popped item's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Postgres holds the key live: do not run the item on Redis.
    Postgres,
    /// Postgres holds no live copy of it (or it is a content hash).
    NotPostgres,
    /// Neither could say (the reason): the item waits, unrun.
    Unknown(String),
}

/// Asks the guard, then Postgres, whether `key` (the job key of `decoded`)
/// is live in Postgres.
pub async fn owner(
    db: &PgPool,
    conn: &mut MultiplexedConnection,
    keys: &RouteKeys,
    queue: &str,
    decoded: &Decoded,
    key: &str,
) -> Owner {
    if matches!(decoded.key, KeySource::ContentHash(_)) {
        return Owner::NotPostgres;
    }
    let guard = live_guard::check(conn, keys, key).await;
    if let Ok(Guard::Live) = guard {
        return Owner::Postgres;
    }
    let ask = sqlx::query_scalar::<_, bool>(LIVE_SQL)
        .bind(queue)
        .bind(key)
        .fetch_one(db);
    let why = match tokio::time::timeout(ASK_TIMEOUT, ask).await {
        Ok(Ok(true)) => return Owner::Postgres,
        Ok(Ok(false)) => return Owner::NotPostgres,
        Ok(Err(e)) => e.to_string(),
        Err(_) => "Postgres timed out".into(),
    };
    match guard {
        Ok(Guard::Absent) => Owner::NotPostgres,
        Ok(_) => Owner::Unknown(format!("{why}; the live-key guard is not written yet")),
        Err(e) => Owner::Unknown(format!("{why}; the live-key guard: {e}")),
    }
}

/// Whether this consumer already finished an item of `key` (it is in the
/// route's ran set, written in the same step as the ack or the move to the
/// dead list): then this item is a second push of a job that ran — a
/// client's retry forwarded to Redis — and is dropped unrun. Only id keys:
/// identical texts are numbered apart. A Redis error answers "no": the
/// item then runs, as the Redis side always has (at least once).
pub async fn ran_already(
    conn: &mut MultiplexedConnection,
    keys: &RouteKeys,
    decoded: &Decoded,
    key: &str,
) -> bool {
    if matches!(decoded.key, KeySource::ContentHash(_)) {
        return false;
    }
    let score: redis::RedisResult<Option<f64>> = redis::cmd("ZSCORE")
        .arg(keys.ran())
        .arg(key)
        .query_async(conn)
        .await;
    matches!(score, Ok(Some(_)))
}

/// Records that the consumer skipped `key` (the diff counts skips); best
/// effort, off the slot's path: a lost row costs a count, not a run.
pub fn record_skip(db: &PgPool, queue: &str, key: &str) {
    let (db, queue, key) = (db.clone(), queue.to_string(), key.to_string());
    tokio::spawn(async move {
        let insert = sqlx::query("INSERT INTO qbridge.skipped_runs (queue, key) VALUES ($1, $2)")
            .bind(&queue)
            .bind(&key)
            .execute(&db);
        let failed = match tokio::time::timeout(ASK_TIMEOUT * 5, insert).await {
            Ok(Ok(_)) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        tracing::debug!(error = %failed, "redis consumer: a skip was not recorded");
    });
}
