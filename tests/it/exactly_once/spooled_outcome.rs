//! qbridge's consumer ran and acked a job while Postgres was away; then its
//! process was killed, taking the outcome it held in memory with it; then
//! Redis restarted without persistence, taking the ran set. Repair found no
//! trace that the job ran and, on the restart's evidence, pushed it back:
//! it would run a second time. The consumer now syncs each outcome to its
//! local spool (`state_dir`) before the ack, and repair replays the spools
//! of runs that are gone before it judges.

use std::path::Path;
use std::time::Duration;

use super::process_rig::{OneRoute, ProcessRig};
use crate::support;

const ROUTE: &str = "spooled";
const LIST: &str = "qbt:spooled:jobs";

fn config(dir: &Path, redis_url: &str, proxy_port: u16) -> String {
    // The handler says it started, takes 2 s (Postgres is killed then),
    // and writes one line per run.
    OneRoute {
        name: ROUTE,
        list: LIST,
        format: "json:/id",
        script: "touch \"$1\"; sleep 2; echo run >> \"$2\"",
        args: vec![dir.join("started"), dir.join("ran")],
    }
    .config(dir, redis_url, proxy_port)
}

#[tokio::test]
async fn a_job_acked_while_postgres_was_away_is_not_pushed_back_after_its_process_and_redis_die() {
    let rig = acked_then_process_and_redis_died().await;
    let report = rig.repair(ROUTE).await;
    assert_ran_once(&rig, &report).await;
}

/// The same, repaired through the admin API of another process on the same
/// host (one that runs no consumer, so nothing replays the spool at its
/// start): the API's repair brings in the host's spools as the CLI's does.
#[tokio::test]
async fn repair_over_the_admin_api_brings_in_the_spools_of_its_host() {
    let rig = acked_then_process_and_redis_died().await;
    let port = crate::servers::free_port();
    let admin_cfg = rig.dir.path().join("admin.toml");
    let without_consumer = std::fs::read_to_string(rig.dir.path().join("qbridge.toml"))
        .unwrap()
        .replace("enabled = true", "enabled = false")
        .lines()
        .filter(|l| !l.starts_with("redis_consumer"))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&admin_cfg, without_consumer).unwrap();
    let listen = format!("127.0.0.1:{port}");
    let mut admin = tokio::process::Command::new(env!("CARGO_BIN_EXE_qbridge"))
        .args(["run", "--database-url", &rig.pg.url(), "--config"])
        .arg(&admin_cfg)
        .args(["--http-listen", &listen])
        .env("QBRIDGE_ADMIN_TOKEN", "spool-admin-token")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let url = format!("http://{listen}/v1/routes/{ROUTE}/repair");
    // Until the new process listens (a connection refused is its start).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let reply = loop {
        let sent = client
            .post(&url)
            .bearer_auth("spool-admin-token")
            .json(&serde_json::json!({}))
            .send()
            .await;
        match sent {
            Ok(reply) => break reply,
            Err(e) if std::time::Instant::now() < deadline && e.is_connect() => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("the admin API's repair: {e}"),
        }
    };
    let status = reply.status();
    let report: serde_json::Value = reply.json().await.unwrap();
    assert!(status.is_success(), "{status}: {report}");
    assert_eq!(report["spools"]["found"], true, "{report}");
    assert_eq!(report["spools"]["brought_in"], 1, "{report}");
    assert_ran_once(&rig, &report).await;
    let _ = support::sigterm_and_wait(&mut admin).await;
}

/// The job ran and was acked while Postgres was away; then its process was
/// SIGKILLed and Redis restarted without persistence.
async fn acked_then_process_and_redis_died() -> ProcessRig {
    let mut rig = ProcessRig::start(config).await;
    rig.push_until_running(LIST, r#"{"id":"k1"}"#).await;
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
    rig
}

/// Nothing was pushed back and nothing waits: the job ran once and its run
/// is on record once; the spool files are gone.
async fn assert_ran_once(rig: &ProcessRig, report: &serde_json::Value) {
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
