//! qbridge's consumer ran and acked a job while Postgres was away; then its
//! process was killed, taking the outcome it held in memory with it; then
//! Redis restarted without persistence, taking the ran set. Repair found no
//! trace that the job ran and, on the restart's evidence, pushed it back:
//! it would run a second time. The consumer now syncs each outcome to its
//! local spool (`state_dir`) before the ack, and repair replays the spools
//! of runs that are gone before it judges.

use std::path::Path;
use std::time::Duration;

use super::process_rig::ProcessRig;
use crate::support;

const ROUTE: &str = "spooled";
const LIST: &str = "qbt:spooled:jobs";

fn config(dir: &Path, redis_url: &str, proxy_port: u16) -> String {
    let started = dir.join("started");
    let ledger = dir.join("ran");
    // The handler says it started, takes 2 s (Postgres is killed then),
    // and writes one line per run.
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
format = "json:/id"
phase = "dual_write"
handler = {{ type = "command", program = "/bin/sh", args = ["-c", "touch \"$1\"; sleep 2; echo run >> \"$2\"", "sh", {started:?}, {ledger:?}] }}
redis_consumer = {{ concurrency = 1, consumer_name = "spool-c1" }}
diff = {{ settle = "0s" }}
"#,
        state = dir.join("state"),
    )
}

#[tokio::test]
async fn a_job_acked_while_postgres_was_away_is_not_pushed_back_after_its_process_and_redis_die() {
    let mut rig = ProcessRig::start(config).await;
    rig.push(LIST, r#"{"id":"k1"}"#).await;
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
    // Postgres goes away while the job runs; the consumer acks it anyway
    // (its outcome is kept): the ran set holds the key once it is acked.
    rig.pg.kill();
    let direct = rig.direct().await;
    support::wait_for("the ack", Duration::from_secs(20), || {
        let mut direct = direct.clone();
        async move {
            let score: Option<f64> = ::redis::cmd("ZSCORE")
                .arg(format!("qbridge:ran:{ROUTE}"))
                .arg("k1")
                .query_async(&mut direct)
                .await
                .unwrap_or(None);
            score.is_some()
        }
    })
    .await;
    // The process dies holding the outcome; Redis loses everything.
    rig.kill_process().await;
    rig.redis.kill();
    rig.redis.resume();
    rig.pg.resume();

    let report = rig.repair(ROUTE).await;
    assert_eq!(
        report["repair"]["repushed"], 0,
        "the job that ran was pushed back: {report}"
    );
    let waiting: i64 = ::redis::cmd("LLEN")
        .arg(LIST)
        .query_async(&mut rig.direct().await)
        .await
        .unwrap();
    assert_eq!(waiting, 0, "nothing waits to run a second time");
    let ran: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.outcomes WHERE queue = $1 AND key = 'k1' AND outcome = 'ok'",
    )
    .bind(ROUTE)
    .fetch_one(&rig.db)
    .await
    .unwrap();
    assert_eq!(ran, 1, "the run is on record once");
    let runs = std::fs::read_to_string(rig.dir.path().join("ran")).unwrap_or_default();
    assert_eq!(runs.lines().count(), 1, "the handler ran once");
    // Replayed runs leave nothing behind.
    let left: Vec<_> = walk(&rig.dir.path().join("state"));
    assert!(left.is_empty(), "spool files left: {left:?}");
}

/// Files under `dir`, recursively.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}
