//! `qbridge dlq list|show|requeue`.

use crate::cli::{DlqCommand, DlqFilter};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::output;
use crate::queue::dlq::{self, Selector};

fn selector(f: &DlqFilter) -> Result<Selector> {
    if let Some(q) = &f.queue {
        crate::queue::validate::queue_name(q)?;
    }
    Ok(Selector {
        ids: (!f.ids.is_empty()).then(|| f.ids.clone()),
        queue: f.queue.clone(),
        error_contains: f.error_contains.clone(),
    })
}

pub async fn run(config: &Config, cmd: DlqCommand, as_json: bool) -> Result<()> {
    let db = config.open_db(2).await?;
    crate::db::check_schema(&db).await?;
    match cmd {
        DlqCommand::List { filter, limit } => {
            let rows = dlq::list(&db, &selector(&filter)?, limit).await?;
            if as_json {
                // An object, like every other command's output, so fields can
                // be added later without breaking scripts.
                output::json(&serde_json::json!({ "dead_jobs": rows }));
            } else if rows.is_empty() {
                println!("no dead jobs match");
            } else {
                let table: Vec<Vec<String>> = rows
                    .iter()
                    .map(|r| {
                        vec![
                            r.id.to_string(),
                            r.queue.clone(),
                            r.kind.clone().unwrap_or_default(),
                            r.key.clone().unwrap_or_default(),
                            format!("{}/{}", r.attempts, r.max_attempts),
                            r.failed_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                            truncate(r.last_error.as_deref().unwrap_or(""), 60),
                        ]
                    })
                    .collect();
                println!(
                    "{}",
                    output::table(
                        &[
                            "id",
                            "queue",
                            "kind",
                            "key",
                            "attempts",
                            "failed_at",
                            "last_error"
                        ],
                        &table
                    )
                );
            }
        }
        DlqCommand::Show { id } => match dlq::show(&db, id).await? {
            Some(job) if as_json => output::json(&job),
            Some(job) => {
                let j = &job.job;
                println!("id:         {}", j.id);
                println!("queue:      {}", j.queue);
                println!("kind:       {}", j.kind.as_deref().unwrap_or("-"));
                println!("key:        {}", j.key.as_deref().unwrap_or("-"));
                println!("attempts:   {}/{}", j.attempts, j.max_attempts);
                println!("created_at: {}", j.created_at);
                println!("failed_at:  {}", j.failed_at);
                println!("last_error: {}", j.last_error.as_deref().unwrap_or("-"));
                println!("payload:    {}", job.payload);
            }
            None => return Err(Error::InvalidInput(format!("no dead job with id {id}"))),
        },
        DlqCommand::Requeue { filter, all, rate } => {
            let sel = selector(&filter)?;
            if sel.is_empty() && !all {
                return Err(Error::InvalidInput(
                    "requeue needs --id, --queue or --error, or --all to requeue every dead job"
                        .into(),
                ));
            }
            let total = dlq::count(&db, &sel).await?;
            let bar = output::progress(total as u64, as_json, "requeue");
            let moved = dlq::requeue(&db, &sel, rate, |n| bar.set_position(n)).await?;
            bar.finish_and_clear();
            let left = total as u64 - moved.min(total as u64);
            if as_json {
                output::json(&serde_json::json!({ "requeued": moved, "left_in_dlq": left }));
            } else {
                println!("requeued {moved} job(s)");
                if left > 0 {
                    println!("{left} matching job(s) stayed in the dead-letter table: their key is in flight again");
                }
            }
        }
    }
    Ok(())
}

fn truncate(text: &str, max: usize) -> String {
    let one_line = text.replace('\n', " ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        format!("{}…", one_line.chars().take(max).collect::<String>())
    }
}
