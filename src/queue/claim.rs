//! Claim: take up to N ready jobs in one statement — candidates locked
//! `FOR NO KEY UPDATE SKIP LOCKED` in claim order by the ordered walk of a
//! claim index (`qbridge.ready_ids*`, or the tenant walk in its own short
//! transaction), an UPDATE to `running` with a fresh lease token, RETURNING.
//! No transaction is held while handlers run. Optional per-kind filter and
//! per-tenant cap.

use std::time::Duration;

use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;
use sqlx::{PgPool, Postgres};

use crate::error::Result;
use crate::queue::claim_head::ClaimHead;
use crate::queue::job::ClaimedJob;
use crate::queue::{fence, lock_keys};

/// Per-tenant fairness: one claim takes at most `cap` jobs per tenant. The
/// queue's tenant pointer is recorded with [`crate::queue::tenants::ensure`]
/// on first use.
#[derive(Debug, Clone)]
pub struct TenantCap {
    /// Path into the payload (from a JSON pointer) naming the tenant.
    pub path: Vec<String>,
    /// Jobs per tenant per claim.
    pub cap: i64,
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
    /// Optional tenant cap (pools with one queue).
    pub tenant: Option<&'a TenantCap>,
    /// With a tenant cap: start after this tenant (the previous claim's
    /// [`Claimed::tenant_cursor`]), so claims rotate through tenants.
    pub tenant_after: Option<&'a str>,
    /// Delay before a job whose lock key is busy is offered again.
    pub lock_retry_delay: Duration,
    /// Walk the claim index from this head (the previous claim's
    /// [`Claimed::head`], from a [`crate::queue::claim_head::HeadTracker`])
    /// instead of from its start. Used by claims of one queue with no kind
    /// filter or tenant cap; the others always walk from the start.
    pub start: Option<ClaimHead>,
}

const RETURNING: &str = "RETURNING j.id, j.queue, j.kind, j.key, j.payload, j.priority, \
     j.attempts, j.max_attempts, j.lease, j.run_at, j.created_at, j.lock_key, j.tenant, j.copy";

// The candidates of one queue (or one kind of it) come from
// `qbridge.ready_ids` and `qbridge.ready_ids_of_kind` (migration 0022): the
// walk of a claim index in (priority DESC, run_at, id) order, planned with
// every other plan switched off, so the batch is read and not the backlog.
const ONE_QUEUE_CAND: &str = r#"
    SELECT id FROM qbridge.ready_ids(($1::text[])[1], $2)
"#;

// One queue from the head the previous claim found (migration 0023,
// `queue::claim_head`): past the entries claimed jobs left at the start.
const ONE_QUEUE_FROM_HEAD_CAND: &str = r#"
    SELECT id FROM qbridge.ready_ids_from(($1::text[])[1], $2, $5, $6)
"#;

// Several queues: walk the index once per queue, then merge. Rows locked by a
// per-queue branch but cut by the outer LIMIT stay locked only until this
// statement commits.
const MANY_QUEUES_CAND: &str = r#"
    SELECT x.id FROM unnest($1::text[]) AS q(name)
     CROSS JOIN LATERAL qbridge.ready_ids(q.name, $2) x
     ORDER BY x.priority DESC, x.run_at, x.id
     LIMIT $2
"#;

// A pool limited to some kinds: walk `jobs_claim_kind_idx` once per (queue,
// kind), so a bulk backlog of other kinds in the same queue is never read.
const KINDS_CAND: &str = r#"
    SELECT x.id FROM unnest($1::text[]) AS q(name)
     CROSS JOIN unnest($5::text[]) AS k(kind)
     CROSS JOIN LATERAL qbridge.ready_ids_of_kind(q.name, k.kind, $2) x
     ORDER BY x.priority DESC, x.run_at, x.id
     LIMIT $2
"#;

// Tenant cap (one queue). `tenants` walks `jobs_claim_tenant_idx` from tenant
// to tenant (a loose index scan: one index probe per tenant, however many jobs
// each has), starting after $7 (from the first when NULL) and, when $8 is
// set, stopping at $8, so
// successive claims rotate through the tenants. Each visited tenant offers at
// most $6 of its jobs in claim order; the oldest $2 of those are taken.
const TENANTS_CTE: &str = r#"RECURSIVE tenants(t, n) AS (
    (SELECT tenant, 1 FROM qbridge.jobs
      WHERE state = 'ready' AND tenant IS NOT NULL AND queue = ($1::text[])[1]
        AND ($7::text IS NULL OR tenant > $7) AND ($8::text IS NULL OR tenant <= $8)
      ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT j.tenant FROM qbridge.jobs j
             WHERE j.state = 'ready' AND j.tenant IS NOT NULL AND j.queue = ($1::text[])[1]
               AND j.tenant > tenants.t AND ($8::text IS NULL OR j.tenant <= $8)
             ORDER BY j.tenant LIMIT 1),
           n + 1
      FROM tenants WHERE tenants.t IS NOT NULL AND n < $2
),"#;

const TENANT_CAND: &str = r#"
    SELECT x.id FROM tenants
     CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM qbridge.jobs
         WHERE state = 'ready' AND tenant IS NOT NULL AND queue = ($1::text[])[1]
           AND tenant = tenants.t AND run_at <= now()
           AND ($5::text[] IS NULL OR kind = ANY($5))
         ORDER BY priority DESC, run_at, id
         LIMIT $6
         FOR NO KEY UPDATE SKIP LOCKED
     ) x
     WHERE tenants.t IS NOT NULL
     ORDER BY x.priority DESC, x.run_at, x.id
     LIMIT $2
"#;

// The UPDATE reaches the candidates by id through `jobs_pkey`
// (`id = ANY(ARRAY(...))`), with no join. A join of `jobs` with `cand` let
// the planner, told by the statistics that the table was empty, put a
// scan of the whole table on the outside of a nested loop: every row
// compared with every candidate, 4 s a claim at 85,000 rows (the
// paced runs that stalled; `tests/it/claim_plans.rs`). One lease token per
// claim, from an uncorrelated subquery (evaluated once): ids tell the jobs
// of a batch apart, so (id, lease) is still unique per attempt.
fn claim_sql(ctes: &str, cand: &str) -> String {
    format!(
        "WITH {ctes} cand AS ({cand})
UPDATE qbridge.jobs j
   SET state = 'running', attempts = j.attempts + 1,
       lease = (SELECT nextval('qbridge.lease_seq')),
       locked_by = $3, lease_until = now() + $4 * interval '1 millisecond'
 WHERE j.id = ANY (ARRAY(SELECT id FROM cand))
{RETURNING}"
    )
}

/// The five statement texts, built once from the constant pieces above.
fn statements() -> &'static [String; 5] {
    static SQL: std::sync::OnceLock<[String; 5]> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        [
            claim_sql("", ONE_QUEUE_CAND),
            claim_sql("", ONE_QUEUE_FROM_HEAD_CAND),
            claim_sql("", MANY_QUEUES_CAND),
            claim_sql("", KINDS_CAND),
            claim_sql(TENANTS_CTE, TENANT_CAND),
        ]
    })
}

// The tenant claim's loose index scan and per-tenant walks are one
// statement, not a function per queue like the other claims' (migration
// 0022), so it gets the same planner switches from its own transaction:
// two round trips more per claim, paid only by tenant-capped pools (with
// them on every claim, `bench steady`'s workers fell behind: p50 18 -> 110
// ms). Scoped to that transaction: no other statement on the connection is
// planned with them.
const ORDERED_WALK_ONLY: &str =
    "BEGIN; SET LOCAL enable_indexscan = on; SET LOCAL enable_seqscan = off; \
     SET LOCAL enable_bitmapscan = off; SET LOCAL enable_sort = off";

/// Runs one claim statement in a transaction planned with
/// [`ORDERED_WALK_ONLY`].
async fn walking_the_index<'q>(
    pool: &PgPool,
    query: QueryAs<'q, Postgres, ClaimedJob, PgArguments>,
) -> Result<Vec<ClaimedJob>> {
    let mut tx = pool.begin_with(ORDERED_WALK_ONLY).await?;
    let jobs = query.fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok(jobs)
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
    /// With a tenant cap: where the next claim should start.
    pub tenant_cursor: Option<String>,
    /// The first job taken, in claim order (before any was put back for its
    /// lock key): where the next claim may start ([`ClaimRequest::start`]).
    pub head: Option<ClaimHead>,
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
    let kinds = req.kinds;
    let [one, from_head, many, by_kind, tenant] = statements();
    let mut jobs: Vec<ClaimedJob> = match req.tenant {
        None => {
            // Only a claim of one queue with no kind filter walks from a head.
            let start = req
                .start
                .filter(|_| kinds.is_none() && req.queues.len() == 1);
            let sql = match (kinds.is_some(), req.queues.len(), start) {
                (true, _, _) => by_kind,
                (false, 1, Some(_)) => from_head,
                (false, 1, None) => one,
                (false, _, _) => many,
            };
            let query = sqlx::query_as(sql)
                .bind(req.queues)
                .bind(req.limit)
                .bind(req.worker)
                .bind(lease_ms);
            // Only the per-kind statement has a $5, and the walk from a head
            // a $5 and $6.
            let query = match (kinds, start) {
                (Some(kinds), _) => query.bind(kinds),
                (None, Some(head)) => query.bind(head.priority).bind(head.walk_from()),
                (None, None) => query,
            };
            query.fetch_all(pool).await?
        }
        Some(t) => {
            let queue = &req.queues[0];
            super::tenants::ensure(pool, queue, &t.path).await?;
            let after = req.tenant_after.map(str::to_string);
            let run = |after: Option<String>, upto: Option<String>, limit: i64| {
                let query = sqlx::query_as::<_, ClaimedJob>(tenant)
                    .bind(&req.queues[..1])
                    .bind(limit)
                    .bind(req.worker)
                    .bind(lease_ms)
                    .bind(kinds)
                    .bind(t.cap)
                    .bind(after)
                    .bind(upto);
                walking_the_index(pool, query)
            };
            let mut jobs = run(after.clone(), None, req.limit).await?;
            if (jobs.len() as i64) < req.limit && after.is_some() {
                // Wrap around: the tenants up to and including the cursor.
                let rest = run(None, after, req.limit - jobs.len() as i64).await?;
                jobs.extend(rest);
            }
            jobs
        }
    };
    // RETURNING hands the rows back in the order the UPDATE found them (by
    // id); the pool starts the first and holds the rest, and of two jobs
    // with one lock key the first runs, so put them back in claim order.
    jobs.sort_by(|a, b| (b.priority, a.run_at, a.id).cmp(&(a.priority, b.run_at, b.id)));
    let found = jobs.len();
    let head = ClaimHead::of(&jobs);
    let tenant_cursor = match req.tenant {
        Some(_) => jobs.iter().filter_map(|j| j.tenant.clone()).max(),
        None => None,
    };
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
            tenant_cursor,
            head,
        });
    }
    let refs: Vec<_> = jobs.iter().map(|j| j.job_ref()).collect();
    match lock_keys::settle(pool, jobs, req.lock_retry_delay).await {
        Ok(kept) => Ok(Claimed {
            deferred: found - kept.len(),
            jobs: kept,
            more,
            tenant_cursor,
            head,
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
