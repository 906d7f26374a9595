//! The fleet adapters' reporters under a fault — qbridge down
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
use crate::sidekiq_versions::Sidekiq;
use crate::support;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// A framework's demo application (the team's code) and how it runs.
#[derive(Clone, Copy)]
enum Fleet {
    Sidekiq(Sidekiq),
    Celery,
    Rq,
}

impl Fleet {
    fn app(self) -> &'static str {
        match self {
            Fleet::Sidekiq(_) => "sidekiq_app.rb",
            Fleet::Celery => "celery_app.py",
            Fleet::Rq => "rq_app.py",
        }
    }

    /// Where the application's source is in the repository: the one
    /// sample app per framework.
    fn source(self) -> String {
        format!("{REPO}/examples/fleets/{}", self.app())
    }

    /// (the route's Redis key, its format) for the framework's queue.
    fn route_key(self, queue: &str) -> (String, &'static str) {
        match self {
            Fleet::Sidekiq(_) => (format!("queue:{queue}"), "sidekiq"),
            Fleet::Celery => (queue.to_string(), "celery"),
            Fleet::Rq => (format!("rq:queue:{queue}"), "rq"),
        }
    }

    fn producer(self, n: usize) -> tokio::process::Command {
        let mut cmd = match self {
            Fleet::Sidekiq(sidekiq) => sidekiq.ruby(),
            Fleet::Celery | Fleet::Rq => tokio::process::Command::new(support::python()),
        };
        cmd.arg(self.app()).args(["produce", &n.to_string()]);
        cmd
    }

    fn worker(self, queue: &str) -> tokio::process::Command {
        match self {
            Fleet::Sidekiq(sidekiq) => {
                let mut cmd = sidekiq.server();
                cmd.args(["-r", "./sidekiq_app.rb", "-q", queue, "-c", "4"]);
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
/// adapters from this repository (Ruby's are on the `RUBYLIB` that
/// [`Sidekiq::ruby`] gives).
fn app_env(cmd: &mut tokio::process::Command, dir: &Path, redis: &str, queue: &str, ledger: &str) {
    cmd.current_dir(dir)
        .env("REDIS_URL", redis)
        .env("SIDEKIQ_QUEUE", queue)
        .env("QUEUE_NAME", queue)
        .env("LEDGER_URL", ledger)
        .env("QBD_REDIS_URL", redis)
        .env("QBD_QUEUE", queue)
        .env("QBD_LEDGER", ledger)
        .env("QBD_SIDE", "redis")
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
    std::fs::copy(fleet.source(), dir.path().join(fleet.app())).unwrap();
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
async fn sidekiq_6_jobs_run_while_qbridge_is_down_and_are_never_pushed_back(pool: PgPool) {
    qbridge_down_while_the_fleet_runs(pool, Fleet::Sidekiq(Sidekiq::V6)).await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn sidekiq_7_jobs_run_while_qbridge_is_down_and_are_never_pushed_back(pool: PgPool) {
    qbridge_down_while_the_fleet_runs(pool, Fleet::Sidekiq(Sidekiq::V7)).await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn celery_tasks_run_while_qbridge_is_down_and_are_never_pushed_back(pool: PgPool) {
    qbridge_down_while_the_fleet_runs(pool, Fleet::Celery).await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn rq_jobs_run_while_qbridge_is_down_and_are_never_pushed_back(pool: PgPool) {
    qbridge_down_while_the_fleet_runs(pool, Fleet::Rq).await;
}

/// Runs one of the adapters' own test suites in `dir` against this test's
/// migrated database and the shared Redis; fails on a failure or a skipped
/// test.
async fn adapter_suite(pool: &PgPool, mut cmd: tokio::process::Command, dir: &str, what: &str) {
    cmd.current_dir(dir)
        .env("QBRIDGE_TEST_DATABASE_URL", support::db_url(pool))
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
    // unittest ends a skipped test's line with "... skipped" and counts
    // "(skipped=N)"; minitest counts "N skips". (Test names may say
    // "skipped": the live-key guard's tests do.)
    let skipped = text.contains("... skipped")
        || text.contains("skipped=")
        || text
            .lines()
            .any(|l| l.contains(" skips") && !l.contains(" 0 skips"));
    assert!(!skipped, "a test was skipped:\n{text}");
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_python_adapters_own_tests_pass(pool: PgPool) {
    let mut cmd = tokio::process::Command::new(support::python());
    // As the package's README runs it: discovery from adapters/python.
    cmd.args(["-m", "unittest", "-v"]);
    let dir = format!("{REPO}/adapters/python");
    adapter_suite(&pool, cmd, &dir, "Python adapters'").await;
}

/// The Ruby adapter's minitest suite as its README runs it (`ruby -Ilib
/// -Itest test/all.rb` in `adapters/ruby`), on one Sidekiq.
async fn sidekiq_suite(pool: &PgPool, sidekiq: Sidekiq) {
    let mut cmd = sidekiq.ruby();
    cmd.args(["-Ilib", "-Itest", "test/all.rb"]);
    let dir = format!("{REPO}/adapters/ruby");
    adapter_suite(pool, cmd, &dir, &format!("Sidekiq adapter's ({sidekiq:?})")).await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_sidekiq_adapters_own_tests_pass_on_sidekiq_6(pool: PgPool) {
    sidekiq_suite(&pool, Sidekiq::V6).await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_sidekiq_adapters_own_tests_pass_on_sidekiq_7(pool: PgPool) {
    sidekiq_suite(&pool, Sidekiq::V7).await;
}

/// `adapters/ruby` builds as the `qbridge-sidekiq` gem: its name, the
/// version in `lib/qbridge/version.rb`, every library file, the runner, the
/// README and changelog, and Sidekiq >= 6, < 9; and it installs, the runner
/// on the gem's executables.
#[test]
fn the_sidekiq_adapter_builds_and_installs_as_a_gem() {
    let dir = tempfile::tempdir().unwrap();
    let gem = dir.path().join("qbridge-sidekiq.gem");
    let run = |cmd: &mut std::process::Command| -> String {
        let out = cmd
            .current_dir(format!("{REPO}/adapters/ruby"))
            .output()
            .expect("gem runs (Debian: apt-get install ruby; ./scripts/test-deps.sh)");
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(std::process::Command::new("gem")
        .args(["build", "qbridge-sidekiq.gemspec", "--output"])
        .arg(&gem));
    let spec = run(std::process::Command::new("ruby")
        .args([
            "-rrubygems/package",
            "-e",
            "s = Gem::Package.new(ARGV[0]).spec; puts s.name, s.version, s.executables.join(' '), \
             s.runtime_dependencies.map { |d| \"#{d.name} #{d.requirement}\" }.join(';'), s.files.sort",
        ])
        .arg(&gem));
    let lines: Vec<&str> = spec.lines().collect();
    let version = std::fs::read_to_string(format!("{REPO}/adapters/ruby/lib/qbridge/version.rb"))
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("SIDEKIQ_ADAPTER_VERSION = "))
        .map(|v| v.trim_matches('"').to_string())
        .expect("version.rb names the version");
    assert_eq!(lines[0], "qbridge-sidekiq");
    assert_eq!(lines[1], version);
    assert_eq!(lines[2], "qbridge-sidekiq-runner");
    assert_eq!(lines[3], "sidekiq >= 6, < 9");
    let mut wanted: Vec<String> = std::fs::read_dir(format!("{REPO}/adapters/ruby/lib/qbridge"))
        .unwrap()
        .map(|e| format!("lib/qbridge/{}", e.unwrap().file_name().to_string_lossy()))
        .chain(["bin/qbridge-sidekiq-runner", "README.md", "CHANGELOG.md"].map(String::from))
        .collect();
    wanted.sort();
    assert_eq!(
        lines[4..],
        wanted.iter().map(String::as_str).collect::<Vec<_>>()[..]
    );
    let home = dir.path().join("home");
    run(std::process::Command::new("gem")
        .args([
            "install",
            "--local",
            "--ignore-dependencies",
            "--no-document",
            "--install-dir",
        ])
        .arg(&home)
        .arg(&gem));
    assert!(home.join("bin/qbridge-sidekiq-runner").exists());
}
