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
//! The same question to Postgres also asks whether the route's Redis side
//! already ran the key to an end (an `ok` or `dead` outcome): what the ran
//! set says, for when Redis lost it in a restart without persistence and a
//! client's retry of the job arrives after.
//!
//! The consumer asks the guard first (one round trip to the Redis it pops
//! from), then Postgres. When Postgres does not answer, a guard that is
//! current (its watermark is there) answers alone for "live": while
//! Postgres is down no key can become live, so the guard holds every live
//! key but those of its last second; and the ran set (asked in the claim
//! before) answers alone for "ran" only when it is whole (its marker names
//! this server: `redis::ran_refill` wrote it again after Redis lost it). When
//! they cannot say, the item is not run yet: it stays in its processing
//! list and is asked about again.
//!
//! Only id keys are asked: content-hash keys of Redis pops are numbered
//! apart from live copies (`:pg<n>`), so they can never name one.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use sqlx::PgPool;

use crate::model::formats::{Decoded, KeySource};
use crate::redis::keys::{RouteKeys, RAN_RETENTION_MS};
use crate::redis::live_guard::{self, Guard};

/// How long the consumer waits for Postgres's answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// `live` when Postgres holds the key live; `ran` when the route's Redis
/// side ran it to an end on record (an `ok` or `dead` outcome within the
/// ran set's retention: what the ran set says, kept where a Redis restart
/// cannot erase it); else `none`.
const OWNER_SQL: &str = r#"
SELECT CASE
  WHEN EXISTS (SELECT 1 FROM qbridge.job_keys WHERE queue = $1 AND key = $2 AND copy = 'live')
    THEN 'live'
  WHEN EXISTS (SELECT 1 FROM qbridge.outcomes
                WHERE queue = $1 AND key = $2 AND side = 'redis' AND mode = 'live'
                  AND outcome IN ('ok', 'dead')
                  AND recorded_at > now() - make_interval(secs => $3::float8 / 1000))
    THEN 'ran'
  ELSE 'none' END
"#;

/// What the guard and Postgres said about a popped item's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Postgres holds the key live: do not run the item on Redis.
    Postgres,
    /// The route's Redis side already ran the job to an end, on record in
    /// Postgres: a client's retry that reached Redis after it lost its ran
    /// set (a restart without persistence). Dropped unrun, as the ran set
    /// would have.
    RanOnRecord,
    /// Postgres holds no live copy of it (or it is a content hash).
    NotPostgres,
    /// Neither could say (the reason): the item waits, unrun.
    Unknown(String),
}

/// Asks the guard, then Postgres, whether `key` (the job key of `decoded`)
/// is live in Postgres, or ran to an end on the Redis side already.
/// `server` is the `run_id` of the Redis `conn` talks to, when known.
pub async fn owner(
    db: &PgPool,
    conn: &mut MultiplexedConnection,
    keys: &RouteKeys,
    queue: &str,
    decoded: &Decoded,
    key: &str,
    server: Option<&str>,
) -> Owner {
    if matches!(decoded.key, KeySource::ContentHash(_)) {
        return Owner::NotPostgres;
    }
    let guard = live_guard::check(conn, keys, key).await;
    if let Ok(Guard::Live) = guard {
        return Owner::Postgres;
    }
    let why = match tokio::time::timeout(ASK_TIMEOUT, ask_postgres(db, queue, key)).await {
        Ok(Ok(owner)) if owner == "live" => return Owner::Postgres,
        Ok(Ok(owner)) if owner == "ran" => return Owner::RanOnRecord,
        Ok(Ok(_)) => return Owner::NotPostgres,
        Ok(Err(e)) => e.to_string(),
        Err(_) => "Postgres timed out".into(),
    };
    match guard {
        // The guard knows live keys, not runs: the ran set (asked before,
        // in the claim) answers "not run" alone only once it is whole again.
        Ok(Guard::Absent) => match ran_set_whole(conn, keys, server).await {
            Ok(true) => Owner::NotPostgres,
            Ok(false) => Owner::Unknown(format!(
                "{why}; the ran set is not written again yet since Redis lost its data"
            )),
            Err(e) => Owner::Unknown(format!("{why}; the ran set's marker: {e}")),
        },
        Ok(_) => Owner::Unknown(format!("{why}; the live-key guard is not written yet")),
        Err(e) => Owner::Unknown(format!("{why}; the live-key guard: {e}")),
    }
}

/// Whether the route's ran set holds every run on record: its marker
/// (`redis::ran_refill`) names `server`, the one this connection reaches.
async fn ran_set_whole(
    conn: &mut MultiplexedConnection,
    keys: &RouteKeys,
    server: Option<&str>,
) -> redis::RedisResult<bool> {
    let Some(server) = server else {
        return Ok(false);
    };
    let marker: Option<String> = redis::cmd("GET")
        .arg(keys.ran_through())
        .query_async(conn)
        .await?;
    Ok(marker.as_deref() == Some(server))
}

/// [`OWNER_SQL`], asked again (within the caller's timeout) when it fails:
/// right after Postgres restarts the pool still holds connections to the
/// old server, and the first answer is a broken connection even though a
/// fresh one would answer. Only a Postgres that stays silent leaves the
/// question to the guard alone.
async fn ask_postgres(db: &PgPool, queue: &str, key: &str) -> sqlx::Result<String> {
    loop {
        let asked = sqlx::query_scalar::<_, String>(OWNER_SQL)
            .bind(queue)
            .bind(key)
            .bind(RAN_RETENTION_MS as f64)
            .fetch_one(db)
            .await;
        match asked {
            Ok(owner) => return Ok(owner),
            Err(e) if matches!(e, sqlx::Error::PoolTimedOut) => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// What the route's ran set and running claims say about a popped item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Its job ran already (the key is in the route's ran set, written in
    /// the same step as the ack or the move to the dead list): this item is
    /// a second push of it — a client's retry forwarded to Redis — and is
    /// dropped unrun.
    Ran,
    /// Another item of the key runs now (the processing list holding it,
    /// whose consumer is alive): this one waits.
    HeldBy(String),
    /// This item may run: the claim is its own (or the key is a content
    /// hash, numbered apart, or Redis did not answer: then it runs, as the
    /// Redis side always has, at least once).
    Run,
}

/// Asks whether `key` ran or runs elsewhere, and claims it for the item in
/// `processing` otherwise (`qbridge:running:<route>`). A claim whose holder's
/// consumer has no heartbeat any more is taken over: that consumer died
/// holding the item, and its next start finds the claim gone to this one.
pub async fn claim(
    conn: &mut MultiplexedConnection,
    (script, keys): (&redis::Script, &RouteKeys),
    processing: &str,
    decoded: &Decoded,
    key: &str,
) -> Claim {
    if matches!(decoded.key, KeySource::ContentHash(_)) {
        return Claim::Run;
    }
    let mut take_over = String::new();
    for _ in 0..2 {
        let answer: redis::RedisResult<String> = script
            .key(keys.ran())
            .key(keys.running())
            .arg(key)
            .arg(processing)
            .arg(&take_over)
            .invoke_async(conn)
            .await;
        let holder = match answer.as_deref() {
            Ok("ran") => return Claim::Ran,
            Ok("") | Err(_) => return Claim::Run,
            Ok(holder) => holder.to_string(),
        };
        if holder_alive(conn, keys, &holder).await {
            return Claim::HeldBy(holder);
        }
        take_over = holder;
    }
    Claim::HeldBy(take_over)
}

/// Whether the consumer owning processing list `holder` still beats (a
/// Redis error says yes: waiting is the safe answer).
async fn holder_alive(conn: &mut MultiplexedConnection, keys: &RouteKeys, holder: &str) -> bool {
    let Some(consumer) = keys.processing_owner(holder) else {
        return false;
    };
    let beats: redis::RedisResult<bool> = redis::cmd("EXISTS")
        .arg(keys.consumer(consumer).heartbeat())
        .query_async(conn)
        .await;
    beats.unwrap_or(true)
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
