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
//! **The count never exceeds what Redis holds.** A copy counted twice
//! would be a number no pop can take, pushed back after a restart as a run
//! too many; a copy not counted hides at most a loss (reported as nothing,
//! never acted on). So, per text: the copies one atomic `LRANGE` of each list
//! shows, less what Postgres already counts as waiting there (pushes not yet
//! popped, numbers repair pushed back), less every pop of the text recorded
//! since just before the read (one that left before the read is subtracted
//! for nothing: an undercount). The pop count's row is locked while the
//! copies are stored, so a pop numbered afterwards sees them. A mirror
//! write still parked in the route's gap list (Postgres was away) would be
//! counted twice: the step waits for gap repair instead.

use std::collections::HashMap;

use redis::aio::ConnectionManager;
use sqlx::PgPool;

use crate::error::{Error, Result};
use crate::ingest::{self, Item, Via};
use crate::model::formats::{decode_bytes, Decoded, KeySource};
use crate::queue::JobCopy;
use crate::redis::keys::RouteKeys;
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

/// Makes sure the pop count of the hash exists, then locks it: a pop numbered
/// while the copies are stored waits, and then sees them.
const LOCK_POPS_SQL: &str = r#"
INSERT INTO qbridge.key_occurrences (queue, side, hash, n) VALUES ($1, 'pop', $2, 0)
ON CONFLICT (queue, side, hash) DO UPDATE SET n = qbridge.key_occurrences.n
"#;

/// Pops of the hash numbered since `$3` (numbered or not: `:r-<pop>` too).
const POPPED_SINCE_SQL: &str = r#"
SELECT count(*) FROM qbridge.numbered_writes
 WHERE queue = $1 AND side = 'pop' AND at >= $3 AND key LIKE 'sha256:' || $2 || ':%'
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
    let read_from: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT now()").fetch_one(db).await?;
    let texts = read_texts(redis, route).await?;
    if texts.is_empty() {
        return Ok(0);
    }
    let mut tx = db.begin().await?;
    let mut items = Vec::new();
    for (hash, (decoded, held)) in &texts {
        sqlx::query(LOCK_POPS_SQL)
            .bind(&route.queue)
            .bind(hash)
            .execute(&mut *tx)
            .await?;
        let known: i64 = sqlx::query_scalar(KNOWN_SQL)
            .bind(&route.queue)
            .bind(hash)
            .fetch_one(&mut *tx)
            .await?;
        let popped: i64 = sqlx::query_scalar(POPPED_SINCE_SQL)
            .bind(&route.queue)
            .bind(hash)
            .bind(read_from)
            .fetch_one(&mut *tx)
            .await?;
        let uncounted = (*held as i64 - known.max(0) - popped).max(0) as usize;
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

/// Each text without an id the route's lists hold, with how many copies:
/// one `LRANGE` per list, so a pop or a hand-back while it is read never
/// shows an item twice (pages would).
async fn read_texts(
    redis: &mut ConnectionManager,
    route: &Route,
) -> Result<HashMap<String, (Decoded, usize)>> {
    let mut texts: HashMap<String, (Decoded, usize)> = HashMap::new();
    for list in route.lists() {
        let items: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(list.as_ref())
            .arg(0)
            .arg(-1)
            .query_async(redis)
            .await?;
        for bytes in items {
            let decoded = decode_bytes(&route.format, bytes.into());
            let KeySource::ContentHash(hash) = &decoded.key else {
                continue;
            };
            let hash = hash.clone();
            texts.entry(hash).or_insert((decoded, 0)).1 += 1;
        }
    }
    Ok(texts)
}
