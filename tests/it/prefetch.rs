//! Prefetch (`worker::prefetch`): jobs a pool claims beyond its free handlers
//! are heartbeated while they wait, handed back with their attempt refunded
//! when they wait too long or the pool stops, and run exactly once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use qbridge::queue::reaper;
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

fn logging_handler(log: &std::path::Path, sleep: &str) -> qbridge::config::HandlerConfig {
    support::sh(
        &format!(
            "printf '%s %s\\n' \"$QBRIDGE_JOB_ID\" \"$QBRIDGE_ATTEMPT\" >> \"$1\"; sleep {sleep}"
        ),
        &[log.to_str().unwrap()],
    )
}

/// One slow handler and a prefetch window far longer than the hold: most
/// claimed jobs wait past it and are handed back, again and again, under a
/// 1 s lease with the reaper passing all the time. Every job still runs
/// exactly once, on attempt 1 (hand-backs refund the attempt), and the
/// reaper never takes a held job (the heartbeat covers them).
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn jobs_held_past_the_hold_are_handed_back_refunded_and_run_once(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs");
    let ids = support::enqueue_ids(&pool, &support::plain_jobs("pf", 40)).await;
    let cfg = PoolBuilder::new("pf")
        .concurrency(1)
        .prefetch(Duration::from_secs(10), 100)
        .lease(Duration::from_secs(1))
        .handler(logging_handler(&log, "0.1"))
        .build();
    let running = RunningPool::start(&pool, cfg);
    let stop = CancellationToken::new();
    let reaper_task = {
        let (db, stop) = (pool.clone(), stop.clone());
        tokio::spawn(async move {
            let mut requeued = 0;
            while !stop.is_cancelled() {
                requeued += reaper::run_once(&db, 100).await.expect("reap").requeued;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            requeued
        })
    };
    let most_claimed = AtomicI64::new(0);
    let (db, most) = (&pool, &most_claimed);
    support::wait_for("every job to run", Duration::from_secs(60), || async move {
        let running = support::count(
            db,
            "SELECT count(*) FROM qbridge.jobs WHERE state = 'running'",
        )
        .await;
        most.fetch_max(running, Ordering::Relaxed);
        support::jobs(db).await == 0
    })
    .await;
    let most_claimed = most_claimed.into_inner();
    stop.cancel();
    let requeued = reaper_task.await.unwrap();
    let (report, completer) = running.stop().await;

    assert!(most_claimed > 1, "never claimed beyond the one handler");
    assert!(report.prefetch_handed_back > 0, "{report:?}");
    assert_eq!(requeued, 0, "the reaper took a held job");
    assert_eq!((completer.completed, completer.lost_lease), (40, 0));
    let by_job = runs(&log);
    for id in &ids {
        assert_eq!(by_job.get(id), Some(&vec![1]), "job {id}: runs by attempt");
    }
}

/// A pool stopped with jobs held hands them back at once (not after their
/// leases expire), unstarted and with the attempt refunded; a later pool
/// runs them, each exactly once, on attempt 1.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn held_jobs_are_handed_back_at_shutdown_and_run_once_later(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs");
    let ids = support::enqueue_ids(&pool, &support::plain_jobs("pf", 300)).await;
    let slow = PoolBuilder::new("pf")
        .concurrency(2)
        .prefetch(Duration::from_secs(10), 300)
        .lease(Duration::from_secs(60))
        .handler(logging_handler(&log, "0.05"))
        .build();
    let first = RunningPool::start(&pool, slow);
    support::wait_for("jobs to be held", Duration::from_secs(20), || async {
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.jobs WHERE state = 'running'",
        )
        .await
            > 2
    })
    .await;
    let (report, _) = first.stop().await;
    assert!(report.prefetch_handed_back > 0, "{report:?}");
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.jobs WHERE state = 'running' OR attempts <> 0",
        )
        .await,
        0,
        "a held job was left claimed or charged an attempt"
    );
    let ran_first = runs(&log).len();
    assert!(ran_first < ids.len(), "everything ran before the stop");

    let rest = PoolBuilder::new("pf")
        .concurrency(8)
        .handler(logging_handler(&log, "0"))
        .build();
    let second = RunningPool::start(&pool, rest);
    support::wait_for("the rest to run", Duration::from_secs(60), || async {
        support::jobs(&pool).await == 0
    })
    .await;
    second.stop().await;
    let by_job = runs(&log);
    for id in &ids {
        assert_eq!(by_job.get(id), Some(&vec![1]), "job {id}: runs by attempt");
    }
}
