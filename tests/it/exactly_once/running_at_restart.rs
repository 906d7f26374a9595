//! Redis restarted without persistence while qbridge's consumer ran a job:
//! the item, its inflight state and its running claim went with Redis while
//! the handler went on. Repair then found the job's mirror copy in no list,
//! took the restart as evidence and pushed the job back, and it ran a second
//! time. The consumer now writes what it runs into the new server (the
//! slot's keeper), so repair finds it held and a client's retry waits for
//! the run to end instead of running beside it.

use std::path::Path;
use std::time::Duration;

use super::process_rig::{OneRoute, ProcessRig};

const ROUTE: &str = "kept";
const LIST: &str = "qbt:kept:jobs";

fn config(format: &str, dir: &Path, redis_url: &str, proxy_port: u16) -> String {
    // The handler says it started, takes 12 s, and writes one line per run.
    OneRoute {
        name: ROUTE,
        list: LIST,
        format,
        script: "touch \"$1\"; sleep 12; echo run >> \"$2\"",
        args: vec![dir.join("started"), dir.join("ran")],
    }
    .config(dir, redis_url, proxy_port)
}

#[tokio::test]
async fn a_job_running_when_redis_restarts_is_neither_pushed_back_nor_run_again() {
    let rig = run_through_a_restart("json:/id", r#"{"id":"k1"}"#, Duration::from_secs(6)).await;
    // A client's retry of the job reaches the new Redis while it runs.
    let mut direct = rig.direct().await;
    let _: i64 = ::redis::cmd("LPUSH")
        .arg(LIST)
        .arg(r#"{"id":"k1"}"#)
        .query_async(&mut direct)
        .await
        .unwrap();
    settled_after_one_run(&rig, "k1").await;
}

/// The same for an item without an id, keyed by its content: the kept item
/// keeps the number its pop took.
#[tokio::test]
async fn an_identical_item_running_when_redis_restarts_runs_once() {
    let rig = run_through_a_restart("raw", "same bytes", Duration::from_secs(6)).await;
    let key: String = sqlx::query_scalar("SELECT key FROM qbridge.job_keys")
        .fetch_one(&rig.db)
        .await
        .unwrap();
    settled_after_one_run(&rig, &key).await;
}

/// Repair right after the restart, before the consumer had a beat to write
/// its item back: repair waits for the new server to settle, then finds it.
#[tokio::test]
async fn repair_right_after_a_restart_waits_for_the_running_items() {
    let rig = run_through_a_restart("json:/id", r#"{"id":"k1"}"#, Duration::ZERO).await;
    settled_after_one_run(&rig, "k1").await;
}

/// Pushes `item` through the proxy, restarts Redis while its handler runs,
/// and repairs `after` the restart: nothing may be pushed back.
async fn run_through_a_restart(format: &'static str, item: &str, after: Duration) -> ProcessRig {
    let mut rig = ProcessRig::start(|d, u, p| config(format, d, u, p)).await;
    rig.push_until_running(LIST, item).await;
    rig.redis.kill();
    rig.redis.resume();
    tokio::time::sleep(after).await;
    let report = rig.repair(ROUTE).await;
    assert_eq!(
        report["repair"]["repushed"], 0,
        "the job still running was pushed back: {report}"
    );
    rig
}

/// The run ends and the lists empty; the job's run is on record once and
/// its handler ran once.
async fn settled_after_one_run(rig: &ProcessRig, key: &str) {
    // Everything settles: the run ends, the retry is dropped unrun.
    rig.wait_until_lists_empty(LIST).await;
    let ok: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.outcomes WHERE queue = $1 AND key = $2 AND outcome = 'ok'",
    )
    .bind(ROUTE)
    .bind(key)
    .fetch_one(&rig.db)
    .await
    .unwrap();
    assert_eq!(ok, 1, "the run is on record once");
    let runs = std::fs::read_to_string(rig.dir.path().join("ran")).unwrap_or_default();
    assert_eq!(runs.lines().count(), 1, "the handler ran once");
}
