//! The reaper: returns jobs whose lease expired (a worker died or hung) to
//! `ready`, or to the dead-letter table when they are out of attempts. One
//! reaper per database at a time (see [`crate::queue::leader`]).
//!
//! Fencing: candidates are locked with SKIP LOCKED and the UPDATE/DELETE
//! re-checks `state = 'running' AND lease_until < now()` on the locked row, so a
//! job that completed, heartbeated or was claimed again in the meantime is left
//! alone. A stale worker's later complete/heartbeat then fails its own fence.

use sqlx::PgPool;

use crate::error::Result;
use crate::queue::leader;

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReapReport {
    /// False when another process held the reaper lock.
    pub led: bool,
    pub requeued: u64,
    pub dead_lettered: u64,
}

const REQUEUE_SQL: &str = r#"
WITH exp AS (
    SELECT id FROM qbridge.jobs
     WHERE state = 'running' AND lease_until < now() AND attempts < max_attempts
     ORDER BY id LIMIT $1
     FOR NO KEY UPDATE SKIP LOCKED
), u AS (
    UPDATE qbridge.jobs j
       SET state = 'ready', lease_until = NULL, locked_by = NULL, run_at = now(),
           last_error = 'lease expired: worker stopped heartbeating'
      FROM exp
     WHERE j.id = exp.id AND j.state = 'running' AND j.lease_until < now()
    RETURNING j.id, j.queue
), n AS (
    SELECT qbridge.hint('qbridge_jobs', q.queue) FROM (SELECT DISTINCT queue FROM u) q
)
SELECT u.queue, count(*) FROM u, (SELECT count(*) FROM n) AS sent GROUP BY u.queue
"#;

const DEAD_SQL: &str = r#"
WITH exp AS (
    SELECT id FROM qbridge.jobs
     WHERE state = 'running' AND lease_until < now() AND attempts >= max_attempts
     ORDER BY id LIMIT $1
     FOR NO KEY UPDATE SKIP LOCKED
), d AS (
    DELETE FROM qbridge.jobs j USING exp
     WHERE j.id = exp.id AND j.state = 'running' AND j.lease_until < now()
    RETURNING j.id, j.queue, j.kind, j.key, j.payload, j.priority, j.attempts,
              j.max_attempts, j.created_at, j.lock_key, j.tenant, j.copy, j.original
), ins AS (
    INSERT INTO qbridge.jobs_dead
           (id, queue, kind, key, payload, priority, attempts, max_attempts, last_error, created_at,
            lock_key, tenant, copy, original)
    SELECT id, queue, kind, key, payload, priority, attempts, max_attempts,
           'lease expired on the last attempt', created_at, lock_key, tenant, copy, original
      FROM d
    RETURNING queue
)
SELECT queue, count(*) FROM ins GROUP BY queue
"#;

/// One reaper pass over at most `limit` expired jobs of each kind.
pub async fn run_once(pool: &PgPool, limit: i64) -> Result<ReapReport> {
    let mut tx = pool.begin().await?;
    let Some(led) = leader::try_lead(&mut tx, leader::REAPER).await? else {
        return Ok(ReapReport::default());
    };
    let requeued: Vec<(String, i64)> = sqlx::query_as(REQUEUE_SQL)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
    let dead: Vec<(String, i64)> = sqlx::query_as(DEAD_SQL)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
    led.done();
    tx.commit().await?;

    let mut report = ReapReport {
        led: true,
        ..Default::default()
    };
    for (queue, n) in requeued {
        metrics::counter!(crate::metrics::JOBS_REAPED, "queue" => queue).increment(n as u64);
        report.requeued += n as u64;
    }
    for (queue, n) in dead {
        metrics::counter!(crate::metrics::JOBS_DEAD_LETTERED, "queue" => queue).increment(n as u64);
        report.dead_lettered += n as u64;
    }
    Ok(report)
}

/// One pass of the reaper service (run every `reaper_interval`). Logs only
/// passes that did something.
pub async fn pass(pool: &PgPool) {
    match run_once(pool, 1000).await {
        Ok(r) if r.requeued + r.dead_lettered > 0 => {
            tracing::info!(
                requeued = r.requeued,
                dead_lettered = r.dead_lettered,
                "reaped expired leases"
            );
        }
        Ok(_) => {}
        Err(err) => tracing::warn!(error = %err, "reaper pass failed"),
    }
}
