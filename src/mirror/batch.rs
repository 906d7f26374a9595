//! One group-commit batch's write: the items of its requests, as [`Part`]s,
//! decoded by their route's format (an RQ id with its job hash from Redis)
//! and stored in one transaction.

use std::collections::HashMap;
use std::time::Duration;
use std::time::Instant;

use ::redis::aio::ConnectionManager;
use bytes::Bytes;
use sqlx::PgPool;

use super::spool;
use crate::error::Error;
use crate::ingest::{self, Item, Stored, Via};
use crate::model::formats::{self, decode_bytes, Format, KeySource};
use crate::queue::JobCopy;
use crate::redis::rq_jobs::{self, JobHash};
use crate::routes::Route;

/// One item of a batch, with what its request says of it.
pub(super) struct Part<'a> {
    route: &'a Route,
    copy: JobCopy,
    via: Via,
    ledger_only: bool,
    writes: uuid::Uuid,
    /// When Redis acknowledged the push, as wall-clock time.
    pushed_at: chrono::DateTime<chrono::Utc>,
    /// Which Redis server did (its `run_id`), when known.
    acked_by: Option<&'a str>,
    index: usize,
    bytes: &'a Bytes,
}

impl<'a> Part<'a> {
    /// The parts of one request's (or one kept request's) items, in order.
    pub(super) fn all(
        route: &'a Route,
        (copy, via, ledger_only): (JobCopy, Via, bool),
        writes: uuid::Uuid,
        (acked_at, acked_by): (Instant, Option<&'a str>),
        items: &'a [Bytes],
    ) -> impl Iterator<Item = Part<'a>> + 'a {
        let ago = chrono::Duration::from_std(acked_at.elapsed()).unwrap_or_default();
        let pushed_at = chrono::Utc::now() - ago;
        items.iter().enumerate().map(move |(index, bytes)| Part {
            route,
            copy,
            via,
            ledger_only,
            writes,
            pushed_at,
            acked_by,
            index,
            bytes,
        })
    }
}

/// The job hashes of the RQ ids among `parts` (`redis::rq_jobs`), read on
/// the writer's Redis connection (none, or a failed read: the copies keep
/// the id alone, logged).
pub(super) async fn rq_jobs_of(
    conn: &mut Option<ConnectionManager>,
    parts: &[Part<'_>],
) -> HashMap<String, JobHash> {
    let ids: Vec<rq_jobs::JobKey<'_>> = parts
        .iter()
        .filter(|p| p.route.format == Format::Rq)
        .filter_map(|p| {
            let id = std::str::from_utf8(p.bytes).ok()?;
            Some((id, p.route.config.keys.rq_job(id)))
        })
        .collect();
    rq_jobs::read_or_none(conn.as_mut(), &ids).await
}

/// Decodes and stores every item of `batch` in one transaction; results in
/// request order, items in order. Items are decoded and stored `chunk` at a
/// time: one push may carry a million items, and decoding them all at once
/// (payloads, keys, bind arrays) cost about 3 KiB each, far past the mirror
/// buffer. Chunks of one transaction see each other's rows, so keys and
/// duplicates come out as in one statement.
///
/// A batch not committed within [`COMMIT_WITHIN`] (and a second per
/// [`ITEMS_PER_SECOND`] items, for a bulk push of a million) fails as if
/// Postgres were away, and its mirror copies are parked in the gap list: a proxy
/// whose path to Postgres stalls must not keep writing them past the
/// moment the other processes take it for gone (`cutover::follow::EXPIRY`)
/// and store a re-push of one of them live. (Writes carry their write ids,
/// so a batch that did commit is not numbered twice by the retry.)
pub(super) async fn write_batch(
    pool: &PgPool,
    all: Vec<Part<'_>>,
    rq_jobs: &HashMap<String, JobHash>,
    payload_limit: usize,
    chunk: usize,
) -> Result<Vec<Stored>, Error> {
    let within = COMMIT_WITHIN + Duration::from_secs((all.len() / ITEMS_PER_SECOND) as u64);
    let write = write_in_one(pool, all, rq_jobs, payload_limit, chunk);
    match tokio::time::timeout(within, write).await {
        Ok(written) => written,
        Err(_) => Err(Error::Db(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("mirror batch not committed within {within:?}"),
        )))),
    }
}

/// How long a batch may take to commit (see [`write_batch`]), shorter than
/// `cutover::follow::EXPIRY`.
const COMMIT_WITHIN: Duration = Duration::from_secs(3);

/// Items a batch is given one more second for. A debug build on a loaded
/// two-core machine stores about this many a second: at 20,000 a bulk push
/// of 100,000 items timed out there again and again, parked, and took
/// minutes to reach Postgres through the gap list.
const ITEMS_PER_SECOND: usize = 2_000;

async fn write_in_one(
    pool: &PgPool,
    all: Vec<Part<'_>>,
    rq_jobs: &HashMap<String, JobHash>,
    payload_limit: usize,
    chunk: usize,
) -> Result<Vec<Stored>, Error> {
    // A batch stuck behind a lock (a business transaction holding a key it
    // shares, a manual LOCK TABLE) fails over to the gap list instead of
    // stalling every proxy client behind the mirror buffer. Sent with BEGIN:
    // one round trip fewer per batch.
    let mut tx = pool
        .begin_with("BEGIN; SET LOCAL lock_timeout = '2s'")
        .await?;
    let mut stored = Vec::with_capacity(all.len());
    for part in all.chunks(chunk.max(1)) {
        let items: Vec<Item<'_>> = part
            .iter()
            .map(|p| {
                let mut decoded = decode_bytes(&p.route.format, p.bytes.clone());
                if let KeySource::Id(id) = &decoded.key {
                    if let Some(job) = rq_jobs.get(id).filter(|_| p.route.format == Format::Rq) {
                        formats::rq::with_job(&mut decoded.payload, job);
                    }
                }
                let hashed = decoded.key.is_content_hash();
                let mut item = Item::new(p.route, decoded, p.copy, p.via);
                if p.copy == JobCopy::Mirror {
                    item.pushed_at = Some(p.pushed_at);
                    item.ledger_only = p.ledger_only;
                }
                // Only content hashes are numbered; an id is its own key.
                if hashed {
                    item.write = Some(spool::write_id(p.writes, p.index));
                }
                item
            })
            .collect();
        stored.extend(ingest::store(&mut tx, items, payload_limit).await?);
    }
    // Which servers took these pushes, in the same transaction: a copy is
    // never stored without the evidence for it, nor the evidence without it.
    let acks: Vec<(&str, &str, Option<chrono::DateTime<chrono::Utc>>)> = all
        .iter()
        .filter(|p| p.copy == JobCopy::Mirror)
        .filter_map(|p| Some((p.route.name.as_str(), p.acked_by?, Some(p.pushed_at))))
        .collect();
    crate::redis::epoch::record_acks(&mut tx, &acks).await?;
    tx.commit().await?;
    Ok(stored)
}
