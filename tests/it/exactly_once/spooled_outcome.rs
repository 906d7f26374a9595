//! qbridge's consumer ran and acked a job while Postgres was away; then its
//! process was killed, taking the outcome it held in memory with it; then
//! Redis restarted without persistence, taking the ran set. Repair found no
//! trace that the job ran and, on the restart's evidence, pushed it back:
//! it would run a second time. The consumer now syncs each outcome to its
//! local spool (`state_dir`) before the ack, and repair replays the spools
//! of runs that are gone before it judges.

use std::path::Path;
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;

use crate::servers::{free_port, ThrowawayPostgres, ThrowawayRedis};
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
    let pg = ThrowawayPostgres::start();
    let db = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&pg.url())
        .await
        .expect("throwaway Postgres");
    qbridge::MIGRATOR.run(&db).await.expect("migrate");
    let mut redis = ThrowawayRedis::start();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = dir.path().join("qbridge.toml");
    std::fs::write(&cfg, config(dir.path(), &redis.url(), port)).unwrap();
    let mut process = support::spawn_run(&pg.url(), &cfg);
    let proxy = ::redis::Client::open(format!("redis://127.0.0.1:{port}/0")).unwrap();
    let mut producer = loop {
        match proxy.get_multiplexed_async_connection().await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let _: i64 = ::redis::cmd("LPUSH")
        .arg(LIST)
        .arg(r#"{"id":"k1"}"#)
        .query_async(&mut producer)
        .await
        .unwrap();
    support::wait_for_count(
        &db,
        "the mirror copy",
        "SELECT count(*) FROM qbridge.job_keys",
        1,
    )
    .await;
    let started = dir.path().join("started");
    support::wait_for("the handler to start", Duration::from_secs(20), || async {
        started.exists()
    })
    .await;
    // Postgres goes away while the job runs; the consumer acks it anyway
    // (its outcome is kept): the ran set holds the key once it is acked.
    pg.kill();
    let mut direct = ::redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
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
    process.start_kill().unwrap();
    let _ = process.wait().await;
    redis.kill();
    redis.resume();
    pg.resume();

    let out = support::qbridge(&[
        "diff",
        "--route",
        ROUTE,
        "--repair",
        "--json",
        "--database-url",
        &pg.url(),
        "--config",
        cfg.to_str().unwrap(),
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(
        report["repair"]["repushed"], 0,
        "the job that ran was pushed back: {report}"
    );
    direct = ::redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let waiting: i64 = ::redis::cmd("LLEN")
        .arg(LIST)
        .query_async(&mut direct)
        .await
        .unwrap();
    assert_eq!(waiting, 0, "nothing waits to run a second time");
    let ran: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.outcomes WHERE queue = $1 AND key = 'k1' AND outcome = 'ok'",
    )
    .bind(ROUTE)
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(ran, 1, "the run is on record once");
    let runs = std::fs::read_to_string(dir.path().join("ran")).unwrap_or_default();
    assert_eq!(runs.lines().count(), 1, "the handler ran once");
    // Replayed runs leave nothing behind.
    let left: Vec<_> = walk(&dir.path().join("state"));
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
