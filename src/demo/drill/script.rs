//! The drill's script: the demo's config and servers, the producers, every
//! phase in turn (a planted loss, a ramp, a rollback with jobs in flight, the
//! decommission), then the tally of what ran live, twice or never.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::app::Runtime;
use crate::config::{Config, Overrides};
use crate::demo::attach::AttachedRoute;
use crate::demo::handler::{self, Ledger};
use crate::demo::servers::free_port;
use crate::error::{Error, Result};
use crate::model::Phase;
use crate::ops::operate::{self, Request};
use crate::redis::connect::connect_redis;
use crate::redis::producer::Producer;

use super::{Drill, DrillOptions, Summary};

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
    let config = demo_config(
        &name,
        &list,
        id,
        &url,
        proxy_port,
        opts.step,
        database_url,
        redis_url,
    )?;
    let db = crate::db::connect(database_url, 6).await?;
    crate::db::migrate(&db).await?;

    let AttachedRoute {
        routes,
        route,
        producer,
        watch,
    } = AttachedRoute::attach(&db, &config, &name, redis_url, "qbridge-demo").await?;
    let redis = connect_redis(redis_url).await?;

    let mut rt = Runtime::build(config.clone()).await?;
    rt.serve_http = false;
    let runtime_stop = CancellationToken::new();
    let runtime = tokio::spawn(rt.run_until_stopped(runtime_stop.clone()));

    let mut drill = Drill::new(
        db.clone(),
        route,
        routes,
        producer.clone(),
        redis,
        ledger.clone(),
        opts.as_json,
    );
    // The proxy binds as the runtime starts.
    wait_for_port(proxy_port).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let producers = spawn_producers(
        proxy_url(redis_url, proxy_port)?,
        producer,
        name.clone(),
        list.clone(),
        drill.via_proxy.clone(),
        drill.via_api.clone(),
        stop.clone(),
    );

    let (caught, repaired) = walk_the_phases(&mut drill, &opts, &name, &list).await?;
    stop.store(true, Ordering::SeqCst);
    let _ = producers.await;
    drill.advance(None, opts.step * 6).await?;
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
    watch.stop().await;
    db.close().await;
    Ok(tally(drill, &ledger, (caught, repaired), started))
}

/// The summary: what was produced, what ran live (once, twice, never), the
/// planted loss and the phases' times.
fn tally(drill: Drill, ledger: &Ledger, planted: (bool, bool), started: Instant) -> Summary {
    let (caught, repaired) = planted;
    let via_proxy = drill.via_proxy.load(Ordering::SeqCst);
    let via_api = drill.via_api.load(Ordering::SeqCst);
    let (lost, lost_keys) = never_ran(ledger, via_proxy, via_api);
    let (run_live, live_calls, shadow_calls, twice) = ledger.totals();
    Summary {
        produced: via_proxy + via_api + 1,
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
    }
}

/// The demo's config: one route from a Redis list to a Postgres queue, with
/// its proxy, handler, Redis consumer, shadow, diff and gates, sized so each
/// phase's gate can pass within a few steps.
#[allow(clippy::too_many_arguments)]
fn demo_config(
    name: &str,
    list: &str,
    id: &str,
    url: &str,
    proxy_port: u16,
    step: Duration,
    database_url: &str,
    redis_url: &str,
) -> Result<Config> {
    let step = step.as_secs_f64();
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
    Config::from_toml(&toml, &overrides)
}

/// Waits (10 s at most) until something listens on `port`.
pub(in crate::demo) async fn wait_for_port(port: u16) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > until {
            return Err(Error::CheckFailed("the demo's proxy did not start".into()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The drill itself: every phase in turn, a planted loss repaired, a ramp,
/// a rollback with jobs in flight and the advance back; returns whether the
/// planted loss was caught and repaired.
async fn walk_the_phases(
    drill: &mut Drill,
    opts: &DrillOptions,
    name: &str,
    list: &str,
) -> Result<(bool, bool)> {
    let patience = opts.step * 6;
    drill.say(&format!(
        "route {name}: Redis list {list} → Postgres queue {name}; producers: the RESP proxy and the producer API"
    ));
    drill.say("== redis_only: producers write Redis; the Redis consumer runs every job");
    drill.hold(opts.step).await;
    drill.advance(None, patience).await?;
    drill.say("== dual_write: both sides get every job; Postgres records a mirror copy of each and calls no handler");
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
    let mut redis = drill.redis.clone();
    operate::ramp(
        &drill.db,
        Some(&mut redis),
        &drill.route.clone(),
        100,
        &Request::new("qbridge-demo", Some("demo: ramp to 100%")),
    )
    .await?;
    drill.say("-> 100% of job keys: producers write Postgres only; the Redis consumer drains what is left");
    drill.hold(opts.step / 2).await;
    let back = operate::rollback(
        &drill.db,
        Some(&mut redis),
        &drill.route.clone(),
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
    Ok((caught, repaired))
}

/// How many produced keys never ran live (`p-N` through the proxy, `a-N`
/// through the producer API, and the planted `lost-1`), with up to ten of them.
fn never_ran(ledger: &Ledger, via_proxy: u64, via_api: u64) -> (u64, Vec<String>) {
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
    (lost, lost_keys)
}

/// The proxy's URL: `redis_url` with the proxy's host and port.
pub(in crate::demo) fn proxy_url(redis_url: &str, port: u16) -> Result<String> {
    let mut url =
        url::Url::parse(redis_url).map_err(|e| Error::InvalidInput(format!("redis url: {e}")))?;
    let _ = url.set_host(Some("127.0.0.1"));
    let _ = url.set_port(Some(port));
    Ok(url.to_string())
}
