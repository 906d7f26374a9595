//! `qbridge run` as a real process (its Redis consumer and proxy) against
//! a throwaway Postgres and Redis it may kill, and `qbridge diff --repair
//! --json` against them: the rig of the tests where a process or a server
//! dies mid-job.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::servers::{free_port, ThrowawayPostgres, ThrowawayRedis};
use crate::support;

/// The one route a rig's process runs: qbridge's consumer with one slot, in
/// `dual_write`, whose handler is `/bin/sh -c <script> sh <args…>`.
pub struct OneRoute<'a> {
    pub name: &'a str,
    pub list: &'a str,
    pub format: &'a str,
    pub script: &'a str,
    pub args: Vec<PathBuf>,
}

impl OneRoute<'_> {
    /// The process's config: the proxy on `proxy_port`, the state under
    /// `dir`, this route (its diff settles at once).
    pub fn config(&self, dir: &Path, redis_url: &str, proxy_port: u16) -> String {
        let OneRoute {
            name,
            list,
            format,
            script,
            args,
        } = self;
        let args: Vec<String> = args.iter().map(|a| format!(", {a:?}")).collect();
        format!(
            r#"redis_url = "{redis_url}"
state_dir = {state:?}
shutdown_deadline = "1s"
[proxy]
enabled = true
listen = "127.0.0.1:{proxy_port}"
[[routes]]
name = "{name}"
redis_key = "{list}"
queue = "{name}"
format = "{format}"
phase = "dual_write"
handler = {{ type = "command", program = "/bin/sh", args = ["-c", {script:?}, "sh"{args}] }}
redis_consumer = {{ concurrency = 1, consumer_name = "{name}-c1" }}
diff = {{ settle = "0s" }}
"#,
            state = dir.join("state"),
            args = args.concat(),
        )
    }
}

pub struct ProcessRig {
    pub pg: ThrowawayPostgres,
    pub db: PgPool,
    pub redis: ThrowawayRedis,
    pub dir: tempfile::TempDir,
    pub process: tokio::process::Child,
    /// A producer connected through the process's proxy.
    pub producer: ::redis::aio::MultiplexedConnection,
}

impl ProcessRig {
    /// Starts the servers and `qbridge run` with the config `config` writes
    /// (given the test's folder, Redis's URL and the proxy's port).
    pub async fn start(config: impl FnOnce(&Path, &str, u16) -> String) -> ProcessRig {
        let pg = ThrowawayPostgres::start();
        let db = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(2))
            .connect(&pg.url())
            .await
            .expect("throwaway Postgres");
        qbridge::MIGRATOR.run(&db).await.expect("migrate");
        let redis = ThrowawayRedis::start();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        std::fs::write(
            dir.path().join("qbridge.toml"),
            config(dir.path(), &redis.url(), port),
        )
        .unwrap();
        // Its HTTP listener on any free port: these tests run side by side.
        let process = support::spawn_run_with(
            &pg.url(),
            &dir.path().join("qbridge.toml"),
            &["--http-listen", "127.0.0.1:0"],
        );
        let proxy = ::redis::Client::open(format!("redis://127.0.0.1:{port}/0")).unwrap();
        let producer = loop {
            match proxy.get_multiplexed_async_connection().await {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        ProcessRig {
            pg,
            db,
            redis,
            dir,
            process,
            producer,
        }
    }

    /// `LPUSH list item` through the proxy.
    pub async fn push(&mut self, list: &str, item: &str) {
        let _: i64 = ::redis::cmd("LPUSH")
            .arg(list)
            .arg(item)
            .query_async(&mut self.producer)
            .await
            .unwrap();
    }

    /// [`ProcessRig::push`], then waits for its mirror copy and for the
    /// handler to say it started (it touches `<dir>/started`).
    pub async fn push_until_running(&mut self, list: &str, item: &str) {
        self.push(list, item).await;
        support::wait_for_count(
            &self.db,
            "the mirror copy",
            "SELECT count(*) FROM qbridge.job_keys",
            1,
        )
        .await;
        let started = self.dir.path().join("started");
        support::wait_for("the handler to start", Duration::from_secs(20), || async {
            started.exists()
        })
        .await;
    }

    /// SIGKILLs the process and waits for it.
    pub async fn kill_process(&mut self) {
        self.process.start_kill().unwrap();
        let _ = self.process.wait().await;
    }

    /// `qbridge diff --route <route> --repair --json`: its report, once it
    /// exited successfully.
    pub async fn repair(&self, route: &str) -> serde_json::Value {
        let cfg = self.dir.path().join("qbridge.toml");
        let out = support::qbridge(&[
            "diff",
            "--route",
            route,
            "--repair",
            "--json",
            "--database-url",
            &self.pg.url(),
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
        serde_json::from_str(&stdout).expect("json")
    }

    /// Waits until `list` and every processing list are empty (the runs
    /// ended, whatever was dropped is gone).
    pub async fn wait_until_lists_empty(&self, list: &str) {
        let direct = self.direct().await;
        support::wait_for("the lists to empty", Duration::from_secs(40), || {
            let mut direct = direct.clone();
            async move {
                let waiting: i64 = ::redis::cmd("LLEN")
                    .arg(list)
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
    }

    /// Waits until Redis holds `key` (a marker a process writes).
    pub async fn wait_for_key(&self, what: &str, key: &str) {
        let direct = self.direct().await;
        support::wait_for(what, Duration::from_secs(20), || {
            let mut direct = direct.clone();
            async move {
                let value: Option<String> = ::redis::cmd("GET")
                    .arg(key)
                    .query_async(&mut direct)
                    .await
                    .unwrap_or(None);
                value.is_some()
            }
        })
        .await;
    }

    /// A direct connection to the (restarted) Redis.
    pub async fn direct(&self) -> ::redis::aio::MultiplexedConnection {
        ::redis::Client::open(self.redis.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}
