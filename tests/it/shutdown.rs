//! Graceful shutdown: stopping a runtime mid-work loses no completion (every job
//! whose handler finished is gone from the table), leaves nothing `running`,
//! and hands back jobs whose handlers outlive the deadline.

use std::collections::HashSet;
use std::time::Duration;

use qbridge::app::{Runtime, RuntimeReport};
use qbridge::config::{Config, Overrides};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::support;

fn runtime_config(pool: &PgPool, script: &str, log: &str, deadline: &str) -> Config {
    let toml = format!(
        r#"
        max_connections = 4
        shutdown_deadline = "{deadline}"
        [[pools]]
        queues = ["work"]
        concurrency = 3
        poll_interval = "100ms"
        handler = {{ type = "command", program = "/bin/sh", args = ["-c", {script:?}, "sh", {log:?}] }}
        "#
    );
    Config::from_toml(
        &toml,
        &Overrides {
            database_url: Some(support::db_url(pool)),
            ..Overrides::default()
        },
    )
    .expect("config")
}

async fn start(config: Config) -> (CancellationToken, JoinHandle<RuntimeReport>) {
    let mut rt = Runtime::build(config).await.expect("runtime builds");
    rt.serve_http = false;
    rt.gauge_interval = Duration::from_secs(3600);
    let stop = CancellationToken::new();
    let token = stop.clone();
    let handle =
        tokio::spawn(async move { rt.run_until_stopped(token).await.expect("runtime run") });
    (stop, handle)
}

fn done_ids(log: &std::path::Path) -> Vec<i64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn shutdown_loses_no_completion(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("done");
    let ids = support::enqueue_ids(&pool, &support::plain_jobs("work", 30)).await;
    // The handler records that it started, then, as its last act, that it
    // finished. "Started" is read from the handler, not from the row: a job
    // the pool prefetched is `running` in the table before any handler has it.
    let started_log = dir.path().join("done.started");
    let cfg = runtime_config(
        &pool,
        "echo \"$QBRIDGE_JOB_ID\" >> \"$1.started\"; sleep 0.2; echo \"$QBRIDGE_JOB_ID\" >> \"$1\"",
        log.to_str().unwrap(),
        "30s",
    );
    let (stop, handle) = start(cfg).await;
    support::wait_for("a few jobs to finish", Duration::from_secs(20), || async {
        done_ids(&log).len() >= 4
    })
    .await;
    // Stop while handlers are mid-run.
    let waiting = std::time::Instant::now();
    let running: Vec<i64> = loop {
        let finished: HashSet<i64> = done_ids(&log).into_iter().collect();
        let mid_run: Vec<i64> = done_ids(&started_log)
            .into_iter()
            .filter(|id| !finished.contains(id))
            .collect();
        if !mid_run.is_empty() {
            break mid_run;
        }
        assert!(
            waiting.elapsed() < Duration::from_secs(20),
            "no job was running"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(30), handle)
        .await
        .expect("runtime stopped")
        .unwrap();

    let done = done_ids(&log);
    let done_set: HashSet<i64> = done.iter().copied().collect();
    assert_eq!(done.len(), done_set.len(), "a job ran twice: {done:?}");
    let left: Vec<(i64, String, i32)> =
        sqlx::query_as("SELECT id, state, attempts FROM qbridge.jobs")
            .fetch_all(&pool)
            .await
            .unwrap();
    for (id, state, attempts) in &left {
        assert!(
            !done_set.contains(id),
            "job {id} finished but its completion was lost"
        );
        assert_eq!(state, "ready", "job {id} left {state}");
        assert_eq!(*attempts, 0, "job {id} was started but not finished");
    }
    assert_eq!(done.len() + left.len(), ids.len(), "jobs went missing");
    for id in &running {
        assert!(
            done_set.contains(id),
            "job {id} was running at shutdown but did not finish"
        );
    }
    let started = done_ids(&started_log);
    assert_eq!(
        started.len(),
        done.len(),
        "a handler started but did not finish: started {started:?}, done {done:?}"
    );
    assert_eq!(report.completer.completed, done.len() as u64);
    assert_eq!(report.handed_back, 0);
    assert_eq!(support::dead(&pool).await, 0);
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn shutdown_deadline_hands_back_running_jobs(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("done");
    let ids = support::enqueue_ids(&pool, &support::plain_jobs("work", 2)).await;
    let cfg = runtime_config(
        &pool,
        "sleep 30; echo \"$QBRIDGE_JOB_ID\" >> \"$1\"",
        log.to_str().unwrap(),
        "300ms",
    );
    let (stop, handle) = start(cfg).await;
    support::wait_for(
        "both jobs to be running",
        Duration::from_secs(20),
        || async {
            support::count(
                &pool,
                "SELECT count(*) FROM qbridge.jobs WHERE state = 'running'",
            )
            .await
                == 2
        },
    )
    .await;
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(20), handle)
        .await
        .expect("runtime stopped after its deadline")
        .unwrap();
    assert_eq!(report.handed_back, 2);
    assert!(done_ids(&log).is_empty());
    let left: Vec<(i64, String, Option<String>)> =
        sqlx::query_as("SELECT id, state, locked_by FROM qbridge.jobs ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(left.len(), 2);
    for (i, (id, state, locked_by)) in left.iter().enumerate() {
        assert_eq!(*id, ids[i]);
        assert_eq!(state, "ready", "job {id} was not handed back");
        assert!(locked_by.is_none());
    }
}
