//! Cutover exactly-once where a real migration differs from the demo: an
//! outside fleet qbridge does not run, outcome reports that are lost or
//! partial, retries that re-push a key, identical items (content-hash keys)
//! across a rollback, decommission under a running consumer, and a job that
//! ran live on both sides. Each test failed before its fix.

mod before_mirroring;
mod both_sides;
pub(crate) mod fleet;
mod fleet_rollback;
mod handed_back;
mod identical_backlog;
mod identical_under_load;
mod in_flight_at_flip;
mod key_drift;
mod lost_report;
mod paused_link;
mod popped_then_lost;
mod process_rig;
mod promotion;
mod pushback_race;
mod ran_set_refilled;
mod repush_markers;
mod restart_evidence;
mod running_at_restart;
mod spooled_outcome;

use std::net::SocketAddr;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use qbridge::app::RedisSide;
use qbridge::config::{Config, Overrides};
use qbridge::periodic::Services;

use crate::support;

pub const REDIS: &str = "redis://127.0.0.1:6379";

/// `qbridge proxy` in process: the Redis side with its proxy on a free port.
pub struct ProxySide {
    pub db: PgPool,
    pub addr: SocketAddr,
    side: RedisSide,
    services: Services,
    intake: CancellationToken,
}

impl ProxySide {
    /// Starts the Redis side of `toml` (a config without database or Redis
    /// URL: the test's are used) with its proxy.
    pub async fn start(pool: &PgPool, toml: &str) -> ProxySide {
        ProxySide::start_on(pool, toml, REDIS).await
    }

    /// [`ProxySide::start`] in front of the Redis at `redis_url` (a
    /// throwaway one, for keys shared by every queue such as Sidekiq's sets).
    pub async fn start_on(pool: &PgPool, toml: &str, redis_url: &str) -> ProxySide {
        ProxySide::start_with(toml, redis_url, &support::db_url(pool)).await
    }

    /// [`ProxySide::start_on`] reaching the test's database at
    /// `database_url` (through a relay the test can pause, say).
    pub async fn start_with(toml: &str, redis_url: &str, database_url: &str) -> ProxySide {
        let overrides = Overrides {
            database_url: Some(database_url.into()),
            redis_url: Some(redis_url.into()),
            ..Overrides::default()
        };
        let config = Config::from_toml(&format!("[proxy]\nenabled = true\n{toml}"), &overrides)
            .expect("config");
        let db = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(database_url)
            .await
            .expect("the proxy's pool connects");
        let mut services = Services::new();
        let mut side = RedisSide::start(&config, &db, true, &mut services)
            .await
            .expect("redis side");
        let intake = CancellationToken::new();
        let addr = side
            .start_proxy(&config, Some("127.0.0.1:0"), intake.clone())
            .await
            .expect("proxy");
        ProxySide {
            db,
            addr,
            side,
            services,
            intake,
        }
    }

    /// The route table of the Redis side, following the stored phases.
    pub fn side_routes(&self) -> qbridge::routes::Routes {
        self.side.routes.clone()
    }

    /// Also starts the Redis consumers of the routes that have one.
    pub async fn start_consumers(&mut self, pool: &PgPool, toml: &str) {
        let overrides = Overrides {
            database_url: Some(support::db_url(pool)),
            redis_url: Some(REDIS.into()),
            ..Overrides::default()
        };
        let config = Config::from_toml(&format!("[proxy]\nenabled = true\n{toml}"), &overrides)
            .expect("config");
        self.side
            .start_consumers(&config, &self.db, &self.intake)
            .await
            .expect("consumers");
    }

    /// Forces `route` forward (audited, as `cutover advance --force`) until
    /// it is in `phase`, and waits (10 s at most) until the proxy follows.
    pub async fn force_to(&self, route: &str, redis_url: &str, phase: qbridge::model::Phase) {
        let routes = self.side_routes();
        let route = routes.by_name(route).expect("the route").clone();
        let mut redis = qbridge::redis::connect::connect_redis(redis_url)
            .await
            .unwrap();
        let req = qbridge::ops::operate::Request {
            by: "test@ops",
            reason: Some("the test's flip"),
            force: true,
            percent: None,
        };
        while qbridge::ops::operate::state_of(&self.db, &route, "test@ops")
            .await
            .unwrap()
            .phase
            != phase
        {
            qbridge::ops::operate::advance(&self.db, Some(&mut redis), &route, &req, 1 << 20)
                .await
                .map_err(|_| "refused")
                .unwrap();
        }
        let started = std::time::Instant::now();
        while routes.phase(&route) != phase {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the proxy follows the flip"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("redis://{}/0", self.addr)
    }

    pub async fn stop(self) {
        self.intake.cancel();
        self.side.finish(Duration::from_secs(10)).await;
        self.services.stop(Duration::from_secs(5)).await;
        self.db.close().await;
    }
}

/// Deletes the test's Redis keys.
pub async fn delete_keys(patterns: &[&str]) {
    let mut conn = ::redis::Client::open(REDIS)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for pattern in patterns {
        let keys: Vec<String> = ::redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: i64 = ::redis::cmd("DEL")
                .arg(&keys)
                .query_async(&mut conn)
                .await
                .unwrap_or(0);
        }
    }
}

/// `qbridge diff --repair` on `route` in `dual_write` over the window from
/// `since`: the diff before the repair and what the repair did.
pub async fn diff_and_repair(
    pool: &PgPool,
    conn: &mut ::redis::aio::ConnectionManager,
    route: &qbridge::routes::Route,
    since: chrono::DateTime<chrono::Utc>,
) -> (qbridge::ops::diff::Diff, qbridge::ops::repair::RepairReport) {
    use qbridge::model::Phase;
    use qbridge::ops::{gates, repair};
    let (diff, held) = gates::diff_since(pool, conn, route, Phase::DualWrite, since)
        .await
        .unwrap();
    let report = repair::repair(pool, conn, route, Phase::DualWrite, since, &held, 1 << 20)
        .await
        .unwrap();
    (diff, report)
}

/// The config of route `r` (list `jobs`, queue `q`, `format`) in
/// `dual_write`, run by qbridge's consumer, judged at once (`settle` 0):
/// the route every restart-evidence test repairs.
pub fn restart_route_config(format: &str) -> qbridge::config::Config {
    route_config_in(format, "dual_write")
}

/// [`restart_route_config`] registered in `phase`.
pub fn route_config_in(format: &str, phase: &str) -> qbridge::config::Config {
    let toml = format!(
        "[[routes]]\nname = \"r\"\nredis_key = \"jobs\"\nqueue = \"q\"\nformat = \"{format}\"\n\
         phase = \"{phase}\"\nredis_side = \"qbridge\"\ndiff = {{ settle = \"0s\" }}\n"
    );
    qbridge::config::Config::from_toml(&toml, &qbridge::config::Overrides::default())
        .expect("route config")
}

/// Route `r` of [`route_config_in`] as a process in `phase` sees it.
pub fn routes_in(format: &str, phase: &str) -> qbridge::routes::Routes {
    qbridge::routes::Routes::from_config(&route_config_in(format, phase).routes)
}

/// A forced step, as `cutover advance|rollback --force --reason` takes it.
pub const FORCED: qbridge::ops::operate::Request<'static> = qbridge::ops::operate::Request {
    by: "test@ops",
    reason: Some("the test's walk"),
    force: true,
    percent: None,
};

/// Registers `route` if needed and forces it forward until it is in `phase`.
pub async fn force_to(
    pool: &PgPool,
    conn: &mut ::redis::aio::ConnectionManager,
    route: &qbridge::routes::Route,
    phase: qbridge::model::Phase,
) {
    use qbridge::ops::operate;
    while operate::state_of(pool, route, "test@ops")
        .await
        .unwrap()
        .phase
        != phase
    {
        operate::advance(pool, Some(&mut *conn), route, &FORCED, 1 << 20)
            .await
            .map_err(|e| format!("{e:?}"))
            .expect("advance");
    }
}
