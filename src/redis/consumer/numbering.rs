//! The pop-side numbering of content-hash job keys: the n-th pop of some
//! bytes gets the key the n-th mirrored push of them got, so both sides of
//! the comparison name the same job.
//!
//! Three rules keep the two counts in step:
//! - **Once per pop.** Each pop has an id, kept in the slot's inflight hash
//!   before it is numbered; numbering it again (the reply was lost, the
//!   process restarted) finds its key in `qbridge.numbered_writes` instead of
//!   taking a second number.
//! - **Never a made-up key.** When Postgres cannot number a pop in time the
//!   answer is [`PopKey::Retry`]: the item stays in its processing list and
//!   is numbered later, before it runs. (It used to run as `:0`, a key every
//!   such pop shared and no job had.)
//! - **`redis_only` numbers only what was mirrored.** Nothing is mirrored
//!   in that phase, so a pop takes a number only while the pushes of its
//!   bytes are ahead of the pops; the rest are [`PopKey::Unmirrored`], with
//!   a key no push can have.
//! - **A push-back is popped under its own number.** Repair pushes a lost
//!   item's bytes back; when the pop count had already passed its number
//!   (it was popped, then lost), the number is a hole ([`expect_again`]) and
//!   the next pop of those bytes takes the lowest hole before counting on.

use std::time::Duration;

use sqlx::PgPool;

use crate::model::formats::{Decoded, KeySource};
use crate::model::Phase;

/// The key a pop numbered before, if any; first the queue's pop lock,
/// shared: numbering pops of a queue goes on in parallel, and stops while
/// [`PAUSE_POPS_SQL`] holds it.
const KNOWN_SQL: &str = r#"
SELECT (SELECT key FROM qbridge.numbered_writes WHERE write_id = $1)
  FROM pg_advisory_xact_lock_shared(hashtext('qbridge.pops'), hashtext($2))
"#;

/// Holds every pop of queue `$1` from being numbered until the transaction
/// ends: what counts the copies Redis holds (`ops::backlog`) reads the
/// numbering and Redis at one point that way.
pub const PAUSE_POPS_SQL: &str =
    "SELECT pg_advisory_xact_lock(hashtext('qbridge.pops'), hashtext($1))";

/// The lowest hole of the hash, taken.
const HOLE_SQL: &str = r#"
DELETE FROM qbridge.pop_holes
 WHERE (queue, hash, n) = (SELECT queue, hash, n FROM qbridge.pop_holes
                            WHERE queue = $1 AND hash = $2
                            ORDER BY n LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING n
"#;

/// Makes sure the pop count of the hash exists, so the bump below can lock it.
const ENSURE_SQL: &str = r#"
INSERT INTO qbridge.key_occurrences (queue, side, hash, n) VALUES ($1, 'pop', $2, 0)
ON CONFLICT (queue, side, hash) DO NOTHING
"#;

/// The next pop number; with `$3` only while the pushes are ahead.
const BUMP_SQL: &str = r#"
UPDATE qbridge.key_occurrences p
   SET n = p.n + 1
 WHERE p.queue = $1 AND p.side = 'pop' AND p.hash = $2
   AND (NOT $3 OR p.n < COALESCE((SELECT s.n FROM qbridge.key_occurrences s
                                   WHERE s.queue = $1 AND s.side = 'push' AND s.hash = $2), 0))
RETURNING p.n
"#;

/// `$4`: the Redis server (`run_id`) the item was popped from, if known.
const RECORD_SQL: &str =
    "INSERT INTO qbridge.numbered_writes (write_id, queue, key, side, server) \
                          VALUES ($1, $2, $3, 'pop', $4)";

/// How long numbering a pop may wait for Postgres before the slot retries
/// later (the item waits in its processing list meanwhile).
const NUMBERING_TIMEOUT: Duration = Duration::from_secs(2);

/// What numbering a popped item gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PopKey {
    /// Its job key: an id as it is, or the content hash with this pop's
    /// occurrence number.
    Numbered(String),
    /// A pop in `redis_only` of bytes whose mirrored copies were all popped
    /// already: it matches no job (`sha256:<hex>:r-<pop>`).
    Unmirrored(String),
    /// Postgres did not answer in time (the reason): number it again later.
    Retry(String),
}

/// The job key of the item popped as `pop` (an id unique to this pop, kept
/// in the inflight hash), from a server not named. See the module docs.
pub async fn pop_key(
    db: &PgPool,
    queue: &str,
    phase: Phase,
    decoded: &Decoded,
    pop: &str,
) -> PopKey {
    pop_key_from(db, queue, phase, decoded, pop, None).await
}

/// [`pop_key`] for an item popped from the Redis server `server` (its
/// `run_id`, when known): the evidence that the item went with that server
/// if it is gone and the item never ran.
pub async fn pop_key_from(
    db: &PgPool,
    queue: &str,
    phase: Phase,
    decoded: &Decoded,
    pop: &str,
    server: Option<&str>,
) -> PopKey {
    let KeySource::ContentHash(hash) = &decoded.key else {
        return PopKey::Numbered(decoded.key.with_occurrence(0));
    };
    let bounded = phase == Phase::RedisOnly;
    let numbered = number(db, queue, hash, decoded, (pop, server), bounded);
    match tokio::time::timeout(NUMBERING_TIMEOUT, numbered).await {
        Ok(Ok(key)) => key,
        Ok(Err(e)) => PopKey::Retry(e.to_string()),
        Err(_) => PopKey::Retry("numbering timed out".into()),
    }
}

async fn number(
    db: &PgPool,
    queue: &str,
    hash: &str,
    decoded: &Decoded,
    (pop, server): (&str, Option<&str>),
    bounded: bool,
) -> sqlx::Result<PopKey> {
    let mut tx = db.begin().await?;
    let known: Option<String> = sqlx::query_scalar(KNOWN_SQL)
        .bind(pop)
        .bind(queue)
        .fetch_one(&mut *tx)
        .await?;
    if let Some(key) = known {
        return Ok(classify(key));
    }
    let mut n: Option<i64> = sqlx::query_scalar(HOLE_SQL)
        .bind(queue)
        .bind(hash)
        .fetch_optional(&mut *tx)
        .await?;
    if n.is_none() {
        sqlx::query(ENSURE_SQL)
            .bind(queue)
            .bind(hash)
            .execute(&mut *tx)
            .await?;
        n = sqlx::query_scalar(BUMP_SQL)
            .bind(queue)
            .bind(hash)
            .bind(bounded)
            .fetch_optional(&mut *tx)
            .await?;
    }
    let key = match n {
        Some(n) => PopKey::Numbered(decoded.key.with_occurrence(n.max(1) as u64)),
        None => PopKey::Unmirrored(decoded.key.unmirrored(pop)),
    };
    let text = match &key {
        PopKey::Numbered(k) | PopKey::Unmirrored(k) | PopKey::Retry(k) => k,
    };
    sqlx::query(RECORD_SQL)
        .bind(pop)
        .bind(queue)
        .bind(text)
        .bind(server)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(key)
}

/// A key read back from `numbered_writes`, sorted by its shape.
fn classify(key: String) -> PopKey {
    match key.rsplit(':').next() {
        Some(last) if last.starts_with("r-") => PopKey::Unmirrored(key),
        _ => PopKey::Numbered(key),
    }
}

/// The content hash and occurrence number of a numbered key
/// (`sha256:<hex>:<n>`); `None` for any other key.
pub fn numbered(key: &str) -> Option<(&str, i64)> {
    let rest = key.strip_prefix("sha256:")?;
    let (hash, n) = rest.rsplit_once(':')?;
    // As the SQL reads them (`^sha256:[0-9a-f]+:[0-9]+$`): a producer's own
    // id that merely starts with `sha256:` is not a content hash.
    let hex = !hash.is_empty() && hash.bytes().all(|b| b.is_ascii_hexdigit());
    let digits = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    (hex && digits).then_some(())?;
    Some((hash, n.parse().ok()?))
}

const EXPECT_SQL: &str = r#"
INSERT INTO qbridge.pop_holes (queue, hash, n)
SELECT $1, $2, $3
 WHERE $3 <= (SELECT n FROM qbridge.key_occurrences
               WHERE queue = $1 AND side = 'pop' AND hash = $2)
ON CONFLICT DO NOTHING
"#;

/// Before `key`'s bytes are pushed back to Redis: when the pop count has
/// passed its number, makes it a hole the next pop of those bytes takes
/// (see the module docs). True when a hole was made; undo it with
/// [`unexpect`] if the push does not happen.
pub async fn expect_again(db: &PgPool, queue: &str, key: &str) -> sqlx::Result<bool> {
    let Some((hash, n)) = numbered(key) else {
        return Ok(false);
    };
    let made = sqlx::query(EXPECT_SQL)
        .bind(queue)
        .bind(hash)
        .bind(n)
        .execute(db)
        .await?;
    Ok(made.rows_affected() == 1)
}

/// Takes back a hole [`expect_again`] made for a push that did not happen.
pub async fn unexpect(db: &PgPool, queue: &str, key: &str) -> sqlx::Result<()> {
    if let Some((hash, n)) = numbered(key) {
        sqlx::query("DELETE FROM qbridge.pop_holes WHERE queue = $1 AND hash = $2 AND n = $3")
            .bind(queue)
            .bind(hash)
            .bind(n)
            .execute(db)
            .await?;
    }
    Ok(())
}
