//! An outside fleet: a real Celery worker runs the Redis side (qbridge's
//! consumer does not run), producers push through the proxy in
//! `dual_write`, and the fleet's outcomes are reported for half of the jobs
//! it ran. Silence about the other half is not a loss: repair must push
//! nothing back, and the diff must say it cannot tell.

use std::process::Stdio;

use std::time::Duration;
use tokio::process::Child;

use sqlx::PgPool;

use qbridge::redis::connect::connect_redis;

use super::{delete_keys, ProxySide, REDIS};
use crate::support;

const APP_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python");

fn fleet_env(cmd: &mut tokio::process::Command, broker: &str, queue: &str, ledger: &str) {
    cmd.current_dir(APP_DIR)
        .env("QBT_BROKER", broker)
        .env("QBT_QUEUE", queue)
        .env("QBT_LEDGER", ledger)
        .env("QBT_LEDGER_URL", REDIS);
}

/// Sends `n` tasks through `broker` (with a Celery priority when given) and
/// returns their task ids.
pub(crate) async fn produce(
    broker: &str,
    queue: &str,
    ledger: &str,
    n: usize,
    priority: Option<u8>,
) -> Vec<String> {
    let mut args = vec!["produce".to_string(), n.to_string()];
    args.extend(priority.map(|p| p.to_string()));
    let ids = producer(broker, queue, ledger, &args).await;
    assert_eq!(ids.len(), n);
    ids
}

/// Runs `celery_fleet.py` with `args` as a producer on `broker` and returns
/// the task ids it printed. Async: the proxy runs on this test's own
/// (single-threaded) runtime, so a blocking wait here would stall the proxy
/// the producer talks to.
pub(crate) async fn producer(
    broker: &str,
    queue: &str,
    ledger: &str,
    args: &[String],
) -> Vec<String> {
    let mut cmd = tokio::process::Command::new(support::python());
    cmd.arg("celery_fleet.py").args(args);
    fleet_env(&mut cmd, broker, queue, ledger);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the Celery producer finished within 60 s")
        .expect("the Celery producer runs");
    assert!(
        out.status.success(),
        "producer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// A real Celery worker on Redis itself (not the proxy): the fleet.
fn worker(queue: &str, ledger: &str) -> Child {
    worker_on(REDIS, queue, ledger)
}

/// A real Celery worker on the Redis at `broker`.
pub(crate) fn worker_on(broker: &str, queue: &str, ledger: &str) -> Child {
    let mut cmd = tokio::process::Command::new(support::python());
    cmd.args([
        "-m",
        "celery",
        "-A",
        "celery_fleet",
        "worker",
        "-Q",
        queue,
        "--pool",
        "solo",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-l",
        "WARNING",
    ]);
    fleet_env(&mut cmd, broker, queue, ledger);
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the Celery worker starts")
}

async fn ledger(redis: &mut ::redis::aio::ConnectionManager, ledger: &str) -> Vec<String> {
    ::redis::cmd("LRANGE")
        .arg(ledger)
        .arg(0)
        .arg(-1)
        .query_async(redis)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn silence_from_an_outside_fleet_is_never_taken_for_a_loss(pool: PgPool) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (route, queue) = (format!("cf{}", &id[..12]), format!("qbt_celery_{id}"));
    let ledger_key = format!("qbt:{id}:ledger");
    let toml = format!(
        "[[routes]]\nname = \"{route}\"\nredis_key = \"{queue}\"\nqueue = \"{route}\"\n\
         format = \"celery\"\nphase = \"dual_write\"\ndiff = {{ settle = \"0s\" }}\n"
    );
    let side = ProxySide::start(&pool, &toml).await;
    let ids = produce(&side.url(), &queue, &ledger_key, 20, None).await;
    support::wait_for_count(
        &pool,
        "every task mirrored",
        &format!("SELECT count(*) FROM qbridge.job_keys WHERE queue = '{route}'"),
        20,
    )
    .await;

    let mut fleet = worker(&queue, &ledger_key);
    let mut redis = connect_redis(REDIS).await.unwrap();
    let started = std::time::Instant::now();
    while ledger(&mut redis, &ledger_key).await.len() < 20 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the Celery worker did not run the 20 tasks"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = fleet.kill().await;

    // The fleet reports outcomes for half of what it ran.
    for key in &ids[..10] {
        sqlx::query("SELECT qbridge.report_outcome($1, $2, 'ok', 'done')")
            .bind(&route)
            .bind(key)
            .execute(&pool)
            .await
            .unwrap();
    }

    let routes = side.side_routes();
    let route_ref = routes.by_name(&route).unwrap().clone();
    let since = chrono::Utc::now() - chrono::Duration::minutes(10);
    let (diff, report) = super::diff_and_repair(&pool, &mut redis, &route_ref, since).await;
    assert_eq!(
        report.repushed, 0,
        "jobs the fleet ran were pushed back: {report:?}; diff: {}",
        diff.verdict
    );
    assert_eq!(
        report.unaccounted, 10,
        "the unreported half is 'outcome unknown': {report:?}"
    );
    assert!(
        diff.verdict.contains("outcome unknown"),
        "the diff must not call them repairable: {}",
        diff.verdict
    );
    let left: i64 = ::redis::cmd("LLEN")
        .arg(&queue)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(left, 0, "repair pushed items back to the fleet's queue");
    let ran = ledger(&mut redis, &ledger_key).await;
    assert_eq!(ran.len(), 20, "each task ran once: {ran:?}");

    side.stop().await;
    delete_keys(&[&format!("*{id}*"), &format!("*{route}*")]).await;
}
