//! Queue and database health numbers, for `qbridge stats`, `/metrics` and gates:
//! per-queue depth and lag, dead letters, vacuum health of the hot table, the
//! xmin horizon and the NOTIFY queue.

use serde::Serialize;
use sqlx::PgPool;

use crate::error::Result;

/// Per-queue counts.
#[derive(Debug, Clone, Default, Serialize, sqlx::FromRow, PartialEq)]
pub struct QueueStats {
    pub queue: String,
    /// Runnable now.
    pub ready: i64,
    pub running: i64,
    /// Waiting for a future run_at (delayed or backing off).
    pub scheduled: i64,
    pub dead: i64,
    /// Seconds the oldest runnable job has waited (0 when none).
    pub lag_seconds: f64,
}

/// Database-level health.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DbHealth {
    pub jobs_dead_tuples: i64,
    pub jobs_live_tuples: i64,
    /// Seconds since the last (auto)vacuum of `qbridge.jobs`; -1 if never.
    pub jobs_seconds_since_vacuum: f64,
    /// Age in seconds of the oldest transaction holding back the xmin horizon.
    pub oldest_xact_seconds: f64,
    /// Age in transaction ids of the oldest backend xmin.
    pub oldest_xmin_age: i64,
    /// `pg_notification_queue_usage()`, 0..1.
    pub notify_queue_usage: f64,
}

const QUEUE_SQL: &str = r#"
WITH live AS (
    SELECT queue,
           count(*) FILTER (WHERE state = 'ready' AND run_at <= now()) AS ready,
           count(*) FILTER (WHERE state = 'running') AS running,
           count(*) FILTER (WHERE state = 'ready' AND run_at > now()) AS scheduled,
           coalesce(extract(epoch FROM now() - min(run_at) FILTER (WHERE state = 'ready' AND run_at <= now())), 0)::float8 AS lag_seconds
      FROM qbridge.jobs GROUP BY queue
), dead AS (
    SELECT queue, count(*) AS dead FROM qbridge.jobs_dead GROUP BY queue
)
SELECT coalesce(l.queue, d.queue) AS queue,
       coalesce(l.ready, 0) AS ready, coalesce(l.running, 0) AS running,
       coalesce(l.scheduled, 0) AS scheduled, coalesce(d.dead, 0) AS dead,
       coalesce(l.lag_seconds, 0) AS lag_seconds
  FROM live l FULL JOIN dead d ON d.queue = l.queue
 ORDER BY 1
"#;

/// Every queue with live or dead jobs.
pub async fn queues(pool: &PgPool) -> Result<Vec<QueueStats>> {
    Ok(sqlx::query_as(QUEUE_SQL).fetch_all(pool).await?)
}

/// Vacuum, xmin and NOTIFY health.
pub async fn db_health(pool: &PgPool) -> Result<DbHealth> {
    let (dead, live, since_vacuum): (i64, i64, f64) = sqlx::query_as(
        "SELECT n_dead_tup, n_live_tup, \
                coalesce(extract(epoch FROM now() - greatest(last_autovacuum, last_vacuum))::float8, -1) \
           FROM pg_stat_user_tables WHERE schemaname = 'qbridge' AND relname = 'jobs'",
    )
    .fetch_optional(pool)
    .await?
    .unwrap_or((0, 0, -1.0));
    let (xact_seconds, xmin_age): (f64, i64) = sqlx::query_as(
        // clock_timestamp, not now(): now() is this transaction's start, and
        // a transaction that began after it made the age negative (seen as a
        // failed test while other tests ran on the same server).
        "SELECT greatest(coalesce(extract(epoch FROM clock_timestamp() - min(xact_start))::float8, 0), 0), \
                coalesce(max(age(backend_xmin)), 0)::int8 \
           FROM pg_stat_activity \
          WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()",
    )
    .fetch_one(pool)
    .await?;
    let usage: f64 = sqlx::query_scalar("SELECT pg_notification_queue_usage()")
        .fetch_one(pool)
        .await?;
    Ok(DbHealth {
        jobs_dead_tuples: dead,
        jobs_live_tuples: live,
        jobs_seconds_since_vacuum: since_vacuum,
        oldest_xact_seconds: xact_seconds,
        oldest_xmin_age: xmin_age,
        notify_queue_usage: usage,
    })
}

/// Where each database health number starts to need attention — the
/// levels docs/src/operations/metrics.md gives for alerts, shown by the console:
/// dead tuples past this share of live ones (and at least 100,000) mean
/// vacuum is not keeping up; a transaction open this long, or an xmin this
/// many ids old, holds vacuum back; a NOTIFY queue this full is near the
/// point where NOTIFY fails.
pub const DEAD_TUPLE_SHARE: f64 = 0.2;
pub const OLDEST_XACT_SECONDS: f64 = 300.0;
pub const OLDEST_XMIN_AGE: i64 = 100_000_000;
pub const NOTIFY_QUEUE_USAGE: f64 = 0.5;

/// `health` as (what, measured value with its threshold, over it?).
pub fn health_checks(h: &DbHealth) -> Vec<(&'static str, String, bool)> {
    let dead_bad = h.jobs_dead_tuples >= 100_000
        && h.jobs_dead_tuples as f64 > DEAD_TUPLE_SHARE * h.jobs_live_tuples.max(1) as f64;
    vec![
        (
            "dead tuples in qbridge.jobs",
            format!(
                "{} dead, {} live (attention past {:.0}% of live and 100,000)",
                h.jobs_dead_tuples,
                h.jobs_live_tuples,
                DEAD_TUPLE_SHARE * 100.0
            ),
            dead_bad,
        ),
        (
            "last vacuum of qbridge.jobs",
            if h.jobs_seconds_since_vacuum < 0.0 {
                "never".to_string()
            } else {
                format!("{:.0} s ago", h.jobs_seconds_since_vacuum)
            },
            false,
        ),
        (
            "oldest open transaction",
            format!(
                "{:.0} s (attention past {OLDEST_XACT_SECONDS:.0} s)",
                h.oldest_xact_seconds
            ),
            h.oldest_xact_seconds > OLDEST_XACT_SECONDS,
        ),
        (
            "oldest xmin age",
            format!(
                "{} ids (attention past {OLDEST_XMIN_AGE})",
                h.oldest_xmin_age
            ),
            h.oldest_xmin_age > OLDEST_XMIN_AGE,
        ),
        (
            "NOTIFY queue use",
            format!(
                "{:.1}% (attention past {:.0}%)",
                h.notify_queue_usage * 100.0,
                NOTIFY_QUEUE_USAGE * 100.0
            ),
            h.notify_queue_usage > NOTIFY_QUEUE_USAGE,
        ),
    ]
}
