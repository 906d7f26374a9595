//! The diff of one route over a window: what each side enqueued and ran,
//! the jobs seen on one side only, the outcome mismatches, the lag of each
//! side and a noise baseline — the numbers the gates read and operators see.
//!
//! Sources (all joined by job key):
//! - Postgres side: `qbridge.job_keys` (every key the route enqueued in
//!   Postgres, mirror or live copy) and the Postgres consumer's outcomes;
//! - Redis side: the outcomes the Redis consumer (or an outside fleet) reports
//!   and the items still held in Redis ([`super::redis_view`]).
//!
//! A mirror copy whose Redis copy was never reported nor is still in Redis
//! is repairable when there is evidence Redis lost it (a restart without
//! persistence, a flush, a failover after its push; see
//! [`super::evidence`]): its bytes are still in `job_keys.original` and
//! `--repair` pushes them back. Without evidence it is unaccounted, with
//! the reason, and only an operator's `--assume-lost` pushes it back. A Redis-side
//! job with no Postgres key was never mirrored: `--repair` mirrors those
//! still waiting in Redis; those already run on Redis ran live once, which is
//! what matters, and are only counted.

mod only_postgres;
mod queries;
mod render;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::config::RedisSideKind;
use crate::error::Result;
use crate::ops::evidence::{self, Accounting};
use crate::ops::redis_view::RedisView;
use crate::routes::Route;
use queries::Window;

/// Jobs and attempts one side shows in the window.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SideCounts {
    /// Distinct job keys.
    pub jobs: i64,
    /// Attempts that succeeded.
    pub acks: i64,
    /// Attempts that failed (another one followed).
    pub failures: i64,
    /// Jobs that failed for good.
    pub dead: i64,
    /// Jobs that succeeded more than once (a duplicate push, a lease expiry).
    pub ran_twice: i64,
    /// Push to first outcome, seconds: p50 and p99.
    pub lag_p50: Option<f64>,
    pub lag_p99: Option<f64>,
}

/// One job whose two sides disagree.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Mismatch {
    pub key: String,
    pub redis: String,
    pub postgres: String,
    /// Both answered with a body and the bodies' digests differ.
    pub digest_differs: bool,
}

/// The diff of one route.
#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    pub route: String,
    pub queue: String,
    pub phase: String,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// Keys enqueued in Postgres in the window (mirror and live copies).
    pub postgres_enqueued: i64,
    pub postgres_mirrors: i64,
    /// Keys seen on Redis in the window: reported outcomes plus items held now.
    pub redis_seen: i64,
    /// Items in Redis now: waiting, in processing lists, parked for the mirror repair.
    pub redis_waiting: usize,
    pub redis_processing: usize,
    pub redis_parked: usize,
    /// The Redis lists were longer than the diff reads: counts are lower bounds.
    pub redis_truncated: bool,
    /// The route's jobs in its framework's other structures (Sidekiq's
    /// schedule, retry and dead sets): only on Redis until decommission
    /// carries them.
    pub redis_elsewhere: Vec<crate::ops::structures::Held>,
    pub redis: SideCounts,
    pub postgres: SideCounts,
    /// Ran on Redis, never mirrored (nothing left to repair).
    pub only_redis_ran: i64,
    /// Waiting in Redis, never mirrored (`--repair` mirrors them).
    pub only_redis_waiting: i64,
    /// Mirrored, but Redis neither reported nor holds them: the repairable
    /// ones plus the unaccounted ones.
    pub only_postgres: i64,
    /// Of those, lost by Redis on evidence (`--repair` pushes them back),
    /// with the evidence lines.
    pub repairable: i64,
    pub repair_evidence: Vec<String>,
    /// Of those, without evidence either way (never pushed back without an
    /// operator's `--assume-lost`), with the reason and a sample.
    pub unaccounted: i64,
    pub unaccounted_reason: Option<String>,
    pub sample_unaccounted: Vec<String>,
    /// When each sampled unaccounted job came due (its push, or its
    /// countdown's end): a job due moments ago may still be running.
    pub sample_unaccounted_due: Vec<(String, DateTime<Utc>)>,
    /// Ran on Redis (in the route's ran set) with no outcome reported: the
    /// report was lost or could not be delivered (qbridge down while a
    /// fleet's reporter ran). Not compared, never pushed back.
    pub ran_outcome_unknown: i64,
    pub sample_ran_outcome_unknown: Vec<String>,
    /// Re-pushes after the flip held back until the Redis side shows it let
    /// go of the original (see `crate::ingest`), with a sample of keys.
    pub held_repushes: i64,
    pub sample_held_repushes: Vec<String>,
    /// Whether the Redis side reported any outcome in the window; without
    /// reports `only_postgres` cannot be told from "not run yet".
    pub redis_reports: bool,
    /// Sampled keys per category.
    pub sample_only_redis: Vec<String>,
    pub sample_only_postgres: Vec<String>,
    pub sample_ran_twice: Vec<String>,
    /// Jobs with a final outcome on both sides, and how many disagree.
    pub compared: i64,
    pub mismatched: i64,
    pub mismatches: Vec<Mismatch>,
    /// Second shadow calls compared with the first, and how many disagreed.
    pub noise_samples: i64,
    pub noise_disagreed: i64,
    /// Redis-side jobs with a Postgres copy / Redis-side jobs (1 when none).
    pub mirror_completeness: f64,
    pub mismatch_rate: f64,
    pub noise_rate: f64,
    /// Jobs that ran live on both sides (a Redis-side run and a live
    /// Postgres run of the same key): double runs across the cutover.
    pub ran_both_sides: i64,
    pub sample_ran_both_sides: Vec<String>,
    /// Re-pushes of jobs Postgres owns that the Redis side fetched and did
    /// not run (the live-key guard): double runs prevented.
    pub skipped_repushes: i64,
    /// Who runs the Redis side: with an outside fleet, a mirror copy only
    /// on Postgres has an unknown outcome, and repair does not push it back.
    pub redis_side: RedisSideKind,
    /// One line for people and logs.
    pub verdict: String,
}

impl Diff {
    /// Jobs on one side only.
    pub fn one_sided(&self) -> i64 {
        self.only_redis_ran + self.only_redis_waiting + self.only_postgres
    }

    /// Nothing one-sided, nothing held back, nothing mismatched, nothing
    /// ran twice (on one side or across both).
    pub fn matches(&self) -> bool {
        self.one_sided() == 0
            && self.held_repushes == 0
            && self.mismatched == 0
            && self.ran_both_sides == 0
            && self.redis.ran_twice == 0
            && self.postgres.ran_twice == 0
    }
}

pub(crate) use only_postgres::ONLY_POSTGRES_SQL;
pub(crate) use queries::ran_both_sides;
pub(crate) use queries::UNKNOWN_KEYS_SQL;
pub use render::table;

/// The distinct lines of evidence, with how many jobs each covers.
fn evidence_lines(accounting: &Accounting) -> Vec<String> {
    let mut lines: std::collections::BTreeMap<&str, usize> = Default::default();
    for (_, why) in &accounting.repairable {
        *lines.entry(why.as_str()).or_default() += 1;
    }
    lines
        .into_iter()
        .map(|(why, n)| format!("{n}: {why}"))
        .collect()
}

fn ratio(part: i64, whole: i64) -> f64 {
    if whole <= 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// What [`compute`] needs besides the database.
pub struct DiffInput<'a> {
    pub route: &'a Route,
    pub phase: &'a str,
    pub since: DateTime<Utc>,
    /// What Redis holds now (read before the Postgres queries, so a mirror
    /// written in between is seen).
    pub held: &'a RedisView,
}

/// Computes the diff of one route.
pub async fn compute(db: &PgPool, input: DiffInput<'_>) -> Result<Diff> {
    let route = input.route;
    let until = Utc::now();
    let settle = chrono::Duration::from_std(route.config.cutover.diff.settle).unwrap_or_default();
    let samples = route.config.cutover.diff.sample_keys;
    let window = Window {
        queue: route.queue.as_str(),
        since: input.since,
        settled: until - settle,
        held_keys: input.held.keys(),
        accounted_keys: input.held.accounted_keys(),
        before: input.held.before.clone(),
        samples,
    };
    let (enqueued, mirrors) = queries::enqueued(db, &window).await?;
    let (redis, postgres) = queries::side_counts(db, &window).await?;
    let sample_ran_twice = if redis.ran_twice + postgres.ran_twice > 0 {
        queries::ran_twice_sample(db, &window).await?
    } else {
        Vec::new()
    };
    let one_sided = queries::one_sided(db, &window).await?;
    let accounting = if one_sided.only_postgres > 0 {
        let keys = queries::only_postgres_keys(db, &window).await?;
        evidence::classify(db, route, input.held.epoch.as_ref(), keys).await?
    } else {
        Accounting::default()
    };
    let (held_repushes, sample_held_repushes) =
        crate::ingest::held_count(db, &route.queue, samples as i64).await?;
    let (compared, mismatched, mismatches) = queries::mismatches(db, &window).await?;
    let (noise_samples, noise_disagreed) = queries::noise(db, &window).await?;
    let (ran_both_sides, both_sample) =
        queries::ran_both_sides(db, window.queue, window.since, &input.held.ran, samples).await?;
    let skipped_repushes = queries::skipped_repushes(db, window.queue, window.since).await?;
    let (ran_outcome_unknown, unknown_sample) =
        queries::ran_unreported(db, window.queue, window.since, &input.held.ran, samples).await?;

    // Redis-side jobs: reported ones plus those held now (a key can be both:
    // a failed attempt waits for its retry).
    let reported_held = queries::reported_held(db, &window).await?;
    let held_unreported = window.held_keys.len() as i64 - reported_held;
    let redis_seen = redis.jobs + held_unreported;
    let only_redis = one_sided.only_redis_ran + one_sided.only_redis_waiting;
    let mirror_completeness = if redis_seen > 0 {
        1.0 - ratio(only_redis, redis_seen)
    } else {
        1.0
    };
    let sample_unaccounted: Vec<String> = accounting
        .unaccounted
        .iter()
        .take(samples)
        .cloned()
        .collect();
    let mut diff = Diff {
        route: route.name.clone(),
        queue: route.queue.clone(),
        phase: input.phase.to_string(),
        since: input.since,
        until,
        postgres_enqueued: enqueued,
        postgres_mirrors: mirrors,
        redis_seen,
        redis_waiting: input.held.waiting.len(),
        redis_processing: input.held.processing.len(),
        redis_parked: input.held.parked,
        redis_elsewhere: input.held.elsewhere.clone(),
        redis_truncated: input.held.truncated,
        redis_reports: redis.jobs > 0,
        redis,
        postgres,
        only_redis_ran: one_sided.only_redis_ran,
        only_redis_waiting: one_sided.only_redis_waiting,
        only_postgres: one_sided.only_postgres,
        repairable: accounting.repairable.len() as i64,
        repair_evidence: evidence_lines(&accounting),
        unaccounted: accounting.unaccounted.len() as i64,
        unaccounted_reason: accounting.reason.clone(),
        sample_unaccounted_due: queries::due_times(db, window.queue, &sample_unaccounted).await?,
        sample_unaccounted,
        ran_outcome_unknown,
        sample_ran_outcome_unknown: unknown_sample.into_iter().take(samples).collect(),
        held_repushes,
        sample_held_repushes: sample_held_repushes.into_iter().take(samples).collect(),
        sample_only_redis: one_sided
            .waiting_sample
            .into_iter()
            .chain(one_sided.ran_sample)
            .take(samples)
            .collect(),
        sample_only_postgres: one_sided.postgres_sample,
        sample_ran_twice,
        compared,
        mismatched,
        mismatches,
        noise_samples,
        noise_disagreed,
        mirror_completeness,
        mismatch_rate: ratio(mismatched, compared),
        noise_rate: ratio(noise_disagreed, noise_samples),
        ran_both_sides,
        sample_ran_both_sides: both_sample.into_iter().take(samples).collect(),
        skipped_repushes,
        redis_side: route.config.redis_side,
        verdict: String::new(),
    };
    diff.verdict = render::verdict(&diff);
    Ok(diff)
}
