//! The randomized cutover oracle (`qbridge chaos --scenario cutover-random
//! --seeds N`): for each seed, one route walks — from `dual_write`, or from
//! `redis_only` with a backlog waiting — through a random sequence of
//! phase advances (with a flipped share), rollbacks, percent ramps, worker
//! kills, proxy kills, Redis and Postgres restarts, lost outcome reports,
//! jobs handed back across a phase change ([`hand_back`]), client
//! re-pushes of acknowledged jobs and repairs ([`steps`]), under continuous
//! load through the proxy and the producer API — ids on odd seeds, a few
//! identical texts on a `raw` route (content-hash keys) on even seeds — and
//! ends with the flip to
//! 100% and a decommission. Then the fault suite's [`oracle`] judges the
//! handler's ledger: every acknowledged job ran live (or is dead), none ran
//! live on both sides (but for a Redis attempt a crash interrupted, on
//! record), none twice while a lease was valid, no stale result
//! was applied. On top, the diff must show what happened: every job the
//! ledger saw run live on both sides, and any loss.
//!
//! A seed replays the same walk (the timing of the processes is not
//! replayed, so a failure's seed is where to start looking, not a
//! recording).

mod dump;
mod hand_back;
mod steps;

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::load::{Items, Load};
use super::oracle::{self, Verdict};
use super::rig::Rig;
use super::Harness;
use crate::error::Result;
use crate::model::Phase;
use crate::ops::operate;
use steps::{Step, BY};

/// How a campaign runs.
#[derive(Debug, Clone)]
pub struct Campaign {
    /// The qbridge binary the workers and the proxy run.
    pub bin: std::path::PathBuf,
    /// The first seed and how many.
    pub first_seed: u64,
    pub seeds: u64,
    /// Random steps per seed (the final flip and decommission come after).
    pub steps: usize,
    /// Jobs per second produced meanwhile.
    pub rate: u32,
    /// How long the end may take to drain.
    pub patience: Duration,
    /// The qbridge processes go through a transaction-mode PgBouncer.
    pub via_pgbouncer: bool,
}

/// What one seed did and what the oracle found.
#[derive(Debug, Clone, Serialize)]
pub struct SeedReport {
    pub seed: u64,
    /// Each step as it was taken (a failed step says why).
    pub steps: Vec<String>,
    #[serde(flatten)]
    pub verdict: Verdict,
    pub seconds: f64,
}

impl SeedReport {
    /// Whether the promise held.
    pub fn passed(&self) -> bool {
        self.verdict.violations.is_empty()
    }
}

/// Runs every seed of the campaign, one after another; `progress` hears
/// each report as it is done.
pub async fn campaign(
    c: &Campaign,
    mut progress: impl FnMut(&SeedReport),
) -> Result<Vec<SeedReport>> {
    let mut reports = Vec::new();
    for seed in c.first_seed..c.first_seed + c.seeds {
        let report = run_seed(c, seed).await?;
        progress(&report);
        reports.push(report);
    }
    Ok(reports)
}

/// Starts a walk's servers and processes. A start that fails is tried
/// again, twice: with walks in parallel another one can take a port between
/// this one choosing it and binding it (a campaign process ended on "Address
/// already in use" after 26 of its 142 seeds). The walk has not begun, so
/// nothing is judged twice.
async fn start_rig(c: &Campaign, items: Items, phase: Phase) -> Result<Rig> {
    let mut tries = 0;
    loop {
        match Rig::start_with(&c.bin, phase, "", items, c.via_pgbouncer).await {
            Ok(rig) => return Ok(rig),
            Err(e) if tries < 2 => {
                tries += 1;
                tracing::warn!(error = %e, "the walk's servers did not start; trying again");
            }
            Err(e) => return Err(e),
        }
    }
}

/// The walk's second proxy process (after the rig's own and its workers).
const SECOND_PROXY: &str = "proxy-b";

/// Items pushed at once before a walk that starts in `redis_only` leaves it.
const BACKLOG: usize = 300;

/// Seeds 2, 3, 6, 7, … start in `redis_only` with a backlog waiting in
/// Redis, and their first step takes the route into `dual_write` (where
/// the others start); any walk may roll back there later.
fn start_phase(seed: u64) -> Phase {
    match (seed / 2) % 2 {
        1 => Phase::RedisOnly,
        _ => Phase::DualWrite,
    }
}

/// One seed's walk, end and judgement.
pub async fn run_seed(c: &Campaign, seed: u64) -> Result<SeedReport> {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    // Odd seeds push ids, even seeds a few identical texts (content-hash
    // keys numbered by occurrence: the keys that can drift).
    let items = match seed % 2 {
        1 => Items::Ids,
        _ => Items::Repeating,
    };
    let start = start_phase(seed);
    let mut rig = start_rig(c, items, start).await?;
    // A second proxy: producers and re-pushes go through either, so a job's
    // re-push can reach a proxy that learns of a phase change at another
    // moment than the one still writing its first push.
    rig.add_process(SECOND_PROXY, start, true).await?;
    let h = Harness::attach(&rig).await?;
    let window_start = chrono::Utc::now() - chrono::Duration::seconds(1);
    let load = Load::start_across(c.rate, &rig.proxy_ports(), h.producer.clone(), items);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut done = Vec::new();
    if start == Phase::RedisOnly {
        done.push(stamped(
            steps::push_backlog(&rig, &load.acked, BACKLOG).await,
        ));
        let first = Step::Advance { percent: 100 };
        let said = steps::take(first, &mut rig, &h, &load.acked, &load.pause).await;
        done.push(stamped(
            said.unwrap_or_else(|e| format!("{first:?} failed: {e}")),
        ));
    }
    for _ in 0..c.steps {
        let state = operate::state_of(&rig.db, &h.route, BY).await;
        let (phase, percent) = state.map_or((Phase::DualWrite, 100), |s| (s.phase, s.percent));
        let step = steps::draw(&mut rng, phase, percent);
        let said = steps::take(step, &mut rig, &h, &load.acked, &load.pause).await;
        done.push(stamped(
            said.unwrap_or_else(|e| format!("{step:?} failed: {e}")),
        ));
        done.extend(rig.supervise().into_iter().map(stamped));
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..400))).await;
    }
    let acked = load.stop().await;
    oracle::record_acked(&rig.db, items, &acked.take()).await?;
    done.extend(rig.supervise().into_iter().map(stamped));
    let mut violations = finish(&mut rig, &h, seed, c.patience, &mut done).await;
    let mut verdict = oracle::judge(&rig.db, &rig.faults).await?;
    violations.extend(visible_in_the_diff(&rig, &h, window_start, &verdict).await?);
    verdict.violations.extend(violations);
    if !verdict.violations.is_empty() {
        dump::write(&rig.db, seed, &verdict.violations, &done).await;
        dump::keep_logs(rig.dir.path(), seed);
    }
    rig.stop();
    h.detach().await;
    Ok(SeedReport {
        seed,
        steps: done,
        verdict,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// A step as the walk reports it: the time it ended (UTC, to the
/// millisecond, to line up with the dump's rows and the processes' logs),
/// then what it did.
fn stamped(said: String) -> String {
    format!("{} {said}", chrono::Utc::now().format("%H:%M:%S%.3f"))
}

/// The end every walk has: forward to `postgres_only` with every key
/// flipped, drained, then decommissioned and drained again. What failed.
/// Waits (30 s at most) until the route's gap list is empty.
async fn wait_for_empty_gap(rig: &Rig, h: &Harness) {
    let gap = crate::redis::keys::RouteKeys::of(&h.route).gap();
    let Ok(mut redis) = crate::redis::connect::connect_redis(&rig.redis.url()).await else {
        return;
    };
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        let left: i64 = ::redis::cmd("LLEN")
            .arg(&gap)
            .query_async(&mut redis)
            .await
            .unwrap_or(0);
        if left == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn finish(
    rig: &mut Rig,
    h: &Harness,
    seed: u64,
    patience: Duration,
    done: &mut Vec<String>,
) -> Vec<String> {
    let mut failed = Vec::new();
    for _ in 0..4 {
        let Ok(state) = operate::state_of(&rig.db, &h.route, BY).await else {
            break;
        };
        let step = match (state.phase, state.percent) {
            (Phase::PostgresOnly, 100) => break,
            (Phase::PostgresOnly, _) => Step::Ramp { percent: 100 },
            _ => Step::Advance { percent: 100 },
        };
        if state.phase == Phase::RedisOnly {
            // The advance out of `redis_only` refuses while mirror writes
            // parked in an outage wait in the gap list (they could be
            // counted twice); as the runbook says, wait for gap repair.
            wait_for_empty_gap(rig, h).await;
        }
        match steps::take(step, rig, h, &Default::default(), &Default::default()).await {
            Ok(said) => done.push(stamped(format!("end: {said}"))),
            Err(e) => failed.push(format!("the end's {step:?} failed: {e}")),
        }
    }
    // As the runbook says before decommissioning: push back what the diff
    // shows Redis provably lost (the gate refuses while any is left; the
    // walk forces, so it is done here as an operator would). Past the
    // route's settle time (1 s) after the flip to 100%, when no push goes
    // to Redis any more: a copy mirrored within it is not judged yet, and
    // a repair then left the last copies Redis lost unjudged for good
    // (seeds 2104, 2112: the last copy of a text, pushed 0.1 s before).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    match steps::take(
        Step::Repair,
        rig,
        h,
        &Default::default(),
        &Default::default(),
    )
    .await
    {
        Ok(said) => done.push(stamped(format!("end: {said}"))),
        Err(e) => failed.push(format!("the end's repair failed: {e}")),
    }
    done.extend(rig.supervise().into_iter().map(stamped));
    if oracle::wait_until_done(&rig.db, patience).await.is_none() {
        dump::redis_lists(&rig.redis.url(), seed, "postgres_only").await;
        failed.push(format!(
            "not drained in postgres_only within {:.0} s",
            patience.as_secs_f64()
        ));
    }
    let decommission = Step::Advance { percent: 100 };
    match steps::take(
        decommission,
        rig,
        h,
        &Default::default(),
        &Default::default(),
    )
    .await
    {
        Ok(said) => done.push(stamped(format!("end: {said}"))),
        Err(e) => failed.push(format!("decommission failed: {e}")),
    }
    done.extend(rig.supervise().into_iter().map(stamped));
    if oracle::wait_until_done(&rig.db, patience).await.is_none() {
        failed.push(format!(
            "not drained after decommission within {:.0} s",
            patience.as_secs_f64()
        ));
    }
    failed
}

/// Jobs the ledger saw run live on both sides (a Redis-side call has job
/// id 0).
const LEDGER_BOTH_SIDES_SQL: &str = r#"
SELECT count(DISTINCT r.key) FROM chaos.ledger r
 WHERE r.mode = 'live' AND r.ok AND r.job_id = 0
   AND EXISTS (SELECT 1 FROM chaos.ledger p
                WHERE p.key = r.key AND p.mode = 'live' AND p.ok AND p.job_id <> 0)
"#;

/// A few of those keys, for the dump.
const LEDGER_BOTH_SIDES_KEYS_SQL: &str = r#"
SELECT DISTINCT r.key FROM chaos.ledger r
 WHERE r.mode = 'live' AND r.ok AND r.job_id = 0
   AND EXISTS (SELECT 1 FROM chaos.ledger p
                WHERE p.key = r.key AND p.mode = 'live' AND p.ok AND p.job_id <> 0)
 ORDER BY r.key LIMIT 3
"#;

/// The diff over the whole walk must show every double run across the
/// sides the ledger saw, and a loss when there is one.
async fn visible_in_the_diff(
    rig: &Rig,
    h: &Harness,
    since: chrono::DateTime<chrono::Utc>,
    verdict: &Verdict,
) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let both: i64 = sqlx::query_scalar(LEDGER_BOTH_SIDES_SQL)
        .fetch_one(&rig.db)
        .await?;
    let mut redis = crate::redis::connect::connect_redis(&rig.redis.url()).await?;
    let state = operate::state_of(&rig.db, &h.route, BY).await?;
    let (diff, _) =
        crate::ops::gates::diff_since(&rig.db, &mut redis, &h.route, state.phase, since).await?;
    if both > diff.ran_both_sides {
        let sample: Vec<String> = sqlx::query_scalar(LEDGER_BOTH_SIDES_KEYS_SQL)
            .fetch_all(&rig.db)
            .await?;
        found.push(format!(
            "{both} jobs ran live on both sides, the diff shows {} (ledger: {})",
            diff.ran_both_sides,
            sample
                .iter()
                .map(|k| format!("key {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if verdict.lost > 0 && diff.one_sided() + diff.held_repushes == 0 {
        found.push(format!(
            "{} jobs lost and the diff shows nothing one-sided",
            verdict.lost
        ));
    }
    Ok(found)
}

/// One line per seed, and a summary.
pub fn summary(reports: &[SeedReport]) -> String {
    let mut out = String::new();
    for r in reports {
        out.push_str(&line(r));
        out.push('\n');
    }
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| r.seed.to_string())
        .collect();
    let steps: usize = reports.iter().map(|r| r.steps.len()).sum();
    let jobs: u64 = reports.iter().map(|r| r.verdict.jobs).sum();
    out.push_str(&format!(
        "{} seeds, {steps} steps, {jobs} acknowledged jobs: {}\n",
        reports.len(),
        match failed.is_empty() {
            true => "every promise held".to_string(),
            false => format!("FAILED seeds {}", failed.join(", ")),
        }
    ));
    out
}

/// One seed's line: its numbers and, if it failed, the violations and steps.
pub fn line(r: &SeedReport) -> String {
    let extra: u64 = r.verdict.extra.values().sum();
    // Named apart: the one reason a job may run on both sides.
    let archived = match r.verdict.extra.get(oracle::INTERRUPTED_THEN_ARCHIVED) {
        Some(n) => format!(" ({n} after an interrupted Redis attempt)"),
        None => String::new(),
    };
    let mut text = format!(
        "seed {}: {} steps, {} jobs, {} lost, {} extra attempts{archived}, {:.1} s: {}",
        r.seed,
        r.steps.len(),
        r.verdict.jobs,
        r.verdict.lost,
        extra,
        r.seconds,
        if r.passed() { "ok" } else { "FAILED" }
    );
    if !r.passed() {
        text.push_str(&format!(
            "\n  violations: {}\n  steps: {}",
            r.verdict.violations.join("; "),
            r.steps.join(" | ")
        ));
    }
    text
}
