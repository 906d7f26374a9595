//! The Redis side of a process, built from the config: the route table
//! (following the stored phase flag), the producer (HTTP enqueue uses it),
//! the route maintenance services (key pruning, outbox repair, the diff
//! gauges), and — when asked — the RESP proxy with its mirror writers and
//! gap repair, and the Redis consumers with their outcome recorder.
//! `qbridge run` (with `[proxy] enabled`) and `qbridge proxy` both use it.
//!
//! Redis is connected only while some route still needs it: when every route
//! is `decommissioned` and no proxy runs, qbridge opens no Redis connection.

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::ConnectionManager;
use sqlx::PgPool;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::cutover::watch;
use crate::error::{Error, Result};
use crate::handler::Handler;
use crate::mirror::{self, Mirror, MirrorOptions};
use crate::model::Phase;
use crate::periodic::{Services, Start};
use crate::proxy::{ProxyDeps, ProxyServer};
use crate::redis::connect::connect_redis_with;
use crate::redis::consumer::{ConsumerOptions, ConsumerReport, RedisConsumer};
use crate::redis::outbox;
use crate::redis::producer::Producer;
use crate::routes::Routes;
use crate::shadow::outcomes::WriterReport;
use crate::shadow::{OutcomeRecorder, RecorderOptions};

/// How often owed pushes and parked mirror items are retried.
const REPAIR_EVERY: Duration = Duration::from_secs(5);
/// How often the diff gauges are refreshed.
const DIFF_EVERY: Duration = Duration::from_secs(60);
/// How often held re-pushes are settled on new evidence: a Celery retry
/// can arrive just before the report of the attempt it retries, and should
/// not wait long for it.
const SETTLE_EVERY: Duration = Duration::from_secs(1);
/// How often job keys past their dedup window are forgotten.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// How old an owed push must be before the repair loop makes it (so a
/// producer still pushing after its commit is not raced).
const OUTBOX_GRACE: Duration = Duration::from_secs(30);

/// The proxy's mirror writers: the handle the proxy queues into, and the
/// writer tasks that end once every handle is dropped.
type MirrorWriters = (Mirror, JoinSet<()>);

/// The running Redis side of a process.
pub struct RedisSide {
    /// Every configured route and its phase.
    pub routes: Routes,
    /// Phase-aware enqueue; `None` without routes.
    pub producer: Option<Producer>,
    /// The proxy's writers, when the proxy runs.
    mirror: Option<MirrorWriters>,
    /// This process among the followers of phase changes, with its pool:
    /// it leaves once what it routed is written.
    follower: Option<(PgPool, uuid::Uuid)>,
    /// The RESP proxy, once started; it stops with the intake token.
    proxy: Option<JoinHandle<()>>,
    /// Redis consumers, once started; they stop with the intake token.
    consumers: Vec<JoinHandle<ConsumerReport>>,
    /// The consumers' outcome recorder and its writer.
    outcomes: Option<(OutcomeRecorder, JoinHandle<WriterReport>)>,
}

impl RedisSide {
    /// Connects what the routes need and starts their maintenance into
    /// `services` (they stop with it). `with_mirror` also starts the proxy's
    /// mirror writers and the gap repair.
    pub async fn start(
        cfg: &Config,
        db: &PgPool,
        with_mirror: bool,
        services: &mut Services,
    ) -> Result<RedisSide> {
        // The stored phases, kept current: a phase change reaches every
        // path of this process (proxy, producer, HTTP, both consumers).
        // A process that runs the proxy routes pushes: it is one of the
        // followers every process's pushes wait for after a change.
        let follower = with_mirror.then(uuid::Uuid::new_v4);
        let (phases, watcher) = watch::attach_following(
            db,
            cfg.database.listen_url(&cfg.database_url),
            &cfg.routes,
            &cfg.worker_id,
            services.token(),
            follower,
        )
        .await?;
        if let Some(watcher) = watcher {
            services.adopt("phase watch", watcher);
        }
        let routes = Routes::new(&cfg.routes, phases);
        let needs_redis = with_mirror
            || routes
                .iter()
                .any(|r| routes.phase(r) != Phase::Decommissioned);
        let redis = match needs_redis {
            true => Some(connect_redis_with(&cfg.redis_url, &cfg.redis_tls).await?),
            false => None,
        };
        if !routes.is_empty() {
            start_route_maintenance(services, db, &routes, redis.as_ref(), cfg.payload_limit);
        }
        let producer = (!routes.is_empty()).then(|| {
            Producer::from_parts(db.clone(), redis.clone(), routes.clone(), cfg.payload_limit)
        });
        let mirror = match (with_mirror, &redis) {
            (true, Some(conn)) => Some(start_mirror(cfg, db, conn, &routes, services)),
            _ => None,
        };
        Ok(RedisSide {
            routes,
            producer,
            mirror,
            follower: follower.map(|id| (db.clone(), id)),
            proxy: None,
            consumers: Vec::new(),
            outcomes: None,
        })
    }

    /// Starts the Redis consumer of every route that has one, stopping with
    /// `intake`. Each checks Redis now (unless its route is decommissioned),
    /// so an unreachable Redis is a start-up error.
    pub async fn start_consumers(
        &mut self,
        cfg: &Config,
        db: &PgPool,
        intake: &CancellationToken,
    ) -> Result<usize> {
        let routes: Vec<_> = self
            .routes
            .iter()
            .filter(|r| r.config.redis_consumer.is_some())
            .cloned()
            .collect();
        if routes.is_empty() {
            return Ok(0);
        }
        // The writer outlives the consumers: it ends once they (and so every
        // recorder handle) are gone, after writing what they recorded.
        // Kept: a consumer acks an item once its outcome is handed over,
        // so the writer never drops a batch Postgres refuses; and spooled:
        // handed over means synced to local disk, so the record outlives
        // this process as well.
        let spool = super::outcome_spool::open(cfg, db, intake).await?;
        let (recorder, writer) = OutcomeRecorder::spawn_spooled(
            db.clone(),
            RecorderOptions {
                keep: true,
                ..RecorderOptions::default()
            },
            Some(spool),
            CancellationToken::new(),
        );
        for route in &routes {
            let handler_cfg = route.config.handler.as_ref().ok_or_else(|| {
                Error::Config(format!(
                    "route {:?}: redis_consumer needs a handler",
                    route.name
                ))
            })?;
            let consumer = RedisConsumer::new(
                Arc::clone(route),
                self.routes.clone(),
                &cfg.redis_url,
                &cfg.redis_tls,
                db.clone(),
                Handler::from_config(handler_cfg)?,
                recorder.clone(),
            )
            .await?
            .with_options(ConsumerOptions {
                drain: cfg.shutdown_deadline,
                ..ConsumerOptions::default()
            });
            self.consumers
                .push(tokio::spawn(consumer.run(intake.clone())));
        }
        self.outcomes = Some((recorder, writer));
        Ok(routes.len())
    }

    /// Binds the RESP proxy on `listen` (`[proxy] listen` unless given) and
    /// serves until `intake` is cancelled. Needs `with_mirror` at start.
    pub async fn start_proxy(
        &mut self,
        cfg: &Config,
        listen: Option<&str>,
        intake: CancellationToken,
    ) -> Result<std::net::SocketAddr> {
        let Some((mirror, _)) = &self.mirror else {
            return Err(Error::Config(
                "the proxy needs the mirror writers: start the Redis side with the proxy enabled"
                    .into(),
            ));
        };
        let deps = ProxyDeps {
            config: cfg.proxy.clone(),
            routes: self.routes.clone(),
            mirror: mirror.clone(),
        };
        let server = ProxyServer::bind(listen.unwrap_or(&cfg.proxy.listen), deps).await?;
        let addr = server.local_addr();
        self.proxy = Some(tokio::spawn(server.run(intake)));
        Ok(addr)
    }

    /// Shuts the Redis side down in order, once intake was cancelled: the
    /// proxy answers what it read, the consumers finish or leave their items
    /// in their processing lists, their outcomes are written, the mirror
    /// writers write (or park) what was queued. Each stage gets `deadline`
    /// of its own: a proxy that used all of its drain must not leave the
    /// mirror writers no time to write what Redis already took. The route
    /// maintenance stops later, with the process's services.
    pub async fn finish(mut self, deadline: Duration) {
        let stage = || tokio::time::Instant::now() + deadline;
        if let Some(mut proxy) = self.proxy.take() {
            if tokio::time::timeout_at(stage(), &mut proxy).await.is_err() {
                proxy.abort();
            }
        }
        let until = stage();
        for mut consumer in std::mem::take(&mut self.consumers) {
            match tokio::time::timeout_at(until, &mut consumer).await {
                Ok(Ok(r)) => tracing::info!(route = %r.route, ok = r.ok, failed = r.failed,
                    dead = r.dead, recovered = r.recovered, "redis consumer stopped"),
                // Anything unfinished stays in its processing list for the next start.
                _ => consumer.abort(),
            }
        }
        if let Some((recorder, mut writer)) = self.outcomes.take() {
            drop(recorder);
            if tokio::time::timeout_at(stage(), &mut writer).await.is_err() {
                writer.abort();
            }
        }
        // Outstanding Producer clones (HTTP) hold no Mirror, so dropping ours
        // (the proxy's went with it) lets the writers see the end of their
        // queue. With Postgres down they park the rest in the gap list fast
        // (their breaker skips the connect timeout).
        if let Some((mirror, mut writers)) = self.mirror.take() {
            drop(mirror);
            let until = stage();
            while let Ok(Some(_)) = tokio::time::timeout_at(until, writers.join_next()).await {}
            if !writers.is_empty() {
                tracing::error!("mirror writers did not finish in time; items still queued are neither mirrored nor parked (their Redis copies run; the diff reports them)");
                writers.abort_all();
            }
        }
        if let Some((db, process)) = self.follower.take() {
            if let Err(e) = crate::cutover::follow::leave(&db, process).await {
                tracing::warn!(error = %e, "could not leave the phase followers; the row expires");
            }
        }
    }
}

/// What every route needs while it migrates: job keys past their dedup
/// window forgotten, held re-pushes settled on new evidence; with Redis,
/// the owed producer pushes made, the keys Postgres owns live copied into
/// the live-key guard and the diff gauges refreshed.
fn start_route_maintenance(
    services: &mut Services,
    db: &PgPool,
    routes: &Routes,
    redis: Option<&ConnectionManager>,
    payload_limit: usize,
) {
    services.every(
        "held re-push settling",
        SETTLE_EVERY,
        Start::Now,
        db.clone(),
        move |db| async move {
            match crate::ingest::settle_held_once(&db, payload_limit).await {
                Ok(s) if s.released + s.resolved > 0 => tracing::info!(
                    released = s.released,
                    resolved = s.resolved,
                    "held re-pushes settled on the Redis side's reports"
                ),
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "held re-push settling deferred"),
            }
        },
    );
    let state = (db.clone(), routes.clone());
    services.every(
        "job key pruning",
        PRUNE_EVERY,
        Start::Now,
        state,
        |(db, routes)| async move {
            match crate::ingest::prune_keys_once(&db, &routes).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(keys = n, "forgot job keys past their dedup window"),
                Err(e) => tracing::warn!(error = %e, "job key pruning failed"),
            }
        },
    );
    let Some(conn) = redis else {
        return;
    };
    let state = (db.clone(), conn.clone(), routes.clone());
    services.every(
        "outbox repair",
        REPAIR_EVERY,
        Start::Now,
        state.clone(),
        |(db, mut conn, routes)| async move {
            if let Err(e) = outbox::repair_once(&db, &mut conn, &routes, OUTBOX_GRACE).await {
                tracing::debug!(error = %e, "outbox repair deferred");
            }
        },
    );
    services.every(
        "live-key guard",
        crate::redis::live_guard::PUBLISH_EVERY,
        Start::Now,
        state.clone(),
        |(db, mut conn, routes)| async move {
            crate::redis::live_guard::publish_once(&db, &mut conn, &routes).await;
        },
    );
    // Its own service: a refill of days of runs must not hold up the guard.
    services.every(
        "ran set refill",
        crate::redis::live_guard::PUBLISH_EVERY,
        Start::Now,
        state.clone(),
        |(db, mut conn, routes)| async move {
            crate::redis::ran_refill::refill_once(&db, &mut conn, &routes).await;
        },
    );
    services.every(
        "Redis epoch watch",
        crate::redis::epoch::OBSERVE_EVERY,
        Start::Now,
        state.clone(),
        |(db, mut conn, routes)| async move {
            if let Err(e) = crate::redis::epoch::observe_all(&mut conn, &db, &routes).await {
                tracing::debug!(error = %e, "Redis epoch observation deferred");
            }
        },
    );
    services.every(
        "diff gauges",
        DIFF_EVERY,
        Start::AfterOnePeriod,
        state,
        |(db, mut conn, routes)| async move {
            if let Err(e) = crate::ops::diff_metrics::publish_once(&db, &mut conn, &routes).await {
                tracing::debug!(error = %e, "diff metrics deferred");
            }
        },
    );
}

/// The proxy's mirror writers, and the gap repair that writes what they
/// parked while Postgres was down.
fn start_mirror(
    cfg: &Config,
    db: &PgPool,
    conn: &ConnectionManager,
    routes: &Routes,
    services: &mut Services,
) -> MirrorWriters {
    let opts = MirrorOptions {
        buffer_bytes: cfg.proxy.mirror_buffer,
        batch_items: cfg.proxy.mirror_batch,
        writers: cfg.proxy.mirror_writers,
        linger: cfg.proxy.mirror_linger,
        payload_limit: cfg.payload_limit,
    };
    let limit = cfg.payload_limit;
    services.every(
        "gap repair",
        REPAIR_EVERY,
        Start::Now,
        (db.clone(), conn.clone(), routes.clone()),
        move |(db, mut conn, routes)| async move {
            mirror::gap_repair_pass(&db, &mut conn, &routes, limit).await
        },
    );
    Mirror::start(db.clone(), Some(conn.clone()), opts)
}
