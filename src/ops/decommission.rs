//! Decommissioning a route's Redis side: archive what is left into Postgres,
//! then delete the route's Redis keys.
//!
//! Runs after the flag says `decommissioned`, and first waits until the
//! route's Redis consumers are idle (`idle`): each has acknowledged the
//! phase holding nothing, or its heartbeat is gone. A handler still running
//! on Redis keeps its item in its processing list until it acks; archiving
//! that list earlier made a live Postgres copy of a job Redis was running.
//! Then items left in the list or the processing lists become live Postgres
//! jobs (a key Postgres already has is a duplicate and is not enqueued
//! again). Items of the gap list are not jobs of their own: Redis took them
//! before their mirror write failed, so they are stored as the mirror copies
//! they are, after the runnable lists, and never run here (`parked` has the
//! rule, and what is counted as unaccounted). Items in the Redis dead list
//! go to `qbridge.jobs_dead`, so nothing that was in Redis is lost.

use redis::aio::ConnectionManager;
use serde::Serialize;
use sqlx::PgPool;

use crate::error::Result;
use crate::ingest::{self, Item, Stored, Via};
use crate::model::formats::decode_bytes;
use crate::ops::redis_view::scan;
use crate::queue::JobCopy;
use crate::redis::keys::RouteKeys;
use crate::routes::Route;

mod idle;
mod parked;

pub use parked::Parked;

/// What decommissioning archived and deleted.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Archived {
    /// Items enqueued in Postgres as live jobs.
    pub enqueued: usize,
    /// Items whose key Postgres already had.
    pub duplicates: usize,
    /// Items of the Redis dead list moved to `qbridge.jobs_dead`.
    pub dead: usize,
    /// Redis keys deleted.
    pub keys_deleted: usize,
    /// Items of the gap list: mirror copies of jobs the Redis side owned.
    pub parked: Parked,
    /// Consumers that had acknowledged `decommissioned`, holding nothing.
    pub consumers_acknowledged: Vec<String>,
    /// Consumers whose heartbeat was gone while their processing lists were
    /// still there (their lists were archived with the rest).
    pub consumers_gone: Vec<String>,
}

async fn delete(conn: &mut ConnectionManager, key: &str) -> Result<usize> {
    Ok(redis::cmd("DEL").arg(key).query_async(conn).await?)
}

/// Renames `list` to `to` if it exists.
async fn rename_away(conn: &mut ConnectionManager, list: &str, to: &str) -> Result<()> {
    let exists: bool = redis::cmd("EXISTS").arg(list).query_async(conn).await?;
    if exists {
        redis::cmd("RENAME")
            .arg(list)
            .arg(to)
            .query_async::<()>(conn)
            .await?;
    }
    Ok(())
}

async fn all_items(conn: &mut ConnectionManager, list: &str) -> Result<Vec<Vec<u8>>> {
    Ok(redis::cmd("LRANGE")
        .arg(list)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await?)
}

/// Waits for the route's Redis consumers to be idle (refusing after
/// `gates.decommission_wait`, with nothing touched), then archives and
/// deletes the route's Redis keys. Postgres is written first; a key is
/// deleted only after its items are stored, so a failure midway loses
/// nothing (a second run finds the rest; stored keys are duplicates).
pub async fn archive_and_delete(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    payload_limit: usize,
) -> Result<Archived> {
    let keys = RouteKeys::of(route);
    let consumers = idle::wait(redis, route, &keys).await?;
    let mut report = Archived {
        consumers_acknowledged: consumers.acknowledged,
        consumers_gone: consumers.gone,
        ..Archived::default()
    };
    let main = String::from_utf8_lossy(&route.redis_key).into_owned();
    let mut runnable = vec![main];
    runnable.extend(scan(redis, &keys.any_processing()).await?);
    // Renamed away first, atomically, under a fresh name (never over a list
    // an interrupted run left): a push that still arrives (a producer not
    // behind qbridge) lands in a new list instead of being deleted unread;
    // `qbridge cutover status` counts it and running `qbridge cutover
    // advance` on the decommissioned route archives it.
    for list in &runnable {
        rename_away(redis, list, &keys.new_archiving()).await?;
    }
    rename_away(redis, &keys.gap(), &keys.new_archiving_gap()).await?;
    // The runnable lists first (also what an interrupted earlier run left
    // renamed), so that a parked copy of an item still waiting in them finds
    // its key stored live already.
    for list in scan(redis, &keys.any_archiving()).await? {
        let items = all_items(redis, &list).await?;
        if !items.is_empty() {
            let batch = items
                .into_iter()
                .map(|bytes| Item {
                    route,
                    decoded: decode_bytes(&route.format, bytes.into()),
                    copy: JobCopy::Live,
                    via: Via::Repair,
                })
                .collect();
            let mut tx = db.begin().await?;
            let stored = ingest::store(&mut tx, batch, payload_limit).await?;
            tx.commit().await?;
            for s in stored {
                match s {
                    Stored::New { .. } => report.enqueued += 1,
                    Stored::Duplicate { .. } => report.duplicates += 1,
                }
            }
        }
        report.keys_deleted += delete(redis, &list).await?;
    }
    for list in scan(redis, &keys.any_archiving_gap()).await? {
        let items = all_items(redis, &list).await?;
        let stored = parked::archive(db, redis, route, &keys, items, payload_limit).await?;
        report.parked.add(&stored);
        report.keys_deleted += delete(redis, &list).await?;
    }
    let dead_list = keys.dead();
    let dead = all_items(redis, &dead_list).await?;
    if !dead.is_empty() {
        let mut tx = db.begin().await?;
        for bytes in &dead {
            let decoded = decode_bytes(&route.format, bytes.clone().into());
            sqlx::query(
                "INSERT INTO qbridge.jobs_dead \
                     (id, queue, kind, key, payload, priority, attempts, max_attempts, last_error, \
                      created_at, copy, original) \
                 VALUES (nextval(pg_get_serial_sequence('qbridge.jobs', 'id')), $1, $2, $3, $4, 0, \
                         0, 1, 'archived from the Redis dead list at decommission', now(), 'live', $5)",
            )
            .bind(&route.queue)
            .bind(&decoded.kind)
            .bind(decoded.key.with_occurrence(0))
            .bind(&decoded.payload)
            .bind(&bytes[..])
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        report.dead = dead.len();
    }
    let mut doomed = vec![dead_list, keys.ran()];
    doomed.extend(scan(redis, &keys.any_inflight()).await?);
    doomed.extend(scan(redis, &keys.any_repushed()).await?);
    // The acknowledgements: no consumer beats a decommissioned route again.
    doomed.extend(scan(redis, &keys.any_heartbeat()).await?);
    for key in doomed {
        report.keys_deleted += delete(redis, &key).await?;
    }
    Ok(report)
}
