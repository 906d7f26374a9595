//! Settling held re-pushes (see [`super::promote`]) when their evidence
//! arrives: a re-push whose original the Redis side then reported dead (or,
//! for a fleet, failed) is released as a live job; one whose original the
//! Redis side reported ok was a duplicate of a job that ran and is resolved.
//! Held re-pushes without evidence stay held: the diff shows them, and only
//! an operator's audited `--assume-lost` releases them without evidence
//! ([`release`]).
//!
//! Any number of processes may run the pass: rows are taken with
//! `FOR UPDATE SKIP LOCKED` and settled in the same transaction.

use serde::Serialize;
use sqlx::{PgConnection, PgPool};

use super::promote::{decide, Evidence, Verdict};
use super::release::{released_sql, use_up};
use crate::error::Result;
use crate::metrics as m;
use crate::queue::{enqueue, JobCopy, NewJob};

/// Held re-pushes looked at per pass (a short transaction).
const BATCH: i64 = 500;

/// What one settle pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Settled {
    /// Released as live jobs on evidence the Redis side let go of the original.
    pub released: u64,
    /// Resolved as duplicates: the Redis side ran the original.
    pub resolved: u64,
}

/// One held re-push, as the pass reads it.
type HeldRow = (
    String,                                // queue
    String,                                // key
    Vec<u8>,                               // original
    serde_json::Value,                     // payload
    Option<String>,                        // kind
    Option<i32>,                           // max_attempts
    String,                                // via
    bool,                                  // fleet
    Option<String>,                        // the Redis side's last outcome
    bool,                                  // owed by the outbox
    bool,                                  // Redis handed it out of a set after the flip
    Option<chrono::DateTime<chrono::Utc>>, // when it is due
    Option<i32>,                           // attempts the Redis side used
);

const TAKE_SQL: &str = concat!(
    r#"
SELECT h.queue, h.key, h.original, h.payload, h.kind, h.max_attempts, h.via, h.fleet,
       (SELECT o.outcome FROM qbridge.outcomes o
         WHERE o.queue = h.queue AND o.key = h.key AND o.side = 'redis' AND o.mode = 'live'
         ORDER BY o.recorded_at DESC, o.id DESC LIMIT 1),
       EXISTS (SELECT 1 FROM qbridge.redis_outbox b WHERE b.queue = h.queue AND b.key = h.key),
       "#,
    released_sql!(),
    r#", h.run_at, h.attempts
  FROM qbridge.held_repushes h CROSS JOIN LATERAL (SELECT h.queue, h.key) AS t(queue, key)
 WHERE ($1::text IS NULL OR h.queue = $1)
   AND ($2::text[] IS NULL OR h.key = ANY($2))
 ORDER BY h.held_at
 LIMIT $3
   FOR UPDATE OF h SKIP LOCKED
"#
);

/// The key becomes live unless it is already (a racing re-push was promoted
/// first): returns whether this release owns the live job. A key the dedup
/// window forgot is recorded again.
const LIVE_KEY_SQL: &str = r#"
INSERT INTO qbridge.job_keys (queue, key, copy, via) VALUES ($1, $2, 'live', $3)
ON CONFLICT (queue, key) DO UPDATE SET copy = 'live', seen_at = now(), original = NULL
 WHERE job_keys.copy = 'mirror'
RETURNING key
"#;

/// One pass over every route's held re-pushes.
pub async fn settle_held_once(pool: &PgPool, payload_limit: usize) -> Result<Settled> {
    let mut tx = pool.begin().await?;
    let rows = take(&mut tx, None, None).await?;
    let mut settled = Settled::default();
    for row in rows {
        let (fleet, last, owed, released) = (row.7, row.8.clone(), row.9, row.10);
        let evidence = Evidence {
            copy: "mirror".into(),
            last_redis_outcome: last,
            owed,
            released,
        };
        match decide(&evidence, fleet) {
            Verdict::Promote => {
                if release_row(&mut tx, row, payload_limit).await? {
                    settled.released += 1;
                } else {
                    settled.resolved += 1;
                }
            }
            Verdict::Duplicate => {
                forget(&mut tx, &row.0, &row.1).await?;
                count(&row.0, "resolved");
                settled.resolved += 1;
            }
            Verdict::Hold(_) => {}
        }
    }
    tx.commit().await?;
    Ok(settled)
}

/// Releases the held re-pushes of `keys` on `queue` as live jobs (the
/// operator's audited `--assume-lost KEY…`: they know the originals will
/// never run); returns the keys that now run live or were already live.
/// Only named keys: a Redis crash at some time says nothing of whether an
/// original had run before it, so no time selects held re-pushes.
pub async fn release(
    conn: &mut PgConnection,
    queue: &str,
    keys: &[String],
    payload_limit: usize,
) -> Result<Vec<String>> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let rows = take(conn, Some(queue), Some(keys)).await?;
    let mut released = Vec::new();
    for row in rows {
        let key = row.1.clone();
        release_row(conn, row, payload_limit).await?;
        released.push(key);
    }
    Ok(released)
}

/// Held re-pushes of `queue` (or every queue), with a sample of keys.
pub async fn held_count(pool: &PgPool, queue: &str, samples: i64) -> Result<(i64, Vec<String>)> {
    let rows: Vec<(i64, String)> = sqlx::query_as(
        "SELECT count(*) OVER (), key FROM qbridge.held_repushes WHERE queue = $1 \
          ORDER BY held_at, key LIMIT $2",
    )
    .bind(queue)
    .bind(samples.max(1))
    .fetch_all(pool)
    .await?;
    let total = rows.first().map_or(0, |r| r.0);
    Ok((total, rows.into_iter().map(|r| r.1).collect()))
}

async fn take(
    conn: &mut PgConnection,
    queue: Option<&str>,
    keys: Option<&[String]>,
) -> Result<Vec<HeldRow>> {
    Ok(sqlx::query_as(TAKE_SQL)
        .bind(queue)
        .bind(keys)
        .bind(BATCH)
        .fetch_all(&mut *conn)
        .await?)
}

/// Runs one held re-push live; false when its key was live already (then
/// it is a duplicate of that live job and only forgotten).
async fn release_row(conn: &mut PgConnection, row: HeldRow, payload_limit: usize) -> Result<bool> {
    let (queue, key, original, payload, kind, max_attempts, via, .., run_at, attempts) = row;
    forget(conn, &queue, &key).await?;
    let owns: Option<String> = sqlx::query_scalar(LIVE_KEY_SQL)
        .bind(&queue)
        .bind(&key)
        .bind(&via)
        .fetch_optional(&mut *conn)
        .await?;
    if owns.is_none() {
        count(&queue, "resolved");
        return Ok(false);
    }
    let mut job = NewJob::new(queue.clone(), payload)
        .with_key(&key)
        .with_copy(JobCopy::Live, Some(bytes::Bytes::from(original)));
    job.kind = kind;
    job.max_attempts = max_attempts;
    job.run_at = run_at;
    // The payload was checked (or replaced by a stand-in) when it was held.
    enqueue(conn, &[job], payload_limit.max(1024)).await?;
    if let Some(n) = attempts {
        super::record_attempts(conn, &queue, &[(key.clone(), n)]).await?;
    }
    count(&queue, "released");
    Ok(true)
}

async fn forget(conn: &mut PgConnection, queue: &str, key: &str) -> Result<()> {
    sqlx::query("DELETE FROM qbridge.held_repushes WHERE queue = $1 AND key = $2")
        .bind(queue)
        .bind(key)
        .execute(&mut *conn)
        .await?;
    use_up(conn, &[queue], &[key]).await
}

fn count(queue: &str, result: &'static str) {
    metrics::counter!(m::REPUSHES_SETTLED, "queue" => queue.to_string(), "result" => result)
        .increment(1);
}
