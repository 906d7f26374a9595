//! `qbridge chaos`: runs the fault suite at full size and prints its table
//! (or the reports as JSON); exits non-zero if any scenario failed.

use crate::chaos::{self, Options, Scenario};
use crate::cli::ChaosArgs;
use crate::config::parse_duration;
use crate::error::{Error, Result};

pub async fn run(args: &ChaosArgs, as_json: bool) -> Result<()> {
    let opts = Options {
        bin: std::env::current_exe()?,
        rate: args.rate.max(2),
        span: parse_duration(&args.span)?,
        patience: parse_duration(&args.patience)?,
        notify_fill_mb: args.notify_fill_mb,
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
