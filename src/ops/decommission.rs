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
//!
//! **Once.** Every list is first renamed to a name of its own
//! (`qbridge:archiving…:<route>:<id>`), and its items are stored in one
//! transaction with the row for that name in `qbridge.archived_lists`: a
//! run that overlaps with another, or a re-run after a failure between the
//! commit and the list's deletion, finds the row and stores nothing again.
//! Job keys alone could not tell for items without an id (a second store
//! numbers the same bytes as a new occurrence: a second job).

use redis::aio::ConnectionManager;
use serde::Serialize;
use sqlx::{PgPool, Postgres, Transaction};

use crate::error::{Error, Result};
use crate::ingest::{self, Item, Stored, Via};
use crate::model::formats::{decode_bytes, Decoded};
use crate::model::Phase;
use crate::ops::redis_view::scan;
use crate::queue::JobCopy;
use crate::redis::consumer::numbering::{pop_key, PopKey};
use crate::redis::keys::{inflight_beside, RouteKeys};
use crate::redis::{outbox, rq_jobs};
use crate::routes::Route;

mod idle;
mod interrupted;
mod parked;
pub(crate) mod structures;

pub use parked::Parked;
pub use structures::Carried;

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
    /// Jobs carried out of the framework's other structures (Sidekiq's
    /// schedule, retry and dead sets).
    pub carried: Carried,
    /// Consumers that had acknowledged `decommissioned`, holding nothing.
    pub consumers_acknowledged: Vec<String>,
    /// Consumers whose heartbeat was gone while their processing lists were
    /// still there (their lists were archived with the rest).
    pub consumers_gone: Vec<String>,
    /// Of their items, those whose Redis attempt had begun: recorded as
    /// interrupted Redis-side attempts (`decommission/interrupted.rs`).
    pub interrupted: usize,
}

/// Waits for the route's Redis consumers to be idle (refusing after
/// `gates.decommission_wait`, with nothing touched), then archives and
/// deletes the route's Redis keys. Postgres is written first; a list is
/// deleted only after its items are stored, so a failure midway loses
/// nothing, and a second run stores nothing twice (see the module docs).
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
    report.interrupted = interrupted::record(db, redis, route, &keys).await?;
    rename_all(redis, route, &keys).await?;
    // The runnable lists first (also what an interrupted earlier run left
    // renamed), so that a parked copy of an item still waiting in them finds
    // its key stored live already.
    for list in scan(redis, &keys.any_archiving()).await? {
        let items = all_items(redis, &list).await?;
        for s in archive_live(db, redis, route, &list, items, payload_limit).await? {
            match s {
                Stored::New { .. } | Stored::Recorded { .. } => report.enqueued += 1,
                Stored::Duplicate { .. } => report.duplicates += 1,
            }
        }
        // The inflight hash renamed with it goes in the same step: an
        // overlapping run must not delete it while this one still reads it.
        let inflight = keys.archiving_inflight(&list);
        report.keys_deleted += delete_all(redis, std::iter::once(list).chain(inflight)).await?;
    }
    // Pushes the producer API still owes Redis: the outbox leaves a
    // decommissioned route alone, so they run here or nowhere.
    for s in archive_owed(db, redis, route, payload_limit).await? {
        match s {
            Stored::New { .. } | Stored::Recorded { .. } => report.enqueued += 1,
            Stored::Duplicate { .. } => report.duplicates += 1,
        }
    }
    report.carried = structures::carry(db, redis, route, payload_limit).await?;
    for list in scan(redis, &keys.any_archiving_gap()).await? {
        let items = all_items(redis, &list).await?;
        let stored = parked::archive(db, redis, route, &list, items, payload_limit).await?;
        report.parked.add(&stored);
        report.keys_deleted += delete(redis, &list).await?;
    }
    for list in scan(redis, &keys.any_archiving_dead()).await? {
        let items = all_items(redis, &list).await?;
        report.dead += archive_dead(db, route, &list, items).await?;
        report.keys_deleted += delete(redis, &list).await?;
    }
    // The live-key guard too: nothing runs the route on Redis any more
    // (its publisher stops writing it once the route is decommissioned).
    let mut doomed = vec![
        keys.ran(),
        keys.running(),
        keys.epoch(),
        keys.live(),
        keys.live_through(),
        keys.ran_through(),
    ];
    doomed.extend(scan(redis, &keys.any_inflight()).await?);
    doomed.extend(scan(redis, &keys.any_repushed()).await?);
    // The acknowledgements: no consumer beats a decommissioned route again.
    doomed.extend(scan(redis, &keys.any_heartbeat()).await?);
    for key in doomed {
        report.keys_deleted += delete(redis, &key).await?;
    }
    Ok(report)
}

/// Renames the route's lists away, atomically, each under a fresh name
/// (never over a list an interrupted run left): a push that still arrives (a
/// producer not behind qbridge) lands in a new list instead of being deleted
/// unread; `qbridge cutover status` counts it and running `qbridge cutover
/// advance` on the decommissioned route archives it.
async fn rename_all(redis: &mut ConnectionManager, route: &Route, keys: &RouteKeys) -> Result<()> {
    let runnable: Vec<String> = route
        .lists()
        .iter()
        .map(|list| String::from_utf8_lossy(list).into_owned())
        .collect();
    for list in &runnable {
        rename_away(redis, &[(list, &keys.new_archiving())]).await?;
    }
    // A processing list moves with its inflight hash, in one step: the
    // hash has the key its held item was popped under.
    for list in scan(redis, &keys.any_processing()).await? {
        let to = keys.new_archiving();
        let mut pairs = vec![(list.clone(), to.clone())];
        pairs.extend(inflight_beside(&list).zip(keys.archiving_inflight(&to)));
        rename_away(redis, &pairs).await?;
    }
    rename_away(redis, &[(keys.gap(), keys.new_archiving_gap())]).await?;
    rename_away(redis, &[(keys.dead(), keys.new_archiving_dead())]).await
}

/// Stores a runnable list's items as live jobs, once.
async fn archive_live(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    list: &str,
    items: Vec<Vec<u8>>,
    payload_limit: usize,
) -> Result<Vec<Stored>> {
    let Some(mut tx) = claim(db, route, list, items.len()).await? else {
        return Ok(Vec::new());
    };
    let decoded: Vec<_> = items
        .into_iter()
        .map(|bytes| decode_bytes(&route.format, bytes.into()))
        .collect();
    let held = held_item(redis, route, list, &decoded).await?;
    let mut batch = Vec::with_capacity(decoded.len());
    for (i, decoded) in decoded.into_iter().enumerate() {
        let mut item = Item::new(route, decoded, JobCopy::Live, Via::Archive);
        if item.decoded.key.is_content_hash() {
            // Taking the item out of Redis is its pop: it gets the key the
            // Redis consumer would have given it (so it meets its mirror
            // copy), numbered once per list and place however often a run
            // is repeated. The item a consumer held was popped already: it
            // keeps that pop's key (oracle seed 60024).
            let pop = match &held {
                Some((at, HeldPop::Key(key))) if *at == i => {
                    item.known_key = Some(key.clone());
                    batch.push(item);
                    continue;
                }
                Some((at, HeldPop::Pop(pop))) if *at == i => pop.clone(),
                _ => format!("archive:{list}:{i}"),
            };
            item.known_key = match pop_key(db, &route.queue, Phase::Decommissioned, &item.decoded, &pop).await {
                PopKey::Numbered(key) | PopKey::Unmirrored(key) => Some(key),
                PopKey::Retry(reason) => {
                    return Err(Error::Refused(format!(
                        "cannot number an archived item yet ({reason}); nothing was archived from this list, run it again"
                    )))
                }
            };
        }
        batch.push(item);
    }
    ran_already(redis, route, &mut batch).await?;
    rq_jobs::attach(
        redis,
        (&route.format, &route.config.keys),
        batch.iter_mut().map(|i| &mut i.decoded),
    )
    .await;
    let stored = ingest::store(&mut tx, batch, payload_limit).await?;
    tx.commit().await?;
    Ok(stored)
}

/// What a consumer's inflight hash says about the item it held.
enum HeldPop {
    /// The key its pop was given.
    Key(String),
    /// The pop's id: numbered under it (once, however often it is asked).
    Pop(String),
}

/// The item a consumer held in renamed processing list `list` (its place
/// among `items`) and what its inflight hash, renamed with the list, says
/// of its pop; `None` when there is no such hash (the route's own lists) or
/// nothing ties it to one item. A slot holds one item, but a pop whose
/// reply was lost can land a second one in its list: a key goes to an item
/// of its text only (identical texts are interchangeable), a bare pop id
/// only to a list's single item.
async fn held_item(
    redis: &mut ConnectionManager,
    route: &Route,
    list: &str,
    items: &[Decoded],
) -> Result<Option<(usize, HeldPop)>> {
    let Some(inflight) = RouteKeys::of(route).archiving_inflight(list) else {
        return Ok(None);
    };
    let (key, pop): (Option<String>, Option<String>) = redis::cmd("HMGET")
        .arg(&inflight)
        .arg("key")
        .arg("pop")
        .query_async(redis)
        .await?;
    Ok(match (key, pop) {
        (Some(key), _) => items
            .iter()
            .rposition(|d| d.key.is_content_hash() && d.key.names(&key))
            .map(|at| (at, HeldPop::Key(key))),
        (None, Some(pop)) if items.len() == 1 => Some((0, HeldPop::Pop(pop))),
        _ => None,
    })
}

/// Takes the route's owed outbox rows and stores them as live jobs under
/// their keys, in one transaction (a second run finds no rows) — except a
/// row whose paid marker is in Redis: its push happened (the marker and the
/// push are one Lua step) and only the commit deleting the row failed, so
/// the job was Redis's — archived with the lists if it still waited, run
/// there if not (oracle seed 4193: such a row ran a job on both sides) —
/// and a row whose key the Redis side ran ([`ran_already`]).
async fn archive_owed(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    payload_limit: usize,
) -> Result<Vec<Stored>> {
    let mut tx = db.begin().await?;
    let rows: Vec<(String, Vec<u8>, uuid::Uuid)> = sqlx::query_as(
        "DELETE FROM qbridge.redis_outbox WHERE queue = $1 RETURNING key, original, token",
    )
    .bind(&route.queue)
    .fetch_all(&mut *tx)
    .await?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let tokens: Vec<uuid::Uuid> = rows.iter().map(|(_, _, token)| *token).collect();
    let paid = outbox::paid_markers(redis, &tokens).await?;
    let mut batch: Vec<Item<'_>> = rows
        .into_iter()
        .zip(paid)
        .filter(|(_, paid)| !paid)
        .map(|((key, original, _), _)| {
            let decoded = decode_bytes(&route.format, original.into());
            let mut item = Item::new(route, decoded, JobCopy::Live, Via::Archive);
            item.known_key = Some(key);
            item
        })
        .collect();
    // A key the Redis side ran (the same id pushed by another path) is a
    // second copy of a finished job, as in the lists.
    ran_already(redis, route, &mut batch).await?;
    let stored = ingest::store(&mut tx, batch, payload_limit).await?;
    tx.commit().await?;
    Ok(stored)
}

/// Items whose key the Redis side ran (qbridge's consumer's ran set: the
/// report may have been lost) are a second copy of a finished job — a
/// client's retried push — and are stored as the mirror copies they are, so
/// nothing runs them again. A reported `ok` does the same in `ingest`.
async fn ran_already(
    redis: &mut ConnectionManager,
    route: &Route,
    batch: &mut [Item<'_>],
) -> Result<()> {
    let keys: Vec<String> = batch
        .iter()
        .map(|i| match &i.known_key {
            Some(key) => key.clone(),
            None => i.decoded.key.with_occurrence(0),
        })
        .collect();
    if keys.is_empty() {
        return Ok(());
    }
    let scores: Vec<Option<f64>> = redis::cmd("ZMSCORE")
        .arg(RouteKeys::of(route).ran())
        .arg(&keys)
        .query_async(redis)
        .await?;
    for (item, score) in batch.iter_mut().zip(scores) {
        if score.is_some() {
            item.copy = JobCopy::Mirror;
        }
    }
    Ok(())
}

/// Copies a dead list's items into `qbridge.jobs_dead`, once; returns how
/// many it copied.
async fn archive_dead(
    db: &PgPool,
    route: &Route,
    list: &str,
    items: Vec<Vec<u8>>,
) -> Result<usize> {
    let Some(mut tx) = claim(db, route, list, items.len()).await? else {
        return Ok(0);
    };
    for bytes in &items {
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
    Ok(items.len())
}

/// The transaction that stores renamed `list`'s items, already holding its
/// row in `qbridge.archived_lists`; `None` when the list is empty or a run
/// stored it already. An overlapping run's insert waits for this one's
/// commit and then finds the row.
async fn claim<'a>(
    db: &'a PgPool,
    route: &Route,
    list: &str,
    items: usize,
) -> Result<Option<Transaction<'a, Postgres>>> {
    if items == 0 {
        return Ok(None);
    }
    let mut tx = db.begin().await?;
    let claimed = sqlx::query(
        "INSERT INTO qbridge.archived_lists (route, list, items) VALUES ($1, $2, $3) \
         ON CONFLICT (route, list) DO NOTHING",
    )
    .bind(&route.name)
    .bind(list)
    .bind(i32::try_from(items).unwrap_or(i32::MAX))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    Ok((claimed == 1).then_some(tx))
}

async fn delete(conn: &mut ConnectionManager, key: &str) -> Result<usize> {
    delete_all(conn, [key]).await
}

/// Deletes `keys` in one step; returns how many existed.
async fn delete_all<K: redis::ToRedisArgs>(
    conn: &mut ConnectionManager,
    keys: impl IntoIterator<Item = K>,
) -> Result<usize> {
    let mut del = redis::cmd("DEL");
    for key in keys {
        del.arg(key);
    }
    Ok(del.query_async(conn).await?)
}

/// Renames the first pair's list to its new name if it exists, and with
/// it the keys of the other pairs that exist (a processing list's inflight
/// hash), in one step: an overlapping run may have renamed it a moment ago,
/// and then there is nothing to do.
async fn rename_away<K: AsRef<str>>(conn: &mut ConnectionManager, pairs: &[(K, K)]) -> Result<()> {
    let script = redis::Script::new(RENAME_IF_EXISTS_LUA);
    let mut call = script.prepare_invoke();
    for (from, to) in pairs {
        call.key(from.as_ref()).key(to.as_ref());
    }
    call.invoke_async::<i64>(conn).await?;
    Ok(())
}

const RENAME_IF_EXISTS_LUA: &str = "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end \
     for i = 1, #KEYS, 2 do \
       if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('RENAME', KEYS[i], KEYS[i + 1]) end \
     end return 1";

async fn all_items(conn: &mut ConnectionManager, list: &str) -> Result<Vec<Vec<u8>>> {
    Ok(redis::cmd("LRANGE")
        .arg(list)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await?)
}
