//! Dead-letter tools: list, show and requeue (by ids, queue or error text).
//! Requeue moves rows back into the hot table in small batches at a bounded
//! rate, so a large replay cannot starve live work. A dead job whose key is
//! already in flight again is skipped, never dropped.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::error::{Error, Result};

/// One dead-letter row without its payload (listings never show payloads).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct DeadJob {
    pub id: i64,
    pub queue: String,
    pub kind: Option<String>,
    pub key: Option<String>,
    pub attempts: i32,
    pub max_attempts: i32,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub failed_at: DateTime<Utc>,
}

/// A dead-letter row with its payload, for `dlq show`.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct DeadJobDetail {
    #[sqlx(flatten)]
    #[serde(flatten)]
    pub job: DeadJob,
    pub payload: serde_json::Value,
    pub priority: i32,
}

/// Which dead jobs to act on. Empty filters match everything.
#[derive(Debug, Default, Clone)]
pub struct Selector {
    pub ids: Option<Vec<i64>>,
    pub queue: Option<String>,
    /// Substring of `last_error`.
    pub error_contains: Option<String>,
}

impl Selector {
    /// True when no filter is set (requeue refuses that without `all`).
    pub fn is_empty(&self) -> bool {
        self.ids.is_none() && self.queue.is_none() && self.error_contains.is_none()
    }
}

const FILTER: &str = "($1::int8[] IS NULL OR d.id = ANY($1)) \
    AND ($2::text IS NULL OR d.queue = $2) \
    AND ($3::text IS NULL OR strpos(d.last_error, $3) > 0)";

/// [`FILTER`] applied to a second `jobs_dead` row aliased `d2`.
const FILTER_D2: &str = "($1::int8[] IS NULL OR d2.id = ANY($1)) \
    AND ($2::text IS NULL OR d2.queue = $2) \
    AND ($3::text IS NULL OR strpos(d2.last_error, $3) > 0)";

const COLUMNS: &str =
    "d.id, d.queue, d.kind, d.key, d.attempts, d.max_attempts, d.last_error, d.created_at, d.failed_at";

/// Newest first, at most `limit`.
pub async fn list(pool: &PgPool, sel: &Selector, limit: i64) -> Result<Vec<DeadJob>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM qbridge.jobs_dead d WHERE {FILTER} ORDER BY d.failed_at DESC, d.id DESC LIMIT $4"
    );
    Ok(sqlx::query_as(&sql)
        .bind(&sel.ids)
        .bind(&sel.queue)
        .bind(&sel.error_contains)
        .bind(limit)
        .fetch_all(pool)
        .await?)
}

/// Matching rows.
pub async fn count(pool: &PgPool, sel: &Selector) -> Result<i64> {
    let sql = format!("SELECT count(*) FROM qbridge.jobs_dead d WHERE {FILTER}");
    Ok(sqlx::query_scalar(&sql)
        .bind(&sel.ids)
        .bind(&sel.queue)
        .bind(&sel.error_contains)
        .fetch_one(pool)
        .await?)
}

/// One row with its payload.
pub async fn show(pool: &PgPool, id: i64) -> Result<Option<DeadJobDetail>> {
    let sql =
        format!("SELECT {COLUMNS}, d.payload, d.priority FROM qbridge.jobs_dead d WHERE d.id = $1");
    Ok(sqlx::query_as(&sql).bind(id).fetch_optional(pool).await?)
}

/// Moves up to `batch` matching rows back to `ready` (attempts reset) in one
/// transaction and returns how many moved. Rows whose (queue, key) is in flight
/// again are left in the dead-letter table.
pub async fn requeue_batch(pool: &PgPool, sel: &Selector, batch: i64) -> Result<u64> {
    let sql = format!(
        "WITH pick AS ( \
             SELECT d.id FROM qbridge.jobs_dead d \
              WHERE {FILTER} \
                AND NOT EXISTS (SELECT 1 FROM qbridge.jobs j WHERE j.queue = d.queue AND j.key = d.key) \
                AND NOT EXISTS (SELECT 1 FROM qbridge.jobs_dead d2 \
                                 WHERE d2.queue = d.queue AND d2.key = d.key AND d2.id < d.id \
                                   AND {FILTER_D2}) \
              ORDER BY d.id LIMIT $4 FOR UPDATE SKIP LOCKED \
         ), moved AS ( \
             DELETE FROM qbridge.jobs_dead d USING pick WHERE d.id = pick.id \
             RETURNING d.queue, d.kind, d.key, d.payload, d.priority, d.max_attempts, d.last_error, d.lock_key, d.tenant, d.copy, d.original \
         ) \
         INSERT INTO qbridge.jobs (queue, kind, key, payload, priority, max_attempts, last_error, lock_key, tenant, copy, original) \
         SELECT queue, kind, key, payload, priority, max_attempts, last_error, lock_key, tenant, copy, original FROM moved"
    );
    // The same (queue, key) can be dead more than once (it failed, was
    // enqueued again and failed again): `pick` takes only the oldest matching
    // one, the others then find their key in flight and stay dead. Skipping
    // them in `pick` (not after it) keeps a short batch meaning "no more rows".
    // No ON CONFLICT: if a key races back in flight, the unique index fails the
    // whole statement and nothing is deleted.
    let done = sqlx::query(&sql)
        .bind(&sel.ids)
        .bind(&sel.queue)
        .bind(&sel.error_contains)
        .bind(batch)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

/// Requeues everything `sel` matches at no more than `per_second` jobs/s,
/// calling `progress(moved_so_far)` after each batch.
pub async fn requeue(
    pool: &PgPool,
    sel: &Selector,
    per_second: u32,
    mut progress: impl FnMut(u64),
) -> Result<u64> {
    if per_second == 0 {
        return Err(Error::InvalidInput(
            "requeue rate must be at least 1 job/s".into(),
        ));
    }
    // Ten batches a second keeps each transaction short and the rate smooth.
    let batch = i64::from(per_second.div_ceil(10)).max(1);
    let period = Duration::from_secs_f64(batch as f64 / f64::from(per_second));
    let mut moved = 0u64;
    let mut ticker = tokio::time::interval(period);
    loop {
        ticker.tick().await;
        let n = requeue_batch(pool, sel, batch).await?;
        moved += n;
        progress(moved);
        if n < batch as u64 {
            return Ok(moved);
        }
    }
}
