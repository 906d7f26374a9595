//! `qbridge bench proxy`: LPUSH throughput and latency direct to Redis vs
//! through the RESP proxy in `dual_write`, in one run, with the same raw RESP
//! clients and pipeline depth. Everything runs in this process (proxy,
//! group-commit mirror with its lag probe, clients), so the comparison is
//! between the two paths on the same machine at the same moment.
//!
//! `--slow-postgres <dur>` holds an EXCLUSIVE lock on `qbridge.job_keys`
//! during the proxy phase, so mirror writes stall: it shows that the proxy
//! slows its clients down (bounded mirror buffer) instead of growing.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use sqlx::{Connection, PgPool};
use tokio_util::sync::CancellationToken;

use crate::bench::harness::{rss_mib, sample_rss};
use crate::bench::parse_dur;
use crate::config::{Config, Overrides};
use crate::error::{Error, Result};
use crate::mirror::{repair_gaps_once, LagProbe, Mirror, MirrorOptions};
use crate::redis::connect::connect_redis;
use crate::redis::keys::RouteKeys;
use crate::routes::Routes;

mod clients;
mod report;
mod sides;

use clients::{phase, Side};
use sides::{Running, Twemproxy};

/// The queue of the bench route (cleared at the start and the end).
pub const PROXY_QUEUE: &str = "qbridge_bench_proxy";
/// Unrecorded warm-up per side: connections, caches, the writers' first batches.
const WARMUP: Duration = Duration::from_secs(1);
/// When the `--slow-postgres` lock starts, into the proxy phase.
const STALL_AT: Duration = Duration::from_secs(2);

/// `qbridge bench proxy` options.
#[derive(Debug, Clone, Args)]
pub struct ProxyArgs {
    /// Client connections per side.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// LPUSH commands in flight per client (pipeline depth).
    #[arg(long, default_value_t = 1)]
    pub depth: usize,
    /// How long each side is measured.
    #[arg(long, default_value = "10s", value_parser = parse_dur)]
    pub duration: Duration,
    /// Size of each pushed JSON payload.
    #[arg(long, default_value_t = 200)]
    pub payload_bytes: usize,
    /// Lock `qbridge.job_keys` this long during the proxy phase (0s = off).
    #[arg(long, default_value = "0s", value_parser = parse_dur)]
    pub slow_postgres: Duration,
    /// Items per mirror transaction (default: `[proxy] mirror_batch`).
    #[arg(long)]
    pub mirror_batch: Option<usize>,
    /// Mirror transactions in flight (default: `[proxy] mirror_writers`).
    #[arg(long)]
    pub mirror_writers: Option<usize>,
    /// How long a mirror batch that is not full waits for more (default:
    /// `[proxy] mirror_linger`; 0s writes at once).
    #[arg(long, value_parser = parse_dur)]
    pub mirror_linger: Option<Duration>,
    /// Phase of the bench route: `redis_only` measures the proxy's splice
    /// without mirroring, to tell its cost from the mirror's.
    #[arg(long, default_value = "dual_write", value_parser = ["dual_write", "redis_only"])]
    pub phase: String,
    /// Items per LPUSH (a bulk push: one command carries this many).
    #[arg(long, default_value_t = 1)]
    pub items: usize,
    /// Leave twemproxy out (it is measured by default, and its absence is
    /// an error: `scripts/bench-deps.sh` installs it).
    #[arg(long)]
    pub without_twemproxy: bool,
    /// Pushes per second of all clients together, paced (0: as fast as the
    /// clients can): latency and mirror lag at a given load, not at
    /// saturation.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
}

/// What the mirror stall did to the proxy's clients.
#[derive(Debug, Default)]
struct Stall {
    locked_secs: f64,
    before_ops_s: f64,
    during_ops_s: f64,
    /// Pushes completed by the time the lock was released.
    done_at_release: u64,
}

/// A finished run.
pub struct ProxyRun {
    args: ProxyArgs,
    /// The mirror's settings the run used.
    mirror: MirrorOptions,
    direct: Side,
    /// Sides that only forward, measured in the same run: qbridge's splice
    /// alone (`redis_only`) and twemproxy when installed.
    references: Vec<(&'static str, Side)>,
    /// `--without-twemproxy`: the table says it was left out.
    twemproxy_left_out: bool,
    proxy: Side,
    /// Proxy pushes mirrored per second: the measured pushes over the time
    /// from the phase's start until the last of them was committed.
    mirror_items_s: f64,
    /// Mirror lag of the measured proxy pushes, ms, sorted.
    lag_ms: Vec<f64>,
    pushed: u64,
    mirrored: i64,
    rss_before_mib: f64,
    rss_peak_mib: f64,
    stall: Option<Stall>,
}

pub async fn run(config: &Config, args: &ProxyArgs) -> Result<ProxyRun> {
    let stalls = !args.slow_postgres.is_zero();
    check_args(args)?;
    let upstream = redis_addr(&config.proxy.upstream)?;
    let key = format!("qbridge:bench:{}", uuid::Uuid::new_v4());
    let db = prepare(config, &key).await?;
    let routes = bench_route(args, &key)?;
    let mirrors = args.phase == "dual_write";
    let repair_routes = routes.clone();
    let opts = mirror_options(config, args);
    // The writers get their own pool, one connection each, like `qbridge proxy`.
    let mirror_db = config.open_db(opts.writers as u32 + 1).await?;
    let probe: LagProbe = Arc::default();
    // The gap spool of production: a batch Postgres cannot take (a stall
    // beyond the writers' lock timeout) is parked in Redis and repaired
    // below, as `qbridge proxy`'s repair loop would; the final count check
    // proves nothing was lost on the way.
    let mut spool = connect_redis(&config.proxy.upstream).await?;
    let (mirror, writers) =
        Mirror::start_probed(mirror_db, Some(spool.clone()), opts, Some(probe.clone()));
    let server = Running::qbridge(config.proxy.clone(), routes, mirror.clone()).await?;
    let proxy_addr = server.addr;
    let key_text = key.clone();
    let key: Arc<[u8]> = Arc::from(key.into_bytes());
    let done = Arc::new(AtomicU64::new(0));
    phase(upstream, args, &key, "wd", WARMUP, &done).await?;
    let warm = phase(proxy_addr, args, &key, "wp", WARMUP, &done).await?;
    // Warm-up lags are not recorded: wait for their commits, then forget them.
    if mirrors {
        wait_for(Duration::from_secs(10), || lag_count(&probe) >= warm.items).await;
    }
    take_lags(&probe);
    let direct = phase(upstream, args, &key, "d", args.duration, &done).await?;
    // Keeps Redis's memory to one phase of items; not timed.
    del_key(&config.proxy.upstream, &key).await?;
    let references = references(config, args, &key_text, upstream, &mirror, &done).await?;
    // RSS from here on is the proxy's (the direct samples are freed).
    let rss_before_mib = rss_mib();
    let rss_stop = CancellationToken::new();
    let rss = sample_rss(rss_stop.clone());

    done.store(0, Ordering::Relaxed);
    let phase_start = Instant::now();
    let stall_task = stalls.then(|| {
        tokio::spawn(stall(
            config.database_url.clone(),
            phase_start,
            args.slow_postgres,
            done.clone(),
        ))
    });
    let proxy = phase(proxy_addr, args, &key, "p", args.duration, &done).await?;
    let stall_report = match stall_task {
        Some(task) => Some(task.await.map_err(join_err)??),
        None => None,
    };

    // Every proxy push (warm-up included) must become exactly one mirror copy.
    let pushed = if mirrors { warm.items + proxy.items } else { 0 };
    let deadline = Duration::from_secs(30) + args.slow_postgres;
    let mirrored = if mirrors {
        let limit = config.payload_limit;
        wait_for_mirror(&db, &mut spool, &repair_routes, pushed, deadline, limit).await?
    } else {
        count_mirrored(&db).await?
    };
    let mirror_items_s = proxy.items as f64 / phase_start.elapsed().as_secs_f64();
    rss_stop.cancel();
    let rss_peak_mib = rss.await.unwrap_or(0.0);
    let mut lag_ms: Vec<f64> = take_lags(&probe).into_iter().map(|s| s * 1e3).collect();
    lag_ms.sort_by(f64::total_cmp);
    server.stop().await;
    finish_mirror(mirror, writers).await;
    cleanup(&db, &config.proxy.upstream, &key_text).await?;
    Ok(ProxyRun {
        args: args.clone(),
        mirror: opts,
        direct,
        references,
        twemproxy_left_out: args.without_twemproxy,
        proxy,
        mirror_items_s: if mirrors { mirror_items_s } else { 0.0 },
        lag_ms,
        pushed,
        mirrored,
        rss_before_mib,
        rss_peak_mib,
        stall: stall_report,
    })
}

/// The forwarding-only sides, each after an unrecorded warm-up, with the
/// list emptied after each: qbridge's splice alone (unless the bench route
/// is `redis_only` already: then the proxy side is that) and twemproxy
/// (unless `--without-twemproxy`).
async fn references(
    config: &Config,
    args: &ProxyArgs,
    key: &str,
    upstream: SocketAddr,
    mirror: &Mirror,
    done: &Arc<AtomicU64>,
) -> Result<Vec<(&'static str, Side)>> {
    let raw: Arc<[u8]> = Arc::from(key.as_bytes());
    let mut sides = Vec::new();
    if args.phase == "dual_write" {
        let splice_args = ProxyArgs {
            phase: "redis_only".into(),
            ..args.clone()
        };
        let routes = bench_route(&splice_args, key)?;
        let splice = Running::qbridge(config.proxy.clone(), routes, mirror.clone()).await?;
        phase(splice.addr, args, &raw, "ws", WARMUP, done).await?;
        let side = phase(splice.addr, args, &raw, "s", args.duration, done).await?;
        splice.stop().await;
        del_key(&config.proxy.upstream, raw.as_ref()).await?;
        sides.push(("qbridge splice", side));
    }
    if args.without_twemproxy {
        return Ok(sides);
    }
    let twem = Twemproxy::start(upstream).await?;
    phase(twem.addr, args, &raw, "wt", WARMUP, done).await?;
    let side = phase(twem.addr, args, &raw, "t", args.duration, done).await?;
    drop(twem);
    del_key(&config.proxy.upstream, raw.as_ref()).await?;
    sides.push(("twemproxy", side));
    Ok(sides)
}

/// A migrated database without the previous runs' rows and key.
async fn prepare(config: &Config, key: &str) -> Result<PgPool> {
    let db = config.open_db(2).await?;
    crate::db::migrate(&db).await?;
    cleanup(&db, &config.proxy.upstream, key).await?;
    // Earlier runs' deleted rows would slow this one (a server with
    // autovacuum off keeps them): start from vacuumed tables.
    sqlx::query("VACUUM (ANALYZE) qbridge.jobs, qbridge.job_keys")
        .execute(&db)
        .await?;
    Ok(db)
}

/// The bench's route, exactly as a config file would declare it.
fn bench_route(args: &ProxyArgs, key: &str) -> Result<Routes> {
    let snippet = format!(
        "[[routes]]\nname = \"{PROXY_QUEUE}\"\nredis_key = \"{key}\"\nqueue = \"{PROXY_QUEUE}\"\n\
         format = \"json:/id\"\nphase = \"{}\"\n",
        args.phase
    );
    Ok(Routes::from_config(
        &Config::from_toml(&snippet, &Overrides::default())?.routes,
    ))
}

/// Shuts the mirror down in order (after the proxy answered what it read):
/// the writers write what was queued once the last handle is gone.
async fn finish_mirror(mirror: Mirror, mut writers: tokio::task::JoinSet<()>) {
    drop(mirror);
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while writers.join_next().await.is_some() {}
    })
    .await;
}

fn check_args(args: &ProxyArgs) -> Result<()> {
    if args.clients == 0 || args.depth == 0 {
        return Err(Error::InvalidInput(
            "--clients and --depth must be at least 1".into(),
        ));
    }
    if !args.slow_postgres.is_zero()
        && args.duration < args.slow_postgres + STALL_AT + Duration::from_secs(1)
    {
        return Err(Error::InvalidInput(
            "--duration must be at least --slow-postgres + 3s (the lock starts 2s in)".into(),
        ));
    }
    Ok(())
}

/// The mirror's settings: the config's, with the bench's overrides.
fn mirror_options(config: &Config, args: &ProxyArgs) -> MirrorOptions {
    MirrorOptions {
        buffer_bytes: config.proxy.mirror_buffer,
        batch_items: args
            .mirror_batch
            .unwrap_or(config.proxy.mirror_batch)
            .max(1),
        writers: args
            .mirror_writers
            .unwrap_or(config.proxy.mirror_writers)
            .max(1),
        linger: args.mirror_linger.unwrap_or(config.proxy.mirror_linger),
        payload_limit: config.payload_limit,
    }
}

/// Waits up to `deadline` until every push became a job, repairing what a
/// stall parked in the gap list meanwhile; returns the copies counted.
async fn wait_for_mirror(
    db: &PgPool,
    spool: &mut ::redis::aio::ConnectionManager,
    routes: &Routes,
    pushed: u64,
    deadline: Duration,
    payload_limit: usize,
) -> Result<i64> {
    let mut mirrored = 0;
    let until = Instant::now() + deadline;
    while Instant::now() < until {
        // Quiet unless something was parked (a --slow-postgres stall).
        while repair_gaps_once(db, spool, routes, payload_limit).await? > 0 {}
        mirrored = count_mirrored(db).await?;
        if mirrored >= pushed as i64 {
            return Ok(mirrored);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    use ::redis::AsyncCommands;
    let gap: i64 = spool
        .llen(RouteKeys::named(PROXY_QUEUE).gap())
        .await
        .unwrap_or(-1);
    tracing::warn!(
        gap_list = gap,
        missing = pushed as i64 - mirrored,
        "mirror count short after the wait"
    );
    Ok(mirrored)
}

/// Holds an EXCLUSIVE lock on `qbridge.job_keys` (every mirror write inserts
/// there) for `hold`, from `STALL_AT` into the phase; counts the pushes the
/// clients completed before and during it.
async fn stall(url: String, start: Instant, hold: Duration, done: Arc<AtomicU64>) -> Result<Stall> {
    let mut conn = sqlx::PgConnection::connect(&url).await?;
    tokio::time::sleep_until((start + STALL_AT).into()).await;
    let mut tx = conn.begin().await?;
    sqlx::query("LOCK TABLE qbridge.job_keys IN EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await?;
    let (locked, before) = (Instant::now(), done.load(Ordering::Relaxed));
    tokio::time::sleep(hold).await;
    let during = done.load(Ordering::Relaxed) - before;
    let locked_secs = locked.elapsed().as_secs_f64();
    tx.commit().await?;
    Ok(Stall {
        locked_secs,
        before_ops_s: before as f64 / locked.duration_since(start).as_secs_f64(),
        during_ops_s: during as f64 / locked_secs,
        done_at_release: before + during,
    })
}

/// Removes the bench route's rows and the bench list.
async fn cleanup(db: &PgPool, redis_url: &str, key: &str) -> Result<()> {
    for table in ["jobs", "jobs_dead", "job_keys", "key_occurrences"] {
        sqlx::query(&format!("DELETE FROM qbridge.{table} WHERE queue = $1"))
            .bind(PROXY_QUEUE)
            .execute(db)
            .await?;
    }
    del_key(redis_url, key.as_bytes()).await?;
    del_key(redis_url, format!("qbridge:gap:{PROXY_QUEUE}").as_bytes()).await
}

async fn del_key(redis_url: &str, key: &[u8]) -> Result<()> {
    let redis = Error::Redis;
    let client = ::redis::Client::open(redis_url).map_err(redis)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(redis)?;
    ::redis::cmd("DEL")
        .arg(key)
        .query_async::<()>(&mut conn)
        .await
        .map_err(redis)
}

/// Mirror copies in the ledger: a copy pushed in `dual_write` with shadow
/// calls off (the bench route) is recorded in `job_keys` without a `jobs`
/// row (`ingest::Item::ledger_only`).
async fn count_mirrored(db: &PgPool) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.job_keys WHERE queue = $1 AND copy = 'mirror'",
    )
    .bind(PROXY_QUEUE)
    .fetch_one(db)
    .await?)
}

fn lag_count(probe: &LagProbe) -> u64 {
    probe.lock().map(|v| v.len() as u64).unwrap_or(0)
}

fn take_lags(probe: &LagProbe) -> Vec<f64> {
    probe
        .lock()
        .map(|mut v| std::mem::take(&mut *v))
        .unwrap_or_default()
}

async fn wait_for(limit: Duration, mut ready: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !ready() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `host:port` of the upstream; the raw clients speak no AUTH, so none may be set.
fn redis_addr(url: &str) -> Result<SocketAddr> {
    let bad = |m: &str| Error::InvalidInput(format!("bench proxy: Redis URL: {m}"));
    let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if parsed.password().is_some() || parsed.scheme() != "redis" {
        return Err(bad("needs a plain redis:// URL without a password"));
    }
    let host = parsed.host_str().ok_or_else(|| bad("no host"))?;
    let port = parsed.port().unwrap_or(6379);
    std::net::ToSocketAddrs::to_socket_addrs(&(host, port))?
        .next()
        .ok_or_else(|| bad("host does not resolve"))
}

fn join_err(e: tokio::task::JoinError) -> Error {
    Error::InvalidInput(format!("bench task failed: {e}"))
}
