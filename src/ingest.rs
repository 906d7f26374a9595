//! Writing routed list items into Postgres: the one place that turns items
//! into jobs, shared by the proxy's group commit, the producer API, HTTP
//! enqueue and gap repair.
//!
//! For each item, on the caller's connection or transaction (nothing here
//! commits):
//! 1. decode it by its route's format (done by the caller: [`Item`]);
//! 2. items with no id get their occurrence number (`qbridge.key_occurrences`):
//!    mirror copies on side `push`, the count the Redis consumer's pops
//!    follow; live copies, which never reach Redis, on side `live` (`:pg<n>`).
//!    Identical bytes pushed twice are two jobs; the same write stored twice
//!    (it carries a write id) is one (`qbridge.numbered_writes`);
//! 3. the key goes into `qbridge.job_keys`, which remembers keys after their
//!    job is done: a key seen before (a Sidekiq retry, a producer retry) is a
//!    duplicate and no job is enqueued for it;
//! 4. new keys become jobs, live or mirror copies, with the original bytes;
//! 5. a live re-push of a key recorded as a mirror copy (after the flip)
//!    runs live only on evidence the Redis side let go of the original, and
//!    is held back otherwise ([`promote`], [`held`]); Redis handing a
//!    scheduled job out of its set after the flip is such evidence
//!    ([`release`]).

mod attempts;
mod held;
mod keys;
mod promote;
pub mod release;
mod writes;

pub use attempts::record_attempts;
pub use held::{held_count, release, settle_held_once, Settled};
pub use promote::{decide, Evidence, Verdict};

use std::collections::{HashMap, HashSet};

use serde_json::json;
use sqlx::PgConnection;

use crate::error::Result;
use crate::metrics as m;
use crate::model::formats::{attempts_so_far, Decoded, KeySource};
use crate::queue::{enqueue, validate, EnqueueOutcome, JobCopy, NewJob};
use crate::routes::Route;

/// The path an item came in by (the `via` of `job_keys`, a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Via {
    /// The RESP proxy.
    Proxy,
    /// The Rust producer API.
    Producer,
    /// `POST /v1/queues/{queue}/jobs`.
    Http,
    /// Gap repair after a Postgres outage, or `qbridge diff --repair`.
    Repair,
    /// Decommission: the Redis original itself, taken out of Redis, so the
    /// Redis side no longer holds it (the evidence a re-push needs).
    Archive,
    /// `qbridge import`: a copy of what already waited in Redis before the
    /// route was mirrored (it stays in Redis).
    Import,
}

impl Via {
    /// The label text.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Proxy => "proxy",
            Via::Producer => "producer",
            Via::Http => "http",
            Via::Repair => "repair",
            Via::Archive => "archive",
            Via::Import => "import",
        }
    }
}

/// One item to store.
#[derive(Debug)]
pub struct Item<'a> {
    /// Its route.
    pub route: &'a Route,
    /// The item read by the route's format.
    pub decoded: Decoded,
    /// Live copy (Postgres runs it) or mirror (Redis runs it).
    pub copy: JobCopy,
    /// How it came in.
    pub via: Via,
    /// Its key when already known: an item taken from Redis to be stored
    /// (repair, decommission's archive) has the key the Redis side gives it.
    pub known_key: Option<String>,
    /// The write id given to the item before its first write: storing the
    /// same write again finds the key it got (`qbridge.numbered_writes`)
    /// instead of numbering its content hash a second time.
    pub write: Option<String>,
    /// When Redis took the item, if before this store (a proxy push
    /// mirrored later): `job_keys.pushed_at`, what loss evidence is judged
    /// against.
    pub pushed_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When the job is due, if later than now (a job carried from a
    /// framework's schedule or retry set).
    pub run_at: Option<chrono::DateTime<chrono::Utc>>,
    /// A mirror copy pushed in `dual_write` on a route that records them in
    /// the ledger (`[routes.shadow] dual_write = "ledger"`, the default): its
    /// key and bytes go into `job_keys` and no `jobs` row is written — the
    /// row, its claim and its completion were most of the mirror's cost.
    /// A copy due later keeps its row (the diff reads its due
    /// time there).
    pub ledger_only: bool,
}

impl<'a> Item<'a> {
    /// An item with no known key and no write id.
    pub fn new(route: &'a Route, decoded: Decoded, copy: JobCopy, via: Via) -> Item<'a> {
        Item {
            route,
            decoded,
            copy,
            via,
            known_key: None,
            write: None,
            pushed_at: None,
            run_at: None,
            ledger_only: false,
        }
    }

    /// When the job is due, if later than its push: a set's score (the
    /// caller's `run_at`), else the message's own time (Celery's `eta`).
    pub fn due_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        self.run_at
            .or_else(|| crate::model::formats::due_at(&self.route.format, &self.decoded.payload))
    }
}

/// What became of one item, in input order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// A new job with this id and key.
    New { id: i64, key: String },
    /// The key was known: no new job.
    Duplicate { key: String },
    /// A new key of a ledger-only mirror copy ([`Item::ledger_only`]):
    /// recorded in `job_keys`, no `jobs` row.
    Recorded { key: String },
}

impl Stored {
    /// The item's job key.
    pub fn key(&self) -> &str {
        match self {
            Stored::New { key, .. } | Stored::Duplicate { key } | Stored::Recorded { key } => key,
        }
    }
}

const OCCURRENCES_SQL: &str = r#"
INSERT INTO qbridge.key_occurrences (queue, side, hash, n)
SELECT t.queue, t.side, t.hash, count(*)
  FROM unnest($1::text[], $2::text[], $3::text[]) AS t(queue, side, hash)
 GROUP BY t.queue, t.side, t.hash
 ORDER BY t.queue, t.side, t.hash
ON CONFLICT (queue, side, hash) DO UPDATE SET n = key_occurrences.n + excluded.n
RETURNING queue, side, hash, n
"#;

/// Counts a batch's items per (route, path): one labelled increment per
/// group, not one per item, on the proxy's hot path.
fn count(items: &[Item<'_>], stored: &[Stored], flags: &[Option<&str>]) {
    // (new, duplicate, flagged) per route and path.
    let mut groups: HashMap<(&str, Via), (u64, u64, u64)> = HashMap::new();
    for ((item, s), flag) in items.iter().zip(stored).zip(flags) {
        let group = groups.entry((&item.route.name, item.via)).or_default();
        match s {
            Stored::New { .. } | Stored::Recorded { .. } => group.0 += 1,
            Stored::Duplicate { .. } => group.1 += 1,
        }
        group.2 += u64::from(flag.is_some());
    }
    for ((route, via), (new, duplicate, flagged)) in groups {
        let route = route.to_string();
        metrics::counter!(m::MIRRORED, "route" => route.clone(), "via" => via.as_str())
            .increment(new);
        metrics::counter!(m::MIRROR_DUPLICATES, "route" => route.clone()).increment(duplicate);
        metrics::counter!(m::ITEMS_FLAGGED, "route" => route).increment(flagged);
    }
}

// Both statements take row locks in (queue, hash) / (queue, key) order, so
// two group commits sharing keys wait for each other instead of deadlocking.

/// Stores `items` on `conn` (see the module docs) and returns one outcome
/// per item, in order. An error leaves the caller's transaction to roll back.
pub async fn store(
    conn: &mut PgConnection,
    items: Vec<Item<'_>>,
    payload_limit: usize,
) -> Result<Vec<Stored>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let keys = assign_keys(conn, &items).await?;
    let oversize: Vec<bool> = items
        .iter()
        .map(|i| validate::payload_value(&i.decoded.payload, payload_limit).is_err())
        .collect();
    let flags: Vec<Option<&str>> = items
        .iter()
        .zip(&oversize)
        .map(|(i, &big)| match &i.decoded.flagged {
            Some(reason) => Some(reason.as_str()),
            None if big => Some(OVERSIZED),
            None => None,
        })
        .collect();
    let mut fresh = keys::known_keys(conn, &items, &keys, &flags).await?;
    let upgraded = promote::promote_or_hold(conn, &items, &keys, &oversize, &mut fresh).await?;
    let mut jobs = Vec::new();
    let mut fresh_index = Vec::new();
    let mut upgraded_index = Vec::new();
    let mut recorded = Vec::new();
    let mut claimed: HashSet<(&str, &str)> = HashSet::new();
    for (i, (item, key)) in items.iter().zip(&keys).enumerate() {
        // The first item of a batch with a key takes it; later ones are
        // duplicates of it, like a later batch's would be.
        let pair = (item.route.queue.as_str(), key.as_str());
        let owned = (pair.0.to_string(), pair.1.to_string());
        if let Some(&id) = upgraded.get(&owned) {
            if claimed.insert(pair) {
                upgraded_index.push((i, id));
            }
        } else if fresh.contains(&owned) && claimed.insert(pair) {
            if item.ledger_only && item.copy == JobCopy::Mirror && item.due_at().is_none() {
                recorded.push(i);
            } else {
                jobs.push(new_job(item, key, oversize[i]));
                fresh_index.push(i);
            }
        }
    }
    // The oversized ones carry a small stand-in payload now, within any limit.
    let outcomes = enqueue(conn, &jobs, payload_limit.max(1024)).await?;

    let mut stored: Vec<Stored> = keys
        .iter()
        .map(|k| Stored::Duplicate { key: k.clone() })
        .collect();
    for i in recorded {
        stored[i] = Stored::Recorded {
            key: keys[i].clone(),
        };
    }
    for (i, id) in upgraded_index {
        stored[i] = Stored::New {
            id,
            key: keys[i].clone(),
        };
    }
    for (i, outcome) in fresh_index.into_iter().zip(outcomes) {
        // An in-flight job with this key that job_keys did not know (enqueued
        // by plain SQL or `qbridge enqueue` with the same key) stays the one job.
        if let EnqueueOutcome::Inserted(id) = outcome {
            stored[i] = Stored::New {
                id,
                key: keys[i].clone(),
            };
        }
    }
    // A framework's retry (Sidekiq's retry_count, Celery's retries header)
    // starts from the attempts it already used on the Redis side, so the
    // route's max_attempts bounds the whole job.
    let mut used: std::collections::BTreeMap<&str, Vec<(String, i32)>> = Default::default();
    for (item, key) in items.iter().zip(&keys) {
        if let Some(n) = attempts_so_far(&item.route.format, &item.decoded.payload) {
            let queue = item.route.queue.as_str();
            used.entry(queue).or_default().push((key.clone(), n));
        }
    }
    for (queue, used) in used {
        record_attempts(conn, queue, &used).await?;
    }
    count(&items, &stored, &flags);
    Ok(stored)
}

/// The job key of every item: a known key as it is, ids as they are,
/// content hashes numbered by occurrence in push order — mirror copies
/// (which reach Redis) on the count the Redis consumer's pops follow, live
/// copies (which never do) on their own count, as `:pg<n>`. A write stored
/// before keeps the key it got.
async fn assign_keys(conn: &mut PgConnection, items: &[Item<'_>]) -> Result<Vec<String>> {
    let mut keys: Vec<Option<String>> = items
        .iter()
        .map(|item| match (&item.known_key, &item.decoded.key) {
            (Some(key), _) => Some(key.clone()),
            (None, KeySource::Id(_)) => Some(item.decoded.key.with_occurrence(0)),
            (None, KeySource::ContentHash(_)) => None,
        })
        .collect();
    let (writes, queues): (Vec<&str>, Vec<&str>) = items
        .iter()
        .zip(&keys)
        .filter(|(_, key)| key.is_none())
        .filter_map(|(item, _)| Some((item.write.as_deref()?, item.route.queue.as_str())))
        .unzip();
    if !writes.is_empty() {
        let written = writes::written_before(conn, &writes, &queues).await?;
        for (item, key) in items.iter().zip(keys.iter_mut()) {
            if let (None, Some(write)) = (&key, &item.write) {
                *key = written.get(write).cloned();
            }
        }
    }
    let (mut queues, mut sides, mut hashes) = (Vec::new(), Vec::new(), Vec::new());
    for (item, key) in items.iter().zip(&keys) {
        if let (None, KeySource::ContentHash(hash)) = (key, &item.decoded.key) {
            queues.push(item.route.queue.as_str());
            sides.push(side(item.copy));
            hashes.push(hash.as_str());
        }
    }
    if hashes.is_empty() {
        return Ok(keys.into_iter().flatten().collect());
    }
    // Totals after this batch; the batch's items take the last numbers.
    let rows: Vec<(String, String, String, i64)> = sqlx::query_as(OCCURRENCES_SQL)
        .bind(&queues)
        .bind(&sides)
        .bind(&hashes)
        .fetch_all(&mut *conn)
        .await?;
    let mut counts: HashMap<(&str, &str, &str), u64> = HashMap::new();
    for ((q, s), h) in queues.iter().zip(&sides).zip(&hashes) {
        *counts.entry((q, s, h)).or_default() += 1;
    }
    let mut next: HashMap<(String, String, String), u64> = HashMap::new();
    for (queue, side, hash, total) in rows {
        let in_batch = counts
            .get(&(queue.as_str(), side.as_str(), hash.as_str()))
            .copied()
            .unwrap_or(0);
        let first = (total as u64).saturating_sub(in_batch) + 1;
        next.insert((queue, side, hash), first);
    }
    let mut recorded = (Vec::new(), Vec::new(), Vec::new());
    for (item, key) in items.iter().zip(keys.iter_mut()) {
        let KeySource::ContentHash(hash) = &item.decoded.key else {
            continue;
        };
        if key.is_some() {
            continue;
        }
        let slot = next
            .entry((
                item.route.queue.clone(),
                side(item.copy).into(),
                hash.clone(),
            ))
            .or_insert(1);
        let n = *slot;
        *slot += 1;
        let numbered = match item.copy {
            JobCopy::Live => item.decoded.key.with_live_occurrence(n),
            JobCopy::Mirror => item.decoded.key.with_occurrence(n),
        };
        if let Some(write) = &item.write {
            recorded.0.push(write.as_str());
            recorded.1.push(item.route.queue.as_str());
            recorded.2.push(numbered.clone());
        }
        *key = Some(numbered);
    }
    writes::record(conn, &recorded.0, &recorded.1, &recorded.2).await?;
    Ok(keys.into_iter().flatten().collect())
}

/// The occurrence count an item's copy is numbered on: mirror copies reach
/// Redis and are popped there (`push`, matched by `pop`); live copies never
/// do (`live`).
fn side(copy: JobCopy) -> &'static str {
    match copy {
        JobCopy::Live => "live",
        JobCopy::Mirror => "push",
    }
}

/// The flag of an item whose payload is over `payload_limit`.
const OVERSIZED: &str =
    "payload over payload_limit; the item is kept in jobs.original (a mirror copy's in job_keys.original)";

/// Stores `items` in a transaction of their own; returns how many were new
/// jobs (the rest were duplicates of known keys).
pub async fn store_counting_new(
    db: &sqlx::PgPool,
    items: Vec<Item<'_>>,
    payload_limit: usize,
) -> Result<usize> {
    let mut tx = db.begin().await?;
    let stored = store(&mut tx, items, payload_limit).await?;
    tx.commit().await?;
    Ok(stored
        .iter()
        .filter(|s| matches!(s, Stored::New { .. }))
        .count())
}

/// The job of one item. A payload over the limit is not refused (Redis has
/// already taken the item): it is stored flagged, with its bytes kept in
/// `original`, so nothing is lost and `stats` shows it. A mirror copy keeps
/// its bytes in `job_keys.original` instead (until the Redis side reports
/// the job): its own row is drained within moments, and writing the bytes
/// twice on the mirror's hot path cost the proxy its mirror lag target.
pub(crate) fn new_job(item: &Item<'_>, key: &str, oversize: bool) -> NewJob {
    let decoded = &item.decoded;
    let payload = if oversize {
        json!({ "flagged": OVERSIZED, "original_len": decoded.original.len() })
    } else {
        decoded.payload.clone()
    };
    let mut job = NewJob::new(item.route.queue.clone(), payload)
        .with_key(key)
        .with_copy(
            item.copy,
            (item.copy == JobCopy::Live).then(|| decoded.original.clone()),
        );
    job.kind = decoded.kind.clone();
    job.priority = crate::model::formats::job_priority(&item.route.format, &decoded.payload);
    job.max_attempts = item.route.max_attempts;
    job.run_at = item.due_at();
    job
}

/// Keys deleted per route and pass, so one pass is a short statement.
const PRUNE_BATCH: i64 = 10_000;

/// Forgets job keys older than their route's dedup window (a re-push after
/// that is a new job); returns how many were deleted. A maintenance pass.
pub async fn prune_keys_once(pool: &sqlx::PgPool, routes: &crate::routes::Routes) -> Result<u64> {
    let mut pruned = 0;
    for route in routes.iter() {
        let done = sqlx::query(
            "DELETE FROM qbridge.job_keys WHERE (queue, key) IN ( \
                 SELECT queue, key FROM qbridge.job_keys \
                  WHERE queue = $1 AND seen_at < now() - $2 * interval '1 millisecond' \
                  LIMIT $3)",
        )
        .bind(&route.queue)
        .bind(route.config.dedup_window.as_millis() as i64)
        .bind(PRUNE_BATCH)
        .execute(pool)
        .await?;
        pruned += done.rows_affected();
        // The write ids of the same age: a write retried after its key was
        // forgotten is a new job anyway.
        sqlx::query(
            "DELETE FROM qbridge.numbered_writes WHERE write_id IN ( \
                 SELECT write_id FROM qbridge.numbered_writes \
                  WHERE queue = $1 AND at < now() - $2 * interval '1 millisecond' \
                  LIMIT $3)",
        )
        .bind(&route.queue)
        .bind(route.config.dedup_window.as_millis() as i64)
        .bind(PRUNE_BATCH)
        .execute(pool)
        .await?;
        // Push-backs of the same age: the evidence they used up is as old.
        sqlx::query(
            "DELETE FROM qbridge.text_repushes WHERE queue = $1 \
               AND at < now() - $2 * interval '1 millisecond'",
        )
        .bind(&route.queue)
        .bind(route.config.dedup_window.as_millis() as i64)
        .execute(pool)
        .await?;
    }
    Ok(pruned)
}
