//! Worker pool leases: heartbeats keep a long job's lease alive against the
//! reaper, and an attempt whose lease is taken away is cancelled and its
//! result discarded.

use std::time::Duration;

use qbridge::queue::NewJob;
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::support::{self, PoolBuilder, RunningPool};

/// A handler running 2.5 s under a 1 s lease, with a reaper passing all the
/// time: heartbeats keep the lease, so the job runs once and completes.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn heartbeat_keeps_a_long_job_alive(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs");
    let id = support::enqueue_ids(&pool, &[NewJob::new("long", json!({}))]).await[0];
    let cfg = PoolBuilder::new("long")
        .lease(Duration::from_secs(1))
        .handler(support::sh(
            "echo \"$QBRIDGE_ATTEMPT\" >> \"$1\"; sleep 2.5",
            &[log.to_str().unwrap()],
        ))
        .build();
    let running = RunningPool::start(&pool, cfg);

    let stop = CancellationToken::new();
    let reaper_task = support::reap_until(&pool, &stop);
    support::wait_for(
        "the long job to complete",
        Duration::from_secs(20),
        || async { support::jobs(&pool).await == 0 },
    )
    .await;
    stop.cancel();
    assert_eq!(
        reaper_task.await.unwrap(),
        0,
        "the reaper took a heartbeating job"
    );
    let (_, report) = running.stop().await;
    assert_eq!((report.completed, report.lost_lease), (1, 0));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "1\n",
        "job {id} ran more than once"
    );
}

/// Whether process `pid` is gone (or a zombie waiting to be reaped).
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Someone else takes the lease (as a re-claim after reaping would): the next
/// heartbeat finds it lost, the handler is killed, and nothing is written for
/// the lost attempt.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn lost_lease_cancels_the_handler(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let done_file = dir.path().join("done");
    let id = support::enqueue_ids(&pool, &[NewJob::new("steal", json!({}))]).await[0];
    let cfg = PoolBuilder::new("steal")
        .lease(Duration::from_secs(1))
        .handler(support::sh(
            "echo $$ > \"$1\"; sleep 5 && echo done > \"$2\"",
            &[pid_file.to_str().unwrap(), done_file.to_str().unwrap()],
        ))
        .build();
    let running = RunningPool::start(&pool, cfg);
    support::wait_for("the handler to start", Duration::from_secs(10), || async {
        std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n'))
    })
    .await;
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    let stolen: i64 = sqlx::query_scalar(
        "UPDATE qbridge.jobs SET lease = nextval('qbridge.lease_seq'), locked_by = 'thief' \
          WHERE id = $1 AND state = 'running' RETURNING lease",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    // Well before the handler's own 5 s: the heartbeat (every lease/3) cancels it.
    support::wait_for(
        "the handler to be killed",
        Duration::from_secs(3),
        || async { process_gone(pid) },
    )
    .await;
    let (_, report) = running.stop().await;
    assert!(!done_file.exists(), "the cancelled handler ran to the end");
    assert_eq!((report.completed, report.retried, report.dead), (0, 0, 0));
    // The thief's attempt is untouched: still running under its lease.
    let row: (String, i64, String) =
        sqlx::query_as("SELECT state, lease, locked_by FROM qbridge.jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(row, ("running".into(), stolen, "thief".into()));
}
