//! The identical items Redis already holds when a route enters `dual_write`.
//!
//! Items without an id are keyed by their bytes' hash and counted: the n-th
//! pop of a text takes the number of its n-th mirrored push
//! (`redis/consumer/numbering.rs`). A copy pushed before the route was
//! mirrored was never counted, so a pop of it in `dual_write` took the
//! number of a *later* mirrored push; the mirror, finding that number
//! already ran, kept nothing of the later push, and when Redis then lost
//! it no count in Postgres showed the loss. So on the way into `dual_write`
//! (before the flip, while nothing is mirrored) the copies Redis holds that
//! Postgres does not count yet are stored as mirror copies, numbered like
//! pushes, with their bytes: pops then take their numbers, and a restart
//! that loses them is loss evidence like for any mirrored push.
//!
//! **The count is exact.** A copy counted twice would be a number no pop
//! can take, pushed back after a restart as a run too many; a copy not
//! counted would let a later loss go unseen. So the count reads Redis and
//! the numbering at one point: in one transaction that first holds every
//! pop of the queue from being numbered (`PAUSE_POPS_SQL`; the consumer's
//! numbering takes the same lock shared), one Lua step reads the route's
//! lists and qbridge's consumer's processing lists with their pop ids. Per
//! text, the copies Redis holds that no pop has numbered yet (in the lists,
//! or popped and not numbered: no `numbered_writes` row for the pop id),
//! less what Postgres already counts as waiting (pushes no pop took,
//! numbers repair pushed back), are stored. A mirror write still parked in
//! the route's gap list (Postgres was away) would be counted twice: the step
//! waits for gap repair instead; so would a push a process still mirrors
//! just after a rollback to `redis_only`: the count waits until the route
//! has held `redis_only` for a few poll intervals, and checks the phase
//! (locked) in its transaction, so a concurrent advance cannot count after
//! its flip. What it cannot see: an item a slot pops between the scan for
//! processing lists and the read when the slot's list did not exist at the
//! scan (an idle slot's list is deleted by Redis when empty), a consumer
//! starting meanwhile, and items pushed by a producer not behind qbridge
//! after the count: all leave copies uncounted (a later loss of them can go
//! unseen; nothing is pushed back that was not lost).

use std::collections::HashMap;

use redis::aio::ConnectionManager;
use sqlx::PgPool;

use crate::cutover::watch;
use crate::error::{Error, Result};
use crate::ingest::{self, Item, Via};
use crate::model::formats::{decode_bytes, Decoded, KeySource};
use crate::model::Phase;
use crate::ops::redis_view::scan;
use crate::queue::JobCopy;
use crate::redis::consumer::numbering::PAUSE_POPS_SQL;
use crate::redis::keys::{inflight_beside, RouteKeys};
use crate::routes::Route;

/// Copies Postgres counts as waiting in Redis: pushes no pop took yet, and
/// the numbers repair pushed back (holes the next pops take).
const KNOWN_SQL: &str = r#"
SELECT COALESCE((SELECT n FROM qbridge.key_occurrences
                  WHERE queue = $1 AND side = 'push' AND hash = $2), 0)
     - COALESCE((SELECT n FROM qbridge.key_occurrences
                  WHERE queue = $1 AND side = 'pop' AND hash = $2), 0)
     + (SELECT count(*) FROM qbridge.pop_holes WHERE queue = $1 AND hash = $2)
"#;

/// The route's stored phase, locked, and whether it has held for `$2`
/// seconds.
const PHASE_SQL: &str = r#"
SELECT phase, since < now() - make_interval(secs => $2) FROM qbridge.route_phases
 WHERE route = $1 FOR UPDATE
"#;

/// Waits until the route has been in `redis_only` for
/// [`watch::FOLLOWED`]: every process has stopped mirroring by then, and a
/// mirror write in flight has committed or parked in the gap list (after a
/// rollback a process may still mirror a push, whose copy would otherwise
/// be counted twice: here, and when its mirror write commits).
async fn wait_until_nothing_mirrors(db: &PgPool, route: &Route) -> Result<()> {
    let held_for: Option<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM now() - since)::float8 FROM qbridge.route_phases WHERE route = $1",
    )
    .bind(&route.name)
    .fetch_optional(db)
    .await?;
    let left = watch::FOLLOWED.as_secs_f64() - held_for.unwrap_or(0.0);
    if left > 0.0 {
        tokio::time::sleep(std::time::Duration::from_secs_f64(left + 0.05)).await;
    }
    Ok(())
}

/// Which of `$1` (pop ids) were numbered already.
const NUMBERED_SQL: &str =
    "SELECT write_id FROM qbridge.numbered_writes WHERE write_id = ANY($1::text[])";

/// Reads every list in KEYS at once: for each, its items; for a processing
/// list (ARGV[i] = its inflight hash, else ""), also the pop id of its
/// item as the last element (`""` when none is stored yet).
const READ_LUA: &str = r#"
local out = {}
for i, key in ipairs(KEYS) do
  local items = redis.call('LRANGE', key, 0, -1)
  if ARGV[i] ~= '' then
    items[#items + 1] = redis.call('HGET', ARGV[i], 'pop') or ''
  end
  out[i] = items
end
return out
"#;

/// Stores, as mirror copies, the copies of items without an id that `route`'s
/// lists hold and Postgres does not count yet. Returns how many it stored.
pub async fn count_identical(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    payload_limit: usize,
) -> Result<usize> {
    let parked: i64 = redis::cmd("LLEN")
        .arg(RouteKeys::of(route).gap())
        .query_async(redis)
        .await?;
    if parked > 0 {
        return Err(Error::Refused(format!(
            "route {:?}: {parked} mirror writes parked while Postgres was away are not written \
             yet; entering dual_write now could count them twice. Retry once gap repair has \
             written them (the gap list is empty)",
            route.name
        )));
    }
    let processing = processing_lists(redis, route).await?;
    wait_until_nothing_mirrors(db, route).await?;
    let mut tx = db.begin().await?;
    sqlx::query(PAUSE_POPS_SQL)
        .bind(&route.queue)
        .execute(&mut *tx)
        .await?;
    // Held until the count commits: a second advance counts after this one
    // (and finds nothing new), never after its flip, while mirroring runs.
    let (phase, settled): (String, bool) = sqlx::query_as(PHASE_SQL)
        .bind(&route.name)
        .bind(watch::FOLLOWED.as_secs_f64())
        .fetch_one(&mut *tx)
        .await?;
    if phase != Phase::RedisOnly.as_str() || !settled {
        return Err(Error::Refused(format!(
            "route {:?} is {phase} now (another advance?): the items without an id Redis holds \
             are counted only in redis_only, once no process mirrors",
            route.name
        )));
    }
    let texts = read_texts(&mut tx, redis, route, &processing).await?;
    let mut items = Vec::new();
    for (hash, (decoded, held)) in &texts {
        let known: i64 = sqlx::query_scalar(KNOWN_SQL)
            .bind(&route.queue)
            .bind(hash)
            .fetch_one(&mut *tx)
            .await?;
        let uncounted = (*held as i64 - known.max(0)).max(0) as usize;
        for _ in 0..uncounted {
            items.push(Item::new(
                route,
                decoded.clone(),
                JobCopy::Mirror,
                Via::Import,
            ));
        }
    }
    let stored = items.len();
    if stored > 0 {
        ingest::store(&mut tx, items, payload_limit).await?;
    }
    tx.commit().await?;
    Ok(stored)
}

/// The processing lists of qbridge's consumers of the route, with their
/// inflight hashes.
async fn processing_lists(
    redis: &mut ConnectionManager,
    route: &Route,
) -> Result<Vec<(String, String)>> {
    let lists = scan(redis, &RouteKeys::of(route).any_processing()).await?;
    Ok(lists
        .into_iter()
        .filter_map(|list| Some((inflight_beside(&list)?, list)))
        .map(|(inflight, list)| (list, inflight))
        .collect())
}

/// Each text without an id that Redis holds for the route and no pop has
/// numbered, with how many copies: the route's lists and the items of
/// `processing` whose pop is not numbered, read in one Lua step.
async fn read_texts(
    tx: &mut sqlx::PgConnection,
    redis: &mut ConnectionManager,
    route: &Route,
    processing: &[(String, String)],
) -> Result<HashMap<String, (Decoded, usize)>> {
    let lists = route.lists();
    let read_lua = redis::Script::new(READ_LUA);
    let mut script = read_lua.prepare_invoke();
    for list in &lists {
        script.key(list.as_ref()).arg("");
    }
    for (list, inflight) in processing {
        script.key(list).arg(inflight);
    }
    let read: Vec<Vec<Vec<u8>>> = script.invoke_async(redis).await?;
    let mut waiting: Vec<Vec<u8>> = Vec::new();
    let mut popped: Vec<(String, Vec<Vec<u8>>)> = Vec::new();
    for (i, mut items) in read.into_iter().enumerate() {
        if i < lists.len() {
            waiting.extend(items);
        } else {
            let pop = String::from_utf8_lossy(&items.pop().unwrap_or_default()).into_owned();
            popped.push((pop, items));
        }
    }
    let ids: Vec<&str> = popped
        .iter()
        .map(|(pop, _)| pop.as_str())
        .filter(|p| !p.is_empty())
        .collect();
    let numbered: Vec<String> = sqlx::query_scalar(NUMBERED_SQL)
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await?;
    for (pop, items) in popped {
        if !numbered.contains(&pop) {
            waiting.extend(items);
        }
    }
    let mut texts: HashMap<String, (Decoded, usize)> = HashMap::new();
    for bytes in waiting {
        let decoded = decode_bytes(&route.format, bytes.into());
        let KeySource::ContentHash(hash) = &decoded.key else {
            continue;
        };
        let hash = hash.clone();
        texts.entry(hash).or_insert((decoded, 0)).1 += 1;
    }
    Ok(texts)
}
