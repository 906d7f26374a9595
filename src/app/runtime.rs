//! `qbridge run`: builds everything the process runs — the Redis side
//! ([`super::redis_side`]), the HTTP listener, the batched completer, the
//! pools ([`super::pools`]) and the queue's background services
//! ([`super::maintenance`]) — and shuts it down in order: stop intake, drain
//! handlers under the deadline, flush completions, finish the Redis side,
//! stop the background services, close the pool.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::redis_side::RedisSide;
use super::{maintenance, pools};
use crate::config::Config;
use crate::error::Result;
use crate::handler::Handler;
use crate::http::AppState;
use crate::periodic::Services;
use crate::queue::completer::{self, CompleterConfig, CompleterReport};
use crate::worker::pool::PoolReport;

/// How long background services get to stop once everything else has.
const SERVICES_GRACE: Duration = Duration::from_secs(5);
/// How long the outcome writer gets to write what the pools recorded.
const OUTCOMES_GRACE: Duration = Duration::from_secs(10);

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
        let db = config.open_db(config.max_connections).await?;
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
        crate::metrics::zero_series(
            &cfg.routes
                .iter()
                .map(|r| r.name.clone())
                .collect::<Vec<_>>(),
            &cfg.pools
                .iter()
                .flat_map(|p| p.queues.iter().cloned())
                .collect::<Vec<_>>(),
        );
        let mut services = Services::new();
        maintenance::start_history(&mut services, cfg, &self.db).await?;
        let mut redis_side =
            RedisSide::start(cfg, &self.db, cfg.proxy.enabled, &mut services).await?;
        if cfg.proxy.enabled {
            redis_side.start_proxy(cfg, None, stop.clone()).await?;
        }
        redis_side.start_consumers(cfg, &self.db, &stop).await?;
        if self.serve_http {
            let state = AppState::from_config(cfg, self.db.clone(), redis_side.producer.clone());
            let http =
                crate::http::serve(&cfg.http.listen, state, services.token().clone()).await?;
            services.adopt("http listener", http);
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
        let built = pools::build(
            cfg,
            &self.db,
            &redis_side.routes,
            &done_tx,
            self.handler_override.as_ref(),
        )?;
        // Only the pools hold the completer's sender now: once they stop,
        // the completer flushes what is left and returns.
        drop(done_tx);
        maintenance::start(
            &mut services,
            cfg,
            &self.db,
            built.wakers,
            self.listen,
            self.gauge_interval,
        );
        tracing::info!(pools = built.pools.len(), worker = %cfg.worker_id, "worker runtime started");

        let mut report = run_pools(built.pools, &stop, cfg.shutdown_deadline).await;
        report.completer = done_rx.await.unwrap_or_default();
        if let Some(mut writer) = built.outcome_writer {
            if tokio::time::timeout(OUTCOMES_GRACE, &mut writer)
                .await
                .is_err()
            {
                writer.abort();
            }
        }
        redis_side.finish(cfg.shutdown_deadline).await;
        // A maintenance pass stuck on a half-open connection must not hold
        // the process: the services get a moment, then are aborted.
        services.stop(SERVICES_GRACE).await;
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

/// Runs every pool until `stop`, each draining its handlers under
/// `deadline`, and sums their reports. With no pools (schedules,
/// maintenance, the proxy or consumers only) nothing ends on its own, so
/// it waits for `stop`.
async fn run_pools(
    pools: Vec<crate::worker::pool::WorkerPool>,
    stop: &CancellationToken,
    deadline: Duration,
) -> RuntimeReport {
    let running: Vec<_> = pools
        .into_iter()
        .map(|p| tokio::spawn(p.run(stop.clone(), deadline)))
        .collect();
    let mut report = RuntimeReport::default();
    if running.is_empty() {
        stop.cancelled().await;
    }
    for handle in running {
        let r: PoolReport = handle.await.unwrap_or_default();
        report.claimed += r.claimed;
        report.handed_back += r.handed_back;
    }
    report
}
