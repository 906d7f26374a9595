//! Resque's layout (read in Resque 3.0's `lib/resque/data_store.rb` and
//! `failure/redis.rb`, resque-scheduler 5.0's
//! `lib/resque/scheduler/delaying_extensions.rb`), under its namespace
//! (`resque:` by default):
//!
//! - `queues`: a set of queue names; `queue:<name>`: a list, RPUSHed, of
//!   `{"class", "args"}`;
//! - `failed`: a list shared by every queue, each entry naming its
//!   `queue` (a requeued one keeps its place with `retried_at` set);
//! - `workers`: a set of worker ids; `worker:<id>`: while the worker runs a
//!   job, `{"queue", "run_at", "payload"}`;
//! - resque-scheduler: `delayed_queue_schedule`, a sorted set of
//!   timestamps; `delayed:<ts>`: a list of `{"class", "args", "queue"}` due
//!   then; `timestamps:<job>`: a set per job (its name holds the job, so
//!   the survey never prints it).
//!
//! No Resque client runs here: the tests write these keys as those files
//! do.

use std::collections::BTreeSet;

use redis::aio::ConnectionManager;

use super::read::{self, Shape, Tally};
use super::report::{Found, Framework, QueueRow, Sizes};
use super::scan::Keyspace;
use super::Recognised;
use crate::error::Result;

/// Resque runs a job once (retries need the resque-retry plugin).
pub const MAX_ATTEMPTS: i32 = 1;

/// The Resque installation under `ns` (`resque:`).
pub async fn recognise(
    conn: &mut ConnectionManager,
    space: &Keyspace,
    ns: &str,
    names: &[String],
) -> Result<Recognised> {
    // Resque's own namespace is no option worth showing; another is.
    let label = if ns == "resque:" {
        ""
    } else {
        ns.trim_end_matches(':')
    };
    let mut found = Found::new(Framework::Resque, label);
    let mut queues: BTreeSet<String> = names.iter().cloned().collect();
    let list_prefix = format!("{ns}queue:");
    for list in space.lists_under(list_prefix.as_bytes()) {
        if let Ok(name) = std::str::from_utf8(&list[list_prefix.len()..]) {
            queues.insert(name.to_string());
        }
    }
    let mut claimed = Vec::new();
    let failed_key = format!("{ns}failed").into_bytes();
    let failed = if space.lists.contains(&failed_key) {
        claimed.push(failed_key.clone());
        Some(read::tally(conn, &failed_key, Shape::List, &mut unrequeued).await?)
    } else {
        None
    };
    let delayed = delayed(conn, space, ns, &mut found, &mut claimed).await?;
    let working = working(conn, space, ns, &mut found).await?;
    let mut rows = Vec::new();
    for queue in &queues {
        let key = format!("{ns}queue:{queue}").into_bytes();
        let mut row = QueueRow::new(Framework::Resque, found.namespace.as_str(), queue, key);
        row.waiting = read::lengths(conn, &[&row.raw_key]).await?[0];
        for (tally, column, name) in [
            (&delayed, &mut row.scheduled, "scheduled"),
            (&failed, &mut row.dead, "dead"),
        ] {
            *column = Some(tally.as_ref().map_or(0, |t| t.of(queue)));
            if tally.as_ref().is_some_and(Tally::estimated) {
                row.estimated.push(name);
            }
        }
        row.in_flight = Some(working.by_queue.get(queue).copied().unwrap_or(0));
        if row.waiting > 0 {
            let items = read::sample(conn, &row.raw_key, row.waiting).await?;
            row.payload =
                Sizes::of_lengths(items.iter().map(|i| i.len() as u64).collect(), "items");
        }
        rows.push(row);
    }
    Ok(Recognised {
        found,
        rows,
        claimed,
    })
}

/// A failed entry's queue, unless it was requeued since (`retried_at`).
fn unrequeued(entry: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(entry).ok()?;
    if value.get("retried_at").is_some_and(|at| !at.is_null()) {
        return None;
    }
    value.get("queue")?.as_str().map(str::to_owned)
}

/// resque-scheduler's delayed jobs by queue: every `delayed:<ts>` list,
/// read up to [`read::MAX_MEMBERS`] members in all.
async fn delayed(
    conn: &mut ConnectionManager,
    space: &Keyspace,
    ns: &str,
    found: &mut Found,
    claimed: &mut Vec<Vec<u8>>,
) -> Result<Option<Tally>> {
    let index = format!("{ns}delayed_queue_schedule").into_bytes();
    let prefix = format!("{ns}delayed:");
    let lists: Vec<&[u8]> = space
        .lists_under(prefix.as_bytes())
        .filter(|k| k[prefix.len()..].iter().all(u8::is_ascii_digit))
        .collect();
    if read::types(conn, &[&index]).await?[0] != "zset" && lists.is_empty() {
        return Ok(None);
    }
    found
        .options
        .push("resque-scheduler: delayed jobs in delayed_queue_schedule and delayed:<ts>".into());
    let mut all = Tally::default();
    for list in lists {
        claimed.push(list.to_vec());
        if all.read >= read::MAX_MEMBERS {
            all.total += read::lengths(conn, &[list]).await?[0];
            continue;
        }
        all.merge(read::tally(conn, list, Shape::List, &mut read::queue_field).await?);
    }
    Ok(Some(all))
}

/// The jobs Resque's workers run now, by queue (`worker:<id>` of every
/// registered worker; an idle worker has none).
async fn working(
    conn: &mut ConnectionManager,
    space: &Keyspace,
    ns: &str,
    found: &mut Found,
) -> Result<Tally> {
    let mut tally = Tally::default();
    let set = format!("{ns}workers").into_bytes();
    if !space.sets.contains(&set) {
        return Ok(tally);
    }
    let ids: Vec<Vec<u8>> = redis::cmd("SMEMBERS").arg(&set).query_async(conn).await?;
    found.workers = ids.len() as u64;
    for id in ids {
        let key = [ns.as_bytes(), b"worker:", &id].concat();
        if read::key_type(conn, &key).await? != "string" {
            continue;
        }
        let job: Option<Vec<u8>> = redis::cmd("GET").arg(&key).query_async(conn).await?;
        if let Some(queue) = job.as_deref().and_then(read::queue_field) {
            *tally.by_queue.entry(queue).or_default() += 1;
        }
    }
    Ok(tally)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requeued_failure_is_no_longer_the_queues() {
        assert_eq!(
            unrequeued(br#"{"payload":{},"queue":"mail","failed_at":"x"}"#),
            Some("mail".into())
        );
        assert_eq!(
            unrequeued(br#"{"payload":{},"queue":"mail","retried_at":"2026/11/26"}"#),
            None
        );
        assert_eq!(
            unrequeued(br#"{"payload":{},"queue":"mail","retried_at":null}"#),
            Some("mail".into())
        );
    }
}
