//! The queue's own background services of `qbridge run`: history retention,
//! the LISTEN connection, the reaper, recurring schedules, the tenant
//! backfill and the gauges. Each is one pass on a period (see
//! [`crate::periodic`]); the leader-elected ones take their advisory lock
//! inside the pass, so any number of processes can run them.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::Mutex;

use crate::config::Config;
use crate::error::Result;
use crate::periodic::{Services, Start};
use crate::queue::listener::{self, Wakers};
use crate::queue::{history, reaper, schedule, tenants};
use crate::worker::gauges::Gauges;

const HOURLY: Duration = Duration::from_secs(3600);
const MINUTE: Duration = Duration::from_secs(60);
/// How often schedules look for a due period.
const SCHEDULE_TICK: Duration = Duration::from_secs(1);

/// History retention: today's partition must exist before the first
/// completion, so the first pass runs now, before anything is started;
/// then hourly.
pub async fn start_history(services: &mut Services, cfg: &Config, db: &PgPool) -> Result<()> {
    let days = cfg.history.retention_days;
    if days == 0 {
        return Ok(());
    }
    history::run_once(db, days).await?;
    services.every(
        "history retention",
        HOURLY,
        Start::AfterOnePeriod,
        db.clone(),
        move |db| async move {
            if let Err(err) = history::run_once(&db, days).await {
                tracing::warn!(error = %err, "history maintenance failed");
            }
        },
    );
    Ok(())
}

/// What wakes, reaps, fires and measures. `listen: false` leaves the LISTEN
/// connection out (to measure the poll backstop alone).
pub fn start(
    services: &mut Services,
    cfg: &Config,
    db: &PgPool,
    wakers: Wakers,
    listen: bool,
    gauge_interval: Duration,
) {
    match cfg.database.listen_url(&cfg.database_url) {
        Some(url) if listen => {
            let token = services.token().clone();
            services.spawn(
                "LISTEN connection",
                listener::run(url.to_string(), wakers, token),
            );
        }
        None if listen => tracing::info!(
            "no LISTEN behind a transaction-mode pooler without [database] direct_url: \
             workers find jobs by polling (each pool's poll_interval)"
        ),
        _ => {}
    }
    services.every(
        "reaper",
        cfg.reaper_interval,
        Start::Now,
        db.clone(),
        |db| async move { reaper::pass(&db).await },
    );
    if !cfg.schedules.is_empty() {
        let state = (db.clone(), Arc::new(cfg.schedules.clone()));
        let limit = cfg.payload_limit;
        services.every(
            "schedules",
            SCHEDULE_TICK,
            Start::Now,
            state,
            move |(db, schedules)| async move { schedule::pass(&db, &schedules, limit).await },
        );
    }
    if cfg.pools.iter().any(|p| p.tenant.is_some()) {
        // Jobs that raced with the tenant setting get their tenant here.
        services.every(
            "tenant backfill",
            MINUTE,
            Start::AfterOnePeriod,
            db.clone(),
            |db| async move {
                if let Err(err) = tenants::backfill(&db).await {
                    tracing::warn!(error = %err, "tenant backfill failed");
                }
            },
        );
    }
    // Remembers the queues it reported, to zero the ones that disappear.
    let gauges = Arc::new(Mutex::new(Gauges::default()));
    services.every(
        "gauges",
        gauge_interval,
        Start::Now,
        (db.clone(), gauges),
        |(db, gauges)| async move { gauges.lock().await.pass(&db).await },
    );
}
