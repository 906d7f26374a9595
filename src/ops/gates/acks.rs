//! The shadow gate's ack check: do both sides succeed at the same jobs?
//!
//! **Which jobs.** The jobs Redis owns (mirror copies) that came due inside
//! the window and at least `diff.settle` ago — due, not pushed: a job
//! scheduled for later (a countdown, `perform_in`) runs when due on both
//! sides — so each side had its time to run them. Counting outcomes by when
//! they were recorded instead counted a job on one side whose other outcome
//! fell just outside the window: a steady producer at 10 jobs/s made the
//! check refuse one evaluation in four. Live copies are left out: a key
//! Postgres runs live (the flipped share before a rollback) has no Redis
//! run to compare with, and counting its live runs held the shadow gate
//! shut after every rollback. A job that ran on Redis with its report lost
//! (the route's ran set) is left out as well: its outcome is unknown, not
//! different.
//!
//! **How far apart.** `ack_tolerance` is a rate, and a rate cannot be judged
//! on a handful of jobs: at 0.1% any difference below 1,000 jobs refused.
//! So the gap may be as large as a side that truly differs on
//! `ack_tolerance` of its jobs would show at 95% confidence (the binomial
//! quantile, [`allowed_gap`]): 0 below 52 jobs, 1 up to 355, 2 up to 818,
//! 3 at 1,000, 15 at 10,000, 117 at 100,000 — near the rate itself once the
//! volume allows it to be judged. A gap above that says the sides differ by
//! more than the tolerance, whatever the volume.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::error::Result;
use crate::routes::Route;

/// Per side, how many of the comparable jobs succeeded.
const ACKS_SQL: &str = r#"
WITH comparable AS (
    SELECT k.key FROM qbridge.job_keys k
     WHERE k.queue = $1 AND k.copy = 'mirror'
       AND greatest(k.seen_at, coalesce(k.due_at, k.seen_at)) >= $2
       AND greatest(k.seen_at, coalesce(k.due_at, k.seen_at)) < $3)
SELECT count(*) FILTER (WHERE r.ok),
       count(*) FILTER (WHERE p.ok),
       count(*)
  FROM comparable c
  CROSS JOIN LATERAL (SELECT EXISTS (SELECT 1 FROM qbridge.outcomes o
                                      WHERE o.queue = $1 AND o.key = c.key AND o.side = 'redis'
                                        AND o.outcome = 'ok') AS ok) r
  CROSS JOIN LATERAL (SELECT EXISTS (SELECT 1 FROM qbridge.outcomes o
                                      WHERE o.queue = $1 AND o.key = c.key AND o.side = 'postgres'
                                        AND o.outcome = 'ok' AND o.mode <> 'noise') AS ok) p
 -- Ran on Redis, its report lost: not comparable.
 WHERE r.ok OR NOT (c.key = ANY($4))
"#;

/// What the check counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acks {
    /// Comparable jobs that succeeded on Redis.
    pub redis: i64,
    /// Comparable jobs that succeeded on Postgres (a shadow call).
    pub postgres: i64,
    /// Comparable jobs.
    pub jobs: i64,
}

impl Acks {
    /// How far apart the two counts are.
    pub fn gap(&self) -> u64 {
        self.redis.abs_diff(self.postgres)
    }
}

/// Counts the comparable jobs of `route` due from `since` to `settled`;
/// `ran_unknown` are the keys the Redis side ran without a report.
pub async fn count(
    db: &PgPool,
    route: &Route,
    since: DateTime<Utc>,
    settled: DateTime<Utc>,
    ran_unknown: &[String],
) -> Result<Acks> {
    let (redis, postgres, jobs): (i64, i64, i64) = sqlx::query_as(ACKS_SQL)
        .bind(&route.queue)
        .bind(since)
        .bind(settled)
        .bind(ran_unknown)
        .fetch_one(db)
        .await?;
    Ok(Acks {
        redis,
        postgres,
        jobs,
    })
}

/// The largest gap between the sides' counts over `jobs` jobs that a side
/// differing on `rate` of its jobs shows at 95% confidence: the 95th
/// percentile of Binomial(`jobs`, `rate`), exact while the mean is small,
/// by the normal approximation beyond (where the two agree within a job).
pub fn allowed_gap(jobs: u64, rate: f64) -> u64 {
    const CONFIDENCE: f64 = 0.95;
    if jobs == 0 || rate <= 0.0 {
        return 0;
    }
    if rate >= 1.0 {
        return jobs;
    }
    let n = jobs as f64;
    let mean = n * rate;
    if mean > 50.0 {
        let sd = (mean * (1.0 - rate)).sqrt();
        return ((mean + 1.6449 * sd).ceil() as u64).min(jobs);
    }
    // P(X = 0) = (1 - rate)^n, then P(X = k + 1) = P(X = k) (n - k) / (k + 1) · rate / (1 - rate).
    let mut pmf = (n * (1.0 - rate).ln()).exp();
    let mut cdf = pmf;
    let mut k = 0u64;
    while cdf < CONFIDENCE && k < jobs {
        pmf *= (n - k as f64) / (k as f64 + 1.0) * rate / (1.0 - rate);
        k += 1;
        cdf += pmf;
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowed_gap_grows_with_the_jobs_judged() {
        let at = |n| allowed_gap(n, 0.001);
        assert_eq!((at(0), at(10), at(51)), (0, 0, 0));
        assert_eq!((at(52), at(355)), (1, 1));
        assert_eq!((at(356), at(818)), (2, 2));
        assert_eq!(at(1_000), 3);
        assert_eq!(at(10_000), 15);
        // Near the rate itself at volume: 0.13% of 100,000.
        assert_eq!(at(100_000), 117);
        assert_eq!(allowed_gap(500, 0.0), 0);
        assert_eq!(allowed_gap(5, 1.0), 5);
    }

    #[test]
    fn the_gap_is_the_distance_between_the_counts() {
        let acks = Acks {
            redis: 7,
            postgres: 9,
            jobs: 9,
        };
        assert_eq!(acks.gap(), 2);
    }
}
