//! Claim: take up to N ready jobs in one autocommit statement — a
//! `FOR NO KEY UPDATE SKIP LOCKED` subselect in claim order, an UPDATE to
//! `running` with a fresh lease token, RETURNING. No transaction is held while
//! handlers run. Optional per-kind filter and per-tenant cap.

use std::time::Duration;

use sqlx::PgPool;

use crate::error::Result;
use crate::queue::job::ClaimedJob;
use crate::queue::{fence, lock_keys};

/// Per-tenant fairness: one claim takes at most `cap` jobs per tenant.
#[derive(Debug, Clone)]
pub struct TenantCap {
    /// Path into the payload (from a JSON pointer) naming the tenant.
    pub path: Vec<String>,
    /// Jobs per tenant per claim.
    pub cap: i64,
    /// How many ready rows (in claim order) one claim looks at to find tenants.
    /// A tenant behind more than this many ready jobs waits for the window.
    pub window: i64,
}

/// What to claim.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// Queues to claim from.
    pub queues: &'a [String],
    /// Only these kinds, when set (a pool for latency-sensitive kinds).
    pub kinds: Option<&'a [String]>,
    /// Most jobs to take.
    pub limit: i64,
    /// Recorded in `locked_by` for operators.
    pub worker: &'a str,
    /// Lease length; heartbeats extend it.
    pub lease: Duration,
    /// Optional tenant cap.
    pub tenant: Option<&'a TenantCap>,
    /// Delay before a job whose lock key is busy is offered again.
    pub lock_retry_delay: Duration,
}

const RETURNING: &str = "RETURNING j.id, j.queue, j.kind, j.key, j.payload, j.priority, \
     j.attempts, j.max_attempts, j.lease, j.run_at, j.created_at, j.lock_key";

// One queue: `queue = $1[1]` is an equality the claim index can walk in
// (priority DESC, run_at, id) order. `queue = ANY($1)` cannot keep that order,
// and the planner falls back to a scan and sort of every ready row.
const ONE_QUEUE_CAND: &str = r#"
    SELECT id FROM qbridge.jobs
     WHERE state = 'ready' AND queue = ($1::text[])[1] AND run_at <= now()
       AND ($5::text[] IS NULL OR kind = ANY($5))
     ORDER BY priority DESC, run_at, id
     LIMIT $2
     FOR NO KEY UPDATE SKIP LOCKED
"#;

// Several queues: walk the index once per queue, then merge. Rows locked by a
// per-queue branch but cut by the outer LIMIT stay locked only until this
// statement commits.
const MANY_QUEUES_CAND: &str = r#"
    SELECT x.id FROM unnest($1::text[]) AS q(name)
     CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM qbridge.jobs
         WHERE state = 'ready' AND queue = q.name AND run_at <= now()
           AND ($5::text[] IS NULL OR kind = ANY($5))
         ORDER BY priority DESC, run_at, id
         LIMIT $2
         FOR NO KEY UPDATE SKIP LOCKED
     ) x
     ORDER BY x.priority DESC, x.run_at, x.id
     LIMIT $2
"#;

// A pool limited to some kinds: walk `jobs_claim_kind_idx` once per (queue,
// kind), so a bulk backlog of other kinds in the same queue is never read.
const KINDS_CAND: &str = r#"
    SELECT x.id FROM unnest($1::text[]) AS q(name)
     CROSS JOIN unnest($5::text[]) AS k(kind)
     CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM qbridge.jobs
         WHERE state = 'ready' AND kind IS NOT NULL AND queue = q.name AND kind = k.kind
           AND run_at <= now()
         ORDER BY priority DESC, run_at, id
         LIMIT $2
         FOR NO KEY UPDATE SKIP LOCKED
     ) x
     ORDER BY x.priority DESC, x.run_at, x.id
     LIMIT $2
"#;

// Tenant cap: read a window of ready rows without locking them, keep at most
// $7 per tenant, then lock only the picks (SKIP LOCKED drops any that another
// claimer took in the meantime).
const TENANT_CAND: &str = r#"
    WITH win AS (
        SELECT x.id, x.priority, x.run_at, x.payload #>> $6::text[] AS tenant
          FROM unnest($1::text[]) AS q(name)
         CROSS JOIN LATERAL (
            SELECT id, priority, run_at, payload FROM qbridge.jobs
             WHERE state = 'ready' AND queue = q.name AND run_at <= now()
               AND ($5::text[] IS NULL OR kind = ANY($5))
             ORDER BY priority DESC, run_at, id
             LIMIT $8
         ) x
    ), ranked AS (
        SELECT id, priority, run_at,
               row_number() OVER (PARTITION BY tenant ORDER BY priority DESC, run_at, id) AS rn
          FROM win
    ), pick AS (
        SELECT id FROM ranked WHERE rn <= $7 ORDER BY priority DESC, run_at, id LIMIT $2
    )
    SELECT id FROM qbridge.jobs
     WHERE id IN (SELECT id FROM pick) AND state = 'ready'
     FOR NO KEY UPDATE SKIP LOCKED
"#;

// The `l` CTE draws one lease token per claim: ids tell the jobs of a batch
// apart, so (id, lease) is still unique per attempt. A CTE with a volatile
// function is evaluated once.
fn claim_sql(cand: &str) -> String {
    format!(
        "WITH cand AS ({cand}), l AS (SELECT nextval('qbridge.lease_seq') AS lease)
UPDATE qbridge.jobs j
   SET state = 'running', attempts = j.attempts + 1, lease = l.lease,
       locked_by = $3, lease_until = now() + $4 * interval '1 millisecond'
  FROM cand, l
 WHERE j.id = cand.id
{RETURNING}"
    )
}

/// The four statement texts, built once from the constant pieces above.
fn statements() -> &'static [String; 4] {
    static SQL: std::sync::OnceLock<[String; 4]> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        [
            claim_sql(ONE_QUEUE_CAND),
            claim_sql(MANY_QUEUES_CAND),
            claim_sql(KINDS_CAND),
            claim_sql(TENANT_CAND),
        ]
    })
}

/// What one claim statement produced.
#[derive(Debug, Default)]
pub struct Claimed {
    /// Jobs to run now.
    pub jobs: Vec<ClaimedJob>,
    /// Jobs claimed but put back because their lock key was busy.
    pub deferred: usize,
    /// True when the queue probably has more runnable jobs right now, so the
    /// caller should claim again at once instead of sleeping: the statement
    /// filled its limit, or (with a tenant cap, which trims batches on purpose)
    /// found anything at all.
    pub more: bool,
}

/// Claims up to `req.limit` jobs. Jobs whose lock key is held by a running job
/// are put back (see [`lock_keys`]) and not returned.
pub async fn claim(pool: &PgPool, req: &ClaimRequest<'_>) -> Result<Vec<ClaimedJob>> {
    Ok(claim_batch(pool, req).await?.jobs)
}

/// [`claim`] with the bookkeeping a worker pool needs to pace itself.
pub async fn claim_batch(pool: &PgPool, req: &ClaimRequest<'_>) -> Result<Claimed> {
    if req.limit <= 0 || req.queues.is_empty() {
        return Ok(Claimed::default());
    }
    let lease_ms = req.lease.as_millis().min(i64::MAX as u128) as i64;
    let kinds: Option<Vec<String>> = req.kinds.map(|k| k.to_vec());
    let [one, many, by_kind, tenant] = statements();
    let jobs: Vec<ClaimedJob> = match req.tenant {
        None => {
            let sql = match (req.kinds.is_some(), req.queues.len()) {
                (true, _) => by_kind,
                (false, 1) => one,
                (false, _) => many,
            };
            sqlx::query_as(sql)
                .bind(req.queues)
                .bind(req.limit)
                .bind(req.worker)
                .bind(lease_ms)
                .bind(kinds)
                .fetch_all(pool)
                .await?
        }
        Some(t) => {
            sqlx::query_as(tenant)
                .bind(req.queues)
                .bind(req.limit)
                .bind(req.worker)
                .bind(lease_ms)
                .bind(kinds)
                .bind(&t.path)
                .bind(t.cap)
                .bind(t.window.max(req.limit))
                .fetch_all(pool)
                .await?
        }
    };
    let found = jobs.len();
    let more = if req.tenant.is_some() {
        found > 0
    } else {
        found as i64 >= req.limit
    };
    if !jobs.iter().any(|j| j.lock_key.is_some()) {
        return Ok(Claimed {
            jobs,
            deferred: 0,
            more,
        });
    }
    let refs: Vec<_> = jobs.iter().map(|j| j.job_ref()).collect();
    match lock_keys::settle(pool, jobs, req.lock_retry_delay).await {
        Ok(kept) => Ok(Claimed {
            deferred: found - kept.len(),
            jobs: kept,
            more,
        }),
        Err(err) => {
            // The claim committed but nothing may run unchecked: hand every job
            // back with its attempt refunded, so none is dead-lettered by the
            // reaper without having run. Best effort; otherwise leases expire.
            let _ = fence::release(pool, &refs, true).await;
            Err(err)
        }
    }
}
