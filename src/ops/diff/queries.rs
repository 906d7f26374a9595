//! The diff's SQL: each query reads one number (or count and sample) of
//! the window, joined by job key; `compute` in the parent puts them together.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::{Mismatch, SideCounts};
use crate::error::Result;

type SideRow = (String, i64, i64, i64, i64, i64, Option<f64>, Option<f64>);

/// Per side in one pass: jobs, acks, failed attempts, dead jobs, jobs that
/// succeeded more than once, and push-to-first-outcome percentiles (from
/// the due time for a job scheduled for later; hash
/// aggregation per key, no sort of the window).
const SIDES_SQL: &str = r#"
WITH per_key AS (
    SELECT side, key,
           count(*) FILTER (WHERE outcome = 'ok') AS oks,
           -- A shadow call and a live run of one key (a retry promoted
           -- while its mirror copy was drained) are not a double run.
           greatest(count(*) FILTER (WHERE outcome = 'ok' AND mode = 'live'),
                    count(*) FILTER (WHERE outcome = 'ok' AND mode <> 'live')) AS most_oks,
           count(*) FILTER (WHERE outcome = 'failed') AS fails,
           bool_or(outcome = 'dead') AS dead,
           min(recorded_at) AS first_at
      FROM qbridge.outcomes
     WHERE queue = $1 AND recorded_at >= $2 AND mode <> 'noise'
     GROUP BY side, key)
SELECT p.side, count(*), sum(p.oks)::int8, sum(p.fails)::int8,
       count(*) FILTER (WHERE p.dead), count(*) FILTER (WHERE p.most_oks > 1),
       -- From the push, or from when a job scheduled for later was due.
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM p.first_at - greatest(k.seen_at, k.due_at))),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM p.first_at - greatest(k.seen_at, k.due_at)))
  FROM per_key p LEFT JOIN qbridge.job_keys k ON k.queue = $1 AND k.key = p.key
 GROUP BY p.side
"#;

const RAN_TWICE_SQL: &str = r#"
SELECT DISTINCT key FROM (
    SELECT key FROM qbridge.outcomes
     WHERE queue = $1 AND recorded_at >= $2 AND mode <> 'noise' AND outcome = 'ok'
     GROUP BY side, key, mode = 'live' HAVING count(*) > 1) twice
 ORDER BY key LIMIT $3
"#;

const ONLY_REDIS_RAN_SQL: &str = r#"
SELECT count(*) OVER (), o.key FROM (
    SELECT DISTINCT key FROM qbridge.outcomes
     WHERE queue = $1 AND side = 'redis' AND recorded_at >= $2 AND recorded_at < $3) o
 WHERE NOT EXISTS (SELECT 1 FROM qbridge.job_keys k WHERE k.queue = $1 AND k.key = o.key)
 ORDER BY o.key LIMIT $4
"#;

/// Keys held in Redis that Postgres never got (`--repair` mirrors them).
pub(crate) const UNKNOWN_KEYS_SQL: &str = r#"
SELECT t.key FROM unnest($2::text[]) AS t(key)
 WHERE NOT EXISTS (SELECT 1 FROM qbridge.job_keys k WHERE k.queue = $1 AND k.key = t.key)
"#;

/// Mirror copies whose Redis copy is unaccounted for: no final Redis
/// outcome (ok or dead; a failed attempt is retried from a processing list,
/// which a Redis restart can lose too), not held in Redis now and not owed
/// to Redis by the outbox.
/// `original IS NOT NULL` narrows the scan (a final Redis outcome clears
/// it), but the outcome check itself is what counts:
/// the Redis consumer can finish a job before its mirror row commits, and
/// then nothing cleared that row's bytes.
///
/// Ids are matched by key. Content hashes are counted (a key names a
/// count, not a copy), in three classes per text:
/// - *popped* (a number a pop took, not a hole): unaccounted unless Redis
///   holds it under that key (a processing list, the ran set); an outbox row
///   naming it is the outbox's copy, which pops under a later number;
/// - *hole* (a number a push-back waits to be popped under): the same;
/// - *fresh* (no pop took it yet): as many as Redis has copies waiting (the
///   diff's view names them by the next pop numbers) plus the copies the
///   outbox owes are accounted for, the newest first; the older rest are
///   unaccounted. Copies pushed after a restart are the ones Redis has, so
///   the copies called missing are those pushed before it.
///
/// The settle time (`$3`) waits for a job's outcome to be recorded, so it
/// applies to ids and popped numbers, counted from when the job came due
/// (`due_at`: a countdown or scheduled job runs then, not at its push). A *fresh* key names a count, not a
/// copy — the oldest numbers no pop took — and under load those are always
/// the newest: filtered by their own push time, a copy Redis lost was never
/// judged while producers and the consumer went on (oracle seeds 3208,
/// 3568). Fresh keys are judged against what Postgres held just before
/// Redis was read instead (`RedisView::before`): only numbers up to the
/// text's push count then (`$6` texts, `$7` counts) — a copy numbered by
/// then was in Redis, popped (the pop count is read after Redis), owed by
/// the outbox (`$5`, its keys then) or lost — so a push written to both
/// while Redis was read never looks missing. An outbox row whose paid
/// marker Redis had then (`$8`, tokens) owes nothing: its copy is counted
/// in Redis or among the pops.
///
/// `$4`: the keys Redis accounts for (`RedisView::accounted_keys`).
///
/// Rows: the key, and whether a pop had taken its number when this reading
/// was made (*popped* or *hole*): repair pushes such a copy back under its
/// own number, and any other under the next one. That must be this
/// reading's answer, not a later one: pops go on while repair pushes back.
pub(crate) const ONLY_POSTGRES_SQL: &str = r#"
WITH silent AS (
    SELECT k.key, greatest(k.seen_at, COALESCE(k.due_at, k.seen_at)) AS due,
           COALESCE(k.pushed_at, k.seen_at) AS pushed,
           substring(k.key from '^sha256:([0-9a-f]+):[0-9]+$') AS hash,
           substring(k.key from '^sha256:[0-9a-f]+:([0-9]+)$')::bigint AS n
      FROM qbridge.job_keys k
     WHERE k.queue = $1 AND k.copy = 'mirror' AND k.original IS NOT NULL AND k.seen_at >= $2
       AND NOT EXISTS (SELECT 1 FROM qbridge.outcomes o
                        WHERE o.queue = k.queue AND o.key = k.key AND o.side = 'redis'
                          AND o.outcome IN ('ok', 'dead'))
       -- Due later: a framework's schedule or retry set holds it until then
       -- (mirrored from a ZADD, or imported), not a list qbridge reads.
       AND NOT EXISTS (SELECT 1 FROM qbridge.jobs j
                        WHERE j.queue = k.queue AND j.key = k.key AND j.copy = 'mirror'
                          AND j.run_at > now())),
classed AS (
    SELECT s.*, COALESCE(p.n, 0) AS pops,
           CASE WHEN s.hash IS NULL THEN 'id'
                WHEN EXISTS (SELECT 1 FROM qbridge.pop_holes h
                              WHERE h.queue = $1 AND h.hash = s.hash AND h.n = s.n) THEN 'hole'
                WHEN s.n <= COALESCE(p.n, 0) THEN 'popped'
                ELSE 'fresh' END AS class
      FROM silent s
      LEFT JOIN qbridge.key_occurrences p ON p.queue = $1 AND p.side = 'pop' AND p.hash = s.hash
      LEFT JOIN unnest($6::text[], $7::int8[]) AS b(hash, pushed) ON b.hash = s.hash
     -- A copy numbered after Redis was read may still be on its way there.
     WHERE s.hash IS NULL OR s.n <= COALESCE(p.n, 0) OR s.n <= COALESCE(b.pushed, 0)),
ranked AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.hash, c.class
                                   ORDER BY c.pushed DESC, c.n DESC) AS newest
      FROM classed c),
-- Per text with fresh copies: the copies Redis holds above its pop count,
-- and those the outbox owes. Counted once per text and joined, not once
-- per fresh copy: a backlog of N identical items made that N x N.
fresh_texts AS (
    SELECT DISTINCT hash, pops FROM classed WHERE class = 'fresh'),
listed AS (
    SELECT f.hash, count(*) AS copies
      FROM fresh_texts f
      JOIN (SELECT substring(a.key from '^sha256:([0-9a-f]+):') AS hash,
                   substring(a.key from '^sha256:[0-9a-f]+:([0-9]+)$')::bigint AS n
              FROM unnest($4::text[]) AS a(key)
             WHERE a.key LIKE 'sha256:%') a ON a.hash = f.hash AND a.n > f.pops
     GROUP BY f.hash),
-- The keys Redis accounts for, as a set to join (a lookup in the array
-- for each copy made a long backlog quadratic too).
accounted AS (
    SELECT DISTINCT a.key FROM unnest($4::text[]) AS a(key)),
owing AS (
    SELECT substring(owed.key from '^sha256:([0-9a-f]+):') AS hash, count(*) AS copies
      FROM (SELECT b.key FROM qbridge.redis_outbox b
             WHERE b.queue = $1 AND NOT (b.token = ANY($8::uuid[]))
            UNION
            SELECT o.key FROM unnest($5::text[]) AS o(key)) owed
     WHERE owed.key LIKE 'sha256:%'
     GROUP BY 1)
SELECT r.key, r.class IN ('popped', 'hole') AS popped FROM ranked r
  LEFT JOIN listed l ON l.hash = r.hash
  LEFT JOIN owing w ON w.hash = r.hash
  LEFT JOIN accounted acc ON acc.key = r.key
 WHERE (r.due < $3 OR r.class = 'fresh')
   AND CASE r.class
         WHEN 'id' THEN acc.key IS NULL
                        AND NOT (r.key = ANY($5::text[]))
                        AND NOT EXISTS (SELECT 1 FROM qbridge.redis_outbox b
                                         WHERE b.queue = $1 AND b.key = r.key
                                           AND NOT (b.token = ANY($8::uuid[])))
         WHEN 'fresh' THEN r.newest > COALESCE(l.copies, 0) + COALESCE(w.copies, 0)
         ELSE acc.key IS NULL
       END
 ORDER BY r.due, r.key
"#;

/// Compared jobs and mismatches counted in SQL; only a sample of the
/// mismatched rows (plus one row carrying the counts) comes back.
const MISMATCH_SQL: &str = r#"
WITH last AS (
    SELECT DISTINCT ON (key, side) key, side, outcome, digest
      FROM qbridge.outcomes
     WHERE queue = $1 AND recorded_at >= $2 AND mode <> 'noise' AND outcome <> 'failed'
     ORDER BY key, side, recorded_at DESC, id DESC),
pairs AS (
    SELECT r.key, r.outcome AS redis, p.outcome AS postgres,
           (r.digest IS NOT NULL AND p.digest IS NOT NULL AND r.digest <> p.digest) AS digest_differs
      FROM last r JOIN last p ON p.key = r.key AND p.side = 'postgres'
     WHERE r.side = 'redis'),
ranked AS (
    SELECT *, (redis <> postgres OR digest_differs) AS bad,
           count(*) OVER () AS compared,
           count(*) FILTER (WHERE redis <> postgres OR digest_differs) OVER () AS mismatched,
           row_number() OVER (PARTITION BY (redis <> postgres OR digest_differs) ORDER BY key) AS n
      FROM pairs)
SELECT key, redis, postgres, digest_differs, bad, compared, mismatched
  FROM ranked WHERE n <= $3 AND (bad OR n = 1)
"#;

/// Keys with a live run on each side: the Redis side's run and a live
/// Postgres copy's (shadow and noise calls are comparisons, not runs). The
/// Redis side's run is its reported outcome, or the key in qbridge's
/// consumer's ran set ($4), so a double run stays visible when the Redis
/// side's report was lost.
pub(crate) const BOTH_SIDES_SQL: &str = r#"
SELECT count(*) OVER (), key FROM (
    SELECT key FROM qbridge.outcomes
     WHERE queue = $1 AND recorded_at >= $2 AND mode = 'live'
     GROUP BY key
    HAVING count(DISTINCT side) = 2
        OR (bool_or(side = 'postgres') AND key = ANY($4::text[]))) both_sides
 ORDER BY key LIMIT $3
"#;

/// Count and sample of a key query: `SELECT count(*) OVER (), key … LIMIT`.
fn count_and_sample(rows: Vec<(i64, String)>) -> (i64, Vec<String>) {
    let total = rows.first().map_or(0, |r| r.0);
    (total, rows.into_iter().map(|r| r.1).collect())
}

const NOISE_SQL: &str = r#"
SELECT count(*),
       count(*) FILTER (WHERE s.outcome <> n.outcome OR s.digest IS DISTINCT FROM n.digest)
  FROM qbridge.outcomes n
  JOIN LATERAL (
        SELECT outcome, digest FROM qbridge.outcomes s
         WHERE s.queue = n.queue AND s.key = n.key AND s.side = 'postgres'
           AND s.mode = 'shadow' AND s.attempt IS NOT DISTINCT FROM n.attempt
         ORDER BY s.id DESC LIMIT 1) s ON true
 WHERE n.queue = $1 AND n.mode = 'noise' AND n.recorded_at >= $2
"#;

/// The window a diff reads, shared by every query.
pub(super) struct Window<'a> {
    pub queue: &'a str,
    pub since: DateTime<Utc>,
    /// Outcomes before this are settled: a job without one is one-sided.
    pub settled: DateTime<Utc>,
    /// Every key Redis holds now.
    pub held_keys: Vec<String>,
    /// Those plus the keys qbridge's consumer finished (its ran set).
    pub accounted_keys: Vec<String>,
    /// What Postgres held just before Redis was read.
    pub before: crate::ops::redis_view::ReadBefore,
    /// Sample keys kept per list.
    pub samples: usize,
}

impl Window<'_> {
    fn limit(&self) -> i64 {
        self.samples as i64
    }
}

/// Keys the route enqueued in Postgres in the window, and how many of them
/// are mirror copies.
pub(super) async fn enqueued(db: &PgPool, w: &Window<'_>) -> Result<(i64, i64)> {
    Ok(sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE copy = 'mirror') \
           FROM qbridge.job_keys WHERE queue = $1 AND seen_at >= $2",
    )
    .bind(w.queue)
    .bind(w.since)
    .fetch_one(db)
    .await?)
}

/// The counts of each side: (redis, postgres).
pub(super) async fn side_counts(db: &PgPool, w: &Window<'_>) -> Result<(SideCounts, SideCounts)> {
    let mut redis = SideCounts::default();
    let mut postgres = SideCounts::default();
    let rows: Vec<SideRow> = sqlx::query_as(SIDES_SQL)
        .bind(w.queue)
        .bind(w.since)
        .fetch_all(db)
        .await?;
    for (side, jobs, acks, failures, dead, twice, lag_p50, lag_p99) in rows {
        let counts = SideCounts {
            jobs,
            acks,
            failures,
            dead,
            ran_twice: twice,
            lag_p50,
            lag_p99,
        };
        match side.as_str() {
            "redis" => redis = counts,
            _ => postgres = counts,
        }
    }
    Ok((redis, postgres))
}

/// Sample keys of jobs that succeeded more than once.
pub(super) async fn ran_twice_sample(db: &PgPool, w: &Window<'_>) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(RAN_TWICE_SQL)
        .bind(w.queue)
        .bind(w.since)
        .bind(w.limit())
        .fetch_all(db)
        .await?)
}

/// Jobs seen on one side only, each count with a sample of keys.
pub(super) struct OneSided {
    pub only_redis_ran: i64,
    pub ran_sample: Vec<String>,
    pub only_redis_waiting: i64,
    pub waiting_sample: Vec<String>,
    pub only_postgres: i64,
    pub postgres_sample: Vec<String>,
}

pub(super) async fn one_sided(db: &PgPool, w: &Window<'_>) -> Result<OneSided> {
    let (only_redis_ran, ran_sample) = count_and_sample(
        sqlx::query_as(ONLY_REDIS_RAN_SQL)
            .bind(w.queue)
            .bind(w.since)
            .bind(w.settled)
            .bind(w.limit())
            .fetch_all(db)
            .await?,
    );
    let (only_redis_waiting, waiting_sample) = count_and_sample(
        sqlx::query_as(&format!(
            "SELECT count(*) OVER (), key FROM ({UNKNOWN_KEYS_SQL}) unknown LIMIT $3"
        ))
        .bind(w.queue)
        .bind(&w.held_keys)
        .bind(w.limit())
        .fetch_all(db)
        .await?,
    );
    let (only_postgres, postgres_sample) = count_and_sample(
        sqlx::query_as(&format!(
            "SELECT count(*) OVER (), key FROM ({ONLY_POSTGRES_SQL}) one_sided LIMIT $9"
        ))
        .bind(w.queue)
        .bind(w.since)
        .bind(w.settled)
        .bind(&w.accounted_keys)
        .bind(w.before.owed())
        .bind(&w.before.texts)
        .bind(&w.before.pushed)
        .bind(w.before.paid_tokens())
        .bind(w.limit())
        .fetch_all(db)
        .await?,
    );
    Ok(OneSided {
        only_redis_ran,
        ran_sample,
        only_redis_waiting,
        waiting_sample,
        only_postgres,
        postgres_sample,
    })
}

/// When each of `keys` came due: its first sighting, or its due time when
/// that is later (a countdown or a scheduled job), in the order of `keys`.
pub(super) async fn due_times(
    db: &PgPool,
    queue: &str,
    keys: &[String],
) -> Result<Vec<(String, DateTime<Utc>)>> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_as(
        "SELECT t.key, greatest(k.seen_at, COALESCE(k.due_at, k.seen_at)) \
           FROM unnest($2::text[]) WITH ORDINALITY AS t(key, n) \
           JOIN qbridge.job_keys k ON k.queue = $1 AND k.key = t.key \
          ORDER BY t.n",
    )
    .bind(queue)
    .bind(keys)
    .fetch_all(db)
    .await?)
}

/// Every mirror copy only on Postgres (to classify: repairable or not).
pub(super) async fn only_postgres_keys(db: &PgPool, w: &Window<'_>) -> Result<Vec<String>> {
    Ok(
        sqlx::query_scalar(&format!("SELECT key FROM ({ONLY_POSTGRES_SQL}) one_sided"))
            .bind(w.queue)
            .bind(w.since)
            .bind(w.settled)
            .bind(&w.accounted_keys)
            .bind(w.before.owed())
            .bind(&w.before.texts)
            .bind(&w.before.pushed)
            .bind(w.before.paid_tokens())
            .fetch_all(db)
            .await?,
    )
}

/// Keys compared across the sides, how many disagree, and a sample of them.
pub(super) async fn mismatches(db: &PgPool, w: &Window<'_>) -> Result<(i64, i64, Vec<Mismatch>)> {
    type PairRow = (String, String, String, bool, bool, i64, i64);
    let pair_rows: Vec<PairRow> = sqlx::query_as(MISMATCH_SQL)
        .bind(w.queue)
        .bind(w.since)
        .bind(w.limit().max(1))
        .fetch_all(db)
        .await?;
    let (compared, mismatched) = pair_rows.first().map_or((0, 0), |r| (r.5, r.6));
    let sample = pair_rows
        .into_iter()
        .filter(|r| r.4)
        .take(w.samples)
        .map(|(key, redis, postgres, digest_differs, ..)| Mismatch {
            key,
            redis,
            postgres,
            digest_differs,
        })
        .collect();
    Ok((compared, mismatched, sample))
}

/// Noise calls in the window and how many disagreed with the live run.
pub(super) async fn noise(db: &PgPool, w: &Window<'_>) -> Result<(i64, i64)> {
    Ok(sqlx::query_as(NOISE_SQL)
        .bind(w.queue)
        .bind(w.since)
        .fetch_one(db)
        .await?)
}

/// How many of the keys Redis holds have a Redis-side outcome already.
pub(super) async fn reported_held(db: &PgPool, w: &Window<'_>) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(DISTINCT key) FROM qbridge.outcomes \
          WHERE queue = $1 AND side = 'redis' AND recorded_at >= $2 AND key = ANY($3::text[])",
    )
    .bind(w.queue)
    .bind(w.since)
    .bind(&w.held_keys)
    .fetch_one(db)
    .await?)
}

/// Jobs that ran live on both sides, with a sample of their keys.
/// `ran`: the keys in qbridge's consumer's ran set (empty for a fleet).
/// Re-pushes the Redis side skipped in the window (fleets' adapters and
/// qbridge's consumer record them in `skipped_runs`).
pub(crate) async fn skipped_repushes(
    db: &PgPool,
    queue: &str,
    since: DateTime<Utc>,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.skipped_runs WHERE queue = $1 AND recorded_at >= $2",
    )
    .bind(queue)
    .bind(since)
    .fetch_one(db)
    .await?)
}

pub(crate) async fn ran_both_sides(
    db: &PgPool,
    queue: &str,
    since: DateTime<Utc>,
    ran: &[String],
    samples: usize,
) -> Result<(i64, Vec<String>)> {
    Ok(count_and_sample(
        sqlx::query_as(BOTH_SIDES_SQL)
            .bind(queue)
            .bind(since)
            // LIMIT 0 would lose the count with the rows.
            .bind(samples.max(1) as i64)
            .bind(ran)
            .fetch_all(db)
            .await?,
    ))
}

/// Keys the Redis side finished by its ran set (`$4`) — mirrored in the
/// window, with no final Redis outcome reported: they ran, and what came of
/// them is unknown (a report lost, qbridge down while a fleet ran them).
const RAN_UNREPORTED_SQL: &str = r#"
SELECT count(*) OVER (), k.key FROM qbridge.job_keys k
 WHERE k.queue = $1 AND k.copy = 'mirror' AND k.seen_at >= $2 AND k.key = ANY($4::text[])
   AND NOT EXISTS (SELECT 1 FROM qbridge.outcomes o
                    WHERE o.queue = k.queue AND o.key = k.key AND o.side = 'redis'
                      AND o.outcome IN ('ok', 'dead'))
 ORDER BY k.key LIMIT $3
"#;

/// Jobs the Redis side ran whose outcome is unknown, with a sample.
/// `ran`: the keys in the route's ran set.
pub(crate) async fn ran_unreported(
    db: &PgPool,
    queue: &str,
    since: DateTime<Utc>,
    ran: &[String],
    samples: usize,
) -> Result<(i64, Vec<String>)> {
    if ran.is_empty() {
        return Ok((0, Vec::new()));
    }
    Ok(count_and_sample(
        sqlx::query_as(RAN_UNREPORTED_SQL)
            .bind(queue)
            .bind(since)
            // LIMIT 0 would lose the count with the rows.
            .bind(samples.max(1) as i64)
            .bind(ran)
            .fetch_all(db)
            .await?,
    ))
}
