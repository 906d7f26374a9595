//! The gauge collector: every few seconds, reads queue depths, lag, dead
//! letters and database health into Prometheus gauges. Queues that emptied out
//! are set back to zero rather than left at their last value.

use std::collections::HashSet;

use sqlx::PgPool;

use crate::error::Result;
use crate::metrics as m;
use crate::queue::stats;

/// Remembers which queues were reported, to zero the ones that disappear.
#[derive(Debug, Default)]
pub struct Gauges {
    seen: HashSet<String>,
}

impl Gauges {
    /// One collection pass.
    pub async fn run_once(&mut self, pool: &PgPool) -> Result<()> {
        let queues = stats::queues(pool).await?;
        let mut now_seen = HashSet::new();
        for q in &queues {
            let label = q.queue.clone();
            metrics::gauge!(m::JOBS_READY, "queue" => label.clone()).set(q.ready as f64);
            metrics::gauge!(m::JOBS_RUNNING, "queue" => label.clone()).set(q.running as f64);
            metrics::gauge!(m::JOBS_SCHEDULED, "queue" => label.clone()).set(q.scheduled as f64);
            metrics::gauge!(m::JOBS_DEAD, "queue" => label.clone()).set(q.dead as f64);
            metrics::gauge!(m::QUEUE_LAG, "queue" => label.clone()).set(q.lag_seconds);
            now_seen.insert(label);
        }
        for gone in self.seen.difference(&now_seen) {
            for name in [
                m::JOBS_READY,
                m::JOBS_RUNNING,
                m::JOBS_SCHEDULED,
                m::JOBS_DEAD,
                m::QUEUE_LAG,
            ] {
                metrics::gauge!(name, "queue" => gone.clone()).set(0.0);
            }
        }
        self.seen = now_seen;

        let h = stats::db_health(pool).await?;
        metrics::gauge!(m::TABLE_DEAD_TUPLES).set(h.jobs_dead_tuples as f64);
        metrics::gauge!(m::TABLE_SINCE_VACUUM).set(h.jobs_seconds_since_vacuum);
        metrics::gauge!(m::OLDEST_XACT).set(h.oldest_xact_seconds);
        metrics::gauge!(m::OLDEST_XMIN_AGE).set(h.oldest_xmin_age as f64);
        metrics::gauge!(m::NOTIFY_QUEUE_USAGE).set(h.notify_queue_usage);
        Ok(())
    }
}

impl Gauges {
    /// One pass of the gauge service: collects, and logs a failure.
    pub async fn pass(&mut self, pool: &PgPool) {
        if let Err(err) = self.run_once(pool).await {
            tracing::warn!(error = %err, "gauge collection failed");
        }
    }
}
