//! Redis restarted without persistence while qbridge's consumer ran a job:
//! the item, its inflight state and its running claim went with Redis while
//! the handler went on. Repair then found the job's mirror copy in no list,
//! took the restart as evidence and pushed the job back, and it ran a second
//! time. The consumer now writes what it runs into the new server (the
//! slot's keeper), so repair finds it held and a client's retry waits for
//! the run to end instead of running beside it.

use std::path::Path;
use std::time::Duration;

use super::process_rig::ProcessRig;
use crate::support;

const ROUTE: &str = "kept";
const LIST: &str = "qbt:kept:jobs";

fn config(format: &str, dir: &Path, redis_url: &str, proxy_port: u16) -> String {
    let started = dir.join("started");
    let ledger = dir.join("ran");
    // The handler says it started, takes 12 s, and writes one line per run.
    format!(
        r#"redis_url = "{redis_url}"
state_dir = {state:?}
shutdown_deadline = "1s"
[proxy]
enabled = true
listen = "127.0.0.1:{proxy_port}"
[[routes]]
name = "{ROUTE}"
redis_key = "{LIST}"
queue = "{ROUTE}"
format = "{format}"
phase = "dual_write"
handler = {{ type = "command", program = "/bin/sh", args = ["-c", "touch \"$1\"; sleep 12; echo run >> \"$2\"", "sh", {started:?}, {ledger:?}] }}
redis_consumer = {{ concurrency = 1, consumer_name = "kept-c1" }}
diff = {{ settle = "0s" }}
"#,
        state = dir.join("state"),
    )
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
    rig.push(LIST, item).await;
    support::wait_for_count(
        &rig.db,
        "the mirror copy",
        "SELECT count(*) FROM qbridge.job_keys",
        1,
    )
    .await;
    let started = rig.dir.path().join("started");
    support::wait_for("the handler to start", Duration::from_secs(20), || async {
        started.exists()
    })
    .await;
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
    let direct = rig.direct().await;
    // Everything settles: the run ends, the retry is dropped unrun.
    support::wait_for("the lists to empty", Duration::from_secs(40), || {
        let mut direct = direct.clone();
        async move {
            let waiting: i64 = ::redis::cmd("LLEN")
                .arg(LIST)
                .query_async(&mut direct)
                .await
                .unwrap_or(1);
            let processing: Vec<String> = ::redis::cmd("KEYS")
                .arg("qbridge:processing:*")
                .query_async(&mut direct)
                .await
                .unwrap_or_default();
            waiting == 0 && processing.is_empty()
        }
    })
    .await;
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
