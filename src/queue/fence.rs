//! Fenced state changes on claimed jobs: heartbeat, complete, retry, dead-letter
//! and release. Each one matches on (id, lease, state = 'running'); a job that
//! does not match has lost its lease (reaped, or claimed again) and the call's
//! result for it is discarded, never applied. All take batches: one statement
//! for many jobs.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sqlx::PgExecutor;

use crate::error::Result;
use crate::queue::job::JobRef;

/// Which jobs of a fenced call were applied and which had lost their lease.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FenceResult {
    /// Ids whose change was applied.
    pub applied: Vec<i64>,
    /// Attempts whose lease was gone: nothing was changed for them.
    pub lost: Vec<JobRef>,
}

impl FenceResult {
    fn from_applied(refs: &[JobRef], applied: Vec<i64>) -> Self {
        let set: HashSet<i64> = applied.iter().copied().collect();
        // A batch can hold two attempts of one job (a stale worker's outcome
        // next to the current one's, in the same completer batch). The
        // statements return only ids, but at most one attempt per id can
        // match, and it is the one with the largest lease: lease tokens only
        // grow, and the row carries the newest one handed out. Every other
        // attempt of that id was fenced out.
        let newest = newest_leases(refs);
        let lost = refs
            .iter()
            .filter(|r| !set.contains(&r.id) || newest.get(&r.id) != Some(&r.lease))
            .copied()
            .collect();
        FenceResult { applied, lost }
    }
}

fn split(refs: &[JobRef]) -> (Vec<i64>, Vec<i64>) {
    refs.iter().map(|r| (r.id, r.lease)).unzip()
}

/// The attempts of a batch as the jsonb `{"<id>": lease, …}` and their ids.
/// Of two attempts of one job only the newest lease can match (see
/// [`FenceResult::from_applied`]), so it is the one kept. Bound as jsonb, not
/// as text cast in the statement: a generic plan casts a text parameter again
/// for every row (220–340 ms for 1,000 completions, against 1.8 ms).
fn lease_by_id(refs: &[JobRef]) -> (Vec<i64>, sqlx::types::Json<HashMap<i64, i64>>) {
    let newest = newest_leases(refs);
    (newest.keys().copied().collect(), sqlx::types::Json(newest))
}

/// Each job's largest lease among `refs`: lease tokens only grow, so it is
/// the only attempt of that job that can still hold it.
fn newest_leases(refs: &[JobRef]) -> HashMap<i64, i64> {
    let mut newest: HashMap<i64, i64> = HashMap::with_capacity(refs.len());
    for r in refs {
        let e = newest.entry(r.id).or_insert(r.lease);
        *e = (*e).max(r.lease);
    }
    newest
}

fn millis(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

// Plan note: heartbeat, retry, dead-letter and release join `jobs` with
// unnest(ids, leases). The planner reaches the jobs through
// `jobs_running_idx` (running rows only, so as small as the work in flight)
// and hash-joins: ~1.5 ms for 500 outcomes. Adding a redundant
// `j.id = ANY($1)` looks helpful but turns it into a nested loop over the
// unnest (measured 57 ms for 500), so don't. A heartbeat covers every job in
// flight anyway, and retries and dead letters are rare.
const HEARTBEAT_SQL: &str = r#"
UPDATE qbridge.jobs j SET lease_until = now() + $3 * interval '1 millisecond'
  FROM unnest($1::int8[], $2::int8[]) AS c(id, lease)
 WHERE j.id = c.id AND j.lease = c.lease AND j.state = 'running'
RETURNING j.id
"#;

// Completion, the hottest fenced statement, is the exception: a hash join
// over `jobs_running_idx` reads every running job for each batch, so its cost
// grew with the work in flight (16.8 ms for 1,000 completions with 12,000
// jobs running; with producers and workers at full speed it was the largest
// cost per job). It reaches each job by id (`= ANY`, an index probe per job)
// and checks the lease by key in a jsonb object {"<id>": lease} ($2, see
// [`lease_by_id`]): 1.8 ms for the same batch, whatever runs beside it
// (generic plan; measured with EXPLAIN ANALYZE).
const COMPLETE_SQL: &str = r#"
DELETE FROM qbridge.jobs j
 WHERE j.id = ANY($1::int8[]) AND j.state = 'running'
   AND j.lease = ($2::jsonb ->> j.id::text)::int8
RETURNING j.id
"#;

const COMPLETE_WITH_HISTORY_SQL: &str = r#"
WITH d AS (
    DELETE FROM qbridge.jobs j
     WHERE j.id = ANY($1::int8[]) AND j.state = 'running'
       AND j.lease = ($2::jsonb ->> j.id::text)::int8
    RETURNING j.id, j.queue, j.kind, j.key, j.attempts, j.created_at, j.lease
)
INSERT INTO qbridge.jobs_done (id, queue, kind, key, attempts, created_at, lease)
SELECT id, queue, kind, key, attempts, created_at, lease FROM d
RETURNING id
"#;

const RETRY_SQL: &str = r#"
UPDATE qbridge.jobs j
   SET state = 'ready', run_at = now() + c.delay_ms * interval '1 millisecond',
       lease_until = NULL, locked_by = NULL, last_error = c.err
  FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::text[]) AS c(id, lease, delay_ms, err)
 WHERE j.id = c.id AND j.lease = c.lease AND j.state = 'running'
RETURNING j.id
"#;

const DEAD_SQL: &str = r#"
WITH d AS (
    DELETE FROM qbridge.jobs j USING unnest($1::int8[], $2::int8[], $3::text[]) AS c(id, lease, err)
     WHERE j.id = c.id AND j.lease = c.lease AND j.state = 'running'
    RETURNING j.id, j.queue, j.kind, j.key, j.payload, j.priority, j.attempts,
              j.max_attempts, c.err, j.created_at, j.lock_key, j.tenant, j.copy, j.original
)
INSERT INTO qbridge.jobs_dead
       (id, queue, kind, key, payload, priority, attempts, max_attempts, last_error, created_at,
        lock_key, tenant, copy, original)
SELECT * FROM d
RETURNING id
"#;

// Handing a job back wakes other workers at once instead of at their next poll.
const RELEASE_SQL: &str = r#"
WITH u AS (
    UPDATE qbridge.jobs j
       SET state = 'ready', lease_until = NULL, locked_by = NULL,
           attempts = j.attempts - CASE WHEN $3 THEN 1 ELSE 0 END
      FROM unnest($1::int8[], $2::int8[]) AS c(id, lease)
     WHERE j.id = c.id AND j.lease = c.lease AND j.state = 'running'
    RETURNING j.id, j.queue
), n AS (
    SELECT qbridge.hint('qbridge_jobs', q.queue) FROM (SELECT DISTINCT queue FROM u) q
)
SELECT u.id FROM u, (SELECT count(*) FROM n) AS sent
"#;

/// Extends the leases of running jobs by `lease` from now.
pub async fn heartbeat<'e>(
    db: impl PgExecutor<'e>,
    refs: &[JobRef],
    lease: Duration,
) -> Result<FenceResult> {
    if refs.is_empty() {
        return Ok(FenceResult::default());
    }
    let (ids, leases) = split(refs);
    let applied = sqlx::query_scalar(HEARTBEAT_SQL)
        .bind(ids)
        .bind(leases)
        .bind(millis(lease))
        .fetch_all(db)
        .await?;
    Ok(FenceResult::from_applied(refs, applied))
}

/// Completes jobs: they leave the hot table (into day-partitioned history when
/// `keep_history`).
pub async fn complete<'e>(
    db: impl PgExecutor<'e>,
    refs: &[JobRef],
    keep_history: bool,
) -> Result<FenceResult> {
    if refs.is_empty() {
        return Ok(FenceResult::default());
    }
    let (ids, leases) = lease_by_id(refs);
    let sql = if keep_history {
        COMPLETE_WITH_HISTORY_SQL
    } else {
        COMPLETE_SQL
    };
    let applied = sqlx::query_scalar(sql)
        .bind(ids)
        .bind(leases)
        .fetch_all(db)
        .await?;
    Ok(FenceResult::from_applied(refs, applied))
}

/// Puts jobs back to `ready` after their delay, recording the error.
pub async fn retry<'e>(
    db: impl PgExecutor<'e>,
    items: &[(JobRef, Duration, String)],
) -> Result<FenceResult> {
    if items.is_empty() {
        return Ok(FenceResult::default());
    }
    let refs: Vec<JobRef> = items.iter().map(|i| i.0).collect();
    let (ids, leases) = split(&refs);
    let applied = sqlx::query_scalar(RETRY_SQL)
        .bind(ids)
        .bind(leases)
        .bind(items.iter().map(|i| millis(i.1)).collect::<Vec<_>>())
        .bind(items.iter().map(|i| i.2.clone()).collect::<Vec<_>>())
        .fetch_all(db)
        .await?;
    Ok(FenceResult::from_applied(&refs, applied))
}

/// Moves jobs to `jobs_dead` with their error.
pub async fn dead_letter<'e>(
    db: impl PgExecutor<'e>,
    items: &[(JobRef, String)],
) -> Result<FenceResult> {
    if items.is_empty() {
        return Ok(FenceResult::default());
    }
    let refs: Vec<JobRef> = items.iter().map(|i| i.0).collect();
    let (ids, leases) = split(&refs);
    let applied = sqlx::query_scalar(DEAD_SQL)
        .bind(ids)
        .bind(leases)
        .bind(items.iter().map(|i| i.1.clone()).collect::<Vec<_>>())
        .fetch_all(db)
        .await?;
    Ok(FenceResult::from_applied(&refs, applied))
}

/// Hands jobs back to `ready` at once (shutdown). `refund_attempt` undoes the
/// attempt count for jobs whose handler never started.
pub async fn release<'e>(
    db: impl PgExecutor<'e>,
    refs: &[JobRef],
    refund_attempt: bool,
) -> Result<FenceResult> {
    if refs.is_empty() {
        return Ok(FenceResult::default());
    }
    let (ids, leases) = split(refs);
    let applied = sqlx::query_scalar(RELEASE_SQL)
        .bind(ids)
        .bind(leases)
        .bind(refund_attempt)
        .fetch_all(db)
        .await?;
    Ok(FenceResult::from_applied(refs, applied))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_by_id_keeps_the_newest_attempt_of_each_job() {
        let refs = [
            JobRef { id: 7, lease: 3 },
            JobRef { id: 9, lease: 4 },
            JobRef { id: 7, lease: 5 },
        ];
        let (mut ids, json) = lease_by_id(&refs);
        ids.sort();
        assert_eq!(ids, [7, 9]);
        // As the statement reads it: object keys are the ids' decimal text.
        let text = serde_json::to_string(&json.0).unwrap();
        let map: HashMap<String, i64> = serde_json::from_str(&text).unwrap();
        assert_eq!(map, HashMap::from([("7".into(), 5), ("9".into(), 4)]));
        assert_eq!(serde_json::to_string(&lease_by_id(&[]).1 .0).unwrap(), "{}");
    }
}
