//! What a route's framework structures hold now (`model::structures`):
//! Sidekiq's `schedule`, `retry` and `dead` sets, RQ's registries, Resque's
//! `failed` list and resque-scheduler's delayed jobs, Celery's `unacked`
//! hash, the private lists of a Sidekiq reliable fetch — counted for the route's queue, with when the first and the last of
//! them is due. Shown by `qbridge cutover status` and the diff; the gate into
//! `decommissioned` refuses while any holds a job of the route.
//!
//! Every structure is walked page by page (`ZSCAN`, `LRANGE`, `HSCAN`),
//! never read whole: Sidekiq's dead set keeps 10,000 jobs by default, shared
//! by every queue, and this runs with every diff.

use chrono::{DateTime, Utc};
use redis::aio::ConnectionManager;
use serde::Serialize;

use crate::error::Result;
use crate::model::structures::{self, Holding, Shape, Structure};
use crate::routes::Route;

/// Members read per ZSCAN, LRANGE or HSCAN step.
const PAGE: usize = 1000;

/// One structure's jobs of the route.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Held {
    pub holding: Holding,
    /// The structure's key (a sorted set, a list, a hash; for
    /// resque-scheduler's delayed jobs, their index).
    pub key: String,
    /// The route's jobs in it.
    pub jobs: u64,
    /// The earliest score among them (when the next is due).
    pub next_at: Option<DateTime<Utc>>,
    /// The latest (when the last is due: the route's Redis side is quiet
    /// after it, as far as these jobs go).
    pub last_at: Option<DateTime<Utc>>,
}

impl Held {
    /// `schedule: 3 scheduled (next 2026-11-25 16:00:00, last 2026-11-25
    /// 17:00:00)`.
    pub fn describe(&self) -> String {
        let when = |at: DateTime<Utc>| at.format("%Y-%m-%d %H:%M:%S").to_string();
        match (self.next_at, self.last_at) {
            (Some(next), Some(last)) if self.holding != Holding::Dead && next != last => format!(
                "{}: {} {} (next {}, last {})",
                self.key,
                self.jobs,
                self.holding,
                when(next),
                when(last)
            ),
            (Some(next), _) if self.holding != Holding::Dead => format!(
                "{}: {} {} (next {})",
                self.key,
                self.jobs,
                self.holding,
                when(next)
            ),
            _ => format!("{}: {} {}", self.key, self.jobs, self.holding),
        }
    }
}

/// The structures that hold any of the route's jobs, one description each.
pub fn non_empty(held: &[Held]) -> Vec<String> {
    held.iter()
        .filter(|h| h.jobs > 0)
        .map(Held::describe)
        .collect()
}

/// Reads every structure of `route` (nothing for formats without any). A
/// reliable fetch's private lists are there only while a worker holds a
/// job in one: most fleets have none, and an empty pattern says nothing.
pub async fn read(conn: &mut ConnectionManager, route: &Route) -> Result<Vec<Held>> {
    let mut out = Vec::new();
    for structure in route.structures() {
        let held = count(conn, &structure).await?;
        if held.jobs > 0 || !is_private(&structure) {
            out.push(held);
        }
    }
    Ok(out)
}

/// Whether `structure` is a reliable fetch's private lists.
pub(crate) fn is_private(structure: &Structure) -> bool {
    structure.shape == Shape::PrivateLists
}

/// Reads one structure of a route.
pub async fn read_one(conn: &mut ConnectionManager, structure: &Structure) -> Result<Held> {
    count(conn, structure).await
}

/// Counts the route's members of one structure and their earliest and
/// latest times, page by page: a count keeps no member (this runs with every
/// diff, including the periodic gauges).
async fn count(conn: &mut ConnectionManager, structure: &Structure) -> Result<Held> {
    let (mut jobs, mut earliest, mut latest) = (0u64, None::<f64>, None::<f64>);
    scan_owned(conn, structure, |_, score| {
        jobs += 1;
        if let Some(score) = score {
            earliest = Some(earliest.map_or(score, |e| e.min(score)));
            latest = Some(latest.map_or(score, |l| l.max(score)));
        }
    })
    .await?;
    Ok(Held {
        holding: structure.holding,
        key: structure.key.clone(),
        jobs,
        next_at: earliest.and_then(structures::score_time),
        last_at: latest.and_then(structures::score_time),
    })
}

/// The route's members of one structure qbridge carries (a sorted set or
/// a list: [`Structure::carried`]), with their scores (0 for a list's).
pub(crate) async fn members(
    conn: &mut ConnectionManager,
    structure: &Structure,
) -> Result<Vec<(Vec<u8>, f64)>> {
    let mut out = Vec::new();
    scan_owned(conn, structure, |member, score| {
        out.push((member, score.unwrap_or(0.0)))
    })
    .await?;
    Ok(out)
}

/// Removes carried members from their structure: `ZREM` from a sorted set,
/// one `LREM` per entry from a list (an identical entry elsewhere in the
/// list is another job, and stays).
pub(crate) async fn remove(
    conn: &mut ConnectionManager,
    structure: &Structure,
    members: &[(Vec<u8>, f64)],
) -> Result<()> {
    match structure.shape {
        Shape::SortedSet => {
            for chunk in members.chunks(PAGE) {
                let names: Vec<&[u8]> = chunk.iter().map(|(m, _)| &m[..]).collect();
                let _: i64 = redis::cmd("ZREM")
                    .arg(&structure.key)
                    .arg(names)
                    .query_async(conn)
                    .await?;
            }
        }
        Shape::List => {
            for chunk in members.chunks(PAGE) {
                let mut pipe = redis::pipe();
                for (member, _) in chunk {
                    pipe.cmd("LREM").arg(&structure.key).arg(1).arg(&member[..]);
                }
                let _: Vec<i64> = pipe.query_async(conn).await?;
            }
        }
        Shape::DelayedIndex { .. } | Shape::UnackedHash { .. } | Shape::PrivateLists => {
            return Err(crate::error::Error::Refused(format!(
                "qbridge does not carry {}: {} jobs stay where they are",
                structure.key, structure.holding
            )))
        }
    }
    Ok(())
}

/// Hands each of the route's members of one structure to `each`, with its
/// time when the structure keeps one.
async fn scan_owned(
    conn: &mut ConnectionManager,
    structure: &Structure,
    mut each: impl FnMut(Vec<u8>, Option<f64>),
) -> Result<()> {
    match &structure.shape {
        Shape::SortedSet => {
            zscan(conn, &structure.key, |member, score| {
                if structure.owns(&member) {
                    each(member, Some(score));
                }
            })
            .await
        }
        Shape::List => {
            list_pages(conn, structure.key.as_bytes(), |member| {
                if structure.owns(&member) {
                    each(member, None);
                }
            })
            .await
        }
        Shape::DelayedIndex { lists } => {
            let mut stamps = Vec::new();
            zscan(conn, &structure.key, |ts, score| stamps.push((ts, score))).await?;
            for (ts, score) in stamps {
                let list = [lists.as_bytes(), &ts].concat();
                list_pages(conn, &list, |member| {
                    if structure.owns(&member) {
                        each(member, Some(score));
                    }
                })
                .await?;
            }
            Ok(())
        }
        Shape::PrivateLists => {
            for list in matching_keys(conn, &structure.key).await? {
                list_pages(conn, &list, |member| {
                    if structure.owns(&member) {
                        each(member, None);
                    }
                })
                .await?;
            }
            Ok(())
        }
        Shape::UnackedHash { index } => {
            let mut owned = Vec::new();
            hscan(conn, &structure.key, |tag, entry| {
                if structure.owns(&entry) {
                    owned.push((tag, entry));
                }
            })
            .await?;
            for (tag, entry) in owned {
                // A held task is due at its ETA; without one, it is the
                // worker's to run now (the index says since when).
                let due = match eta_of(&entry) {
                    Some(eta) => Some(eta),
                    None => {
                        redis::cmd("ZSCORE")
                            .arg(index)
                            .arg(&tag)
                            .query_async::<Option<f64>>(conn)
                            .await?
                    }
                };
                each(entry, due);
            }
            Ok(())
        }
    }
}

/// The `eta` header of a kombu message `[message, exchange, routing_key]`,
/// in seconds since the epoch.
fn eta_of(entry: &[u8]) -> Option<f64> {
    let entry: serde_json::Value = serde_json::from_slice(entry).ok()?;
    let eta = entry.get(0)?.get("headers")?.get("eta")?.as_str()?;
    let at = chrono::DateTime::parse_from_rfc3339(eta).ok()?;
    Some(at.timestamp_millis() as f64 / 1000.0)
}

/// The keys matching the glob `pattern`, walking the keyspace with `SCAN`
/// (never `KEYS`, which blocks Redis for the whole walk).
async fn matching_keys(conn: &mut ConnectionManager, pattern: &str) -> Result<Vec<Vec<u8>>> {
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, page): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(PAGE)
            .query_async(conn)
            .await?;
        keys.extend(page);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// A sorted set's members with their scores, page by page (ZSCAN).
async fn zscan(
    conn: &mut ConnectionManager,
    key: &str,
    each: impl FnMut(Vec<u8>, f64),
) -> Result<()> {
    scan_pairs("ZSCAN", conn, key, each).await
}

/// A hash's fields with their values, page by page (HSCAN).
async fn hscan(
    conn: &mut ConnectionManager,
    key: &str,
    each: impl FnMut(Vec<u8>, Vec<u8>),
) -> Result<()> {
    scan_pairs("HSCAN", conn, key, each).await
}

/// Walks a `ZSCAN`/`HSCAN` cursor to its end, handing each pair to `each`.
async fn scan_pairs<V: redis::FromRedisValue>(
    command: &str,
    conn: &mut ConnectionManager,
    key: &str,
    mut each: impl FnMut(Vec<u8>, V),
) -> Result<()> {
    let mut cursor: u64 = 0;
    loop {
        let (next, page): (u64, Vec<(Vec<u8>, V)>) = redis::cmd(command)
            .arg(key)
            .arg(cursor)
            .arg("COUNT")
            .arg(PAGE)
            .query_async(conn)
            .await?;
        for (name, value) in page {
            each(name, value);
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// A list, page by page from its head.
async fn list_pages(
    conn: &mut ConnectionManager,
    key: &[u8],
    mut each: impl FnMut(Vec<u8>),
) -> Result<()> {
    let mut start = 0isize;
    loop {
        let page: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(key)
            .arg(start)
            .arg(start + PAGE as isize - 1)
            .query_async(conn)
            .await?;
        let read = page.len();
        for member in page {
            each(member);
        }
        if read < PAGE {
            return Ok(());
        }
        start += PAGE as isize;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_celery_task_is_due_at_its_eta() {
        let entry = br#"[{"headers":{"eta":"2026-11-26T10:00:00+00:00","id":"t"},"body":"e30="},"","reports"]"#;
        let due = eta_of(entry).and_then(structures::score_time).unwrap();
        assert_eq!(due.to_rfc3339(), "2026-11-26T10:00:00+00:00");
        assert_eq!(eta_of(br#"[{"headers":{"eta":null}},"","reports"]"#), None);
    }
}
