//! The diff of one route over a window: what each side enqueued and ran,
//! the jobs seen on one side only, the outcome mismatches, the lag of each
//! side and a noise baseline — the numbers the gates read and operators see.
//!
//! Sources (all joined by job key):
//! - Postgres side: `qbridge.job_keys` (every key the route enqueued in
//!   Postgres, mirror or live copy) and the Postgres consumer's outcomes;
//! - Redis side: the outcomes the Redis consumer (or an outside fleet) reports
//!   and the items still held in Redis ([`super::redis_view`]).
//!
//! A mirror copy whose Redis copy was never reported nor is still in Redis
//! was lost on the Redis side (a restart without persistence): its bytes are
//! still in `job_keys.original` and `--repair` pushes them back. A Redis-side
//! job with no Postgres key was never mirrored: `--repair` mirrors those
//! still waiting in Redis; those already run on Redis ran live once, which is
//! what matters, and are only counted.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::error::Result;
use crate::ops::redis_view::RedisView;
use crate::routes::Route;

/// Jobs and attempts one side shows in the window.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SideCounts {
    /// Distinct job keys.
    pub jobs: i64,
    /// Attempts that succeeded.
    pub acks: i64,
    /// Attempts that failed (another one followed).
    pub failures: i64,
    /// Jobs that failed for good.
    pub dead: i64,
    /// Jobs that succeeded more than once (a duplicate push, a lease expiry).
    pub ran_twice: i64,
    /// Push to first outcome, seconds: p50 and p99.
    pub lag_p50: Option<f64>,
    pub lag_p99: Option<f64>,
}

/// One job whose two sides disagree.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Mismatch {
    pub key: String,
    pub redis: String,
    pub postgres: String,
    /// Both answered with a body and the bodies' digests differ.
    pub digest_differs: bool,
}

/// The diff of one route.
#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    pub route: String,
    pub queue: String,
    pub phase: String,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// Keys enqueued in Postgres in the window (mirror and live copies).
    pub postgres_enqueued: i64,
    pub postgres_mirrors: i64,
    /// Keys seen on Redis in the window: reported outcomes plus items held now.
    pub redis_seen: i64,
    /// Items in Redis now: waiting, in processing lists, parked for the mirror repair.
    pub redis_waiting: usize,
    pub redis_processing: usize,
    pub redis_parked: usize,
    /// The Redis lists were longer than the diff reads: counts are lower bounds.
    pub redis_truncated: bool,
    pub redis: SideCounts,
    pub postgres: SideCounts,
    /// Ran on Redis, never mirrored (nothing left to repair).
    pub only_redis_ran: i64,
    /// Waiting in Redis, never mirrored (`--repair` mirrors them).
    pub only_redis_waiting: i64,
    /// Mirrored, but Redis neither reported nor holds them (`--repair` re-pushes).
    pub only_postgres: i64,
    /// Whether the Redis side reported any outcome in the window; without
    /// reports `only_postgres` cannot be told from "not run yet".
    pub redis_reports: bool,
    /// Sampled keys per category.
    pub sample_only_redis: Vec<String>,
    pub sample_only_postgres: Vec<String>,
    pub sample_ran_twice: Vec<String>,
    /// Jobs with a final outcome on both sides, and how many disagree.
    pub compared: i64,
    pub mismatched: i64,
    pub mismatches: Vec<Mismatch>,
    /// Second shadow calls compared with the first, and how many disagreed.
    pub noise_samples: i64,
    pub noise_disagreed: i64,
    /// Redis-side jobs with a Postgres copy / Redis-side jobs (1 when none).
    pub mirror_completeness: f64,
    pub mismatch_rate: f64,
    pub noise_rate: f64,
    /// One line for people and logs.
    pub verdict: String,
}

impl Diff {
    /// Jobs on one side only.
    pub fn one_sided(&self) -> i64 {
        self.only_redis_ran + self.only_redis_waiting + self.only_postgres
    }

    /// Nothing one-sided, nothing mismatched, nothing ran twice.
    pub fn matches(&self) -> bool {
        self.one_sided() == 0
            && self.mismatched == 0
            && self.redis.ran_twice == 0
            && self.postgres.ran_twice == 0
    }
}

fn ratio(part: i64, whole: i64) -> f64 {
    if whole <= 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

type SideRow = (String, i64, i64, i64, i64, i64, Option<f64>, Option<f64>);

/// Per side in one pass: jobs, acks, failed attempts, dead jobs, jobs that
/// succeeded more than once, and push-to-first-outcome percentiles (hash
/// aggregation per key, no sort of the window).
const SIDES_SQL: &str = r#"
WITH per_key AS (
    SELECT side, key,
           count(*) FILTER (WHERE outcome = 'ok') AS oks,
           count(*) FILTER (WHERE outcome = 'failed') AS fails,
           bool_or(outcome = 'dead') AS dead,
           min(recorded_at) AS first_at
      FROM qbridge.outcomes
     WHERE queue = $1 AND recorded_at >= $2 AND mode <> 'noise'
     GROUP BY side, key)
SELECT p.side, count(*), sum(p.oks)::int8, sum(p.fails)::int8,
       count(*) FILTER (WHERE p.dead), count(*) FILTER (WHERE p.oks > 1),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM p.first_at - k.seen_at)),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM p.first_at - k.seen_at))
  FROM per_key p LEFT JOIN qbridge.job_keys k ON k.queue = $1 AND k.key = p.key
 GROUP BY p.side
"#;

const RAN_TWICE_SQL: &str = r#"
SELECT key FROM qbridge.outcomes
 WHERE queue = $1 AND recorded_at >= $2 AND mode <> 'noise' AND outcome = 'ok'
 GROUP BY side, key HAVING count(*) > 1
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
/// which a Redis restart can lose too) and not held in Redis now.
/// `original IS NOT NULL` narrows the scan (a final Redis outcome clears
/// it), but the outcome check itself is what counts:
/// the Redis consumer can finish a job before its mirror row commits, and
/// then nothing cleared that row's bytes.
pub(crate) const ONLY_POSTGRES_SQL: &str = r#"
SELECT k.key FROM qbridge.job_keys k
 WHERE k.queue = $1 AND k.copy = 'mirror' AND k.original IS NOT NULL
   AND k.seen_at >= $2 AND k.seen_at < $3 AND NOT (k.key = ANY($4::text[]))
   AND NOT EXISTS (SELECT 1 FROM qbridge.outcomes o
                    WHERE o.queue = k.queue AND o.key = k.key AND o.side = 'redis'
                      AND o.outcome IN ('ok', 'dead'))
 ORDER BY k.seen_at, k.key
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

/// What [`compute`] needs besides the database.
pub struct DiffInput<'a> {
    pub route: &'a Route,
    pub phase: &'a str,
    pub since: DateTime<Utc>,
    /// What Redis holds now (read before the Postgres queries, so a mirror
    /// written in between is seen).
    pub held: &'a RedisView,
}

/// Computes the diff of one route.
pub async fn compute(db: &PgPool, input: DiffInput<'_>) -> Result<Diff> {
    let route = input.route;
    let queue = route.queue.as_str();
    let since = input.since;
    let until = Utc::now();
    let settled =
        until - chrono::Duration::from_std(route.config.cutover.diff.settle).unwrap_or_default();
    let samples = route.config.cutover.diff.sample_keys;
    let held_keys = input.held.keys();

    let (enqueued, mirrors): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE copy = 'mirror') \
           FROM qbridge.job_keys WHERE queue = $1 AND seen_at >= $2",
    )
    .bind(queue)
    .bind(since)
    .fetch_one(db)
    .await?;

    let mut redis = SideCounts::default();
    let mut postgres = SideCounts::default();
    let rows: Vec<SideRow> = sqlx::query_as(SIDES_SQL)
        .bind(queue)
        .bind(since)
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
    let sample_ran_twice: Vec<String> = if redis.ran_twice + postgres.ran_twice > 0 {
        sqlx::query_scalar(RAN_TWICE_SQL)
            .bind(queue)
            .bind(since)
            .bind(samples as i64)
            .fetch_all(db)
            .await?
    } else {
        Vec::new()
    };

    let limit = samples as i64;
    let (only_redis_ran, ran_sample) = count_and_sample(
        sqlx::query_as(ONLY_REDIS_RAN_SQL)
            .bind(queue)
            .bind(since)
            .bind(settled)
            .bind(limit)
            .fetch_all(db)
            .await?,
    );
    let (only_redis_waiting, waiting_sample) = count_and_sample(
        sqlx::query_as(&format!(
            "SELECT count(*) OVER (), key FROM ({UNKNOWN_KEYS_SQL}) unknown LIMIT $3"
        ))
        .bind(queue)
        .bind(&held_keys)
        .bind(limit)
        .fetch_all(db)
        .await?,
    );
    let (only_postgres, postgres_sample) = count_and_sample(
        sqlx::query_as(&format!(
            "SELECT count(*) OVER (), key FROM ({ONLY_POSTGRES_SQL}) one_sided LIMIT $5"
        ))
        .bind(queue)
        .bind(since)
        .bind(settled)
        .bind(&held_keys)
        .bind(limit)
        .fetch_all(db)
        .await?,
    );

    type PairRow = (String, String, String, bool, bool, i64, i64);
    let pair_rows: Vec<PairRow> = sqlx::query_as(MISMATCH_SQL)
        .bind(queue)
        .bind(since)
        .bind(limit.max(1))
        .fetch_all(db)
        .await?;
    let (compared, mismatched) = pair_rows.first().map_or((0, 0), |r| (r.5, r.6));
    let mismatches: Vec<Mismatch> = pair_rows
        .into_iter()
        .filter(|r| r.4)
        .take(samples)
        .map(|(key, redis, postgres, digest_differs, ..)| Mismatch {
            key,
            redis,
            postgres,
            digest_differs,
        })
        .collect();
    let (noise_samples, noise_disagreed): (i64, i64) = sqlx::query_as(NOISE_SQL)
        .bind(queue)
        .bind(since)
        .fetch_one(db)
        .await?;

    // Redis-side jobs: reported ones plus those held now (a key can be both:
    // a failed attempt waits for its retry).
    let reported_held: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT key) FROM qbridge.outcomes \
          WHERE queue = $1 AND side = 'redis' AND recorded_at >= $2 AND key = ANY($3::text[])",
    )
    .bind(queue)
    .bind(since)
    .bind(&held_keys)
    .fetch_one(db)
    .await?;
    let held_unreported = held_keys.len() as i64 - reported_held;
    let redis_seen = redis.jobs + held_unreported;
    let only_redis = only_redis_ran + only_redis_waiting;
    let mirror_completeness = if redis_seen > 0 {
        1.0 - ratio(only_redis, redis_seen)
    } else {
        1.0
    };
    let mut diff = Diff {
        route: route.name.clone(),
        queue: route.queue.clone(),
        phase: input.phase.to_string(),
        since,
        until,
        postgres_enqueued: enqueued,
        postgres_mirrors: mirrors,
        redis_seen,
        redis_waiting: input.held.waiting.len(),
        redis_processing: input.held.processing.len(),
        redis_parked: input.held.parked,
        redis_truncated: input.held.truncated,
        redis_reports: redis.jobs > 0,
        redis,
        postgres,
        only_redis_ran,
        only_redis_waiting,
        only_postgres,
        sample_only_redis: waiting_sample
            .into_iter()
            .chain(ran_sample)
            .take(samples)
            .collect(),
        sample_only_postgres: postgres_sample,
        sample_ran_twice,
        compared,
        mismatched,
        mismatches,
        noise_samples,
        noise_disagreed,
        mirror_completeness,
        mismatch_rate: ratio(mismatched, compared),
        noise_rate: ratio(noise_disagreed, noise_samples),
        verdict: String::new(),
    };
    diff.verdict = verdict(&diff);
    Ok(diff)
}

fn percent(r: f64) -> String {
    format!("{:.2}%", r * 100.0)
}

/// The one-line summary.
fn verdict(d: &Diff) -> String {
    let head = if d.matches() { "MATCH" } else { "DIFFERS" };
    let mut line = format!(
        "{}: {head} ({}) — redis {} jobs, postgres {} enqueued; only on redis {} ({} waiting, repairable); only on postgres {}{}; mismatches {}/{} ({}, noise {}); ran twice: redis {}, postgres {}",
        d.route,
        d.phase,
        d.redis_seen,
        d.postgres_enqueued,
        d.only_redis_ran + d.only_redis_waiting,
        d.only_redis_waiting,
        d.only_postgres,
        if d.only_postgres > 0 { " (repairable)" } else { "" },
        d.mismatched,
        d.compared,
        percent(d.mismatch_rate),
        percent(d.noise_rate),
        d.redis.ran_twice,
        d.postgres.ran_twice,
    );
    if !d.redis_reports && d.postgres_mirrors > 0 {
        line.push_str(
            "; the Redis side reported no outcomes, so 'only on postgres' may count jobs Redis ran",
        );
    }
    if d.redis_truncated {
        line.push_str("; Redis lists longer than the diff reads: counts are lower bounds");
    }
    line
}

/// The diff as a table for people.
pub fn table(d: &Diff) -> String {
    let secs = |v: Option<f64>| v.map_or("-".to_string(), |s| format!("{:.3}s", s));
    let mut out = String::new();
    out.push_str(&format!(
        "route {} (queue {}, phase {}), {} → {}\n\n",
        d.route,
        d.queue,
        d.phase,
        d.since.format("%Y-%m-%d %H:%M:%S"),
        d.until.format("%H:%M:%S")
    ));
    out.push_str(&format!("{:<28} {:>12} {:>12}\n", "", "redis", "postgres"));
    let rows = [
        (
            "jobs",
            d.redis_seen.to_string(),
            d.postgres_enqueued.to_string(),
        ),
        (
            "acks",
            d.redis.acks.to_string(),
            d.postgres.acks.to_string(),
        ),
        (
            "failed attempts",
            d.redis.failures.to_string(),
            d.postgres.failures.to_string(),
        ),
        (
            "dead",
            d.redis.dead.to_string(),
            d.postgres.dead.to_string(),
        ),
        (
            "ran more than once",
            d.redis.ran_twice.to_string(),
            d.postgres.ran_twice.to_string(),
        ),
        (
            "only on this side",
            (d.only_redis_ran + d.only_redis_waiting).to_string(),
            d.only_postgres.to_string(),
        ),
        (
            "push→outcome p50",
            secs(d.redis.lag_p50),
            secs(d.postgres.lag_p50),
        ),
        (
            "push→outcome p99",
            secs(d.redis.lag_p99),
            secs(d.postgres.lag_p99),
        ),
    ];
    for (name, r, p) in rows {
        out.push_str(&format!("{name:<28} {r:>12} {p:>12}\n"));
    }
    out.push_str(&format!(
        "\nin Redis now: {} waiting, {} in processing, {} parked for the mirror repair\n",
        d.redis_waiting, d.redis_processing, d.redis_parked
    ));
    out.push_str(&format!(
        "mirror completeness {:.4}%; outcome mismatches {} of {} compared ({}); noise {} of {} ({})\n",
        d.mirror_completeness * 100.0,
        d.mismatched,
        d.compared,
        percent(d.mismatch_rate),
        d.noise_disagreed,
        d.noise_samples,
        percent(d.noise_rate)
    ));
    let list = |name: &str, keys: &[String], out: &mut String| {
        if !keys.is_empty() {
            out.push_str(&format!("{name}: {}\n", keys.join(", ")));
        }
    };
    list("only on redis (sample)", &d.sample_only_redis, &mut out);
    list(
        "only on postgres (sample)",
        &d.sample_only_postgres,
        &mut out,
    );
    list("ran more than once (sample)", &d.sample_ran_twice, &mut out);
    for m in &d.mismatches {
        out.push_str(&format!(
            "mismatch {}: redis {} / postgres {}{}\n",
            m.key,
            m.redis,
            m.postgres,
            if m.digest_differs {
                ", responses differ"
            } else {
                ""
            }
        ));
    }
    out.push('\n');
    out.push_str(&d.verdict);
    out.push('\n');
    out
}
