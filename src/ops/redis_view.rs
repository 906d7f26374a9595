//! What a route still holds in Redis, read for the diff: the items waiting
//! in its list, the items its consumers are working on (processing lists),
//! and the items parked for a later mirror write (gap list) — each with the
//! job key it has or will get.
//!
//! Keys of items with no id are content hashes numbered in pop order: the
//! n-th waiting copy of some bytes gets the number the Redis consumer will
//! give it when it pops it (the pops so far plus its place in line), so the
//! diff names the same key the push side stored.

use std::collections::HashMap;

use bytes::Bytes;
use redis::aio::ConnectionManager;
use sqlx::PgPool;

use crate::config::PushEnd;
use crate::error::Result;
use crate::model::formats::{decode_bytes, KeySource};
use crate::ops::structures;
use crate::redis::epoch::{self, Epoch};
use crate::redis::keys::{inflight_beside, RouteKeys};
use crate::redis::outbox;
use crate::routes::Route;

/// Most items read from one route's lists; past it the view says it is
/// truncated and the diff counts only what it read.
pub const MAX_ITEMS: usize = 200_000;
/// Items per LRANGE.
const PAGE: isize = 1000;

/// One item found in Redis.
#[derive(Debug, Clone)]
pub struct Held {
    pub key: String,
    pub original: Bytes,
}

/// A route's items in Redis.
#[derive(Debug, Default)]
pub struct RedisView {
    /// In the route's list, in pop order.
    pub waiting: Vec<Held>,
    /// In the consumers' processing lists.
    pub processing: Vec<Held>,
    /// Parked in the gap list, waiting for the mirror repair.
    pub parked: usize,
    /// More items than [`MAX_ITEMS`]: the counts are lower bounds.
    pub truncated: bool,
    /// Job keys qbridge's consumer finished (the route's ran set, newest
    /// [`MAX_ITEMS`]): they ran on Redis whether or not their outcome
    /// reached Postgres, so none of them is ever "only on postgres".
    pub ran: Vec<String>,
    /// Which Redis this was read from (observed first): the evidence a
    /// loss needs ([`crate::ops::evidence`]).
    pub epoch: Option<Epoch>,
    /// The route's jobs in its framework's other structures (Sidekiq's
    /// schedule, retry and dead sets; [`crate::ops::structures`]).
    pub elsewhere: Vec<structures::Held>,
    /// What Postgres held just before Redis was read, and which of its
    /// outbox rows that Redis had paid (`ONLY_POSTGRES_SQL`).
    pub before: ReadBefore,
    /// Identical copies were pushed or popped while Redis was read: for
    /// their texts this reading may count a copy twice (a pop mid-read is
    /// both waiting and popped) and so hide a loss. Repair reads again.
    pub moved_while_read: bool,
}

/// The route's numbering totals: pushes and pops of identical copies, and
/// numbers waiting to be popped again. A change between two reads of it
/// means copies moved in between.
const MOVES_SQL: &str = "\
    SELECT (SELECT coalesce(sum(n), 0) FROM qbridge.key_occurrences WHERE queue = $1 AND side = 'push')::int8, \
           (SELECT coalesce(sum(n), 0) FROM qbridge.key_occurrences WHERE queue = $1 AND side = 'pop')::int8, \
           (SELECT count(*) FROM qbridge.pop_holes WHERE queue = $1)";

async fn moves(db: &PgPool, route: &Route) -> Result<(i64, i64, i64)> {
    Ok(sqlx::query_as(MOVES_SQL)
        .bind(&route.queue)
        .fetch_one(db)
        .await?)
}

/// Read from Postgres in one statement just before Redis is read, so that
/// nothing written to both while Redis is read looks missing from Redis:
/// the outbox's keys (a push paid meanwhile is counted in the outbox, in
/// Redis or both), and the push count of each text with copies Redis has
/// not reported (a copy numbered up to it was in Redis, popped, owed or
/// lost by the time Redis is read; one numbered later may be in flight).
/// Then the outbox rows' paid markers are read from Redis, before its lists
/// ([`ReadBefore::sort_paid`]).
#[derive(Debug, Default, Clone)]
pub struct ReadBefore {
    /// The outbox rows: key, token, and whether the Redis the lists were
    /// read from had the row's paid marker. A paid row owes nothing: the pay
    /// pushed it (it waits in Redis or was popped, and the lists and the
    /// pops are read after the markers) and only the commit deleting the row
    /// failed (oracle seed 50260: counted as owed, such a row stood in for a
    /// copy a restart lost).
    outbox: Vec<(String, uuid::Uuid, bool)>,
    /// Content hashes, and their push counts, index by index.
    pub texts: Vec<String>,
    pub pushed: Vec<i64>,
}

const READ_BEFORE_SQL: &str = r#"
WITH silent AS (
    SELECT DISTINCT substring(k.key from '^sha256:([0-9a-f]+):[0-9]+$') AS hash
      FROM qbridge.job_keys k
     WHERE k.queue = $1 AND k.copy = 'mirror' AND k.original IS NOT NULL
       AND k.key LIKE 'sha256:%')
SELECT 'push', o.hash, o.n, NULL::uuid FROM qbridge.key_occurrences o JOIN silent s ON s.hash = o.hash
 WHERE o.queue = $1 AND o.side = 'push'
UNION ALL
SELECT 'owed', b.key, 0, b.token FROM qbridge.redis_outbox b WHERE b.queue = $1
"#;

/// Reads [`ReadBefore`] for `route`; every outbox row counts as owed until
/// [`ReadBefore::sort_paid`] reads the markers.
pub async fn read_before(db: &PgPool, route: &Route) -> Result<ReadBefore> {
    let rows: Vec<(String, String, i64, Option<uuid::Uuid>)> = sqlx::query_as(READ_BEFORE_SQL)
        .bind(&route.queue)
        .fetch_all(db)
        .await?;
    let mut before = ReadBefore::default();
    for (what, key, n, token) in rows {
        match (what.as_str(), token) {
            ("owed", Some(token)) => before.outbox.push((key, token, false)),
            ("push", _) => {
                before.texts.push(key);
                before.pushed.push(n);
            }
            _ => {}
        }
    }
    Ok(before)
}

impl ReadBefore {
    /// Marks the outbox rows Redis (`conn`) has paid markers for.
    pub async fn sort_paid(&mut self, conn: &mut ConnectionManager) -> Result<()> {
        let tokens: Vec<uuid::Uuid> = self.outbox.iter().map(|row| row.1).collect();
        let paid = outbox::paid_markers(conn, &tokens).await?;
        for (row, paid) in self.outbox.iter_mut().zip(paid) {
            row.2 = paid;
        }
        Ok(())
    }

    /// Every row owed again: the markers were read from a Redis that is
    /// gone, with the copies they vouched for (the outbox pays those rows
    /// to the new server).
    fn all_owed(&mut self) {
        for row in &mut self.outbox {
            row.2 = false;
        }
    }

    /// The keys of the rows owed to Redis (`ONLY_POSTGRES_SQL`'s `$5`).
    pub fn owed(&self) -> Vec<String> {
        self.outbox
            .iter()
            .filter(|row| !row.2)
            .map(|row| row.0.clone())
            .collect()
    }

    /// The tokens of the paid rows (`ONLY_POSTGRES_SQL`'s `$8`).
    pub fn paid_tokens(&self) -> Vec<uuid::Uuid> {
        self.outbox
            .iter()
            .filter(|row| row.2)
            .map(|row| row.1)
            .collect()
    }
}

impl RedisView {
    /// Every key held, waiting or in progress.
    pub fn keys(&self) -> Vec<String> {
        self.waiting
            .iter()
            .chain(&self.processing)
            .map(|h| h.key.clone())
            .collect()
    }

    /// Every key Redis accounts for: held now, or finished by the consumer.
    pub fn accounted_keys(&self) -> Vec<String> {
        let mut keys = self.keys();
        keys.extend(self.ran.iter().cloned());
        keys
    }
}

/// Reads `list` page by page from index 0 (the LPUSH end).
async fn read_list(
    conn: &mut ConnectionManager,
    list: &str,
    budget: &mut usize,
    truncated: &mut bool,
) -> Result<Vec<Bytes>> {
    let mut out = Vec::new();
    let mut start: isize = 0;
    loop {
        if *budget == 0 {
            let len: usize = redis::cmd("LLEN").arg(list).query_async(conn).await?;
            *truncated |= len > out.len();
            return Ok(out);
        }
        let page = PAGE.min(*budget as isize);
        let items: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(list)
            .arg(start)
            .arg(start + page - 1)
            .query_async(conn)
            .await?;
        let got = items.len();
        *budget -= got;
        out.extend(items.into_iter().map(Bytes::from));
        if (got as isize) < page {
            return Ok(out);
        }
        start += page;
    }
}

/// How many items wait in the route's lists, its consumers' processing
/// lists and its gap list: lengths only, and nothing written. A
/// decommissioned route's status reads this, so that looking leaves no key
/// behind ([`read`] observes the epoch, which sets the route's marker).
pub async fn count_left(conn: &mut ConnectionManager, route: &Route) -> Result<(u64, u64, u64)> {
    let mut waiting = 0u64;
    for list in route.lists() {
        let n: u64 = redis::cmd("LLEN").arg(&list[..]).query_async(conn).await?;
        waiting += n;
    }
    let keys = RouteKeys::of(route);
    let mut processing = 0u64;
    for list in scan(conn, &keys.any_processing()).await? {
        let n: u64 = redis::cmd("LLEN").arg(&list).query_async(conn).await?;
        processing += n;
    }
    let parked: u64 = redis::cmd("LLEN").arg(keys.gap()).query_async(conn).await?;
    Ok((waiting, processing, parked))
}

/// Reads the route's lists. `db` numbers content-hash keys.
pub async fn read(conn: &mut ConnectionManager, db: &PgPool, route: &Route) -> Result<RedisView> {
    let moves_before = moves(db, route).await?;
    let mut before = read_before(db, route).await?;
    let observed = epoch::observe(conn, db, route).await?;
    before.sort_paid(conn).await?;
    let mut view = RedisView {
        epoch: Some(observed),
        elsewhere: structures::read(conn, route).await?,
        ..RedisView::default()
    };
    let mut budget = MAX_ITEMS;
    // The route's list, then its priority lists (Celery), each oldest first:
    // consumers pop the end opposite to the producers' push end.
    let mut items = Vec::new();
    for list in route.lists() {
        let key = String::from_utf8_lossy(&list).into_owned();
        let mut part = read_list(conn, &key, &mut budget, &mut view.truncated).await?;
        if route.push == PushEnd::Lpush {
            part.reverse();
        }
        items.extend(part);
    }
    let keys = RouteKeys::of(route);
    let lists: Vec<String> = scan(conn, &keys.any_processing()).await?;
    let mut processing = Vec::new();
    for list in lists {
        let known: Option<String> = match inflight_beside(&list) {
            Some(inflight) => {
                redis::cmd("HGET")
                    .arg(inflight)
                    .arg("key")
                    .query_async(conn)
                    .await?
            }
            None => None,
        };
        // The hash names the one item its pop took; a pop whose reply was
        // lost can land a second one in the list, numbered like a waiting
        // item. The key goes to an item of its text (the newest: identical
        // texts are interchangeable), as at decommission.
        let held = read_list(conn, &list, &mut budget, &mut view.truncated).await?;
        let named = known.as_deref().and_then(|key| {
            held.iter().rposition(|item| {
                let decoded = decode_bytes(&route.format, item.clone());
                decoded.key.is_content_hash() && decoded.key.names(key)
            })
        });
        for (at, item) in held.into_iter().enumerate() {
            let key = if Some(at) == named {
                known.clone()
            } else {
                None
            };
            processing.push((key, item));
        }
    }
    let gap: usize = redis::cmd("LLEN").arg(keys.gap()).query_async(conn).await?;
    view.parked = gap;
    view.ran = redis::cmd("ZRANGE")
        .arg(keys.ran())
        .arg(0)
        .arg(MAX_ITEMS.saturating_sub(1))
        .arg("REV")
        .query_async(conn)
        .await?;
    // A restart since the markers were read took the copies they vouched
    // for: the rows are owed again.
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    let same_server = view.epoch.as_ref().is_some_and(|e| {
        !e.run_id.is_empty() && epoch::run_id_of(&info) == Some(e.run_id.as_str())
    });
    if !same_server {
        before.all_owed();
    }
    view.before = before;

    // Processing items were numbered when popped (their inflight hash says
    // so); waiting ones take the numbers after the pops so far.
    let mut next: HashMap<String, NextPops> = HashMap::new();
    for (known, item) in processing {
        let key = match known {
            Some(k) => k,
            None => keyed(db, route, &item, &mut next).await?,
        };
        view.processing.push(Held {
            key,
            original: item,
        });
    }
    for item in items {
        let key = keyed(db, route, &item, &mut next).await?;
        view.waiting.push(Held {
            key,
            original: item,
        });
    }
    view.moved_while_read = moves(db, route).await? != moves_before;
    Ok(view)
}

/// The numbers the next pops of one hash take, in order: its holes first
/// (push-backs popped under their own numbers), then the count onwards.
#[derive(Default)]
struct NextPops {
    holes: std::collections::VecDeque<u64>,
    count: u64,
}

/// The key an item has (an id) or will get when popped (a numbered hash,
/// the way `redis::consumer::numbering` will number it).
async fn keyed(
    db: &PgPool,
    route: &Route,
    item: &Bytes,
    next: &mut HashMap<String, NextPops>,
) -> Result<String> {
    let decoded = decode_bytes(&route.format, item.clone());
    let KeySource::ContentHash(hash) = &decoded.key else {
        return Ok(decoded.key.with_occurrence(0));
    };
    if !next.contains_key(hash) {
        let popped: Option<i64> = sqlx::query_scalar(
            "SELECT n FROM qbridge.key_occurrences WHERE queue = $1 AND side = 'pop' AND hash = $2",
        )
        .bind(&route.queue)
        .bind(hash)
        .fetch_optional(db)
        .await?;
        let holes: Vec<i64> = sqlx::query_scalar(
            "SELECT n FROM qbridge.pop_holes WHERE queue = $1 AND hash = $2 ORDER BY n",
        )
        .bind(&route.queue)
        .bind(hash)
        .fetch_all(db)
        .await?;
        let pops = NextPops {
            holes: holes.into_iter().map(|n| n.max(0) as u64).collect(),
            count: popped.unwrap_or(0).max(0) as u64,
        };
        next.insert(hash.clone(), pops);
    }
    let pops = next.get_mut(hash).expect("inserted above");
    let n = match pops.holes.pop_front() {
        Some(n) => n,
        None => {
            pops.count += 1;
            pops.count
        }
    };
    Ok(decoded.key.with_occurrence(n))
}

/// Every key matching `pattern` (SCAN, never KEYS: a big keyspace stays served).
pub(crate) async fn scan(conn: &mut ConnectionManager, pattern: &str) -> Result<Vec<String>> {
    let mut cursor: u64 = 0;
    let mut out = Vec::new();
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        out.extend(keys);
        if next == 0 {
            out.sort();
            return Ok(out);
        }
        cursor = next;
    }
}
