//! The diff as Prometheus gauges, refreshed every minute for routes between
//! `dual_write` and `postgres_only` (before and after, one side is empty by
//! design). A diff reads the whole gate window, so only one process per
//! database computes it: the one whose open transaction holds the
//! transaction-scoped advisory lock (it writes nothing and, read committed,
//! keeps no snapshot between statements, so it holds back no vacuum; a
//! session lock would not survive a transaction-mode pooler, where the
//! unlock can reach another server connection). Scrape that one, or sum
//! with `max`.

use redis::aio::ConnectionManager;
use sqlx::PgPool;

use crate::error::Result;
use crate::metrics as m;
use crate::model::Phase;
use crate::ops::gates::diff_since;
use crate::queue::leader;
use crate::routes::Routes;

/// Computes each compared route's diff over its gate window and sets the
/// gauges, if no other process is doing it; says whether it did.
pub async fn publish_once(
    db: &PgPool,
    redis: &mut ConnectionManager,
    routes: &Routes,
) -> Result<bool> {
    let mut lead = db.begin().await?;
    let Some(led) = leader::try_lead(&mut lead, leader::DIFF_GAUGES).await? else {
        return Ok(false);
    };
    let result = publish_routes(db, redis, routes).await;
    led.done();
    // Ending the transaction releases the lock, whatever the result.
    lead.rollback().await?;
    result.map(|()| true)
}

async fn publish_routes(db: &PgPool, redis: &mut ConnectionManager, routes: &Routes) -> Result<()> {
    for route in routes.iter() {
        let phase = routes.phase(route);
        if matches!(phase, Phase::RedisOnly | Phase::Decommissioned) {
            continue;
        }
        let window =
            chrono::Duration::from_std(route.config.cutover.gates.window).unwrap_or_default();
        let (d, _) = diff_since(db, redis, route, phase, chrono::Utc::now() - window).await?;
        let name = route.name.clone();
        let gauge = |metric: &'static str, value: f64| {
            metrics::gauge!(metric, "route" => name.clone()).set(value);
        };
        gauge(m::DIFF_MISMATCHES, d.mismatched as f64);
        gauge(m::DIFF_MISMATCH_RATE, d.mismatch_rate);
        gauge(m::DIFF_NOISE_RATE, d.noise_rate);
        gauge(m::DIFF_MIRROR_COMPLETENESS, d.mirror_completeness);
        gauge(m::DIFF_RAN_BOTH_SIDES, d.ran_both_sides as f64);
        for (side, jobs, one_sided) in [
            (
                "redis",
                d.redis_seen,
                d.only_redis_ran + d.only_redis_waiting,
            ),
            ("postgres", d.postgres_enqueued, d.only_postgres),
        ] {
            metrics::gauge!(m::DIFF_JOBS, "route" => name.clone(), "side" => side).set(jobs as f64);
            metrics::gauge!(m::DIFF_ONE_SIDED, "route" => name.clone(), "side" => side)
                .set(one_sided as f64);
        }
    }
    Ok(())
}
