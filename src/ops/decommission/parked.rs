//! The gap list at decommission. `qbridge:gap:<route>` holds items whose
//! mirror write failed (Postgres was down) *after* Redis took them: each is
//! the Postgres copy of a job the Redis side owned, never a job of its own.
//! The rule decommission follows:
//!
//! 1. The route's list and processing lists are archived first, as live
//!    copies: a parked item whose job is still waiting there (or was left in
//!    a processing list) runs once in Postgres from there, and its parked
//!    copy finds the key known (no second job; content-hash items get their
//!    own occurrence number, as a mirror copy that never runs).
//! 2. Every parked item is then stored as what it is, a **mirror copy**
//!    (`ingest::store`, as gap repair would have): a key Postgres already
//!    has stores nothing; a new key is recorded and drained without a call,
//!    so it never runs here.
//! 3. Of those new mirror copies, the ones with no evidence that Redis ran
//!    them (not in `qbridge:ran:<route>`, no `ok`/`dead` outcome from the
//!    Redis side) are counted as unaccounted: Redis took them and they are
//!    in no list, so they may have run, be running in an outside fleet, or
//!    have been lost. Never inferred from silence: they are not run, their
//!    bytes stay in `job_keys.original`, and the count is printed for the
//!    operator (the diff lists them).

use redis::aio::ConnectionManager;
use serde::Serialize;
use sqlx::PgPool;

use crate::error::Result;
use crate::ingest::{self, Item, Stored, Via};
use crate::model::formats::decode_bytes;
use crate::queue::JobCopy;
use crate::redis::gap_entry;
use crate::redis::keys::RouteKeys;
use crate::routes::Route;

/// What became of the gap list's items.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Parked {
    /// Stored as new mirror copies (their key was new to Postgres).
    pub mirrored: usize,
    /// Their key was known to Postgres already: nothing stored.
    pub known: usize,
    /// Of the mirrored, those with no evidence that Redis ran them.
    pub unaccounted: usize,
}

impl Parked {
    pub(super) fn add(&mut self, other: &Parked) {
        self.mirrored += other.mirrored;
        self.known += other.known;
        self.unaccounted += other.unaccounted;
    }
}

/// Stores the parked `items` of `route`, renamed to `list`, as mirror
/// copies, once (see the module docs), and sorts out what is known of them.
pub(super) async fn archive(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    list: &str,
    items: Vec<Vec<u8>>,
    payload_limit: usize,
) -> Result<Parked> {
    let Some(mut tx) = super::claim(db, route, list, items.len()).await? else {
        return Ok(Parked::default());
    };
    let batch = items
        .into_iter()
        .map(|bytes| {
            let entry = gap_entry::decode(bytes.into());
            let decoded = decode_bytes(&route.format, entry.item);
            let mut item = Item::new(route, decoded, JobCopy::Mirror, Via::Repair);
            item.write = entry.write;
            item
        })
        .collect();
    let stored = ingest::store(&mut tx, batch, payload_limit).await?;
    tx.commit().await?;
    let new: Vec<String> = stored
        .iter()
        .filter_map(|s| match s {
            Stored::New { key, .. } | Stored::Recorded { key } => Some(key.clone()),
            Stored::Duplicate { .. } => None,
        })
        .collect();
    let ran = ran_on_redis(db, redis, route, &new).await?;
    Ok(Parked {
        mirrored: new.len(),
        known: stored.len() - new.len(),
        unaccounted: new.len() - ran,
    })
}

/// How many of `new` the Redis side is known to have finished: in the
/// route's ran set, or reported `ok`/`dead` from the Redis side.
async fn ran_on_redis(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    new: &[String],
) -> Result<usize> {
    if new.is_empty() {
        return Ok(0);
    }
    let scores: Vec<Option<f64>> = redis::cmd("ZMSCORE")
        .arg(RouteKeys::of(route).ran())
        .arg(new)
        .query_async(redis)
        .await?;
    let reported: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT key FROM qbridge.outcomes \
          WHERE queue = $1 AND side = 'redis' AND outcome IN ('ok', 'dead') AND key = ANY($2)",
    )
    .bind(&route.queue)
    .bind(new)
    .fetch_all(db)
    .await?;
    Ok(new
        .iter()
        .zip(&scores)
        .filter(|(key, score)| score.is_some() || reported.contains(key))
        .count())
}
