//! The Redis consumer of one route: runs the route's handler on the items
//! of its Redis list, live, for the routes whose Redis side qbridge runs.
//!
//! **Reliable pop.** Each of `concurrency` slots has its own connection and
//! processing list, `qbridge:processing:<route>:<consumer_name>:<n>`. A slot
//! `BLMOVE`s the oldest item (the end opposite the producers' push end) into
//! its list, runs the handler, and on success removes it (`LREM`). A failed
//! attempt is retried in place after `retry_delay`, up to `max_attempts`;
//! then — or at once for a permanent failure — the item moves to
//! `qbridge:dead:<route>`, in one Lua script with its removal from the
//! processing list. An item is therefore always in the source list, in a
//! processing list or in the dead list: never lost, never in two of them.
//!
//! **State that survives a crash.** Beside each processing list a hash
//! `qbridge:inflight:<route>:<consumer_name>:<n>` holds the item's job key
//! and its attempts so far. The attempt is counted *before* the handler
//! runs, so an item that crashes the process uses up attempts and ends in
//! the dead list instead of crashing it forever.
//!
//! **Recovery.** At start-up each slot first runs what its processing list
//! still holds, before popping anything new; lists of slots beyond the
//! current concurrency (it was lowered) are run by slot `n % concurrency`.
//! Recovered items are *processed first, in place* rather than pushed back to
//! the source list, because the inflight hash belongs to the processing
//! list: in place, an item keeps its job key (a content-hash key was numbered
//! by pop order and a second pop would number it again) and its attempt
//! count. It was also the oldest item, so running it first keeps the order.
//! A consumer only recovers its own lists: `consumer_name` must be stable
//! across restarts and unique among running processes.
//!
//! **Outcomes.** Every attempt is recorded (side `redis`, mode `live`) with
//! its job key, error class, response digest and attempt number through the
//! [`OutcomeRecorder`], which never blocks. Content-hash keys (resque, raw,
//! flagged items) are numbered by pop occurrence, the way the push side
//! numbers mirrored pushes ([`numbering`]: once per pop, retried rather than
//! run unnumbered, bounded in `redis_only`).
//!
//! **Phases.** It runs in every phase but `decommissioned`; in
//! `postgres_only` it keeps draining what is left. While decommissioned it
//! opens no Redis connection at all; it looks at the phase again every
//! `phase_poll` and stops its slots when the phase becomes decommissioned:
//! each slot finishes the item in hand (acked or dead) and pops no more.
//!
//! **Heartbeat.** While its slots run it beats
//! `qbridge:consumer:<route>:<consumer_name>` (the phase it acts on, the
//! items it holds) with a TTL, and once every slot stopped for
//! `decommissioned` it says so, holding nothing: decommission archives the
//! route's processing lists only then, or once the heartbeat expired
//! (`heartbeat` has the rules).
//!
//! **Shutdown.** Cancelling the token stops popping at once; an item being
//! handled gets `drain` more to finish, then is left in its processing list
//! for the next start; the heartbeat is deleted. Nothing here logs a
//! payload; logs carry the route, the slot and at most a short hash of a
//! job key.
//!
//! Redis Cluster is not supported: BLMOVE and the scripts touch the source,
//! processing and dead lists together.

pub mod heartbeat;
mod inflight;
pub mod numbering;
pub mod postgres_owns;
mod scripts;
mod slot;

use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use ::redis::Script;
use sqlx::PgPool;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::tls::RedisTls;
use crate::config::RedisConsumerConfig;
use crate::error::{Error, Result};
use crate::handler::Handler;
use crate::model::Phase;
use crate::redis::keys::{ConsumerKeys, RouteKeys};
use crate::routes::{Route, Routes};
use crate::shadow::OutcomeRecorder;

use heartbeat::Beater;
use slot::Slot;

/// Timing of a consumer; the defaults suit production.
#[derive(Debug, Clone, Copy)]
pub struct ConsumerOptions {
    /// How long one BLMOVE waits for an item; also how soon a slot notices
    /// a phase change when its list is empty.
    pub block: Duration,
    /// How long an in-flight handler may still run once shutdown starts.
    pub drain: Duration,
    /// Pause before reconnecting after a Redis error.
    pub reconnect_delay: Duration,
    /// How often a decommissioned route looks at its phase again.
    pub phase_poll: Duration,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        ConsumerOptions {
            block: Duration::from_secs(1),
            drain: Duration::from_secs(30),
            reconnect_delay: Duration::from_secs(1),
            phase_poll: Duration::from_secs(1),
        }
    }
}

/// What a consumer did, summed over its slots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerReport {
    /// The route's name.
    pub route: String,
    /// Items acked.
    pub ok: u64,
    /// Failed attempts followed by another attempt.
    pub failed: u64,
    /// Items moved to the dead list.
    pub dead: u64,
    /// Items found in a processing list at start-up and run.
    pub recovered: u64,
    /// Redis errors the slots reconnected after.
    pub redis_errors: u64,
    /// Items dropped unrun: re-pushes of a key Postgres holds live (it ran
    /// or runs that job; see `live_in_postgres`).
    pub dropped_live_in_postgres: u64,
    /// Items dropped unrun because the route's ran set already holds their
    /// key: a second push of a job this route finished.
    pub dropped_already_ran: u64,
    /// Whether it ever opened its slots' connections (false: the route was
    /// decommissioned the whole time).
    pub connected: bool,
}

impl ConsumerReport {
    fn add(&mut self, other: &ConsumerReport) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.dead += other.dead;
        self.recovered += other.recovered;
        self.redis_errors += other.redis_errors;
        self.dropped_live_in_postgres += other.dropped_live_in_postgres;
        self.dropped_already_ran += other.dropped_already_ran;
    }
}

/// What every slot of a consumer shares.
struct Ctx {
    route: Arc<Route>,
    routes: Routes,
    client: ::redis::Client,
    db: PgPool,
    handler: Arc<Handler>,
    outcomes: OutcomeRecorder,
    config: RedisConsumerConfig,
    opts: ConsumerOptions,
    keys: ConsumerKeys,
    route_keys: RouteKeys,
    ack: Script,
    dead: Script,
    drop: Script,
    claim: Script,
    /// Items the slots hold now (the heartbeat's `holding`).
    holding: AtomicU64,
    /// When the heartbeat was last written (ms since the epoch, 0 = never):
    /// slots pop only while it is fresh.
    beat_ok_ms: AtomicI64,
}

impl Ctx {
    fn phase(&self) -> Phase {
        self.routes.phase(&self.route)
    }
}

/// The Redis consumer of one route; see the module docs.
pub struct RedisConsumer {
    ctx: Ctx,
}

impl RedisConsumer {
    /// A consumer of `route` (which must have `[routes.redis_consumer]`),
    /// reading its phase from `routes`, numbering pops and recording
    /// outcomes in `db`; a `rediss://` URL trusts `tls`'s CA. Unless the
    /// route is decommissioned it checks now
    /// that Redis answers, so a wrong URL is a one-line error at start-up
    /// (password redacted); decommissioned, it connects to nothing.
    pub async fn new(
        route: Arc<Route>,
        routes: Routes,
        redis_url: &str,
        tls: &RedisTls,
        db: PgPool,
        handler: Handler,
        outcomes: OutcomeRecorder,
    ) -> Result<RedisConsumer> {
        let config = route.config.redis_consumer.clone().ok_or_else(|| {
            Error::Config(format!(
                "route {:?} has no [routes.redis_consumer]",
                route.name
            ))
        })?;
        let unreachable = |e| crate::redis::connect::unreachable(redis_url, e);
        let client = tls.client(redis_url).map_err(unreachable)?;
        if routes.phase(&route) != Phase::Decommissioned {
            let timeouts = ::redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(3)))
                .set_response_timeout(Some(Duration::from_secs(3)));
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&timeouts)
                .await
                .map_err(unreachable)?;
            let _: String = ::redis::cmd("PING")
                .query_async(&mut conn)
                .await
                .map_err(unreachable)?;
            let keys = RouteKeys::of(&route).consumer(&config.consumer_name);
            if heartbeat::in_use(&mut conn, &keys)
                .await
                .map_err(unreachable)?
            {
                return Err(Error::Config(format!(
                    "route {:?}: redis_consumer.consumer_name {:?} is in use by another running \
                     consumer (its heartbeat goes on); give each process its own name, stable \
                     across its restarts",
                    route.name, config.consumer_name
                )));
            }
        }
        let route_keys = RouteKeys::of(&route);
        let keys = route_keys.consumer(&config.consumer_name);
        Ok(RedisConsumer {
            ctx: Ctx {
                route,
                routes,
                client,
                db,
                handler: Arc::new(handler),
                outcomes,
                config,
                opts: ConsumerOptions::default(),
                keys,
                route_keys,
                ack: Script::new(scripts::ACK_LUA),
                dead: Script::new(scripts::DEAD_LUA),
                drop: Script::new(scripts::DROP_LUA),
                claim: Script::new(scripts::CLAIM_LUA),
                holding: AtomicU64::new(0),
                beat_ok_ms: AtomicI64::new(0),
            },
        })
    }

    /// Replaces the default timing (tests use short ones).
    pub fn with_options(mut self, opts: ConsumerOptions) -> RedisConsumer {
        self.ctx.opts = opts;
        self
    }

    /// Runs until `token` is cancelled; see the module docs.
    pub async fn run(self, token: CancellationToken) -> ConsumerReport {
        let ctx = Arc::new(self.ctx);
        let mut report = ConsumerReport {
            route: ctx.route.name.clone(),
            ..ConsumerReport::default()
        };
        loop {
            let started = ctx.phase();
            if started == Phase::Decommissioned {
                tokio::select! {
                    _ = token.cancelled() => return report,
                    _ = tokio::time::sleep(ctx.opts.phase_poll) => continue,
                }
            }
            if token.is_cancelled() {
                return report;
            }
            report.connected = true;
            let mut beater = Beater::new(&ctx);
            // Beaten before any slot touches a list: decommission must never
            // find this consumer's lists in use without its heartbeat.
            if !beater.first(started, &token).await {
                return report;
            }
            let stop_beating = CancellationToken::new();
            let slots = async {
                run_slots(&ctx, &token, &mut report).await;
                stop_beating.cancel();
            };
            tokio::join!(slots, beater.while_running(started, stop_beating.clone()));
            if token.is_cancelled() {
                beater.remove().await;
                return report;
            }
            // Every slot has stopped: nothing pops or runs any more.
            if ctx.phase() == Phase::Decommissioned {
                beater.acknowledge().await;
                tracing::info!(route = %ctx.route.name, "redis consumer: route decommissioned; slots stopped");
            }
        }
    }
}

/// Runs `concurrency` slots (and the orphaned lists they drain) until each
/// stops: shutdown, or the route decommissioned.
async fn run_slots(ctx: &Arc<Ctx>, token: &CancellationToken, report: &mut ConsumerReport) {
    let orphans = orphaned_slots(ctx).await;
    let n = ctx.config.concurrency;
    let mut slots = JoinSet::new();
    for index in 0..n {
        let mine = orphans.iter().copied().filter(|o| o % n == index).collect();
        slots.spawn(Slot::new(Arc::clone(ctx), index, mine).run(token.clone()));
    }
    while let Some(done) = slots.join_next().await {
        match done {
            Ok(r) => report.add(&r),
            Err(e) => {
                tracing::error!(route = %ctx.route.name, error = %e, "redis consumer slot panicked")
            }
        }
    }
}

/// Processing lists of this consumer beyond its current concurrency (it
/// ran with more slots before). A failed scan only delays their recovery
/// to the next start; the slots' own lists are always looked at.
async fn orphaned_slots(ctx: &Ctx) -> Vec<usize> {
    match scan_slots(ctx).await {
        Ok(mut found) => {
            found.retain(|&n| n >= ctx.config.concurrency);
            found.sort_unstable();
            found.dedup();
            found
        }
        Err(e) => {
            tracing::warn!(route = %ctx.route.name, error = %e,
                "redis consumer: cannot look for orphaned processing lists");
            Vec::new()
        }
    }
}

async fn scan_slots(ctx: &Ctx) -> ::redis::RedisResult<Vec<usize>> {
    let mut conn = ctx.client.get_multiplexed_async_connection().await?;
    let pattern = ctx.keys.processing_pattern();
    let mut cursor: u64 = 0;
    let mut found = Vec::new();
    loop {
        let (next, lists): (u64, Vec<String>) = ::redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        found.extend(lists.iter().filter_map(|l| ctx.keys.slot_of(l)));
        if next == 0 {
            return Ok(found);
        }
        cursor = next;
    }
}
