//! `qbridge stats`: per-queue depth and lag, and database health.

use crate::config::Config;
use crate::error::Result;
use crate::output;
use crate::queue::stats;
use crate::redis::connect::connect_redis_with;
use crate::redis::route_stats;

pub async fn run(config: &Config, as_json: bool) -> Result<()> {
    let db = config.open_db(2).await?;
    crate::db::check_schema(&db).await?;
    let queues = stats::queues(&db).await?;
    let health = stats::db_health(&db).await?;
    let routes = crate::commands::routes::stored_routes(&db, config).await?;
    let route_stats = if routes.is_empty() {
        Vec::new()
    } else {
        // Redis lengths are a bonus: stats must work while Redis is down.
        let redis = connect_redis_with(&config.redis_url, &config.redis_tls)
            .await
            .ok();
        route_stats::collect(&db, &routes, redis).await?
    };
    if as_json {
        output::json(
            &serde_json::json!({ "queues": queues, "routes": route_stats, "database": health }),
        );
        return Ok(());
    }
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            vec![
                q.queue.clone(),
                q.ready.to_string(),
                q.running.to_string(),
                q.scheduled.to_string(),
                q.dead.to_string(),
                format!("{:.1}s", q.lag_seconds),
            ]
        })
        .collect();
    if rows.is_empty() {
        println!("no jobs in any queue");
    } else {
        println!(
            "{}",
            output::table(
                &["queue", "ready", "running", "scheduled", "dead", "lag"],
                &rows
            )
        );
    }
    if !route_stats.is_empty() {
        let len = |n: Option<i64>| n.map_or("?".to_string(), |n| n.to_string());
        let rows: Vec<Vec<String>> = route_stats
            .iter()
            .map(|r| {
                vec![
                    r.route.clone(),
                    r.phase.clone(),
                    r.keys.to_string(),
                    r.flagged.to_string(),
                    r.mirror_in_flight.to_string(),
                    r.live_in_flight.to_string(),
                    r.owed_to_redis.to_string(),
                    len(r.redis_list),
                    len(r.gap_list),
                ]
            })
            .collect();
        println!(
            "\n{}",
            output::table(
                &[
                    "route",
                    "phase",
                    "keys",
                    "flagged",
                    "mirror",
                    "live",
                    "owed",
                    "redis list",
                    "gap"
                ],
                &rows
            )
        );
    }
    println!(
        "\njobs table: {} live, {} dead tuples, last vacuum {}; oldest transaction {:.0}s; NOTIFY queue {:.1}% used",
        health.jobs_live_tuples,
        health.jobs_dead_tuples,
        if health.jobs_seconds_since_vacuum < 0.0 {
            "never".to_string()
        } else {
            format!("{:.0}s ago", health.jobs_seconds_since_vacuum)
        },
        health.oldest_xact_seconds,
        health.notify_queue_usage * 100.0
    );
    Ok(())
}
