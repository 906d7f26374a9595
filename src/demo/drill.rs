//! The migration drill: one route walked through every phase under load, the
//! way the runbook (`cutover/`) says, with qbridge's own consumers, the RESP
//! proxy and the producer API, and a handler that keeps a ledger of live
//! and shadow calls per job key.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use indicatif::ProgressBar;
use serde::Serialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::app::Runtime;
use crate::config::{Config, Overrides};
use crate::cutover::{store, watch};
use crate::demo::handler::{self, Ledger};
use crate::demo::servers::free_port;
use crate::error::{Error, Result};
use crate::model::Phase;
use crate::ops::gates;
use crate::ops::operate::{self, Refusal, Request};
use crate::ops::repair;
use crate::redis::connect::connect_redis;
use crate::redis::producer::Producer;
use crate::routes::{Route, Routes};

/// How long one phase holds, and what the drill may print.
pub struct DrillOptions {
    pub step: Duration,
    pub as_json: bool,
}

/// Time spent in one phase.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseTime {
    pub phase: String,
    pub seconds: f64,
}

/// What the drill did.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub produced: u64,
    pub produced_via_proxy: u64,
    pub produced_via_producer_api: u64,
    pub run_live: u64,
    pub live_calls: u64,
    pub shadow_calls: u64,
    pub duplicates: u64,
    pub lost: u64,
    /// Up to ten keys of each, to look them up when a run goes wrong.
    pub duplicate_keys: Vec<String>,
    pub lost_keys: Vec<String>,
    pub planted_caught: bool,
    pub planted_repaired: bool,
    pub forced_advances: u32,
    pub rollbacks: u32,
    pub phases: Vec<PhaseTime>,
    pub seconds: f64,
}

struct Drill {
    db: PgPool,
    route: Arc<Route>,
    routes: Routes,
    producer: Producer,
    redis: redis::aio::ConnectionManager,
    ledger: Ledger,
    bar: ProgressBar,
    as_json: bool,
    via_proxy: Arc<AtomicU64>,
    via_api: Arc<AtomicU64>,
    forced: u32,
    rollbacks: u32,
    phase_started: Instant,
    phases: Vec<PhaseTime>,
}

impl Drill {
    /// A line for people: stdout, or stderr when stdout carries the JSON.
    fn say(&self, line: &str) {
        self.bar.suspend(|| match self.as_json {
            true => eprintln!("{line}"),
            false => println!("{line}"),
        });
    }

    fn status(&self) {
        let (live, _, shadow, _) = self.ledger.totals();
        let produced =
            self.via_proxy.load(Ordering::Relaxed) + self.via_api.load(Ordering::Relaxed);
        self.bar.set_message(format!(
            "{} | produced {produced} | run live {live} | shadow calls {shadow}",
            self.routes.phase(&self.route)
        ));
    }

    /// Waits `d`, refreshing the status line.
    async fn hold(&self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.status();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn close_phase(&mut self, phase: Phase) {
        self.phases.push(PhaseTime {
            phase: phase.to_string(),
            seconds: self.phase_started.elapsed().as_secs_f64(),
        });
        self.phase_started = Instant::now();
    }

    async fn print_diff(&mut self) -> Result<()> {
        let state = store::current(&self.db, &self.route.name)
            .await?
            .ok_or_else(|| Error::InvalidInput("demo route not registered".into()))?;
        let since = gates::window_start(&self.route, &state);
        let (diff, _) =
            gates::diff_since(&self.db, &mut self.redis, &self.route, state.phase, since).await?;
        self.say(&format!("   diff: {}", diff.verdict));
        Ok(())
    }

    /// Advances once the gate passes, printing a refusal's numbers once;
    /// forces (audited, counted) if it has not passed within `patience`.
    async fn advance(&mut self, percent: Option<u8>, patience: Duration) -> Result<Phase> {
        let from = self.routes.phase(&self.route);
        let started = Instant::now();
        let mut refused_once = false;
        loop {
            let force = started.elapsed() > patience;
            let req = Request {
                by: "qbridge-demo",
                reason: Some(if force {
                    "demo: the gate did not pass in time"
                } else {
                    "demo: gate passed"
                }),
                force,
                percent,
            };
            let mut conn = self.redis.clone();
            match operate::advance(&self.db, Some(&mut conn), &self.route, &req, 1 << 20).await {
                Ok(done) => {
                    if done.forced {
                        self.forced += 1;
                    }
                    self.close_phase(from);
                    self.say(&format!(
                        "-> {} → {}{}",
                        done.gate.from,
                        done.gate.to,
                        if done.forced {
                            " (forced)"
                        } else {
                            " (gate passed)"
                        }
                    ));
                    if let Some(a) = done.archived {
                        self.say(&format!(
                            "   archived {} items left in Redis, deleted {} Redis keys",
                            a.enqueued, a.keys_deleted
                        ));
                    }
                    self.wait_for_view(done.state.phase).await;
                    return Ok(done.state.phase);
                }
                Err(Refusal::Gate(gate)) => {
                    if !refused_once {
                        refused_once = true;
                        self.say(&format!(
                            "   gate {} → {} refuses for now:\n{}",
                            gate.from,
                            gate.to,
                            gate.failures()
                        ));
                    }
                    self.hold(Duration::from_millis(500)).await;
                }
                Err(Refusal::Error(e)) => return Err(e),
            }
        }
    }

    /// Until this process's producers see `phase` (they poll the flag).
    async fn wait_for_view(&self, phase: Phase) {
        let until = Instant::now() + Duration::from_secs(5);
        while self.routes.phase(&self.route) != phase && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A job Redis loses (as after a restart without persistence): mirrored
    /// in Postgres, its Redis push never made. Returns (caught, repaired).
    async fn plant_and_repair(&mut self) -> Result<(bool, bool)> {
        let key = "lost-1";
        let mut tx = self.db.begin().await?;
        let pending = self
            .producer
            .enqueue_in(
                &mut tx,
                &self.route.name,
                vec![Bytes::from(format!(r#"{{"id":"{key}"}}"#))],
            )
            .await?;
        tx.commit().await?;
        drop(pending);
        sqlx::query("DELETE FROM qbridge.redis_outbox WHERE queue = $1 AND key = $2")
            .bind(&self.route.queue)
            .bind(key)
            .execute(&self.db)
            .await?;
        self.say("   planted: a job Redis lost (mirrored in Postgres, never in Redis)");
        self.hold(self.route.config.cutover.diff.settle + Duration::from_millis(300))
            .await;
        let state = operate::state_of(&self.db, &self.route, "qbridge-demo").await?;
        let since = gates::window_start(&self.route, &state);
        let (diff, held) =
            gates::diff_since(&self.db, &mut self.redis, &self.route, state.phase, since).await?;
        let caught = diff.sample_only_postgres.iter().any(|k| k == key);
        self.say(&format!("   diff: {}", diff.verdict));
        let report = repair::repair(
            &self.db,
            &mut self.redis,
            &self.route,
            state.phase,
            since,
            &held,
            1 << 20,
        )
        .await?;
        self.say(&format!(
            "   qbridge diff --repair: pushed {} lost job(s) back to Redis",
            report.repushed
        ));
        let until = Instant::now() + Duration::from_secs(10);
        while self.ledger.live(key) == 0 && Instant::now() < until {
            self.hold(Duration::from_millis(100)).await;
        }
        Ok((caught, self.ledger.live(key) == 1))
    }
}

/// Producers until `stop`: the proxy (LPUSH, two items per command) and the
/// producer API, about 150 jobs/s together.
fn spawn_producers(
    proxy_url: String,
    producer: Producer,
    route: String,
    list: String,
    via_proxy: Arc<AtomicU64>,
    via_api: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let proxy = match redis::Client::open(proxy_url) {
            Ok(c) => c.get_multiplexed_async_connection().await.ok(),
            Err(_) => None,
        };
        let Some(mut proxy) = proxy else {
            tracing::error!("demo: cannot connect to the proxy");
            return;
        };
        while !stop.load(Ordering::SeqCst) {
            let n = via_proxy.load(Ordering::SeqCst);
            let items = [
                format!(r#"{{"id":"p-{n}","to":"user{n}@example.com"}}"#),
                format!(r#"{{"id":"p-{}","to":"user{}@example.com"}}"#, n + 1, n + 1),
            ];
            let pushed: redis::RedisResult<i64> = redis::cmd("LPUSH")
                .arg(&list)
                .arg(&items[0])
                .arg(&items[1])
                .query_async(&mut proxy)
                .await;
            if pushed.is_ok() {
                via_proxy.fetch_add(2, Ordering::SeqCst);
            }
            let m = via_api.load(Ordering::SeqCst);
            let item = Bytes::from(format!(r#"{{"id":"a-{m}","to":"api{m}@example.com"}}"#));
            if producer.enqueue(&route, vec![item]).await.is_ok() {
                via_api.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Runs the drill against `database_url` and `redis_url` (both fresh for the
/// demo) and returns its summary.
pub async fn run(database_url: &str, redis_url: &str, opts: DrillOptions) -> Result<Summary> {
    let started = Instant::now();
    let id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let name = format!("demo_{id}");
    let list = format!("demo:{id}:jobs");
    let ledger = Ledger::default();
    let url = handler::serve(ledger.clone()).await?;
    let proxy_port = free_port();
    let step = opts.step.as_secs_f64();
    let toml = format!(
        r#"max_connections = 12
shutdown_deadline = "5s"
[proxy]
enabled = true
listen = "127.0.0.1:{proxy_port}"
[[routes]]
name = "{name}"
redis_key = "{list}"
queue = "{name}"
format = "json:/id"
phase = "redis_only"
handler = {{ type = "http", url = "{url}" }}
pool = {{ poll_interval = "100ms", concurrency = 8 }}
redis_consumer = {{ concurrency = 4, consumer_name = "demo-{id}", retry_delay = "100ms" }}
shadow = {{ noise_sample = 0.05 }}
diff = {{ settle = "1s", ignore_fields = ["/processed_at"] }}
gates = {{ window = "{step}s", min_jobs = 20, ack_tolerance = 0.05, quiet_period = "2s", max_postgres_lag = "5s" }}
"#
    );
    let overrides = Overrides {
        database_url: Some(database_url.to_string()),
        redis_url: Some(redis_url.to_string()),
        ..Overrides::default()
    };
    let config = Config::from_toml(&toml, &overrides)?;
    let db = crate::db::connect(database_url, 6).await?;
    crate::db::migrate(&db).await?;

    let watch_stop = CancellationToken::new();
    let (view, watch_task) =
        watch::attach(&db, &config.routes, "qbridge-demo", &watch_stop).await?;
    let routes = Routes::new(&config.routes, view);
    let route = Arc::clone(
        routes
            .by_name(&name)
            .ok_or_else(|| Error::InvalidInput("demo route missing".into()))?,
    );
    let producer = Producer::connect(
        db.clone(),
        Some(redis_url),
        routes.clone(),
        config.payload_limit,
    )
    .await?;
    let redis = connect_redis(redis_url).await?;

    let mut rt = Runtime::build(config.clone()).await?;
    rt.serve_http = false;
    let runtime_stop = CancellationToken::new();
    let runtime = tokio::spawn(rt.run_until_stopped(runtime_stop.clone()));

    let mut proxy_url =
        url::Url::parse(redis_url).map_err(|e| Error::InvalidInput(format!("redis url: {e}")))?;
    let _ = proxy_url.set_host(Some("127.0.0.1"));
    let _ = proxy_url.set_port(Some(proxy_port));
    let bar = crate::output::progress(0, opts.as_json, "");
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    let mut drill = Drill {
        db: db.clone(),
        route: Arc::clone(&route),
        routes: routes.clone(),
        producer: producer.clone(),
        redis,
        ledger: ledger.clone(),
        bar,
        as_json: opts.as_json,
        via_proxy: Arc::new(AtomicU64::new(0)),
        via_api: Arc::new(AtomicU64::new(0)),
        forced: 0,
        rollbacks: 0,
        phase_started: Instant::now(),
        phases: Vec::new(),
    };
    // The proxy binds as the runtime starts.
    let until = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", proxy_port)).is_err() {
        if Instant::now() > until {
            return Err(Error::InvalidInput("the demo's proxy did not start".into()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let producers = spawn_producers(
        proxy_url.to_string(),
        producer,
        name.clone(),
        list.clone(),
        drill.via_proxy.clone(),
        drill.via_api.clone(),
        stop.clone(),
    );

    let patience = opts.step * 6;
    drill.say(&format!(
        "route {name}: Redis list {list} → Postgres queue {name}; producers: the RESP proxy and the producer API"
    ));
    drill.say("== redis_only: producers write Redis; the Redis consumer runs every job");
    drill.hold(opts.step).await;
    drill.advance(None, patience).await?;
    drill.say("== dual_write: both sides get every job; Postgres drains its mirror copies without calling the handler");
    drill.hold(opts.step).await;
    let (caught, repaired) = drill.plant_and_repair().await?;
    drill.print_diff().await?;
    drill.advance(None, patience).await?;
    drill.say(
        "== shadow: Postgres calls the handler with Qbridge-Mode: shadow and compares outcomes",
    );
    drill.hold(opts.step).await;
    drill.print_diff().await?;
    drill.advance(Some(50), patience).await?;
    drill.say("== postgres_only for 50% of job keys (gradual flip); the rest still as in shadow");
    drill.hold(opts.step / 2).await;
    operate::ramp(
        &db,
        &route,
        100,
        &Request::new("qbridge-demo", Some("demo: ramp to 100%")),
    )
    .await?;
    drill.say("-> 100% of job keys: producers write Postgres only; the Redis consumer drains what is left");
    drill.hold(opts.step / 2).await;
    let back = operate::rollback(
        &db,
        &route,
        &Request::new("qbridge-demo", Some("demo: rollback drill")),
    )
    .await?;
    drill.rollbacks += 1;
    drill.close_phase(Phase::PostgresOnly);
    drill.wait_for_view(back.phase).await;
    drill.say("<- rolled back to shadow with jobs in flight (live copies already in Postgres still run there, once)");
    drill.hold(opts.step).await;
    drill.print_diff().await?;
    drill.advance(None, patience).await?;
    drill.say("== postgres_only again; producers stop, Redis drains");
    drill.hold(opts.step / 2).await;
    stop.store(true, Ordering::SeqCst);
    let _ = producers.await;
    drill.advance(None, patience).await?;
    drill.say("== decommissioned: the route's Redis keys are gone; Postgres only");

    // Every job produced must have run live.
    let produced =
        drill.via_proxy.load(Ordering::SeqCst) + drill.via_api.load(Ordering::SeqCst) + 1;
    let until = Instant::now() + Duration::from_secs(60);
    while (drill.ledger.totals().0 as u64) < produced && Instant::now() < until {
        drill.hold(Duration::from_millis(200)).await;
    }
    drill.hold(Duration::from_millis(500)).await;
    drill.close_phase(Phase::Decommissioned);
    drill.bar.finish_and_clear();
    runtime_stop.cancel();
    let _ = runtime.await;
    watch_stop.cancel();
    if let Some(task) = watch_task {
        let _ = task.await;
    }
    let via_proxy = drill.via_proxy.load(Ordering::SeqCst);
    let via_api = drill.via_api.load(Ordering::SeqCst);
    let mut lost = 0;
    let mut lost_keys = Vec::new();
    for key in (0..via_proxy)
        .map(|n| format!("p-{n}"))
        .chain((0..via_api).map(|n| format!("a-{n}")))
        .chain(["lost-1".to_string()])
    {
        if ledger.live(&key) == 0 {
            lost += 1;
            if lost_keys.len() < 10 {
                lost_keys.push(key);
            }
        }
    }
    let (run_live, live_calls, shadow_calls, twice) = ledger.totals();
    db.close().await;
    Ok(Summary {
        produced,
        produced_via_proxy: via_proxy,
        produced_via_producer_api: via_api,
        run_live: run_live as u64,
        live_calls,
        shadow_calls,
        duplicates: twice as u64,
        lost,
        duplicate_keys: ledger.twice(10),
        lost_keys,
        planted_caught: caught,
        planted_repaired: repaired,
        forced_advances: drill.forced,
        rollbacks: drill.rollbacks,
        phases: drill.phases,
        seconds: started.elapsed().as_secs_f64(),
    })
}
