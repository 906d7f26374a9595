//! `qbridge import --route R [--dry-run]`: copies into Postgres what already
//! waited in Redis before the route was mirrored — the backlog in its list
//! and, for frameworks that keep jobs elsewhere (`model::structures`:
//! Sidekiq's `schedule`, `retry` and `dead` sets, RQ's registries, the
//! tasks a Celery worker holds in kombu's `unacked`, a reliable fetch's
//! private lists, qbridge's own consumer's processing lists), those too.
//!
//! The jobs stay in Redis and the Redis side still runs them: the list's
//! items, the scheduled and retrying jobs and the ones a worker holds
//! become **mirror copies** (due at their scores or ETAs), exactly what the
//! proxy would have stored had they been pushed through it. A mirror copy
//! never runs in Postgres without evidence that the Redis side let go of it,
//! so a copy of a held task runs nothing twice, and the diff can match the
//! worker's run when it comes. Dead jobs go to `qbridge.jobs_dead`, which a
//! later decommission finds already there. So the diff compares them, a
//! percent flip or the flip to `postgres_only` finds them, and
//! decommission carries nothing twice.
//!
//! **Idempotent by key.** A key Postgres knows is counted as already there,
//! never stored twice: run it again at will, e.g. after a run that reported
//! new copies while producers pushed (the list is read page by page, and a
//! push or a pop between two pages shifts what a page holds).
//!
//! Content-hash items (formats without an id) are not imported here: they
//! are counted by the advance into `dual_write` itself, before the flip
//! (`ops::backlog`), because a copy numbered while mirroring runs could be
//! one the mirror numbers too (`docs/src/runbook/README.md`, "Identical
//! items").

use redis::aio::ConnectionManager;
use serde::Serialize;
use sqlx::PgPool;

use crate::config::RedisSideKind;
use crate::error::{Error, Result};
use crate::ingest::{self, Item, Via};
use crate::model::formats::decode_bytes;
use crate::model::structures::{Holding, Owner as StructureOwner, Shape, Structure};
use crate::model::Phase;
use crate::ops::decommission::structures::{store_due, to_dead};
use crate::queue::JobCopy;
use crate::redis::keys::RouteKeys;
use crate::redis::rq_jobs;
use crate::routes::Route;

/// Items read per LRANGE page.
const PAGE: isize = 1000;

/// The last error of a dead job the importer copied.
const IMPORTED_DEAD: &str = "copied from the framework's dead set by qbridge import";

/// What one structure held of the route, and what became of it.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct StructureImport {
    /// The Redis key (`queue:mail`, `schedule`, …).
    pub key: String,
    /// What it holds: `waiting`, `scheduled`, `retrying`, `dead`.
    pub holding: String,
    /// The route's jobs found in it.
    pub found: usize,
    /// Stored now (in a dry run: would be stored, at most).
    pub new: usize,
    /// Already in Postgres (nothing stored).
    pub known: usize,
    /// Left in Redis uncopied, with the reason (content-hash items).
    pub not_copied: usize,
}

/// The import of one route, per structure.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ImportReport {
    pub route: String,
    pub dry_run: bool,
    pub structures: Vec<StructureImport>,
}

/// Why content-hash items are not copied, for the summary.
pub const NOT_COPIED_REASON: &str =
    "items without an id were counted when the route entered dual_write, \
     so they are not imported (see docs/src/runbook/README.md, \"Identical items\"); \
     resque-scheduler's delayed jobs have no id either and are counted, not \
     copied (see docs/src/runbook/frameworks.md). The Redis side still runs them all";

/// Imports what `route` holds in Redis. `progress` is told each page:
/// (structure key, items read so far).
pub async fn import(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    phase: Phase,
    dry_run: bool,
    payload_limit: usize,
    mut progress: impl FnMut(&str, usize),
) -> Result<ImportReport> {
    if matches!(phase, Phase::RedisOnly | Phase::Decommissioned) {
        return Err(Error::Refused(format!(
            "route {:?} is in {phase}: import copies Redis's jobs as mirror copies, which only \
             dual_write, shadow and postgres_only keep; advance to dual_write first",
            route.name
        )));
    }
    let mut report = ImportReport {
        route: route.name.clone(),
        dry_run,
        structures: Vec::new(),
    };
    for list in route.lists() {
        let found = import_list(
            db,
            redis,
            route,
            &list,
            dry_run,
            payload_limit,
            &mut progress,
        );
        report.structures.push(found.await?);
    }
    let mut structures = route.structures();
    if route.config.redis_side == RedisSideKind::Qbridge {
        structures.push(consumer_processing(route));
    }
    for structure in structures {
        if !structure.imported() {
            // Counted, never copied (`Structure::imported`): the gate holds
            // decommission until they are gone from Redis.
            let held = crate::ops::structures::read_one(redis, &structure).await?;
            report.structures.push(StructureImport {
                key: structure.key.clone(),
                holding: structure.holding.to_string(),
                found: held.jobs as usize,
                not_copied: held.jobs as usize,
                ..StructureImport::default()
            });
            continue;
        }
        let mut members = crate::ops::structures::members(redis, &structure).await?;
        if members.is_empty() && crate::ops::structures::is_private(&structure) {
            // No reliable fetch holds a job: nothing to say.
            continue;
        }
        let entries = members.len();
        members = members
            .into_iter()
            .filter_map(|(m, score)| structure.job_of(&m).map(|job| (job, score)))
            .collect();
        progress(&structure.key, members.len());
        let mut line = StructureImport {
            key: structure.key.clone(),
            holding: structure.holding.to_string(),
            found: entries,
            not_copied: entries - members.len(),
            ..StructureImport::default()
        };
        if structure.holding != Holding::Dead {
            // A waiting job without an id is numbered by the pops, like the
            // list's (see NOT_COPIED_REASON); a dead one never runs.
            let before = members.len();
            members.retain(|(m, _)| {
                !decode_bytes(&route.format, m.clone().into())
                    .key
                    .is_content_hash()
            });
            line.not_copied += before - members.len();
        }
        let new = if dry_run {
            let keys: Vec<String> = members
                .iter()
                .map(|(m, _)| {
                    decode_bytes(&route.format, m.clone().into())
                        .key
                        .with_occurrence(0)
                })
                .collect();
            unknown_keys(db, route, &keys, structure.holding == Holding::Dead).await?
        } else if structure.holding == Holding::Dead {
            to_dead(db, redis, route, &members, IMPORTED_DEAD).await?
        } else {
            let copy = (JobCopy::Mirror, Via::Import);
            store_due(db, redis, route, &members, copy, payload_limit).await?
        };
        line.new = new;
        line.known = line.found - line.not_copied - new;
        report.structures.push(line);
    }
    Ok(report)
}

/// The processing lists of qbridge's own Redis consumer: the jobs its
/// slots took and have not finished (running, waiting for their retry, or
/// left by a worker that was killed). Redis holds them as surely as the
/// list's backlog, and a Redis that loses its data loses them too.
fn consumer_processing(route: &Route) -> Structure {
    Structure {
        holding: Holding::Held,
        key: RouteKeys::of(route).any_processing(),
        shape: Shape::PrivateLists,
        owner: StructureOwner::Whole,
        queue: route.queue.clone(),
    }
}

/// One of the route's lists (`Route::lists`: its own, Celery's priority
/// lists), page by page from the oldest item.
async fn import_list(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    key: &[u8],
    dry_run: bool,
    payload_limit: usize,
    progress: &mut impl FnMut(&str, usize),
) -> Result<StructureImport> {
    // As redis-cli shows it: kombu's priority lists end in \x06\x16<step>.
    let list = key.escape_ascii().to_string();
    let mut line = StructureImport {
        key: list.clone(),
        holding: "waiting".into(),
        ..StructureImport::default()
    };
    let mut end: isize = -1;
    loop {
        let page: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(key)
            .arg(end - PAGE + 1)
            .arg(end)
            .query_async(redis)
            .await?;
        if page.is_empty() {
            break;
        }
        let read = page.len();
        line.found += read;
        let mut items: Vec<Item<'_>> = Vec::with_capacity(read);
        for bytes in page {
            let decoded = decode_bytes(&route.format, bytes.into());
            if decoded.key.is_content_hash() {
                line.not_copied += 1;
                continue;
            }
            items.push(Item::new(route, decoded, JobCopy::Mirror, Via::Import));
        }
        let considered = items.len();
        let new = if dry_run {
            let keys: Vec<String> = items
                .iter()
                .map(|i| i.decoded.key.with_occurrence(0))
                .collect();
            unknown_keys(db, route, &keys, false).await?
        } else {
            rq_jobs::attach(
                redis,
                (&route.format, &route.config.keys),
                items.iter_mut().map(|i| &mut i.decoded),
            )
            .await;
            ingest::store_counting_new(db, items, payload_limit).await?
        };
        line.new += new;
        line.known += considered - new;
        progress(&list, line.found);
        if (read as isize) < PAGE {
            break;
        }
        end -= PAGE;
    }
    Ok(line)
}

/// How many of `keys` Postgres does not know where the import would store
/// them: `job_keys` for copies, `jobs_dead` for dead jobs.
async fn unknown_keys(db: &PgPool, route: &Route, keys: &[String], dead: bool) -> Result<usize> {
    let sql = match dead {
        false => {
            "SELECT count(DISTINCT t.key) FROM unnest($2::text[]) AS t(key) \
                   WHERE NOT EXISTS (SELECT 1 FROM qbridge.job_keys k \
                                      WHERE k.queue = $1 AND k.key = t.key)"
        }
        true => {
            "SELECT count(DISTINCT t.key) FROM unnest($2::text[]) AS t(key) \
                  WHERE NOT EXISTS (SELECT 1 FROM qbridge.jobs_dead d \
                                     WHERE d.queue = $1 AND d.key = t.key)"
        }
    };
    let unknown: i64 = sqlx::query_scalar(sql)
        .bind(&route.queue)
        .bind(keys)
        .fetch_one(db)
        .await?;
    Ok(unknown as usize)
}
