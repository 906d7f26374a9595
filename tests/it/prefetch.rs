//! Prefetch (`worker::prefetch`): jobs a pool claims beyond its free handlers
//! are heartbeated while they wait, handed back with their attempt refunded
//! when they wait too long or the pool stops, never held on their last
//! attempt, and run exactly once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use qbridge::config::{HandlerConfig, MAX_PREFETCH_WINDOW};
use qbridge::queue::NewJob;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::support::{self, PoolBuilder, RunningPool};

/// Each line the handler wrote: "job-id attempt".
fn runs(log: &std::path::Path) -> HashMap<i64, Vec<i32>> {
    let mut by_job: HashMap<i64, Vec<i32>> = HashMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let (id, attempt) = line.split_once(' ').expect("id attempt");
        by_job
            .entry(id.parse().unwrap())
            .or_default()
            .push(attempt.parse().unwrap());
    }
    by_job
}

/// Logs "id attempt"; jobs with an id above `fast_until` then sleep `sleep`
/// (handlers that slow down after the pool measured its start rate).
fn slowing_handler(log: &std::path::Path, fast_until: i64, sleep: &str) -> HandlerConfig {
    let script = format!(
        r#"printf '%s %s\n' "$QBRIDGE_JOB_ID" "$QBRIDGE_ATTEMPT" >> "$1"; if [ "$QBRIDGE_JOB_ID" -gt "$2" ]; then sleep {sleep}; fi"#
    );
    support::sh(&script, &[log.to_str().unwrap(), &fast_until.to_string()])
}

/// Waits until the queue is empty; returns the most jobs seen claimed at once.
async fn drain(pool: &PgPool) -> i64 {
    let most = AtomicI64::new(0);
    let (db, seen) = (pool, &most);
    support::wait_for("every job to run", Duration::from_secs(60), || async move {
        let running = support::count(
            db,
            "SELECT count(*) FROM qbridge.jobs WHERE state = 'running'",
        )
        .await;
        seen.fetch_max(running, Ordering::Relaxed);
        support::jobs(db).await == 0
    })
    .await;
    most.into_inner()
}

/// Stops `running` once its slow jobs (past the first 100) have started and
/// checks that it left no job claimed or charged an attempt: what it held
/// went back unstarted, attempt refunded.
async fn stop_once_slow(
    pool: &PgPool,
    running: RunningPool,
    log: &std::path::Path,
) -> qbridge::worker::pool::PoolReport {
    // The first slow job has started: it came with the prefetch the fast
    // ones' rate sized, and the rest of that claim is held. (A count of
    // running rows would not say so: finished jobs stay `running` until the
    // completer's batch lands.)
    support::wait_for(
        "the slow jobs to start",
        Duration::from_secs(20),
        || async { runs(log).len() > 100 },
    )
    .await;
    let (report, _) = running.stop().await;
    assert_eq!(
        support::count(
            pool,
            "SELECT count(*) FROM qbridge.jobs WHERE state = 'running' OR attempts <> 0",
        )
        .await,
        0,
        "a held job was left claimed or charged an attempt"
    );
    report
}

fn assert_each_ran_once_on_attempt_1(log: &std::path::Path, ids: &[i64]) {
    let by_job = runs(log);
    for id in ids {
        assert_eq!(by_job.get(id), Some(&vec![1]), "job {id}: runs by attempt");
    }
}

/// One handler, fast for the first 50 jobs (the start rate is measured on
/// them, so the pool prefetches the rest), then 0.3 s a job: the held jobs
/// wait past the hold and are handed back, again and again, under a 1 s
/// lease with the reaper passing all the time. Every job still runs exactly
/// once, on attempt 1 (hand-backs refund the attempt), and the reaper never
/// takes a held job (the heartbeat covers them).
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn jobs_held_past_the_hold_are_handed_back_refunded_and_run_once(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs");
    let ids = support::enqueue_ids(&pool, &support::plain_jobs("pf", 70)).await;
    let cfg = PoolBuilder::new("pf")
        .concurrency(1)
        .prefetch(MAX_PREFETCH_WINDOW, 100)
        .lease(Duration::from_secs(1))
        .handler(slowing_handler(&log, ids[49], "0.3"))
        .build();
    let running = RunningPool::start(&pool, cfg);
    let stop = CancellationToken::new();
    let reaper_task = support::reap_until(&pool, &stop);
    let most_claimed = drain(&pool).await;
    stop.cancel();
    let requeued = reaper_task.await.unwrap();
    let (report, completer) = running.stop().await;

    assert!(most_claimed > 1, "never claimed beyond the one handler");
    assert!(report.prefetch_handed_back > 0, "{report:?}");
    assert_eq!(requeued, 0, "the reaper took a held job");
    assert_eq!((completer.completed, completer.lost_lease), (70, 0));
    assert_each_ran_once_on_attempt_1(&log, &ids);
}

/// A pool stopped with jobs held hands them back at once (not after their
/// leases expire), unstarted and with the attempt refunded; a later pool
/// runs them, each exactly once, on attempt 1.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn held_jobs_are_handed_back_at_shutdown_and_run_once_later(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs");
    let ids = support::enqueue_ids(&pool, &support::plain_jobs("pf", 300)).await;
    // Fast at first (the rate is measured), then 0.2 s a job: jobs are held.
    let slow = PoolBuilder::new("pf")
        .concurrency(2)
        .prefetch(MAX_PREFETCH_WINDOW, 300)
        .lease(Duration::from_secs(60))
        .handler(slowing_handler(&log, ids[99], "0.2"))
        .build();
    let report = stop_once_slow(&pool, RunningPool::start(&pool, slow), &log).await;
    assert!(report.prefetch_handed_back > 0, "{report:?}");
    assert!(
        runs(&log).len() < ids.len(),
        "everything ran before the stop"
    );

    let rest = PoolBuilder::new("pf")
        .concurrency(8)
        .handler(slowing_handler(&log, i64::MAX, "0"))
        .build();
    let second = RunningPool::start(&pool, rest);
    drain(&pool).await;
    second.stop().await;
    assert_each_ran_once_on_attempt_1(&log, &ids);
}

/// The same with several claims in flight (concurrency 8, batch 4: two
/// claimers, each holding its own prefetch): at shutdown each claimer hands
/// back what it holds, and every job still runs exactly once, on attempt 1.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn several_claimers_hand_back_what_they_hold_and_each_job_runs_once(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs");
    let ids = support::enqueue_ids(&pool, &support::plain_jobs("pf", 300)).await;
    let slow = PoolBuilder::new("pf")
        .concurrency(8)
        .prefetch(MAX_PREFETCH_WINDOW, 4)
        .lease(Duration::from_secs(60))
        .handler(slowing_handler(&log, ids[99], "0.2"))
        .build();
    assert_eq!(qbridge::worker::pool::claims_in_flight(&slow), 2);
    stop_once_slow(&pool, RunningPool::start(&pool, slow), &log).await;
    let rest = PoolBuilder::new("pf")
        .concurrency(8)
        .prefetch(MAX_PREFETCH_WINDOW, 2)
        .handler(slowing_handler(&log, i64::MAX, "0"))
        .build();
    assert_eq!(
        qbridge::worker::pool::claims_in_flight(&rest),
        qbridge::worker::pool::MAX_CLAIMS_IN_FLIGHT
    );
    let second = RunningPool::start(&pool, rest);
    drain(&pool).await;
    second.stop().await;
    assert_each_ran_once_on_attempt_1(&log, &ids);
}

/// Jobs claimed on their last attempt are never held (should the process
/// die holding one, the reaper would dead-letter a job that never ran):
/// fast handlers, so held jobs would start within the window and none would
/// be handed back, yet claims' tails are; and the pause after such a claim
/// keeps the hand-backs to a few tails, not one per claim. Each job runs
/// once, none is dead-lettered.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn jobs_on_their_last_attempt_are_never_held(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs");
    let jobs: Vec<NewJob> = support::plain_jobs("pf", 400)
        .into_iter()
        .map(|mut j| {
            j.max_attempts = Some(1);
            j
        })
        .collect();
    let ids = support::enqueue_ids(&pool, &jobs).await;
    let cfg = PoolBuilder::new("pf")
        .concurrency(2)
        .prefetch(MAX_PREFETCH_WINDOW, 100)
        .handler(slowing_handler(&log, i64::MAX, "0"))
        .build();
    let running = RunningPool::start(&pool, cfg);
    drain(&pool).await;
    let (report, completer) = running.stop().await;
    assert_eq!((completer.completed, completer.dead), (400, 0));
    assert_eq!(support::dead(&pool).await, 0);
    assert_each_ran_once_on_attempt_1(&log, &ids);
    assert!(
        report.prefetch_handed_back > 0,
        "no last-attempt job was handed back: {report:?}"
    );
    assert!(
        report.prefetch_handed_back < 400,
        "tails handed back claim after claim: {report:?}"
    );
}
