//! A Celery task a worker's channel took off the list in `shadow` (kombu
//! keeps it in its `unacked` hash) and gives back after the flip with
//! kombu's own restore, on another connection than the one that took it:
//! WATCH `unacked`, HGET of its entry, then MULTI, ZREM, HDEL of the entry,
//! RPUSH of the task, EXEC. The push is answered by the proxy in
//! `postgres_only`; before the fix it was held as a re-push of a mirrored
//! key for ever (kombu's channel restores on its own client, not on the
//! connection whose BRPOP took the task).

use std::time::Duration;

use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};

use qbridge::model::Phase;

use super::fleet::{fleet_env, produce};
use super::ProxySide;
use crate::servers::ThrowawayRedis;
use crate::support;

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_task_kombu_restores_from_its_unacked_hash_after_the_flip_runs_live(pool: PgPool) {
    // kombu's `unacked` hash is one per Redis database: a Redis of its own.
    let redis = ThrowawayRedis::start();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (route, queue) = (format!("kr{}", &id[..12]), format!("qbt_celery_{id}"));
    let ledger = format!("qbt:{id}:ledger");
    let toml = format!(
        "[[routes]]\nname = \"{route}\"\nredis_key = \"{queue}\"\nqueue = \"{route}\"\n\
         format = \"celery\"\nphase = \"shadow\"\nredis_side = \"fleet\"\n"
    );
    let side = ProxySide::start_on(&pool, &toml, &redis.url()).await;
    let task = produce(&side.url(), &queue, &ledger, 1, None)
        .await
        .remove(0);
    support::wait_for_count(
        &pool,
        "the task mirrored",
        &format!("SELECT count(*) FROM qbridge.job_keys WHERE queue = '{route}'"),
        1,
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let mut cmd = tokio::process::Command::new(support::python());
    cmd.arg("celery_fleet.py")
        .arg("take_and_restore")
        .arg(&go)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    fleet_env(&mut cmd, &side.url(), &queue, &ledger);
    let mut worker = cmd.spawn().expect("python runs");
    let mut lines = BufReader::new(worker.stdout.take().unwrap()).lines();
    let taken = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the worker took the task within 30 s")
        .unwrap()
        .expect("the task id");
    assert_eq!(taken, task);

    side.force_to(&route, &redis.url(), Phase::PostgresOnly)
        .await;
    std::fs::write(&go, b"").unwrap();
    let restored = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("restored within 30 s")
        .unwrap();
    assert_eq!(restored.as_deref(), Some("restored"));
    assert!(worker.wait().await.unwrap().success());

    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.jobs WHERE queue = $1 AND key = $2 AND copy = 'live'",
    )
    .bind(&route)
    .bind(&task)
    .fetch_one(&pool)
    .await
    .unwrap();
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.held_repushes WHERE queue = $1 AND key = $2",
    )
    .bind(&route)
    .bind(&task)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (live, held),
        (1, 0),
        "restored by kombu: runs live, not held"
    );
    side.stop().await;
}
