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
    let key_width = r
        .structures
        .iter()
        .map(|s| s.key.len())
        .chain([9])
        .max()
        .unwrap_or(9);
    let hold_width = r
        .structures
        .iter()
        .map(|s| s.holding.len())
        .chain([5])
        .max()
        .unwrap_or(5);
    let row = |key: &str, holding: &str, cells: [String; 4]| {
        let [found, new, known, left] = cells;
        format!(
            "{key:<key_width$}  {holding:<hold_width$}  {found:>8}  {new:>8}  {known:>8}  {left:>10}\n"
        )
    };
    let header = [
        "FOUND",
        if r.dry_run { "WOULD" } else { "NEW" },
        "KNOWN",
        "NOT COPIED",
    ]
    .map(String::from);
    let mut out = row("STRUCTURE", "HOLDS", header);
    for s in &r.structures {
        let cells = [s.found, s.new, s.known, s.not_copied].map(|n| n.to_string());
        out.push_str(&row(&s.key, &s.holding, cells));
    }
    let new: usize = r.structures.iter().map(|s| s.new).sum();
    let not_copied: usize = r.structures.iter().map(|s| s.not_copied).sum();
    out.push_str(&match (r.dry_run, new, not_copied) {
        (true, n, _) => format!(
            "{}: dry run, {n} jobs would be copied; nothing stored\n",
            r.route
        ),
        (false, 0, 0) => format!(
            "{}: nothing new; Postgres already has every job Redis holds\n",
            r.route
        ),
        (false, 0, left) => format!(
            "{}: nothing new; Postgres has every job Redis holds except the {left} not copied\n",
            r.route
        ),
        (false, n, _) => format!(
            "{}: {n} jobs copied; run it again until it reports nothing new\n",
            r.route
        ),
    });
    if not_copied > 0 {
        out.push_str(&format!("{not_copied} not copied: {NOT_COPIED_REASON}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::import::StructureImport;

    #[test]
    fn keys_show_as_redis_cli_shows_them_and_columns_line_up() {
        let report = ImportReport {
            route: "orders".into(),
            dry_run: false,
            structures: vec![
                StructureImport {
                    key: b"orders\x06\x163".escape_ascii().to_string(),
                    holding: "waiting".into(),
                    found: 12,
                    known: 12,
                    ..StructureImport::default()
                },
                StructureImport {
                    key: "unacked".into(),
                    holding: "held by a worker".into(),
                    found: 3,
                    new: 0,
                    known: 3,
                    ..StructureImport::default()
                },
            ],
        };
        let text = table(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].starts_with("orders\\x06\\x163  waiting  "),
            "{text}"
        );
        assert_eq!(lines[0].len(), lines[1].len(), "{text}");
        assert_eq!(lines[1].len(), lines[2].len(), "{text}");
        assert!(
            lines[3].contains("nothing new; Postgres already has every job"),
            "{text}"
        );
    }

    #[test]
    fn a_run_that_left_jobs_says_so() {
        let report = ImportReport {
            route: "mail".into(),
            dry_run: false,
            structures: vec![StructureImport {
                key: "resque:delayed_queue_schedule".into(),
                holding: "scheduled".into(),
                found: 2,
                not_copied: 2,
                ..StructureImport::default()
            }],
        };
        let text = table(&report);
        assert!(text.contains("except the 2 not copied"), "{text}");
        assert!(!text.contains("every job Redis holds\n"), "{text}");
    }
}
