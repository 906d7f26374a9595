//! The diff's SQL: each query reads one number (or count and sample) of
//! the window, joined by job key; `compute` in the parent puts them together.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::only_postgres::ONLY_POSTGRES_SQL;
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
