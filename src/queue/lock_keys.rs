//! Serialization by lock key: jobs that share a `lock_key` never run at the same
//! time.
//!
//! After a claim returns jobs with lock keys, one short transaction takes a
//! transaction-scoped advisory lock per key (sorted, so two claimers cannot
//! deadlock), then — in a new statement, whose snapshot sees every claim that
//! committed under those locks — looks for other running jobs with the same
//! keys. Jobs that would overlap are put back with a short jittered delay, their
//! attempt refunded. Transaction-scoped locks cannot leak: a crash or a dropped
//! connection ends the transaction and frees them.
//!
//! Two claimers racing for one key may both put their job back (never both
//! keep it); the jittered delay separates their next tries.

use std::collections::HashSet;
use std::time::Duration;

use rand::Rng;
use sqlx::PgPool;

use crate::error::Result;
use crate::queue::job::ClaimedJob;

const LOCK_SQL: &str = r#"
SELECT count(pg_advisory_xact_lock(hashtextextended(k, 7481)))
  FROM (SELECT DISTINCT k FROM unnest($1::text[]) AS k ORDER BY k) s
"#;

const BUSY_SQL: &str = r#"
SELECT DISTINCT lock_key FROM qbridge.jobs
 WHERE state = 'running' AND lock_key = ANY($1) AND NOT (id = ANY($2))
"#;

const PUT_BACK_SQL: &str = r#"
UPDATE qbridge.jobs j
   SET state = 'ready', attempts = j.attempts - 1, lease_until = NULL, locked_by = NULL,
       run_at = now() + c.delay_ms * interval '1 millisecond'
  FROM unnest($1::int8[], $2::int8[], $3::int8[]) AS c(id, lease, delay_ms)
 WHERE j.id = c.id AND j.lease = c.lease AND j.state = 'running'
"#;

/// Keeps the claimed jobs that may run now and puts the others back.
pub async fn settle(
    pool: &PgPool,
    jobs: Vec<ClaimedJob>,
    delay: Duration,
) -> Result<Vec<ClaimedJob>> {
    let keys: Vec<String> = jobs.iter().filter_map(|j| j.lock_key.clone()).collect();
    let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();

    let mut tx = pool.begin().await?;
    sqlx::query(LOCK_SQL).bind(&keys).execute(&mut *tx).await?;
    let busy: Vec<String> = sqlx::query_scalar(BUSY_SQL)
        .bind(&keys)
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await?;
    let busy: HashSet<String> = busy.into_iter().collect();

    let mut taken: HashSet<String> = HashSet::new();
    let mut keep = Vec::with_capacity(jobs.len());
    let mut back = Vec::new();
    for job in jobs {
        match &job.lock_key {
            // Claim order decides which of a batch's same-key jobs runs first.
            Some(k) if busy.contains(k) || !taken.insert(k.clone()) => back.push(job),
            _ => keep.push(job),
        }
    }
    if !back.is_empty() {
        let base = delay.as_millis() as i64;
        // ThreadRng is not Send: keep it out of any await.
        let delays: Vec<i64> = {
            let mut rng = rand::rng();
            back.iter()
                .map(|_| base + rng.random_range(0..=base.max(1)))
                .collect()
        };
        sqlx::query(PUT_BACK_SQL)
            .bind(back.iter().map(|j| j.id).collect::<Vec<_>>())
            .bind(back.iter().map(|j| j.lease).collect::<Vec<_>>())
            .bind(delays)
            .execute(&mut *tx)
            .await?;
        metrics::counter!(crate::metrics::LOCK_KEY_DEFERRED).increment(back.len() as u64);
    }
    tx.commit().await?;
    Ok(keep)
}
