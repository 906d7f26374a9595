//! Completed-job history retention. `jobs_done` is range-partitioned by day;
//! this pass creates the partitions for today and the next two days and drops
//! whole partitions older than the retention window — never a mass DELETE, so
//! retention costs no vacuum.

use chrono::{Duration as ChronoDuration, NaiveDate, Utc};
use sqlx::PgPool;

use crate::error::Result;
use crate::queue::leader;

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HistoryReport {
    pub led: bool,
    pub created: Vec<String>,
    pub dropped: Vec<String>,
    /// Rows that landed in the default partition (a clock far off).
    pub in_default: i64,
}

fn partition_name(day: NaiveDate) -> String {
    format!("jobs_done_{}", day.format("%Y%m%d"))
}

/// Ensures upcoming partitions exist and drops those older than `retention_days`.
pub async fn run_once(pool: &PgPool, retention_days: u32) -> Result<HistoryReport> {
    let mut report = HistoryReport::default();
    let mut tx = pool.begin().await?;
    let Some(led) = leader::try_lead(&mut tx, leader::HISTORY).await? else {
        return Ok(report);
    };
    report.led = true;
    // Partition DDL takes strong locks on jobs_done; behind a long query it
    // would queue every history-keeping completion. Fail fast, retry next pass.
    sqlx::query("SET LOCAL lock_timeout = '2s'")
        .execute(&mut *tx)
        .await?;
    let existing: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i \
           JOIN pg_class c ON c.oid = i.inhrelid \
           JOIN pg_class p ON p.oid = i.inhparent \
           JOIN pg_namespace n ON n.oid = p.relnamespace \
          WHERE n.nspname = 'qbridge' AND p.relname = 'jobs_done'",
    )
    .fetch_all(&mut *tx)
    .await?;

    let today = Utc::now().date_naive();
    for ahead in 0..3 {
        let day = today + ChronoDuration::days(ahead);
        let name = partition_name(day);
        if existing.contains(&name) {
            continue;
        }
        // Rows of that day already in the default partition (it was not
        // there in time) make Postgres refuse the partition, and the first
        // pass is fatal at start-up: every worker exited (oracle seed 4697).
        // The day stays with the default partition (nothing is lost; the
        // pass warns below); the other days are still created.
        let next = day + ChronoDuration::days(1);
        let taken: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM qbridge.jobs_done_default \
                             WHERE finished_at >= $1::date AND finished_at < $2::date)",
        )
        .bind(day)
        .bind(next)
        .fetch_one(&mut *tx)
        .await?;
        if taken {
            continue;
        }
        // DDL takes no parameters; the name and bounds come from dates computed
        // here, never from input.
        let sql = format!(
            "CREATE TABLE qbridge.{name} PARTITION OF qbridge.jobs_done \
             FOR VALUES FROM ('{day}') TO ('{next}')",
            day = day.format("%Y-%m-%d"),
            next = next.format("%Y-%m-%d"),
        );
        sqlx::query(&sql).execute(&mut *tx).await?;
        report.created.push(name);
    }
    let oldest_kept = today - ChronoDuration::days(i64::from(retention_days));
    for name in &existing {
        let Some(day) = name
            .strip_prefix("jobs_done_")
            .and_then(|d| NaiveDate::parse_from_str(d, "%Y%m%d").ok())
        else {
            continue;
        };
        if day < oldest_kept {
            sqlx::query(&format!("DROP TABLE qbridge.{name}"))
                .execute(&mut *tx)
                .await?;
            report.dropped.push(name.clone());
        }
    }
    report.in_default = sqlx::query_scalar("SELECT count(*) FROM qbridge.jobs_done_default")
        .fetch_one(&mut *tx)
        .await?;
    led.done();
    tx.commit().await?;
    if report.in_default > 0 {
        tracing::warn!(
            rows = report.in_default,
            "jobs_done_default has rows (a day's partition came late, or the database clock is \
             off); a day with rows there gets no partition of its own"
        );
    }
    Ok(report)
}
