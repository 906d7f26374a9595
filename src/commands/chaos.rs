//! `qbridge chaos`: runs the fault suite at full size and prints its table
//! (or the reports as JSON); exits non-zero if any scenario failed. With
//! `--scenario cutover-random` it walks the randomized cutover oracle over
//! `--seeds` seeds instead, a line per seed.

use crate::chaos::{self, Options, Scenario};
use crate::cli::ChaosArgs;
use crate::config::parse_duration;
use crate::error::{Error, Result};

pub async fn run(args: &ChaosArgs, as_json: bool) -> Result<()> {
    if args.scenario.contains(&Scenario::CutoverRandom) {
        return walk(args, as_json).await;
    }
    let opts = Options {
        bin: std::env::current_exe()?,
        rate: args.rate.max(2),
        span: parse_duration(&args.span)?,
        patience: parse_duration(&args.patience)?,
        notify_fill_mb: args.notify_fill_mb,
        via_pgbouncer: args.via_pgbouncer,
    };
    let scenarios = match args.scenario.is_empty() {
        true => Scenario::ALL.to_vec(),
        false => args.scenario.clone(),
    };
    let mut reports = Vec::new();
    for scenario in scenarios {
        if !as_json {
            eprintln!("running {} ({:?} of faults)…", scenario.name(), opts.span);
        }
        reports.push(chaos::run(scenario, &opts).await?);
    }
    match as_json {
        true => crate::output::json(&serde_json::json!({ "scenarios": reports })),
        false => print!("{}", chaos::table(&reports)),
    }
    let failed: Vec<&str> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| r.scenario.name())
        .collect();
    match failed.is_empty() {
        true => Ok(()),
        false => Err(Error::InvalidInput(format!(
            "fault suite failed: {}",
            failed.join(", ")
        ))),
    }
}

/// The randomized cutover oracle over `--seeds` seeds.
async fn walk(args: &ChaosArgs, as_json: bool) -> Result<()> {
    let campaign = chaos::cutover_random::Campaign {
        bin: std::env::current_exe()?,
        first_seed: args.seed,
        seeds: args.seeds,
        steps: args.steps,
        rate: args.rate.max(2),
        patience: parse_duration(&args.patience)?,
        via_pgbouncer: args.via_pgbouncer,
    };
    let reports = chaos::cutover_random::campaign(&campaign, |r| {
        if !as_json {
            println!("{}", chaos::cutover_random::line(r));
        }
    })
    .await?;
    match as_json {
        true => crate::output::json(&serde_json::json!({ "seeds": reports })),
        false => print!(
            "{}",
            chaos::cutover_random::summary(&reports)
                .lines()
                .last()
                .map(|l| format!("{l}\n"))
                .unwrap_or_default()
        ),
    }
    let failed = reports.iter().filter(|r| !r.passed()).count();
    match failed {
        0 => Ok(()),
        n => Err(Error::CheckFailed(format!(
            "randomized cutover oracle: {n} of {} seeds broke a promise",
            reports.len()
        ))),
    }
}
