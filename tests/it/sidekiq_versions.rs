//! The Sidekiq adapter on every Sidekiq these tests can run: 6.4 (Debian's
//! `ruby-sidekiq`) and 7.3.10 (vendored in `vendor/ruby`). A real Sidekiq
//! server with the reporter runs the sample app's jobs
//! (`examples/fleets/sidekiq_app.rb`) whose first attempt fails: with
//! Sidekiq's default retry each must be reported `failed`, then `ok`; with
//! `retry: 0` or `retry: false`, `dead`. On Sidekiq 7 the reporter once
//! asked `Sidekiq.options` (gone in 7) for the default max retries, and the
//! middleware swallowed the error: every `failed` and `dead` report was
//! dropped while the `ok` ones arrived.
//!
//! Sidekiq 8 needs Ruby 3.2, which these machines lack: its client is
//! covered by `sidekiq8_fixtures.rs`.

use std::path::PathBuf;
use std::time::Duration;

use sqlx::PgPool;

use qbridge::demo::handler::{self, Ledger};

use crate::servers::ThrowawayRedis;
use crate::support;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// A Sidekiq the tests run.
#[derive(Clone, Copy, Debug)]
pub enum Sidekiq {
    /// 6.4, Debian's `ruby-sidekiq` (the system Ruby's own load path).
    V6,
    /// 7.3.10, from `vendor/ruby`.
    V7,
}

impl Sidekiq {
    /// `RUBYLIB` for this Sidekiq with the adapter's lib first.
    pub fn rubylib(self) -> String {
        let mut dirs = vec![format!("{REPO}/adapters/ruby/lib")];
        if let Sidekiq::V7 = self {
            for lib in [
                "sidekiq-7.3.10",
                "redis-client-0.26.4",
                "connection_pool-2.5.4",
            ] {
                dirs.push(format!("{REPO}/vendor/ruby/{lib}/lib"));
            }
        }
        dirs.join(":")
    }

    /// The version `require "sidekiq"` must load with [`Self::rubylib`].
    fn version_prefix(self) -> &'static str {
        match self {
            Sidekiq::V6 => "6.4.",
            Sidekiq::V7 => "7.3.10",
        }
    }

    /// A `ruby` with this Sidekiq (and the adapter) on its load path;
    /// panics with the install step when it loads another or none.
    pub fn ruby(self) -> tokio::process::Command {
        let out = std::process::Command::new("ruby")
            .args(["-e", "require 'sidekiq'; print Sidekiq::VERSION"])
            .env("RUBYLIB", self.rubylib())
            .output();
        let version = out
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        assert!(
            version.starts_with(self.version_prefix()),
            "Sidekiq {} is needed, found {version:?}: run ./scripts/test-deps.sh (ruby-sidekiq, ruby-rack, ruby-concurrent)",
            self.version_prefix()
        );
        let mut cmd = tokio::process::Command::new("ruby");
        cmd.env("RUBYLIB", self.rubylib()).kill_on_drop(true);
        cmd
    }

    /// This Sidekiq's server (`sidekiq` with its arguments to follow).
    pub fn server(self) -> tokio::process::Command {
        let mut cmd = self.ruby();
        match self {
            Sidekiq::V6 => cmd.arg(debian_sidekiq()),
            Sidekiq::V7 => cmd.arg(format!("{REPO}/vendor/ruby/sidekiq-7.3.10/bin/sidekiq")),
        };
        cmd
    }
}

/// Debian's `sidekiq` executable.
fn debian_sidekiq() -> PathBuf {
    let path = PathBuf::from("/usr/bin/sidekiq");
    assert!(
        path.exists(),
        "sidekiq is missing: run ./scripts/test-deps.sh (it installs ruby-sidekiq)"
    );
    path
}

/// The sample app's jobs whose first attempt fails, pushed with `sidekiq`'s
/// own client and run by its own server with the reporter (outcomes over
/// SQL into this test's database): 5 retried then ok, 2 dead.
async fn first_attempts_fail(pool: PgPool, sidekiq: Sidekiq) {
    let redis = ThrowawayRedis::start();
    let ledger = Ledger::default();
    let ledger_url = handler::serve(ledger.clone()).await.unwrap();
    let queue = format!("sv{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let app_env = |cmd: &mut tokio::process::Command| {
        cmd.current_dir(REPO)
            .env("REDIS_URL", redis.url())
            .env("SIDEKIQ_QUEUE", &queue)
            .env("QBD_LEDGER", &ledger_url);
    };

    let mut producer = sidekiq.ruby();
    producer.arg("tests/ruby/sidekiq_retries.rb");
    app_env(&mut producer);
    let out = tokio::time::timeout(Duration::from_secs(60), producer.output())
        .await
        .expect("the producer finished")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let jids = |what: &str| -> Vec<String> {
        let prefix = format!("{what} ");
        let mut v: Vec<String> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix).map(str::to_string))
            .collect();
        v.sort();
        v
    };
    let (retried, dead) = (jids("retried"), jids("dead"));
    assert_eq!((retried.len(), dead.len()), (5, 2), "{stdout}");

    let mut server = sidekiq.server();
    server
        .args([
            "-r",
            "./examples/fleets/sidekiq_app.rb",
            "-q",
            &queue,
            "-c",
            "4",
        ])
        .env("QBRIDGE_OUTCOMES", support::db_url(&pool))
        .env("QBRIDGE_ROUTE", &queue)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    app_env(&mut server);
    let mut server = server.spawn().expect("the Sidekiq server starts");

    // Everything reported: 5 failed then 5 ok, 2 dead (or a wait that ends
    // with the counts below naming what is missing).
    let count_sql = format!("SELECT count(*) FROM qbridge.outcomes WHERE queue = '{queue}'");
    let _ = tokio::time::timeout(Duration::from_secs(90), async {
        while support::count(&pool, &count_sql).await < 12
            || retried.iter().any(|k| ledger.live(k) == 0)
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    // A report that would come late: give it a moment to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = tokio::process::Command::new("kill")
        .args(["-TERM", &server.id().unwrap().to_string()])
        .status()
        .await;
    let _ = tokio::time::timeout(Duration::from_secs(15), server.wait()).await;
    let _ = server.kill().await;

    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT key, outcome FROM qbridge.outcomes WHERE queue = $1 AND side = 'redis' ORDER BY key, id",
    )
    .bind(&queue)
    .fetch_all(&pool)
    .await
    .unwrap();
    let of = |key: &String| -> Vec<&str> {
        rows.iter()
            .filter(|(k, _)| k == key)
            .map(|(_, o)| o.as_str())
            .collect()
    };
    for jid in &retried {
        assert_eq!(of(jid), ["failed", "ok"], "{sidekiq:?} {jid}: {rows:?}");
        assert_eq!(ledger.live(jid), 1, "{jid} ran once");
    }
    for jid in &dead {
        assert_eq!(of(jid), ["dead"], "{sidekiq:?} {jid}: {rows:?}");
    }
    assert_eq!(rows.len(), 12, "{rows:?}");
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn sidekiq_6_reports_each_failed_attempt_then_the_outcome(pool: PgPool) {
    first_attempts_fail(pool, Sidekiq::V6).await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn sidekiq_7_reports_each_failed_attempt_then_the_outcome(pool: PgPool) {
    first_attempts_fail(pool, Sidekiq::V7).await;
}
