//! Fencing: a worker whose lease expired and was reaped can change nothing; the
//! reaper racing completions never loses or doubles a job; the reaper
//! dead-letters a job whose last attempt expired.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use qbridge::queue::{self, fence, reaper, JobRef, NewJob};
use serde_json::json;
use sqlx::PgPool;

use crate::support::{self, claim_req};

/// Waits until every running job's lease has expired by the database clock.
async fn wait_expired(pool: &PgPool) {
    support::wait_for("leases to expire", Duration::from_secs(10), || async {
        support::count(
            pool,
            "SELECT count(*) FROM qbridge.jobs WHERE state = 'running' AND lease_until >= now()",
        )
        .await
            == 0
    })
    .await;
}

/// Worker A's lease expires, the reaper requeues the job and worker B claims
/// it. Everything A tries afterwards is rejected as a lost lease; B's calls apply.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn stale_worker_is_fenced_out_after_reaping(pool: PgPool) {
    let id = support::enqueue_ids(&pool, &[NewJob::new("q", json!({"x": 1}))]).await[0];
    let a = support::claim(&pool, "q", 1, Duration::from_millis(1)).await;
    assert_eq!(a.len(), 1);
    let a = a[0].job_ref();
    wait_expired(&pool).await;

    let reaped = reaper::run_once(&pool, 100).await.expect("reap");
    assert!(reaped.led);
    assert_eq!(reaped.requeued, 1);

    // Requeued but not yet claimed again: A is already fenced out.
    let r = fence::heartbeat(&pool, &[a], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!((r.applied.len(), r.lost.clone()), (0, vec![a]));
    let r = fence::complete(&pool, &[a], false).await.unwrap();
    assert_eq!(r.lost, vec![a]);
    assert_eq!(
        support::jobs(&pool).await,
        1,
        "a stale complete deleted a requeued job"
    );

    let b = support::claim(&pool, "q", 1, Duration::from_secs(60)).await;
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].id, id);
    assert_eq!(b[0].attempts, 2);
    assert!(
        b[0].lease > a.lease,
        "lease token went back: {} <= {}",
        b[0].lease,
        a.lease
    );
    let b = b[0].job_ref();

    // A wakes up and tries everything: all rejected, nothing changes.
    let before: (String, i64, i32) =
        sqlx::query_as("SELECT state, lease, attempts FROM qbridge.jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    let r = fence::heartbeat(&pool, &[a], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(r.lost, vec![a], "stale heartbeat applied");
    assert!(r.applied.is_empty());
    let r = fence::complete(&pool, &[a], false).await.unwrap();
    assert_eq!(r.lost, vec![a], "stale complete applied");
    assert!(r.applied.is_empty());
    let r = fence::retry(&pool, &[(a, Duration::ZERO, "stale".into())])
        .await
        .unwrap();
    assert_eq!(r.lost, vec![a], "stale retry applied");
    let r = fence::dead_letter(&pool, &[(a, "stale".into())])
        .await
        .unwrap();
    assert_eq!(r.lost, vec![a], "stale dead-letter applied");
    let r = fence::release(&pool, &[a], true).await.unwrap();
    assert_eq!(r.lost, vec![a], "stale release applied");
    let after: (String, i64, i32) =
        sqlx::query_as("SELECT state, lease, attempts FROM qbridge.jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(before, after);
    assert_eq!(support::dead(&pool).await, 0);

    // B, the current lease holder, is applied.
    let r = fence::heartbeat(&pool, &[b], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!((r.applied, r.lost), (vec![id], vec![]));
    let r = fence::complete(&pool, &[b], false).await.unwrap();
    assert_eq!((r.applied, r.lost), (vec![id], vec![]));
    assert_eq!(support::jobs(&pool).await, 0);
    // And a second complete of the same lease is a lost lease, not a double.
    let r = fence::complete(&pool, &[b], false).await.unwrap();
    assert_eq!(r.lost, vec![b]);
}

/// One completer batch can hold a stale attempt of a job next to its current
/// one, in either order; only the current one completes it, and the stale
/// one is reported lost. Beside them a job claimed by someone else with the
/// stale attempt's lease number is untouched (the lease is matched per job).
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_batch_with_a_stale_and_the_current_attempt_completes_once(pool: PgPool) {
    support::enqueue_ids(&pool, &[NewJob::new("q", json!({"x": 1}))]).await;
    let stale = support::claim(&pool, "q", 1, Duration::from_millis(1)).await[0].job_ref();
    wait_expired(&pool).await;
    assert_eq!(reaper::run_once(&pool, 100).await.unwrap().requeued, 1);
    let current = support::claim(&pool, "q", 1, Duration::from_secs(60)).await[0].job_ref();
    // Another job, claimed now; a forged attempt of it under the stale lease.
    support::enqueue_ids(&pool, &[NewJob::new("q", json!({"x": 2}))]).await;
    let other = support::claim(&pool, "q", 1, Duration::from_secs(60)).await[0].job_ref();
    let forged = JobRef {
        id: other.id,
        lease: stale.lease,
    };
    for batch in [[stale, current, forged], [current, stale, forged]] {
        let r = fence::complete(&pool, &batch, false).await.unwrap();
        if r.applied.is_empty() {
            // The first order completed it; the second finds it gone.
            assert_eq!(r.lost.len(), 3, "{r:?}");
            continue;
        }
        assert_eq!(r.applied, vec![current.id], "{r:?}");
        assert_eq!(r.lost, vec![stale, forged], "{r:?}");
    }
    assert_eq!(support::jobs(&pool).await, 1, "the other job still runs");
}

/// Workers claim with a tiny lease and complete after a pause (every other
/// batch after its lease expired), while a reaper loops and the workers
/// re-claim what it requeued. Every job is completed exactly once (one applied
/// complete per id, by its newest attempt), no stale complete is applied, no
/// job is lost or left behind.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn reaper_racing_completions_never_loses_or_doubles(pool: PgPool) {
    const N: usize = 600;
    let ids = support::enqueue_ids(&pool, &support::plain_jobs("race", N)).await;
    let db = support::extra_pool(&pool, 6).await;

    let claimed: Arc<Mutex<Vec<JobRef>>> = Arc::default();
    let applied: Arc<Mutex<Vec<JobRef>>> = Arc::default();
    let lost: Arc<Mutex<Vec<JobRef>>> = Arc::default();
    let stop = tokio_util::sync::CancellationToken::new();

    let reaper_task = {
        let (db, stop) = (db.clone(), stop.clone());
        tokio::spawn(async move {
            let mut requeued = 0;
            while !stop.is_cancelled() {
                requeued += reaper::run_once(&db, 1000).await.expect("reap").requeued;
                tokio::task::yield_now().await;
            }
            requeued
        })
    };
    let mut workers = Vec::new();
    for w in 0..4u64 {
        let (db, stop) = (db.clone(), stop.clone());
        let (claimed, applied, lost) = (claimed.clone(), applied.clone(), lost.clone());
        workers.push(tokio::spawn(async move {
            let queues = vec!["race".to_string()];
            let worker = format!("w{w}");
            let mut round = 0u64;
            while !stop.is_cancelled() {
                round += 1;
                let jobs = queue::claim(
                    &db,
                    &claim_req(&queues, 20, &worker, Duration::from_millis(15)),
                )
                .await
                .expect("claim");
                if jobs.is_empty() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                claimed.lock().unwrap().extend(support::refs(&jobs));
                // Simulated work: every other batch overruns its lease.
                let work = if (round + w).is_multiple_of(2) { 40 } else { 1 };
                tokio::time::sleep(Duration::from_millis(work)).await;
                let r = fence::complete(&db, &support::refs(&jobs), false)
                    .await
                    .expect("complete");
                let applied_ids: HashSet<i64> = r.applied.iter().copied().collect();
                applied.lock().unwrap().extend(
                    jobs.iter()
                        .map(|j| j.job_ref())
                        .filter(|r| applied_ids.contains(&r.id)),
                );
                lost.lock().unwrap().extend(r.lost);
            }
        }));
    }
    support::wait_for(
        "every job to be completed",
        Duration::from_secs(60),
        || async { support::jobs(&pool).await == 0 },
    )
    .await;
    stop.cancel();
    for w in workers {
        w.await.expect("worker");
    }
    let requeued = reaper_task.await.expect("reaper");
    db.close().await;

    let claimed = claimed.lock().unwrap().clone();
    let applied = applied.lock().unwrap().clone();
    let lost = lost.lock().unwrap().clone();
    let mut newest: HashMap<i64, i64> = HashMap::new();
    for r in &claimed {
        let e = newest.entry(r.id).or_insert(r.lease);
        *e = (*e).max(r.lease);
    }
    let mut per_id: HashMap<i64, Vec<i64>> = HashMap::new();
    for r in &applied {
        per_id.entry(r.id).or_default().push(r.lease);
    }
    for id in &ids {
        let leases = per_id.get(id).cloned().unwrap_or_default();
        assert_eq!(
            leases.len(),
            1,
            "job {id} completed under leases {leases:?}"
        );
        // Only the newest attempt may complete: a stale attempt's complete
        // would have deleted a job someone else was running.
        assert_eq!(
            leases[0], newest[id],
            "job {id} completed by a stale attempt"
        );
    }
    assert_eq!(applied.len(), N);
    // Every rejected complete was of an attempt other than the one applied.
    for l in &lost {
        assert_ne!(
            per_id[&l.id],
            vec![l.lease],
            "attempt {l:?} was both lost and applied"
        );
    }
    assert!(
        requeued > 0,
        "the reaper never requeued anything: the race was not exercised"
    );
    assert!(
        !lost.is_empty(),
        "no stale complete was rejected: the race was not exercised"
    );
    assert_eq!(support::dead(&pool).await, 0);
}

/// A job whose last attempt's lease expires goes to the dead-letter table.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn reaper_dead_letters_an_expired_last_attempt(pool: PgPool) {
    let ids = support::enqueue_ids(
        &pool,
        &[
            NewJob::new("q", json!(1)).with_max_attempts(1),
            NewJob::new("q", json!(2)).with_max_attempts(2),
        ],
    )
    .await;
    let claimed = support::claim(&pool, "q", 10, Duration::from_millis(1)).await;
    assert_eq!(claimed.len(), 2);
    wait_expired(&pool).await;
    let r = reaper::run_once(&pool, 100).await.unwrap();
    assert_eq!((r.requeued, r.dead_lettered), (1, 1));
    let (dead_id, err): (i64, String) =
        sqlx::query_as("SELECT id, last_error FROM qbridge.jobs_dead")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(dead_id, ids[0]);
    assert!(err.contains("lease expired"), "{err}");
    let (id, state): (i64, String) = sqlx::query_as("SELECT id, state FROM qbridge.jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!((id, state.as_str()), (ids[1], "ready"));

    // A job with a live lease is never touched.
    let live = support::claim(&pool, "q", 1, Duration::from_secs(60)).await;
    assert_eq!(live.len(), 1);
    let r = reaper::run_once(&pool, 100).await.unwrap();
    assert_eq!((r.requeued, r.dead_lettered), (0, 0));
}

/// Only one reaper leads at a time: a pass while another holds the lock does nothing.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn one_reaper_at_a_time(pool: PgPool) {
    support::enqueue_ids(&pool, &support::plain_jobs("q", 3)).await;
    support::claim(&pool, "q", 3, Duration::from_millis(1)).await;
    wait_expired(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    let led = qbridge::queue::leader::try_lead(&mut tx, qbridge::queue::leader::REAPER)
        .await
        .unwrap()
        .expect("the lock is free");
    let r = reaper::run_once(&pool, 100).await.unwrap();
    assert!(!r.led);
    assert_eq!(r.requeued, 0);
    led.done();
    tx.rollback().await.unwrap();
    let r = reaper::run_once(&pool, 100).await.unwrap();
    assert!(r.led);
    assert_eq!(r.requeued, 3);
}
