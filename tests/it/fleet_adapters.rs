//! Issue 15: the fleet adapters' reporters under a fault — qbridge down
//! while the team's own Sidekiq, Celery or RQ fleet runs. Jobs pushed
//! through the proxy in `dual_write` are mirrored; then qbridge stops and
//! the fleet runs them from Redis directly, its reporter unable to reach
//! `POST /v1/outcomes`. The jobs keep running (each once), the reporter
//! records them as run in the route's ran set, the diff counts them as run
//! with an unknown outcome (none unaccounted), and repair pushes nothing
//! back. The end-to-end migrations through every phase are the
//! `qbridge demo --framework` drills (`demo.rs`), which run the adapters.

use std::path::Path;
use std::time::Duration;

use sqlx::PgPool;

use qbridge::demo::handler::{self, Ledger};
use qbridge::model::Phase;
use qbridge::ops::{gates, repair};
use qbridge::redis::connect::connect_redis;

use crate::exactly_once::ProxySide;
use crate::servers::{free_port, ThrowawayRedis};
use crate::support;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// A framework's demo application (the team's code) and how it runs.
#[derive(Clone, Copy)]
enum Fleet {
    Sidekiq,
    Celery,
    Rq,
}

impl Fleet {
    fn app(self) -> &'static str {
        match self {
            Fleet::Sidekiq => "sidekiq_fleet.rb",
            Fleet::Celery => "celery_app.py",
            Fleet::Rq => "rq_app.py",
        }
    }

    /// (the route's Redis key, its format) for the framework's queue.
    fn route_key(self, queue: &str) -> (String, &'static str) {
        match self {
            Fleet::Sidekiq => (format!("queue:{queue}"), "sidekiq"),
            Fleet::Celery => (queue.to_string(), "celery"),
            Fleet::Rq => (format!("rq:queue:{queue}"), "rq"),
        }
    }

    fn producer(self, n: usize) -> tokio::process::Command {
        let mut cmd = match self {
            Fleet::Sidekiq => tokio::process::Command::new("ruby"),
            Fleet::Celery | Fleet::Rq => tokio::process::Command::new(support::python()),
        };
        cmd.arg(self.app()).args(["produce", &n.to_string()]);
        cmd
    }

    fn worker(self, queue: &str) -> tokio::process::Command {
        match self {
            Fleet::Sidekiq => {
                let mut cmd = tokio::process::Command::new("sidekiq");
                cmd.args(["-r", "./sidekiq_fleet.rb", "-q", queue, "-c", "4"]);
                cmd
            }
            Fleet::Celery => {
                let mut cmd = tokio::process::Command::new(support::python());
                cmd.args([
                    "-m",
                    "celery",
                    "-A",
                    "celery_app",
                    "worker",
                    "-P",
                    "threads",
                ])
                .args(["-c", "4", "-Q", queue, "-l", "WARNING"])
                .args([
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ]);
                cmd
            }
            Fleet::Rq => {
                let mut cmd = tokio::process::Command::new(support::python());
                cmd.args(["rq_app.py", "worker"]);
                cmd
            }
        }
    }
}

/// The application's environment: its Redis, queue and ledger, and the
/// adapters from this repository.
fn app_env(cmd: &mut tokio::process::Command, dir: &Path, redis: &str, queue: &str, ledger: &str) {
    cmd.current_dir(dir)
        .env("QBD_REDIS_URL", redis)
        .env("QBD_QUEUE", queue)
        .env("QBD_LEDGER", ledger)
        .env("QBD_SIDE", "redis")
        .env("REDIS_URL", redis)
        .env("QUEUE_NAME", queue)
        .env("LEDGER_URL", ledger)
        .env("QBD_ADAPTERS", format!("{REPO}/adapters/ruby/lib"))
        .env("PYTHONPATH", format!("{REPO}/adapters/python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .kill_on_drop(true);
}

async fn qbridge_down_while_the_fleet_runs(pool: PgPool, fleet: Fleet) {
    let redis = ThrowawayRedis::start();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let name = format!("fa{}", &id[..12]);
    let (redis_key, format) = fleet.route_key(&name);
    let toml = format!(
        "[[routes]]\nname = \"{name}\"\nredis_key = \"{redis_key}\"\nqueue = \"{name}\"\n\
         format = \"{format}\"\nphase = \"dual_write\"\nredis_side = \"fleet\"\n\
         diff = {{ settle = \"0s\" }}\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let source = match fleet {
        Fleet::Sidekiq => format!("{REPO}/src/demo/fleet/{}", fleet.app()),
        Fleet::Celery | Fleet::Rq => format!("{REPO}/examples/fleets/{}", fleet.app()),
    };
    std::fs::copy(&source, dir.path().join(fleet.app())).unwrap();
    let ledger = Ledger::default();
    let ledger_url = handler::serve(ledger.clone()).await.unwrap();

    // qbridge up: the framework's own client pushes through the proxy.
    let side = ProxySide::start_on(&pool, &toml, &redis.url()).await;
    let route = side.side_routes().by_name(&name).unwrap().clone();
    let since = chrono::Utc::now() - chrono::Duration::minutes(1);
    let n = 12;
    let mut producer = fleet.producer(n);
    app_env(&mut producer, dir.path(), &side.url(), &name, &ledger_url);
    let out = tokio::time::timeout(Duration::from_secs(60), producer.output())
        .await
        .expect("the producer finished")
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let keys: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(keys.len(), n);
    support::wait_for_count(
        &pool,
        "every job mirrored",
        &format!("SELECT count(*) FROM qbridge.job_keys WHERE queue = '{name}'"),
        n as i64,
    )
    .await;

    // qbridge down: the fleet runs from Redis directly and cannot report.
    side.stop().await;
    let dead_listener = format!("http://127.0.0.1:{}", free_port());
    let mut worker = fleet.worker(&name);
    app_env(&mut worker, dir.path(), &redis.url(), &name, &ledger_url);
    worker
        .env("QBRIDGE_OUTCOMES", &dead_listener)
        .env("QBRIDGE_ROUTE", &name)
        .env("QBRIDGE_QUEUE", &name)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut worker = worker.spawn().expect("the fleet's worker starts");
    let mut conn = connect_redis(&redis.url()).await.unwrap();
    let ran_key = format!("qbridge:ran:{name}");
    support::wait_for(
        "every job ran and was recorded",
        Duration::from_secs(90),
        || {
            let (ledger, keys, mut conn, ran_key) =
                (ledger.clone(), keys.clone(), conn.clone(), ran_key.clone());
            async move {
                let recorded: i64 = ::redis::cmd("ZCARD")
                    .arg(&ran_key)
                    .query_async(&mut conn)
                    .await
                    .unwrap_or(0);
                keys.iter().all(|k| ledger.live(k) == 1) && recorded == keys.len() as i64
            }
        },
    )
    .await;
    // Every fifth job failed its first attempt and was retried by the fleet.
    assert!(ledger.failed_once() > 0);
    let _ = tokio::process::Command::new("kill")
        .args(["-TERM", &worker.id().unwrap().to_string()])
        .status()
        .await;
    let _ = tokio::time::timeout(Duration::from_secs(15), worker.wait()).await;
    let _ = worker.kill().await;

    // qbridge back: the diff says they ran with an unknown outcome, and
    // repair pushes nothing back.
    let (diff, held) = gates::diff_since(&pool, &mut conn, &route, Phase::DualWrite, since)
        .await
        .unwrap();
    assert_eq!(diff.ran_outcome_unknown, n as i64, "{}", diff.verdict);
    assert!(diff.verdict.contains("outcome unknown"), "{}", diff.verdict);
    assert_eq!(diff.unaccounted, 0, "{}", diff.verdict);
    assert_eq!(diff.only_postgres, 0, "{}", diff.verdict);
    let report = repair::repair(
        &pool,
        &mut conn,
        &route,
        Phase::DualWrite,
        since,
        &held,
        1 << 20,
    )
    .await
    .unwrap();
    assert_eq!(report.repushed, 0, "{report:?}");
    let waiting: i64 = ::redis::cmd("LLEN")
        .arg(&redis_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(waiting, 0, "nothing pushed back to Redis");
    assert!(
        keys.iter().all(|k| ledger.live(k) == 1),
        "each job ran once"
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn sidekiq_jobs_run_while_qbridge_is_down_and_are_never_pushed_back(pool: PgPool) {
    qbridge_down_while_the_fleet_runs(pool, Fleet::Sidekiq).await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn celery_tasks_run_while_qbridge_is_down_and_are_never_pushed_back(pool: PgPool) {
    qbridge_down_while_the_fleet_runs(pool, Fleet::Celery).await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn rq_jobs_run_while_qbridge_is_down_and_are_never_pushed_back(pool: PgPool) {
    qbridge_down_while_the_fleet_runs(pool, Fleet::Rq).await;
}

/// Runs one of the adapters' own test suites against this test's migrated
/// database and the shared Redis; fails on a failure or a skipped test.
async fn adapter_suite(pool: &PgPool, mut cmd: tokio::process::Command, what: &str) {
    cmd.env("QBRIDGE_TEST_DATABASE_URL", support::db_url(pool))
        .env("QBRIDGE_TEST_REDIS_URL", crate::exactly_once::REDIS)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("the {what} tests finished within 180 s"))
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the {what} tests failed:\n{text}");
    // unittest names a skipped test "skipped"; minitest counts "N skips".
    let skipped = text.contains("skipped")
        || text
            .lines()
            .any(|l| l.contains(" skips") && !l.contains(" 0 skips"));
    assert!(!skipped, "a test was skipped:\n{text}");
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_python_adapters_own_tests_pass(pool: PgPool) {
    let mut cmd = tokio::process::Command::new(support::python());
    // As the package's README runs it: discovery from adapters/python.
    cmd.args(["-m", "unittest", "-v"])
        .current_dir(format!("{REPO}/adapters/python"));
    adapter_suite(&pool, cmd, "Python adapters'").await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_sidekiq_adapters_own_tests_pass(pool: PgPool) {
    let mut cmd = tokio::process::Command::new("ruby");
    cmd.current_dir(REPO).args([
        "-Iadapters/ruby/lib",
        "-e",
        "Dir['adapters/ruby/test/*_test.rb'].sort.each { |f| require File.expand_path(f) }",
    ]);
    adapter_suite(&pool, cmd, "Sidekiq adapter's").await;
}
