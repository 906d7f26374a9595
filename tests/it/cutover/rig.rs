//! A route under cutover, end to end: `qbridge run` (the runtime) with the
//! route's Redis consumer and Postgres pool, a producer that follows the
//! stored phase, and a test HTTP handler that counts live and shadow calls
//! per job key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use qbridge::app::Runtime;
use qbridge::config::{Config, Overrides};
use qbridge::cutover::watch;
use qbridge::model::Phase;
use qbridge::ops::operate::{self, Advanced, Refusal, Request};
use qbridge::redis::producer::Producer;
use qbridge::routes::{Route, Routes};

use crate::support;

pub const REDIS: &str = "redis://127.0.0.1:6379";

/// Calls the handler saw: (job key, mode) → count.
#[derive(Clone, Default)]
pub struct Calls(Arc<Mutex<HashMap<(String, String), usize>>>);

impl Calls {
    pub fn live(&self, key: &str) -> usize {
        self.get(key, "live")
    }

    pub fn shadow(&self, key: &str) -> usize {
        self.get(key, "shadow")
    }

    fn get(&self, key: &str, mode: &str) -> usize {
        let calls = self.0.lock().unwrap();
        calls
            .get(&(key.to_string(), mode.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Every key with a live call, and how many.
    pub fn live_counts(&self) -> HashMap<String, usize> {
        let calls = self.0.lock().unwrap();
        calls
            .iter()
            .filter(|((_, mode), _)| mode == "live")
            .map(|((key, _), n)| (key.clone(), *n))
            .collect()
    }
}

/// Answers `{"key":…, "at":<now>}` (`/at` is an ignored field, so it never
/// counts as a difference). A key starting with `flip` fails for good in
/// shadow mode only: a planted outcome mismatch.
async fn handler(calls: Calls, delay: Duration) -> String {
    let app = axum::Router::new().route(
        "/run",
        axum::routing::post(move |headers: HeaderMap| {
            let calls = calls.clone();
            async move {
                let text = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string()
                };
                let (key, mode) = (text("qbridge-job-key"), text("qbridge-mode"));
                *calls
                    .0
                    .lock()
                    .unwrap()
                    .entry((key.clone(), mode.clone()))
                    .or_default() += 1;
                tokio::time::sleep(delay).await;
                let at = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0);
                let status = if key.starts_with("flip") && mode == "shadow" {
                    StatusCode::UNPROCESSABLE_ENTITY
                } else {
                    StatusCode::OK
                };
                (status, format!(r#"{{"key":"{key}","at":{at}}}"#))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/run")
}

/// Settings a test may change.
pub struct Options {
    pub phase: Phase,
    pub handler_delay: Duration,
    pub window: &'static str,
    pub min_jobs: u64,
    pub quiet_period: &'static str,
    /// `gates.decommission_wait`.
    pub decommission_wait: &'static str,
    /// The route's `format` (`json:/id` keys by id; `raw` by content hash).
    pub format: &'static str,
    /// `diff.settle`.
    pub settle: &'static str,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            phase: Phase::DualWrite,
            handler_delay: Duration::ZERO,
            window: "1m",
            min_jobs: 5,
            quiet_period: "1s",
            decommission_wait: "60s",
            format: "json:/id",
            settle: "1s",
        }
    }
}

pub struct Rig {
    pub pool: PgPool,
    pub config: Config,
    pub calls: Calls,
    pub name: String,
    pub list: String,
    /// A producer whose routes follow the stored phase.
    pub producer: Producer,
    pub routes: Routes,
    watch_stop: CancellationToken,
    runtime: Option<(CancellationToken, JoinHandle<()>)>,
}

impl Rig {
    /// The config, the handler and a producer; the runtime is not started.
    pub async fn new(pool: &PgPool, opts: Options) -> Rig {
        let calls = Calls::default();
        let url = handler(calls.clone(), opts.handler_delay).await;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let name = format!("co{}", &id[..12]);
        let list = format!("qbt:{id}:list");
        let toml = format!(
            r#"max_connections = 8
shutdown_deadline = "5s"
[[routes]]
name = "{name}"
redis_key = "{list}"
queue = "{name}"
format = "{format}"
phase = "{phase}"
handler = {{ type = "http", url = "{url}" }}
pool = {{ poll_interval = "50ms", concurrency = 4, backoff_base = "50ms", backoff_cap = "100ms" }}
redis_consumer = {{ concurrency = 2, consumer_name = "c{id}", retry_delay = "20ms" }}
shadow = {{ noise_sample = 0.0 }}
diff = {{ settle = "{settle}", ignore_fields = ["/at"], sample_keys = 50 }}
gates = {{ window = "{window}", min_jobs = {min_jobs}, quiet_period = "{quiet}", max_postgres_lag = "30s", decommission_wait = "{wait}" }}
"#,
            phase = opts.phase,
            window = opts.window,
            min_jobs = opts.min_jobs,
            quiet = opts.quiet_period,
            wait = opts.decommission_wait,
            format = opts.format,
            settle = opts.settle,
        );
        let overrides = Overrides {
            database_url: Some(support::db_url(pool)),
            redis_url: Some(REDIS.into()),
            ..Overrides::default()
        };
        let config = Config::from_toml(&toml, &overrides).expect("config");
        let watch_stop = CancellationToken::new();
        let (view, _) = watch::attach(
            pool,
            Some(&crate::support::db_url(pool)),
            &config.routes,
            "test",
            &watch_stop,
        )
        .await
        .expect("phases registered");
        let routes = Routes::new(&config.routes, view);
        let producer = Producer::connect(pool.clone(), Some(REDIS), routes.clone(), 1 << 20)
            .await
            .expect("producer");
        Rig {
            pool: pool.clone(),
            config,
            calls,
            name,
            list,
            producer,
            routes,
            watch_stop,
            runtime: None,
        }
    }

    pub fn route(&self) -> Arc<Route> {
        Arc::clone(self.routes.by_name(&self.name).expect("route"))
    }

    /// Starts `qbridge run` (both consumers) in the background.
    pub async fn start(&mut self) {
        let mut rt = Runtime::build(self.config.clone()).await.expect("runtime");
        rt.serve_http = false;
        rt.gauge_interval = Duration::from_secs(3600);
        let stop = CancellationToken::new();
        let token = stop.clone();
        let run = tokio::spawn(async move {
            rt.run_until_stopped(token).await.expect("runtime runs");
        });
        self.runtime = Some((stop, run));
    }

    /// Stops the runtime (its jobs finish or are handed back).
    pub async fn stop(&mut self) {
        if let Some((stop, run)) = self.runtime.take() {
            stop.cancel();
            run.await.unwrap();
        }
    }

    /// Enqueues `{"id": key}` items through the producer API.
    pub async fn produce(&self, keys: &[String]) {
        let items = keys
            .iter()
            .map(|k| Bytes::from(format!(r#"{{"id":"{k}"}}"#)))
            .collect();
        self.producer
            .enqueue(&self.name, items)
            .await
            .expect("enqueue");
    }

    /// A connection to the shared Redis.
    pub async fn redis(&self) -> redis::aio::ConnectionManager {
        redis::aio::ConnectionManager::new(redis::Client::open(REDIS).unwrap())
            .await
            .expect("redis")
    }

    /// LPUSHes raw bytes behind qbridge's back.
    pub async fn push_behind_qbridge(&self, item: &str) {
        let mut conn = self.redis().await;
        let _: i64 = redis::cmd("LPUSH")
            .arg(&self.list)
            .arg(item)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    pub fn req(reason: &str, force: bool) -> Request<'_> {
        Request {
            by: "test@ops",
            reason: Some(reason),
            force,
            percent: None,
        }
    }

    /// `qbridge cutover advance`.
    pub async fn advance(&self, force: bool) -> Result<Advanced, Refusal> {
        let mut conn = self.redis().await;
        let route = self.route();
        operate::advance(
            &self.pool,
            Some(&mut conn),
            &route,
            &Rig::req("test step", force),
            1 << 20,
        )
        .await
    }

    /// `qbridge cutover rollback`.
    pub async fn rollback(&self) -> Phase {
        let route = self.route();
        let mut redis = self.redis().await;
        operate::rollback(
            &self.pool,
            Some(&mut redis),
            &route,
            &Rig::req("test rollback", false),
        )
        .await
        .expect("rollback")
        .phase
    }

    /// Waits until this process's view shows `phase` (the watch polls).
    pub async fn until_phase(&self, phase: Phase) {
        let routes = self.routes.clone();
        let name = self.name.clone();
        support::wait_for("the watch sees the flip", Duration::from_secs(5), || {
            let got = routes.phases().get(&name);
            async move { got == phase }
        })
        .await;
    }

    /// Stops everything and deletes the route's Redis keys.
    pub async fn finish(mut self) {
        self.stop().await;
        self.watch_stop.cancel();
        let mut conn = self.redis().await;
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("qbridge:*:{}*", self.name))
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        keys.push(self.list.clone());
        let _: i64 = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut conn)
            .await
            .unwrap_or(0);
        // Give the watch's LISTEN connection back before the database is dropped.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
