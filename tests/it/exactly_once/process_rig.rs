//! `qbridge run` as a real process (its Redis consumer and proxy) against
//! a throwaway Postgres and Redis it may kill, and `qbridge diff --repair
//! --json` against them: the rig of the tests where a process or a server
//! dies mid-job.

use std::path::Path;
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::servers::{free_port, ThrowawayPostgres, ThrowawayRedis};
use crate::support;

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

    /// A direct connection to the (restarted) Redis.
    pub async fn direct(&self) -> ::redis::aio::MultiplexedConnection {
        ::redis::Client::open(self.redis.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}
