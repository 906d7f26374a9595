//! Shared helpers: database URLs and extra pools for a test's database, a
//! builder for [`PoolConfig`], running a [`WorkerPool`] with its completer, and
//! waiting on a condition with a timeout (tests never sleep to wait), and the
//! last line of a command's output.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use qbridge::config::{Dur, HandlerConfig, PoolConfig};
use qbridge::handler::Handler;
use qbridge::queue::backoff::Backoff;
use qbridge::queue::completer::{self, CompleterConfig, CompleterReport};
use qbridge::queue::{ClaimRequest, ClaimedJob, JobRef, NewJob};
use qbridge::worker::pool::{PoolReport, WorkerPool};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Payload limit used by tests that do not test the limit.
pub const LIMIT: usize = qbridge::queue::validate::DEFAULT_PAYLOAD_LIMIT;

/// The last non-empty line of `text` (log lines may come before it).
pub fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
}

/// The last non-empty line of a finished command's stderr.
pub fn last_stderr_line(out: &std::process::Output) -> String {
    last_line(&String::from_utf8_lossy(&out.stderr)).to_string()
}

/// The URL of the test's own database (for the listener and the runtime).
pub fn db_url(pool: &PgPool) -> String {
    let opts = pool.connect_options();
    let db = opts.get_database().expect("test pool names its database");
    format!("postgres://postgres@127.0.0.1:5432/{db}")
}

/// The name of the test's own database.
pub fn db_name(pool: &PgPool) -> String {
    pool.connect_options()
        .get_database()
        .expect("test pool names its database")
        .to_string()
}

/// A second pool on the test's database with `n` connections (the
/// `#[sqlx::test]` pool is capped at 5). Close it before the test returns, or
/// the test database cannot be dropped.
pub async fn extra_pool(pool: &PgPool, n: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(n)
        .connect_with((*pool.connect_options()).clone())
        .await
        .expect("extra pool connects")
}

/// Polls `cond` every 20 ms until it holds; panics naming `what` after `timeout`.
/// Returns how long it took.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut cond: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if cond().await {
            return started.elapsed();
        }
        if started.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (up to 10 s) until the count query `sql` returns `expected`.
pub async fn wait_for_count(pool: &PgPool, what: &str, sql: &str, expected: i64) {
    wait_for(what, Duration::from_secs(10), || async {
        count(pool, sql).await == expected
    })
    .await;
}

/// Runs a scalar count query.
pub async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Rows in the hot table.
pub async fn jobs(pool: &PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM qbridge.jobs").await
}

/// Rows in the dead-letter table.
pub async fn dead(pool: &PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM qbridge.jobs_dead").await
}

/// Enqueues on the pool and returns the inserted ids (panics on duplicates).
pub async fn enqueue_ids(pool: &PgPool, jobs: &[NewJob]) -> Vec<i64> {
    qbridge::queue::enqueue_many(pool, jobs, LIMIT)
        .await
        .expect("enqueue")
        .into_iter()
        .map(|o| match o {
            qbridge::queue::EnqueueOutcome::Inserted(id) => id,
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

/// `n` plain jobs on `queue` with payload `{"n": i}`.
pub fn plain_jobs(queue: &str, n: usize) -> Vec<NewJob> {
    (0..n)
        .map(|i| NewJob::new(queue, serde_json::json!({ "n": i })))
        .collect()
}

/// A claim request with the usual test defaults.
pub fn claim_req<'a>(
    queues: &'a [String],
    limit: i64,
    worker: &'a str,
    lease: Duration,
) -> ClaimRequest<'a> {
    ClaimRequest {
        queues,
        kinds: None,
        limit,
        worker,
        lease,
        tenant: None,
        tenant_after: None,
        lock_retry_delay: Duration::from_millis(50),
        start: None,
    }
}

/// Claims with default settings.
pub async fn claim(pool: &PgPool, queue: &str, limit: i64, lease: Duration) -> Vec<ClaimedJob> {
    let queues = vec![queue.to_string()];
    qbridge::queue::claim(pool, &claim_req(&queues, limit, "test", lease))
        .await
        .expect("claim")
}

/// Refs of claimed jobs.
pub fn refs(jobs: &[ClaimedJob]) -> Vec<JobRef> {
    jobs.iter().map(|j| j.job_ref()).collect()
}

/// A `/bin/sh -c script` command handler; inside the script `$1..` are `args`.
pub fn sh(script: &str, args: &[&str]) -> HandlerConfig {
    let mut all = vec!["-c".to_string(), script.to_string(), "sh".to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    HandlerConfig::Command {
        program: "/bin/sh".into(),
        args: all,
        timeout: Dur(Duration::from_secs(30)),
        permanent_exit_codes: Vec::new(),
    }
}

/// Builds a [`PoolConfig`] with small, test-friendly defaults: one queue,
/// concurrency 4, lease 30 s, poll 100 ms, backoff 10–100 ms, noop handler.
pub struct PoolBuilder(PoolConfig);

impl PoolBuilder {
    pub fn new(queue: &str) -> Self {
        PoolBuilder(PoolConfig {
            name: "test".into(),
            queues: vec![queue.to_string()],
            kinds: None,
            concurrency: 4,
            batch_size: 4,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(100),
            backoff: Backoff {
                base: Duration::from_millis(10),
                cap: Duration::from_millis(100),
            },
            lock_retry_delay: Duration::from_millis(50),
            prefetch_window: qbridge::config::DEFAULT_PREFETCH_WINDOW,
            tenant: None,
            handler: HandlerConfig::Noop {},
        })
    }

    /// Sets concurrency and batch size together.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.0.concurrency = n;
        self.0.batch_size = n as i64;
        self
    }

    pub fn lease(mut self, d: Duration) -> Self {
        self.0.lease = d;
        self
    }

    pub fn poll(mut self, d: Duration) -> Self {
        self.0.poll_interval = d;
        self
    }

    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.0.backoff = Backoff { base, cap };
        self
    }

    pub fn handler(mut self, h: HandlerConfig) -> Self {
        self.0.handler = h;
        self
    }

    /// Lets claims carry up to `batch` jobs, prefetching `window` of starts.
    pub fn prefetch(mut self, window: Duration, batch: i64) -> Self {
        self.0.prefetch_window = window;
        self.0.batch_size = batch;
        self
    }

    pub fn build(self) -> PoolConfig {
        self.0
    }
}

/// The reaper passing every 50 ms until `stop`; yields how many jobs it
/// requeued.
pub fn reap_until(pool: &PgPool, stop: &CancellationToken) -> JoinHandle<u64> {
    let (db, stop) = (pool.clone(), stop.clone());
    tokio::spawn(async move {
        let mut requeued = 0;
        while !stop.is_cancelled() {
            requeued += qbridge::queue::reaper::run_once(&db, 100)
                .await
                .expect("reap")
                .requeued;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        requeued
    })
}

/// A [`WorkerPool`] running with its own completer.
pub struct RunningPool {
    intake: CancellationToken,
    pool: JoinHandle<PoolReport>,
    completer: JoinHandle<CompleterReport>,
}

impl RunningPool {
    /// Starts `config` on `db`. Nothing LISTENs for it: it finds jobs by polling.
    pub fn start(db: &PgPool, config: PoolConfig) -> RunningPool {
        let (tx, completer) = completer::spawn(db.clone(), CompleterConfig::default());
        let handler = Arc::new(Handler::from_config(&config.handler).expect("handler builds"));
        let pool = WorkerPool {
            config,
            db: db.clone(),
            handler,
            completer: tx,
            waker: Arc::new(Notify::new()),
            worker_id: "test-worker".into(),
            routes: None,
        };
        let intake = CancellationToken::new();
        let handle = tokio::spawn(pool.run(intake.clone(), Duration::from_secs(30)));
        RunningPool {
            intake,
            pool: handle,
            completer,
        }
    }

    /// Stops intake, waits for running handlers, then for the completer's
    /// final flush.
    pub async fn stop(self) -> (PoolReport, CompleterReport) {
        self.intake.cancel();
        let pool = self.pool.await.expect("pool task");
        let completer = self.completer.await.expect("completer task");
        (pool, completer)
    }
}

/// The Python of the test virtual environment, with the real framework
/// clients (Celery, RQ, redis-py) in it. Panics with the install command when
/// it is missing: a missing client is an install step, never a skipped test.
/// Runs `tests/ruby/<script>` with the system's Ruby and Debian's
/// `ruby-sidekiq` (the adapter's lib on `RUBYLIB`: the scripts load the
/// sample app), with `env`; panics with its stderr when it fails, and with
/// the install step when Ruby or Sidekiq is missing.
pub fn ruby(script: &str, env: &[(&str, &str)]) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/ruby")
        .join(script);
    let has_sidekiq = std::process::Command::new("ruby")
        .args(["-e", "require 'sidekiq'"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        has_sidekiq,
        "ruby with Sidekiq is missing: run ./scripts/test-deps.sh (it installs ruby-sidekiq)"
    );
    let out = std::process::Command::new("ruby")
        .arg(&path)
        .env("RUBYLIB", crate::sidekiq_versions::Sidekiq::V6.rubylib())
        .envs(env.iter().copied())
        .output()
        .expect("ruby runs");
    assert!(
        out.status.success(),
        "{} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn python() -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        path.exists(),
        "{} is missing: run ./scripts/test-deps.sh (scripts/test and .ci/run do)",
        path.display()
    );
    path
}

/// The Python of one cell of the framework version matrix
/// (`.matrix/<cell>/bin/python`, made by `./scripts/test-deps.sh` for the
/// cells the suite runs).
pub fn matrix_python(cell: &str) -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".matrix")
        .join(cell)
        .join("bin/python");
    assert!(
        path.exists(),
        "{} is missing: run ./scripts/test-deps.sh (scripts/test and .ci/run do)",
        path.display()
    );
    path
}

/// `qbridge run --database-url URL --config CFG` as a child process (killed
/// if the test ends first).
pub fn spawn_run(database_url: &str, config: &std::path::Path) -> tokio::process::Child {
    spawn_run_with(database_url, config, &[])
}

/// [`spawn_run`] with `extra` arguments after the config.
pub fn spawn_run_with(
    database_url: &str,
    config: &std::path::Path,
    extra: &[&str],
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_qbridge"))
        .args(["run", "--database-url", database_url, "--config"])
        .arg(config)
        .args(extra)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// SIGTERM, then the exit status (within 20 s, else the test fails).
pub async fn sigterm_and_wait(child: &mut tokio::process::Child) -> std::process::ExitStatus {
    let _ = tokio::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status()
        .await;
    tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("stops on SIGTERM")
        .unwrap()
}

/// Runs the built binary with `args` in a clean environment (no
/// `QBRIDGE_*` setting of the machine leaks in); its output.
pub async fn qbridge(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_qbridge"))
        .args(args)
        .env_remove("QBRIDGE_DATABASE_URL")
        .env_remove("QBRIDGE_POOLER")
        .env_remove("QBRIDGE_CONFIG")
        .env_remove("QBRIDGE_HTTP_LISTEN")
        .env_remove("QBRIDGE_REDIS_URL")
        .env_remove("QBRIDGE_PROXY_LISTEN")
        .env("QBRIDGE_LOG_FORMAT", "text")
        .output()
        .await
        .expect("qbridge runs")
}

/// Runs one of `tests/python`'s scripts (`args[0]`, then its arguments)
/// with `python` against `broker` and `queue` (`QBT_BROKER`, `QBT_QUEUE`),
/// within 60 s: (success, stdout lines, stderr). The framework tests' one
/// way of running a real client.
pub async fn python_script(
    python: &std::path::Path,
    args: &[&str],
    broker: &str,
    queue: &str,
) -> (bool, Vec<String>, String) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python");
    let mut cmd = tokio::process::Command::new(python);
    cmd.args(args)
        .current_dir(dir)
        .env("QBT_BROKER", broker)
        .env("QBT_QUEUE", queue)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{} finished within 60 s", args[0]))
        .unwrap_or_else(|e| panic!("{} runs: {e}", args[0]));
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    (
        out.status.success(),
        lines,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`python_script`] that must succeed: its stdout lines.
pub async fn python_script_ok(
    python: &std::path::Path,
    args: &[&str],
    broker: &str,
    queue: &str,
) -> Vec<String> {
    let (ok, lines, stderr) = python_script(python, args, broker, queue).await;
    assert!(ok, "{args:?} failed: {stderr}");
    lines
}
