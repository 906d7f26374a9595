//! `qbridge diff --route R [--since …] [--repair]`: the two sides of a route
//! compared, as a table (or `--json`) ending in a one-line verdict.

use chrono::{DateTime, Utc};

use crate::cli::DiffArgs;
use crate::commands::output;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::redis::producer::connect_redis_with;
use crate::redis::routes::Routes;
use crate::shadow::{diff, repair};

/// A window start: a duration back from now (`10m`) or an RFC 3339 time.
pub fn parse_since(text: &str) -> Result<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let back = crate::config::parse_duration(text).map_err(|_| {
        Error::InvalidInput(format!(
            "since {text:?}: use a duration back from now (10m, 1h) or an RFC 3339 time"
        ))
    })?;
    Ok(Utc::now() - chrono::Duration::from_std(back).unwrap_or_default())
}

/// The route table with the stored phases.
pub async fn stored_routes(db: &sqlx::PgPool, config: &Config) -> Result<Routes> {
    let view = crate::cutover::watch::stored_view(db, &config.routes).await?;
    Ok(Routes::new(&config.routes, view))
}

pub async fn run(config: &Config, args: &DiffArgs, as_json: bool) -> Result<()> {
    let db = crate::db::connect(&config.database_url, 2).await?;
    crate::db::check_schema(&db).await?;
    let routes = stored_routes(&db, config).await?;
    let route = routes
        .by_name(&args.route)
        .ok_or_else(|| {
            Error::InvalidInput(format!("no route named {:?} in the config", args.route))
        })?
        .clone();
    let since = match &args.since {
        Some(text) => parse_since(text)?,
        None => crate::cutover::gates::default_since(&db, &route).await?,
    };
    let phase = routes.phase(&route);
    let mut redis = connect_redis_with(&config.redis_url, &config.redis_tls).await?;
    let (d, held) =
        crate::cutover::gates::diff_since(&db, &mut redis, &route, phase, since).await?;
    let repaired = if args.repair {
        Some(
            repair::repair(
                &db,
                &mut redis,
                &route,
                phase,
                since,
                &held,
                config.payload_limit,
            )
            .await?,
        )
    } else {
        None
    };
    if as_json {
        output::json(&serde_json::json!({ "diff": d, "repair": repaired }));
        return Ok(());
    }
    print!("{}", diff::table(&d));
    if let Some(r) = repaired {
        println!(
            "repair: {} Redis items mirrored into Postgres, {} lost items pushed back to Redis ({} already pushed back earlier){}",
            r.mirrored,
            r.repushed,
            r.already_repushed,
            r.skipped.map(|s| format!("; {s}")).unwrap_or_default()
        );
    }
    Ok(())
}
