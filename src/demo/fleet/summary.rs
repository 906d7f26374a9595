//! The fleet drill's summary: what the framework produced, what ran live
//! on each side, once, twice or never, and how it is reported.

use std::collections::BTreeSet;
use std::time::Instant;

use serde::Serialize;

use super::Framework;
use crate::demo::drill::{Drill, GateWait, PhaseTime};
use crate::demo::handler::Ledger;
use crate::error::{Error, Result};

/// What the fleet drill did.
#[derive(Debug, Clone, Serialize)]
pub struct FleetSummary {
    pub framework: Framework,
    /// The framework's version the drill ran (its own client's answer).
    pub framework_version: String,
    /// Jobs the framework's client pushed through the proxy.
    pub produced: u64,
    /// Of them, scheduled for later.
    pub scheduled: u64,
    /// Produced jobs that ran live at least once.
    pub run_live: u64,
    /// Live runs by the framework's workers (Redis side) and by qbridge's
    /// Postgres workers.
    pub ran_on_redis: u64,
    pub ran_on_postgres: u64,
    /// Shadow calls the runner answered on the Postgres side (recorded
    /// outcomes of mode shadow), compared with the fleet's reports.
    pub shadow_calls: u64,
    /// Jobs whose first attempt failed on purpose and were retried.
    pub failed_first_attempts: u64,
    pub duplicates: u64,
    pub lost: u64,
    pub duplicate_keys: Vec<String>,
    pub lost_keys: Vec<String>,
    pub forced_advances: u32,
    pub phases: Vec<PhaseTime>,
    /// Each advance: how long its gate kept it waiting, and on what.
    pub gate_waits: Vec<GateWait>,
    pub seconds: f64,
}

/// What ran live once, twice or never, of what the fleet produced.
pub(super) fn tally(
    (framework, framework_version): (Framework, String),
    drill: Drill,
    ledger: &Ledger,
    (produced, scheduled): (&BTreeSet<String>, u64),
    shadow_calls: u64,
    started: Instant,
) -> FleetSummary {
    let runs: Vec<(&String, u32)> = produced.iter().map(|k| (k, ledger.live(k))).collect();
    let keys = |pick: &dyn Fn(u32) -> bool| -> Vec<String> {
        runs.iter()
            .filter(|(_, n)| pick(*n))
            .map(|(k, _)| (*k).clone())
            .collect()
    };
    let (lost, twice) = (keys(&|n| n == 0), keys(&|n| n > 1));
    let (_, live_calls, _, _) = ledger.totals();
    let ran_on_redis = ledger.ran_on_redis();
    FleetSummary {
        framework,
        framework_version,
        produced: produced.len() as u64,
        scheduled,
        run_live: runs.iter().filter(|(_, n)| *n > 0).count() as u64,
        ran_on_redis,
        ran_on_postgres: live_calls.saturating_sub(ran_on_redis),
        shadow_calls,
        failed_first_attempts: ledger.failed_once() as u64,
        duplicates: twice.len() as u64,
        lost: lost.len() as u64,
        duplicate_keys: twice.into_iter().take(10).collect(),
        lost_keys: lost.into_iter().take(10).collect(),
        forced_advances: drill.forced,
        gate_waits: drill.gate_waits,
        phases: drill.phases,
        seconds: started.elapsed().as_secs_f64(),
    }
}

#[derive(Serialize)]
struct Report<'a> {
    ok: bool,
    servers: String,
    summary: &'a FleetSummary,
}

/// Prints the summary (or the JSON report); fails when a produced job was
/// lost or ran live twice.
pub fn report(s: &FleetSummary, servers: String, as_json: bool) -> Result<()> {
    let failed = s.lost > 0 || s.duplicates > 0;
    if as_json {
        crate::output::json(&Report {
            ok: !failed,
            servers,
            summary: s,
        });
    } else {
        let fw = s.framework.name();
        println!();
        println!(
            "produced {} jobs with {fw} {}'s own client through the proxy ({} scheduled for later)",
            s.produced, s.framework_version, s.scheduled
        );
        println!(
            "run live: {} jobs ({} by {fw}'s workers from Redis, {} by qbridge from Postgres through the runner); shadow calls compared: {}; first attempts failed and retried: {}",
            s.run_live, s.ran_on_redis, s.ran_on_postgres, s.shadow_calls, s.failed_first_attempts
        );
        println!("duplicates (run live twice): {}", s.duplicates);
        println!("lost: {}", s.lost);
        println!("advances forced past a gate: {}", s.forced_advances);
        println!("gate waits:");
        for w in &s.gate_waits {
            let held = match w.held_by.is_empty() {
                true => "passed at once".to_string(),
                false => format!("held by: {}", w.held_by.join(", ")),
            };
            let forced = if w.forced { " (forced)" } else { "" };
            println!("  {:<34} {:>7.0}s{forced}  {held}", w.gate, w.seconds);
        }
        crate::demo::drill::print_times(&s.phases, s.seconds);
    }
    if failed {
        return Err(Error::CheckFailed(format!(
            "the drill lost {} and ran {} jobs live twice (lost: {:?}; twice: {:?})",
            s.lost, s.duplicates, s.lost_keys, s.duplicate_keys
        )));
    }
    Ok(())
}
