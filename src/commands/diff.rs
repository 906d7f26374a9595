//! `qbridge diff --route R [--since …] [--repair]`: the two sides of a route
//! compared, as a table (or `--json`) ending in a one-line verdict.

use crate::cli::DiffArgs;
use crate::config::Config;
use crate::error::Result;
use crate::ops::{diff, repair};
use crate::output;
use crate::redis::connect::connect_redis_with;

pub async fn run(config: &Config, args: &DiffArgs, as_json: bool) -> Result<()> {
    let assume = assumption(args)?;
    let db = config.open_db(2).await?;
    crate::db::check_schema(&db).await?;
    let routes = super::routes::stored_routes(&db, config).await?;
    let route = super::routes::find(&routes, &args.route)?;
    let since = match &args.since {
        Some(text) => crate::ops::window::parse_since(text)?,
        None => crate::ops::gates::default_since(&db, &route).await?,
    };
    let phase = routes.phase(&route);
    let mut redis = connect_redis_with(&config.redis_url, &config.redis_tls).await?;
    if args.repair {
        // Outcomes a stopped consumer synced to this host's spool are
        // evidence that its jobs ran: into Postgres before repair judges.
        let brought = crate::shadow::spool::bring_in(&config.state_dir, &db).await?;
        match (brought.found, brought.inserted) {
            (false, _) => eprintln!(
                "no consumer outcome spool at {} (state_dir): run repair where the consumers run, with their state_dir",
                brought.folder.display()
            ),
            (true, 0) => {}
            (true, n) => eprintln!(
                "{n} outcome(s) brought in from the consumer spools at {}",
                brought.folder.display()
            ),
        }
    }
    let (d, held) = crate::ops::gates::diff_since(&db, &mut redis, &route, phase, since).await?;
    let repaired = if args.repair {
        let input = repair::RepairInput {
            route: &route,
            phase,
            since,
            held: &held,
            payload_limit: config.payload_limit,
            assume: assume.as_ref(),
        };
        Some(repair::repair_with(&db, &mut redis, input).await?)
    } else {
        None
    };
    if as_json {
        output::json(&serde_json::json!({ "diff": d, "repair": repaired }));
        return Ok(());
    }
    print!("{}", diff::table(&d));
    if let Some(r) = repaired {
        print_repair(&r);
    }
    Ok(())
}

/// The operator's decision of `--assume-lost…`, checked before anything is
/// read (a decision without a reason is refused, nothing is done).
fn assumption(args: &DiffArgs) -> Result<Option<repair::Assumption>> {
    if args.assume_lost.is_empty() && args.assume_lost_before.is_none() {
        return Ok(None);
    }
    let before = match &args.assume_lost_before {
        Some(text) => Some(crate::ops::window::parse_since(text)?),
        None => None,
    };
    let assume = repair::Assumption {
        keys: args.assume_lost.clone(),
        before,
        by: super::operator(args.by.as_deref()),
        reason: args.reason.clone().unwrap_or_default(),
    };
    assume.check()?;
    Ok(Some(assume))
}

fn print_repair(r: &repair::RepairReport) {
    println!(
        "repair: {} Redis items mirrored into Postgres, {} lost items pushed back to Redis ({} already pushed back earlier), {} held re-pushes released live",
        r.mirrored, r.repushed, r.already_repushed, r.released
    );
    for (why, n) in &r.evidence {
        println!("  pushed back {n}: {why}");
    }
    if r.unaccounted > 0 {
        println!(
            "  not pushed back: {} unaccounted ({}), e.g. {}",
            r.unaccounted,
            r.unaccounted_reason
                .as_deref()
                .unwrap_or("no evidence either way"),
            r.unaccounted_sample.join(", ")
        );
    }
    if r.not_judged > 0 {
        println!(
            "  not judged: {} (Redis changed between its readings, up to {}, while its consumers worked; run the repair again when they are quieter)",
            r.not_judged,
            repair::MOST_READINGS
        );
    }
    if r.read_while_moving {
        println!(
            "  identical copies were pushed or popped during every reading: a loss of one of their texts may be hidden; run the repair again when the Redis side is quieter"
        );
    }
    if let Some(s) = &r.skipped {
        println!("  {s}");
    }
}
