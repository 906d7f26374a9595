//! `qbridge import --route R [--dry-run]`: copies what already waits in
//! Redis for a route into Postgres (`ops::import`), with progress on stderr
//! and a summary per structure (or `--json`).

use std::io::Write as _;

use crate::cli::ImportArgs;
use crate::config::Config;
use crate::error::Result;
use crate::ops::import::{self, ImportReport, NOT_COPIED_REASON};
use crate::output;
use crate::redis::connect::connect_redis_with;

pub async fn run(config: &Config, args: &ImportArgs, as_json: bool) -> Result<()> {
    let db = config.open_db(2).await?;
    crate::db::check_schema(&db).await?;
    let routes = super::routes::stored_routes(&db, config).await?;
    let route = super::routes::find(&routes, &args.route)?;
    let mut redis = connect_redis_with(&config.redis_url, &config.redis_tls).await?;
    let phase = routes.phase(&route);
    let progress = |key: &str, read: usize| {
        if !as_json {
            eprint!("\rimport: {key}: {read} read");
            let _ = std::io::stderr().flush();
        }
    };
    let report = import::import(
        &db,
        &mut redis,
        &route,
        phase,
        args.dry_run,
        config.payload_limit,
        progress,
    )
    .await?;
    if as_json {
        output::json(&report);
    } else {
        eprintln!();
        print!("{}", table(&report));
    }
    Ok(())
}

/// The summary: one row per structure, then one verdict line.
fn table(r: &ImportReport) -> String {
    let mut out = format!(
        "{:<24} {:<10} {:>8} {:>8} {:>8} {:>8}\n",
        "STRUCTURE",
        "HOLDS",
        "FOUND",
        if r.dry_run { "WOULD" } else { "NEW" },
        "KNOWN",
        "NOT COPIED"
    );
    for s in &r.structures {
        out.push_str(&format!(
            "{:<24} {:<10} {:>8} {:>8} {:>8} {:>8}\n",
            s.key, s.holding, s.found, s.new, s.known, s.not_copied
        ));
    }
    let new: usize = r.structures.iter().map(|s| s.new).sum();
    let not_copied: usize = r.structures.iter().map(|s| s.not_copied).sum();
    out.push_str(&match (r.dry_run, new) {
        (true, n) => format!(
            "{}: dry run, {n} jobs would be copied; nothing stored\n",
            r.route
        ),
        (false, 0) => format!(
            "{}: nothing new; Postgres already has every job Redis holds\n",
            r.route
        ),
        (false, n) => format!(
            "{}: {n} jobs copied; run it again until it reports nothing new\n",
            r.route
        ),
    });
    if not_copied > 0 {
        out.push_str(&format!("{not_copied} not copied: {NOT_COPIED_REASON}\n"));
    }
    out
}
