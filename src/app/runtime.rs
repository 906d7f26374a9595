//! The worker runtime: builds everything `qbridge run` runs — pools, the batched
//! completer, the LISTEN connection, reaper, scheduler, history retention, gauges
//! and the HTTP listener — and shuts it down in order: stop intake, drain
//! handlers under the deadline, flush completions, stop maintenance, close the pool.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::app::services::RedisSide;
use crate::config::Config;
use crate::error::Result;
use crate::handler::Handler;
use crate::ingest::Via;
use crate::periodic;
use crate::queue::completer::{self, CompleterConfig, CompleterReport};
use crate::queue::listener::{self, Wakers};
use crate::queue::{history, reaper, schedule};
use crate::shadow::{OutcomeRecorder, RecorderOptions};
use crate::worker::gauges;
use crate::worker::pool::{PoolReport, RouteRuns, WorkerPool};

/// Totals after a run.
#[derive(Debug, Default, Clone, Copy)]
pub struct RuntimeReport {
    pub claimed: u64,
    pub handed_back: u64,
    pub completer: CompleterReport,
}

/// A built, not yet running, worker process.
pub struct Runtime {
    pub config: Config,
    pub db: PgPool,
    /// Start the HTTP listener (tests and benches may not want one).
    pub serve_http: bool,
    /// Gauge collection period.
    pub gauge_interval: Duration,
    /// Keep the LISTEN connection (off only to measure the poll backstop).
    pub listen: bool,
    /// Use this handler for every pool instead of the configured ones.
    pub handler_override: Option<Arc<Handler>>,
}

impl Runtime {
    /// Connects and checks the schema.
    pub async fn build(config: Config) -> Result<Runtime> {
        let db = crate::db::connect(&config.database_url, config.max_connections).await?;
        crate::db::check_schema(&db).await?;
        Ok(Runtime {
            config,
            db,
            serve_http: true,
            gauge_interval: Duration::from_secs(5),
            listen: true,
            handler_override: None,
        })
    }

    /// Runs until `stop` is cancelled, then shuts down gracefully.
    pub async fn run_until_stopped(self, stop: CancellationToken) -> Result<RuntimeReport> {
        let cfg = &self.config;
        let maintenance = CancellationToken::new();
        let mut background = Vec::new();

        if cfg.history.retention_days > 0 {
            // Before any completion, so today's partition exists.
            history::run_once(&self.db, cfg.history.retention_days).await?;
            let (db, days) = (self.db.clone(), cfg.history.retention_days);
            let hourly = Duration::from_secs(3600);
            background.push(tokio::spawn(periodic::every(
                hourly,
                maintenance.clone(),
                false,
                move || {
                    let db = db.clone();
                    async move {
                        if let Err(err) = history::run_once(&db, days).await {
                            tracing::warn!(error = %err, "history maintenance failed");
                        }
                    }
                },
            )));
        }
        let mut redis_side =
            RedisSide::start(cfg, &self.db, cfg.proxy.enabled, &maintenance).await?;
        if cfg.proxy.enabled {
            redis_side.start_proxy(cfg, None, stop.clone()).await?;
        }
        redis_side.start_consumers(cfg, &self.db, &stop).await?;
        if self.serve_http {
            let mut state =
                crate::http::AppState::new(self.db.clone(), crate::telemetry::prometheus());
            state.producer = redis_side.producer.clone().map(|p| p.with_via(Via::Http));
            state.payload_limit = cfg.payload_limit;
            state.max_body = cfg.http.max_body.0;
            state.admin_token = cfg.admin_token.clone();
            state.enqueue_requires_token = cfg.http.enqueue_requires_token;
            background
                .push(crate::http::serve(&cfg.http.listen, state, maintenance.clone()).await?);
        }

        let (done_tx, done_rx) = completer::spawn(
            self.db.clone(),
            CompleterConfig {
                batch_size: cfg.completer_batch,
                tick: cfg.completer_tick,
                keep_history: cfg.history.retention_days > 0,
                ..Default::default()
            },
        );

        // A route's pool records its live attempts for the shadow comparison;
        // the writer ends once the pools (every recorder clone) are gone.
        let route_queues: Vec<&str> = cfg.routes.iter().map(|r| r.queue.as_str()).collect();
        let is_route_pool = |pc: &crate::config::PoolConfig| {
            pc.queues.iter().all(|q| route_queues.contains(&q.as_str()))
        };
        let (recorder, outcome_writer) = if cfg.pools.iter().any(is_route_pool) {
            let (recorder, writer) = OutcomeRecorder::spawn(
                self.db.clone(),
                RecorderOptions::default(),
                CancellationToken::new(),
            );
            (Some(recorder), Some(writer))
        } else {
            (None, None)
        };
        let mut shadow_handlers = HashMap::new();
        for route in &cfg.routes {
            if let Some(h) = &route.cutover.shadow.handler {
                shadow_handlers.insert(route.name.clone(), Arc::new(Handler::from_config(h)?));
            }
        }
        let mut wakers = Wakers::default();
        let mut pools = Vec::new();
        for pc in &cfg.pools {
            let waker = Arc::new(Notify::new());
            wakers.register(&pc.queues, waker.clone());
            pools.push(WorkerPool {
                config: pc.clone(),
                db: self.db.clone(),
                handler: match &self.handler_override {
                    Some(h) => h.clone(),
                    None => Arc::new(Handler::from_config(&pc.handler)?),
                },
                completer: done_tx.clone(),
                waker,
                worker_id: cfg.worker_id.clone(),
                routes: recorder
                    .clone()
                    .filter(|_| is_route_pool(pc))
                    .map(|recorder| RouteRuns {
                        recorder,
                        routes: redis_side.routes.clone(),
                        shadow_handlers: shadow_handlers.clone(),
                    }),
            });
        }
        drop(done_tx);
        drop(recorder);

        if self.listen {
            background.push(tokio::spawn(listener::run(
                cfg.database_url.clone(),
                wakers,
                maintenance.clone(),
            )));
        }
        background.push(tokio::spawn(reaper::run(
            self.db.clone(),
            cfg.reaper_interval,
            maintenance.clone(),
        )));
        background.push(tokio::spawn(schedule::run(
            self.db.clone(),
            cfg.schedules.clone(),
            cfg.payload_limit,
            Duration::from_secs(1),
            maintenance.clone(),
        )));
        if cfg.pools.iter().any(|p| p.tenant.is_some()) {
            // Jobs that raced with the tenant setting get their tenant here.
            let db = self.db.clone();
            let minute = Duration::from_secs(60);
            background.push(tokio::spawn(periodic::every(
                minute,
                maintenance.clone(),
                false,
                move || {
                    let db = db.clone();
                    async move {
                        if let Err(err) = crate::queue::tenants::backfill(&db).await {
                            tracing::warn!(error = %err, "tenant backfill failed");
                        }
                    }
                },
            )));
        }
        background.push(tokio::spawn(gauges::run(
            self.db.clone(),
            self.gauge_interval,
            maintenance.clone(),
        )));

        tracing::info!(pools = pools.len(), worker = %cfg.worker_id, "worker runtime started");
        let deadline = cfg.shutdown_deadline;
        let running: Vec<_> = pools
            .into_iter()
            .map(|p| tokio::spawn(p.run(stop.clone(), deadline)))
            .collect();

        let mut report = RuntimeReport::default();
        if running.is_empty() {
            // Schedules, maintenance, the proxy or consumers only: nothing
            // ends on its own.
            stop.cancelled().await;
        }
        for handle in running {
            let r: PoolReport = handle.await.unwrap_or_default();
            report.claimed += r.claimed;
            report.handed_back += r.handed_back;
        }
        // Every pool (and so every completer sender) is gone: the completer
        // flushes what is left and returns.
        report.completer = done_rx.await.unwrap_or_default();
        if let Some(mut writer) = outcome_writer {
            if tokio::time::timeout(Duration::from_secs(10), &mut writer)
                .await
                .is_err()
            {
                writer.abort();
            }
        }
        redis_side.finish(&maintenance, cfg.shutdown_deadline).await;
        // A maintenance pass stuck on a half-open connection must not hold the
        // process: give them a moment, then abort.
        let grace = tokio::time::Instant::now() + Duration::from_secs(5);
        for mut handle in background {
            if tokio::time::timeout_at(grace, &mut handle).await.is_err() {
                handle.abort();
            }
        }
        if tokio::time::timeout(Duration::from_secs(5), self.db.close())
            .await
            .is_err()
        {
            tracing::warn!("closing database connections timed out");
        }
        tracing::info!(
            claimed = report.claimed,
            completed = report.completer.completed,
            handed_back = report.handed_back,
            "worker runtime stopped"
        );
        Ok(report)
    }
}
