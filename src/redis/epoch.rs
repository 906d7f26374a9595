//! Which Redis a route talks to, over time: the evidence that Redis lost
//! data. An epoch is the server's `run_id` (new at every restart and on a
//! failover to another server) plus a marker key qbridge sets once in the
//! route's database (gone after a flush or a restart without persistence).
//! Every process with a Redis side observes it every [`OBSERVE_EVERY`], and
//! the diff and repair observe it before they read; each observation is
//! upserted into `qbridge.redis_epochs`. The pushes qbridge makes or forwards
//! also name the server that took them (the producer's push script reads its
//! `run_id`; the proxy reads it once per upstream connection): the latest
//! push each server acknowledged is kept in `qbridge.redis_run_acks`
//! ([`record_acks`]).
//!
//! A mirror copy that Redis no longer holds was lost by Redis — and may be
//! pushed back by repair — only with this evidence (never from silence):
//! - a server that is not the current one acknowledged a push at or after
//!   the copy's (so the copy went to that server or an earlier one), or
//! - for a content-hash number a pop took, the server the pop took the item
//!   from was seen with another marker than the current one: its data set,
//!   with the processing list that held the item, is gone (the consumer
//!   names its server when it numbers the pop, which may be after the
//!   server died; a restart with persistence or a failover keeps the
//!   marker, so it is no evidence), or
//! - the current server started after the copy was mirrored (its push went
//!   to an earlier server), or
//! - another epoch was observed after the copy was mirrored (so the push
//!   went to that epoch), and the current one began after it.
//!
//! Without the first, items pushed within one observation period before a
//! restart that took less than a second would have none (Redis reports its
//! uptime in whole seconds); that still holds for pushes whose server is
//! not known (an ACL user denied INFO, a push by a process older than
//! migration 0019). They stay unaccounted until an operator decides
//! (`qbridge diff --repair --assume-lost-before`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::aio::ConnectionManager;
use serde::Serialize;
use sqlx::PgPool;

use crate::error::Result;
use crate::redis::keys::RouteKeys;
use crate::routes::Route;

/// How often every process with a Redis side observes each route's epoch:
/// the window in which a push and a quick restart can leave no evidence.
pub const OBSERVE_EVERY: Duration = Duration::from_secs(1);

/// How long after a Redis server starts repair waits before it reads it:
/// qbridge's consumers write the items they are running back into a server
/// that lost them within a beat or two (the slot's keeper in
/// `redis/consumer/slot`); read sooner, such an item looks lost and would
/// be pushed back while its handler still runs.
pub const SETTLE_AFTER_START: Duration = Duration::from_secs(5);

/// Waits until the server has been up for [`SETTLE_AFTER_START`] when it
/// replaced another one the route was seen with (a first server has lost
/// nothing: no wait), at once for one up longer.
pub async fn wait_until_settled(
    conn: &mut ConnectionManager,
    db: &PgPool,
    route: &Route,
) -> Result<()> {
    loop {
        let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
        let uptime = info_field(&info, "uptime_in_seconds").and_then(|v| v.parse::<u64>().ok());
        let Some(up) = uptime.filter(|up| *up < SETTLE_AFTER_START.as_secs()) else {
            return Ok(());
        };
        let replaced: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM qbridge.redis_epochs WHERE route = $1 AND run_id <> $2)",
        )
        .bind(&route.name)
        .bind(run_id_of(&info).unwrap_or_default())
        .fetch_one(db)
        .await?;
        if !replaced {
            return Ok(());
        }
        // Whole seconds, rounded down: looked at again after the rest.
        tokio::time::sleep(SETTLE_AFTER_START - Duration::from_secs(up)).await;
    }
}

/// One observation of a route's Redis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Epoch {
    /// The server's `run_id` (INFO server).
    pub run_id: String,
    /// The value of the route's marker key.
    pub marker: String,
    /// When the server started, at the earliest.
    pub started_at: DateTime<Utc>,
}

/// Reads the route's epoch and records the observation.
pub async fn observe(conn: &mut ConnectionManager, db: &PgPool, route: &Route) -> Result<Epoch> {
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    let run_id = info_field(&info, "run_id").unwrap_or_default().to_string();
    let uptime: i64 = info_field(&info, "uptime_in_seconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let key = RouteKeys::of(route).epoch();
    let fresh = uuid::Uuid::new_v4().simple().to_string();
    // Set once; an existing marker is kept. A second round trip is fine:
    // whichever process sets it first, every process then reads that one.
    let _: Option<String> = redis::cmd("SET")
        .arg(&key)
        .arg(&fresh)
        .arg("NX")
        .query_async(conn)
        .await?;
    let marker: Option<String> = redis::cmd("GET").arg(&key).query_async(conn).await?;
    // Uptime is whole seconds, rounded down: the start was at most one
    // second before now - uptime, and the earliest is the safe bound. It
    // is taken on Postgres's clock, the one `job_keys.seen_at` is on.
    let started_at: DateTime<Utc> = sqlx::query_scalar(
        "INSERT INTO qbridge.redis_epochs (route, run_id, marker, started_at) \
         VALUES ($1, $2, $3, now() - ($4 + 1) * interval '1 second') \
         ON CONFLICT (route, run_id, marker) DO UPDATE SET last_seen = now() \
         RETURNING started_at",
    )
    .bind(&route.name)
    .bind(&run_id)
    .bind(marker.as_deref().unwrap_or(&fresh))
    .bind(uptime as f64)
    .fetch_one(db)
    .await?;
    let epoch = Epoch {
        run_id,
        marker: marker.unwrap_or(fresh),
        started_at,
    };
    Ok(epoch)
}

/// One observation pass over `routes` (the periodic service).
pub async fn observe_all(
    conn: &mut ConnectionManager,
    db: &PgPool,
    routes: &crate::routes::Routes,
) -> Result<()> {
    for route in routes.iter() {
        if routes.phase(route) != crate::model::Phase::Decommissioned {
            observe(conn, db, route).await?;
        }
    }
    Ok(())
}

/// Why each of `keys` (mirror copies of `route`) was lost by Redis, for
/// those that have evidence, given the current `epoch`.
pub async fn loss_evidence(
    db: &PgPool,
    route: &Route,
    epoch: &Epoch,
    keys: &[String],
) -> Result<Vec<(String, String)>> {
    evidence_rows(db, LOSS_EVIDENCE_SQL, route, epoch, keys).await
}

/// Runs one of the evidence queries: `$1` route, `$2` queue, `$3`/`$4` the
/// current epoch, `$5` the keys.
async fn evidence_rows<T>(
    db: &PgPool,
    sql: &'static str,
    route: &Route,
    epoch: &Epoch,
    keys: &[String],
) -> Result<Vec<T>>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    Ok(sqlx::query_as(sql)
        .bind(&route.name)
        .bind(&route.queue)
        .bind(&epoch.run_id)
        .bind(&epoch.marker)
        .bind(keys)
        .fetch_all(db)
        .await?)
}

/// The evidence per key, as one line (no key without evidence is returned).
/// A key is judged by when Redis had it (the rule of [`HAD_AT_SQL`]).
/// The most direct evidence first: the server a pop of the key took the
/// item from held a data set that is gone (`numbered_writes.server`, seen
/// in `redis_epochs` with another marker: the item waited in that server's
/// processing list, and a pop may be numbered after its server died, so the
/// pop's time proves nothing), or a server that acknowledged a
/// push at or after that time is gone (`redis_run_acks`), so the item went
/// with it.
const LOSS_EVIDENCE_SQL: &str = r#"
WITH cur AS (
    SELECT started_at, first_seen FROM qbridge.redis_epochs
     WHERE route = $1 AND run_id = $3 AND marker = $4),
had AS (
    SELECT k.key, p.at AS popped_at, p.server AS popped_from,
           COALESCE(k.pushed_at, k.seen_at) AS pushed_at
      FROM qbridge.job_keys k
      LEFT JOIN LATERAL (SELECT w.at, w.server FROM qbridge.numbered_writes w
                          WHERE w.queue = k.queue AND w.key = k.key AND w.side = 'pop'
                          ORDER BY w.at DESC LIMIT 1) p ON true
     WHERE k.queue = $2 AND k.key = ANY($5::text[])),
judged AS (SELECT key, COALESCE(popped_at, pushed_at) AS at, popped_from FROM had)
SELECT j.key,
       CASE WHEN popped_data_gone.gone
            THEN 'Redis lost its data after the pop (the server that handed the item out, ' ||
                 left(j.popped_from, 12) || ', was seen with another marker: its processing list went with it)'
            WHEN gone.last_ack IS NOT NULL
            THEN 'Redis was replaced after the push (the server that acknowledged a push at ' ||
                 to_char(gone.last_ack AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') ||
                 ' is gone)'
            WHEN cur.started_at > j.at
            THEN 'Redis restarted after the push (server started ' ||
                 to_char(cur.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ')'
            ELSE 'Redis lost its data after the push (it was seen as another server or '
                 'without qbridge''s marker until ' ||
                 to_char(prev.last_seen AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ')'
       END
  FROM judged j
  CROSS JOIN cur
  LEFT JOIN LATERAL (
        SELECT max(o.last_seen) AS last_seen FROM qbridge.redis_epochs o
         WHERE o.route = $1 AND (o.run_id, o.marker) <> ($3, $4)
           AND o.last_seen >= j.at AND o.last_seen < cur.first_seen) prev ON true
  -- The pop's server, last seen, held another data set (its marker) than
  -- the current one: a restart with persistence or a failover keeps the
  -- marker, and then the run id alone proves nothing.
  LEFT JOIN LATERAL (
        SELECT o.marker <> $4 AS gone FROM qbridge.redis_epochs o
         WHERE o.route = $1 AND o.run_id = j.popped_from AND o.run_id <> $3
         ORDER BY o.last_seen DESC LIMIT 1) popped_data_gone ON true
  LEFT JOIN LATERAL (
        SELECT max(a.last_ack) AS last_ack FROM qbridge.redis_run_acks a
         WHERE a.route = $1 AND a.run_id <> $3
           AND a.last_ack >= j.at AND a.last_ack < cur.first_seen) gone ON true
 WHERE cur.started_at > j.at OR prev.last_seen IS NOT NULL OR gone.last_ack IS NOT NULL
    OR popped_data_gone.gone
"#;

/// When Redis had a key's item, for judging it lost: for a number a pop
/// took (a content hash), when the pop took it — the copy a pop takes may
/// be one pushed long before the push its number names (identical copies
/// are numbered apart on the two sides: oracle seed 4820) — else when the
/// push reached Redis. The keys of `$2` (queue `$1`) Redis had before `$3`:
/// `--assume-lost-before`'s selection.
pub const HAD_AT_SQL: &str = r#"
SELECT k.key FROM qbridge.job_keys k
 WHERE k.queue = $1 AND k.key = ANY($2::text[])
   AND COALESCE((SELECT max(w.at) FROM qbridge.numbered_writes w
                  WHERE w.queue = k.queue AND w.key = k.key AND w.side = 'pop'),
                k.pushed_at, k.seen_at) < $3
"#;

/// What Redis lost of some content-hash keys, judged per text: for each of
/// `keys` that no pop has taken yet (a *fresh* number, not a hole), whether
/// it is proven lost, with the evidence line (`None`: not proven). Keys of
/// popped numbers and holes are not returned; they are judged per key by
/// [`loss_evidence`].
///
/// Identical copies are interchangeable and pops number them by count, so
/// after a restart the pops take the lost copies' numbers and the numbers
/// left without a pop are the newest, pushed after it. The evidence is the
/// text's: the copies pushed before the restart that no pop had taken by
/// then — those the restart can have lost. That many of the text's missing
/// copies (the earliest pushed first) are proven lost; the rest are not.
pub async fn text_loss_evidence(
    db: &PgPool,
    route: &Route,
    epoch: &Epoch,
    keys: &[String],
) -> Result<Vec<(String, Option<String>)>> {
    let bound: Option<DateTime<Utc>> = sqlx::query_scalar(BOUND_SQL)
        .bind(&route.name)
        .bind(&epoch.run_id)
        .bind(&epoch.marker)
        .fetch_optional(db)
        .await?
        .flatten();
    let Some(bound) = bound else {
        // The current epoch was never recorded: nothing is proven, but the
        // fresh keys are still the text's to judge.
        let judged = copies_before(db, &route.queue, keys, DateTime::<Utc>::UNIX_EPOCH).await?;
        return Ok(judged.into_iter().map(|(k, _)| (k, None)).collect());
    };
    let line = format!(
        "Redis restarted or lost its data (it was another server until {}) while identical \
         copies pushed before then waited unpopped",
        bound.format("%Y-%m-%dT%H:%M:%SZ")
    );
    Ok(copies_before(db, &route.queue, keys, bound)
        .await?
        .into_iter()
        .map(|(key, covered)| (key, covered.then(|| line.clone())))
        .collect())
}

/// The latest time Redis certainly still was an earlier server: the
/// current one's start at the earliest, the last sight of another one
/// before it, or (just after) the last push another server acknowledged
/// before it. `$1` route, `$2`/`$3` the current epoch.
const BOUND_SQL: &str = r#"
WITH cur AS (
    SELECT started_at, first_seen FROM qbridge.redis_epochs
     WHERE route = $1 AND run_id = $2 AND marker = $3)
SELECT greatest(cur.started_at,
                (SELECT max(o.last_seen) FROM qbridge.redis_epochs o
                  WHERE o.route = $1 AND (o.run_id, o.marker) <> ($2, $3)
                    AND o.last_seen < cur.first_seen),
                -- Just after: the copies judged are those pushed *before*
                -- the bound, and this push is one of them.
                (SELECT max(a.last_ack) + interval '1 microsecond' FROM qbridge.redis_run_acks a
                  WHERE a.route = $1 AND a.run_id <> $2 AND a.last_ack < cur.first_seen))
  FROM cur
"#;

/// Records that the servers named acknowledged pushes of their routes, at
/// the times given (`NULL`: now, by the database's clock at this moment —
/// for a push made just before, inside the transaction that records it).
/// The latest acknowledgement per server is kept (in one of 32 slots picked
/// at random, so concurrent writers do not queue on one row; readers take
/// the latest over them): the evidence that a copy
/// it took was lost when it is no longer the current server
/// ([`LOSS_EVIDENCE_SQL`], [`BOUND_SQL`]). `$1` routes, `$2` run ids, `$3`
/// times.
pub const RECORD_ACKS_SQL: &str = r#"
INSERT INTO qbridge.redis_run_acks AS a (route, run_id, slot, last_ack)
SELECT t.route, t.run_id, floor(random() * 32)::int2, max(COALESCE(t.at, clock_timestamp()))
  FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS t(route, run_id, at)
 WHERE t.run_id <> ''
 GROUP BY t.route, t.run_id
ON CONFLICT (route, run_id, slot) DO UPDATE SET last_ack = greatest(a.last_ack, EXCLUDED.last_ack)
"#;

/// Records, in `tx` (the transaction of the writes they belong to), that
/// `acks` — (route, server run id, when; `None`: now) — were acknowledged.
pub async fn record_acks(
    tx: &mut sqlx::PgConnection,
    acks: &[(&str, &str, Option<DateTime<Utc>>)],
) -> Result<()> {
    if acks.is_empty() {
        return Ok(());
    }
    let latest = latest_per_server(acks);
    sqlx::query(RECORD_ACKS_SQL)
        .bind(latest.iter().map(|a| a.0).collect::<Vec<_>>())
        .bind(latest.iter().map(|a| a.1).collect::<Vec<_>>())
        .bind(latest.iter().map(|a| a.2).collect::<Vec<_>>())
        .execute(tx)
        .await?;
    Ok(())
}

/// One acknowledgement per (route, server): the latest, and `None` (now)
/// over any time. A mirror batch carries one per item, nearly all of one
/// server; grouped before the statement (which groups as well, for any
/// caller), its executor time per batch of ~94 halved
/// (`pg_stat_statements`: 101 → 50 µs).
fn latest_per_server<'a>(
    acks: &[(&'a str, &'a str, Option<DateTime<Utc>>)],
) -> Vec<(&'a str, &'a str, Option<DateTime<Utc>>)> {
    let mut latest: Vec<(&str, &str, Option<DateTime<Utc>>)> = Vec::new();
    for &(route, run, at) in acks {
        match latest.iter_mut().find(|l| l.0 == route && l.1 == run) {
            Some(l) => {
                l.2 = match (l.2, at) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                }
            }
            None => latest.push((route, run, at)),
        }
    }
    latest
}

/// The `run_id` of an `INFO server` reply (what the proxy's probe and the
/// producer's push script read).
pub fn run_id_of(info: &str) -> Option<&str> {
    info_field(info, "run_id").filter(|id| !id.is_empty())
}

/// Of `keys`, the content-hash copies no pop has taken yet (a *fresh*
/// number, not a hole), each with whether a copy of its text pushed before
/// `before` and not popped by then accounts for it: per text, that many of
/// them (the earliest pushed first). Keys of popped numbers, holes and ids
/// are not returned. Used with Redis's restart as `before` (the evidence,
/// [`text_loss_evidence`]) and with an operator's `--assume-lost-before`.
pub async fn copies_before(
    db: &PgPool,
    queue: &str,
    keys: &[String],
    before: DateTime<Utc>,
) -> Result<Vec<(String, bool)>> {
    Ok(sqlx::query_as(COPIES_BEFORE_SQL)
        .bind(queue)
        .bind(keys)
        .bind(before)
        .fetch_all(db)
        .await?)
}

/// `texts`: per text, the copies pushed before `$3` less the pops numbered
/// before it (a pop is numbered after it left Redis) and less the copies
/// repair pushed back since (each stands in for one of those lost).
const COPIES_BEFORE_SQL: &str = r#"
WITH asked AS (
    SELECT t.key, k.pushed,
           substring(t.key from '^sha256:([0-9a-f]+):[0-9]+$') AS hash,
           substring(t.key from '^sha256:[0-9a-f]+:([0-9]+)$')::bigint AS n
      FROM unnest($2::text[]) AS t(key)
      LEFT JOIN LATERAL (SELECT COALESCE(j.pushed_at, j.seen_at) AS pushed FROM qbridge.job_keys j
                          WHERE j.queue = $1 AND j.key = t.key) k ON true),
fresh AS (
    SELECT a.*, row_number() OVER (PARTITION BY a.hash ORDER BY a.pushed, a.n) AS rank
      FROM asked a
     WHERE a.hash IS NOT NULL
       AND a.n > COALESCE((SELECT p.n FROM qbridge.key_occurrences p
                            WHERE p.queue = $1 AND p.side = 'pop' AND p.hash = a.hash), 0)
       AND NOT EXISTS (SELECT 1 FROM qbridge.pop_holes h
                        WHERE h.queue = $1 AND h.hash = a.hash AND h.n = a.n)),
texts AS (
    SELECT h.hash,
           (SELECT count(*) FROM qbridge.job_keys k
             WHERE k.queue = $1 AND k.key LIKE 'sha256:' || h.hash || ':%'
               AND k.key ~ ':[0-9]+$' AND COALESCE(k.pushed_at, k.seen_at) < $3)
         - (SELECT count(DISTINCT w.key) FROM qbridge.numbered_writes w
             WHERE w.queue = $1 AND w.side = 'pop' AND w.key LIKE 'sha256:' || h.hash || ':%'
               AND w.key ~ ':[0-9]+$' AND w.at < $3)
         - (SELECT count(*) FROM qbridge.text_repushes r
             WHERE r.queue = $1 AND r.key LIKE 'sha256:' || h.hash || ':%' AND r.at >= $3)
           AS waiting
      FROM (SELECT DISTINCT hash FROM fresh) h)
SELECT f.key, f.rank <= t.waiting
  FROM fresh f JOIN texts t USING (hash)
"#;

/// A `field:value` line of an INFO reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::{info_field, latest_per_server};
    use chrono::{TimeZone, Utc};

    #[test]
    fn reads_info_fields() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n";
        assert_eq!(info_field(info, "run_id"), Some("abc123"));
        assert_eq!(info_field(info, "uptime_in_seconds"), Some("42"));
        assert_eq!(info_field(info, "run"), None);
    }

    #[test]
    fn keeps_the_latest_ack_per_server_and_now_over_any_time() {
        let t = |s| Some(Utc.timestamp_opt(s, 0).unwrap());
        let acks = [
            ("r", "a", t(10)),
            ("r", "b", t(5)),
            ("r", "a", t(30)),
            ("r", "a", t(20)),
            ("s", "a", t(1)),
            ("r", "b", None),
            ("r", "b", t(50)),
        ];
        assert_eq!(
            latest_per_server(&acks),
            vec![("r", "a", t(30)), ("r", "b", None), ("s", "a", t(1))]
        );
    }
}
