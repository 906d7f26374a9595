//! Claims from the head (`queue::claim_head`, `qbridge.ready_ids_from`): a
//! claim that starts where the previous one found the queue's head does not
//! walk the claim-index entries that claimed jobs leave behind, keeps claim
//! order for every priority and for jobs due from the head on, and a job due
//! behind the head (handed back, or committed late) is still found by the
//! walk from the start each pool makes every `FULL_WALK_EVERY`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use qbridge::queue::claim::{claim_batch, Claimed};
use qbridge::queue::claim_head::{ClaimHead, FULL_WALK_EVERY};
use sqlx::PgPool;

use crate::claim_plans::{flush_counts, qbridge_connection};
use crate::support::{self, claim_req, PoolBuilder, RunningPool};

const LEASE: Duration = Duration::from_secs(60);

/// Inserts `n` ready jobs on `queue` with `priority`, due at `run_at` (SQL),
/// in one statement; returns the first id and the due time.
async fn insert(pool: &PgPool, n: i64, priority: i32, run_at: &str) -> (i64, DateTime<Utc>) {
    sqlx::query_as(&format!(
        "WITH new AS (INSERT INTO qbridge.jobs (queue, kind, payload, priority, run_at) \
         SELECT 'q', 'k', jsonb_build_object('n', g), $2, {run_at} \
           FROM generate_series(1, $1) g RETURNING id, run_at) \
         SELECT min(id), min(run_at) FROM new"
    ))
    .bind(n)
    .bind(priority)
    .fetch_one(pool)
    .await
    .expect("insert jobs")
}

/// Claims up to `limit` from queue `q`, from `start` (or the index's start).
async fn claim_from(db: &PgPool, limit: i64, start: Option<ClaimHead>) -> Claimed {
    let queues = vec!["q".to_string()];
    let mut req = claim_req(&queues, limit, "head", LEASE);
    req.start = start;
    claim_batch(db, &req).await.expect("claim")
}

/// Pages of `jobs_claim_idx` read so far, as far as backends have flushed.
async fn claim_index_pages(observer: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT idx_blks_hit + idx_blks_read FROM pg_statio_user_indexes \
          WHERE indexrelid = 'qbridge.jobs_claim_idx'::regclass",
    )
    .fetch_one(observer)
    .await
    .expect("read index counters")
}

/// One claim of 10 on `db` (a single connection) and the claim-index pages it read.
async fn pages_read(observer: &PgPool, db: &PgPool, start: Option<ClaimHead>) -> (i64, Claimed) {
    flush_counts(db).await;
    let before = claim_index_pages(observer).await;
    let claimed = claim_from(db, 10, start).await;
    flush_counts(db).await;
    (claim_index_pages(observer).await - before, claimed)
}

fn ids(claimed: &Claimed) -> Vec<i64> {
    claimed.jobs.iter().map(|j| j.id).collect()
}

/// 20,000 jobs claimed leave their entries at the start of the claim index
/// (no vacuum runs here). A claim from the start reads every page they fill;
/// a claim from the head the previous claim found reads a few, and takes
/// the same next jobs in the same order.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_claim_from_the_head_does_not_walk_the_entries_claimed_jobs_left(pool: PgPool) {
    sqlx::query("ALTER TABLE qbridge.jobs SET (autovacuum_enabled = off)")
        .execute(&pool)
        .await
        .expect("autovacuum off");
    // Every statement that touches the claim index runs on `db`'s one
    // backend, whose counts `pages_read` flushes: work done on another
    // connection could flush its counts late, inside a measurement (seen
    // under the full suite's load: 105 pages "read" by a claim from the head).
    let db = qbridge_connection(&pool).await;
    insert(&db, 20_000, 0, "now() - interval '1 hour'").await;
    assert_eq!(claim_from(&db, 20_000, None).await.jobs.len(), 20_000);
    let (first_new, _) = insert(&db, 100, 0, "now()").await;
    let first = claim_from(&db, 10, None).await;
    assert_eq!(ids(&first), (first_new..first_new + 10).collect::<Vec<_>>());
    let head = first.head.expect("a claim that took jobs has a head");

    let (from_start, by_full_walk) = pages_read(&pool, &db, None).await;
    let (from_head, by_head_walk) = pages_read(&pool, &db, Some(head)).await;
    db.close().await;

    assert_eq!(
        ids(&by_full_walk),
        (first_new + 10..first_new + 20).collect::<Vec<_>>()
    );
    assert_eq!(
        ids(&by_head_walk),
        (first_new + 20..first_new + 30).collect::<Vec<_>>()
    );
    assert!(
        from_start >= 50,
        "a walk from the start read only {from_start} pages past 20,000 claimed entries: the counters measured nothing"
    );
    assert!(
        from_head <= 10,
        "a claim from the head read {from_head} claim-index pages (from the start: {from_start})"
    );
}

/// From a head of priority 0: a job of a higher priority comes first however
/// long ago it was due, then the head's priority from the head on (less the
/// margin for slow commits), then lower priorities. A job of the head's
/// priority due long before it is not taken; the next walk from the start
/// takes it.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_claim_from_the_head_keeps_claim_order_and_a_full_walk_finds_what_is_behind(
    pool: PgPool,
) {
    let (behind, _) = insert(&pool, 1, 0, "now() - interval '1 hour'").await;
    let (at_head, head_due) = insert(&pool, 1, 0, "now() - interval '1 minute'").await;
    let (within_margin, _) = insert(
        &pool,
        1,
        0,
        "now() - interval '1 minute' - interval '100 milliseconds'",
    )
    .await;
    let (after, _) = insert(&pool, 1, 0, "now() - interval '30 seconds'").await;
    let (higher, _) = insert(&pool, 1, 5, "now() - interval '1 hour'").await;
    let (lower, _) = insert(&pool, 1, -1, "now() - interval '1 hour'").await;
    insert(&pool, 1, 0, "now() + interval '1 hour'").await;

    let head = ClaimHead {
        priority: 0,
        run_at: head_due,
    };
    let from_head = claim_from(&pool, 10, Some(head)).await;
    assert_eq!(
        ids(&from_head),
        vec![higher, within_margin, at_head, after, lower],
        "claim order from the head"
    );
    assert_eq!(
        from_head.head,
        Some(ClaimHead {
            priority: 5,
            run_at: from_head.jobs[0].run_at
        })
    );
    assert_eq!(ids(&claim_from(&pool, 10, None).await), vec![behind]);
}

/// A claim from the head stops at its limit within the first walk it needs:
/// it locks no lower-priority job it does not take.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_claim_from_the_head_takes_its_limit_in_claim_order(pool: PgPool) {
    let (first, due) = insert(&pool, 5, 0, "now() - interval '1 minute'").await;
    let (lower, _) = insert(&pool, 5, -1, "now() - interval '1 minute'").await;
    let head = ClaimHead {
        priority: 0,
        run_at: due,
    };
    let taken = claim_from(&pool, 3, Some(head)).await;
    assert_eq!(ids(&taken), (first..first + 3).collect::<Vec<_>>());
    assert!(taken.more, "a full claim says there may be more");
    let rest = claim_from(&pool, 4, Some(head)).await;
    assert_eq!(ids(&rest), vec![first + 3, first + 4, lower, lower + 1]);
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.jobs WHERE state = 'ready'"
        )
        .await,
        3
    );
}

/// A worker pool draining a backlog claims from the head. A job due an hour
/// before that backlog, enqueued once the pool is draining, still runs while
/// the backlog is far from drained: one of the pool's claimers walks from
/// the start every `FULL_WALK_EVERY`. (Claims from the head alone would leave it until
/// the backlog was gone and a claim came back empty.)
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_job_due_behind_the_head_runs_while_the_pool_drains_a_backlog(pool: PgPool) {
    const BACKLOG: i64 = 50_000;
    insert(&pool, BACKLOG, 0, "now()").await;
    let running = RunningPool::start(&pool, PoolBuilder::new("q").concurrency(8).build());
    support::wait_for(
        "the pool to start draining",
        Duration::from_secs(30),
        || {
            let pool = &pool;
            async move { support::jobs(pool).await < BACKLOG - 100 }
        },
    )
    .await;
    let (late, _) = insert(&pool, 1, 0, "now() - interval '1 hour'").await;
    let took = support::wait_for("the late job to run", Duration::from_secs(60), || {
        let pool = &pool;
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM qbridge.jobs WHERE id = $1")
                .bind(late)
                .fetch_one(pool)
                .await
                .expect("count")
                == 0
        }
    })
    .await;
    let left = support::count(
        &pool,
        "SELECT count(*) FROM qbridge.jobs WHERE state = 'ready'",
    )
    .await;
    running.stop().await;
    assert!(
        left > 0,
        "the late job ran only once the backlog was gone ({took:?}); a walk from the start comes every {FULL_WALK_EVERY:?}"
    );
}
