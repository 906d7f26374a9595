//! `qbridge stats`: per-queue depth and lag, and database health.

use crate::commands::output;
use crate::config::Config;
use crate::error::Result;
use crate::queue::stats;

pub async fn run(config: &Config, as_json: bool) -> Result<()> {
    let db = crate::db::connect(&config.database_url, 2).await?;
    crate::db::check_schema(&db).await?;
    let queues = stats::queues(&db).await?;
    let health = stats::db_health(&db).await?;
    if as_json {
        output::json(&serde_json::json!({ "queues": queues, "database": health }));
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
