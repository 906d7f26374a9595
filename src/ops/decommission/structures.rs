//! Decommission carries the route's jobs out of its framework's other
//! structures (`model::structures`: Sidekiq's `schedule`, `retry`, `dead`,
//! RQ's registries, Resque's `failed`) into their Postgres equivalents,
//! then removes them from Redis: scheduled and retrying jobs become live
//! jobs due when Redis would have run them (the member's score), dead jobs
//! go to `qbridge.jobs_dead`. The gate refuses while any is there; this is
//! what a forced advance does with them.
//!
//! **Once.** Members are removed (`ZREM`, `LREM`) only after their rows
//! committed, and storing again is harmless: a Sidekiq job's key is its
//! `jid`, so a second store is a duplicate, and a dead job is inserted only
//! when its key is not in `jobs_dead` already. The shared structures are
//! only touched for the route's members.
//!
//! **Not carried** ([`Structure::carried`]), only counted and reported:
//! Celery's `unacked` tasks (a worker holds them and runs them) and
//! resque-scheduler's delayed jobs (no id tells a copy from the job the
//! scheduler moves to the queue meanwhile). `docs/src/runbook/frameworks.md` says
//! what to do with them.

use redis::aio::ConnectionManager;
use serde::Serialize;
use sqlx::PgPool;

use crate::error::Result;
use crate::ingest::{self, Item, Via};
use crate::model::formats::{attempts_so_far, decode_bytes, Decoded};
use crate::model::structures::{self, Holding, Structure};
use crate::queue::JobCopy;
use crate::redis::rq_jobs;
use crate::routes::Route;

/// What was carried, per kind of structure.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Carried {
    /// Scheduled jobs enqueued live, due at their time.
    pub scheduled: usize,
    /// Jobs waiting for a retry enqueued live, due at the retry's time.
    pub retrying: usize,
    /// Dead jobs moved to `qbridge.jobs_dead`.
    pub dead: usize,
    /// Jobs qbridge does not carry, left where they are (`key: n holding`).
    pub left: Vec<String>,
}

/// Carries every structure of `route` (nothing for formats without any).
pub async fn carry(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    payload_limit: usize,
) -> Result<Carried> {
    let mut carried = Carried::default();
    for structure in route.structures() {
        if !structure.carried() {
            let held = crate::ops::structures::read_one(redis, &structure).await?;
            if held.jobs > 0 {
                carried.left.push(held.describe());
            }
            continue;
        }
        let members = crate::ops::structures::members(redis, &structure).await?;
        if members.is_empty() {
            continue;
        }
        let n = carry_members(db, redis, route, &structure, &members, payload_limit).await?;
        crate::ops::structures::remove(redis, &structure, &members).await?;
        match structure.holding {
            Holding::Scheduled => carried.scheduled += n,
            Holding::Retrying => carried.retrying += n,
            Holding::Dead => carried.dead += n,
            Holding::Held => {}
        }
    }
    Ok(carried)
}

/// Stores one structure's members where Postgres keeps their like.
async fn carry_members(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    structure: &Structure,
    members: &[(Vec<u8>, f64)],
    payload_limit: usize,
) -> Result<usize> {
    match structure.holding {
        Holding::Dead => to_dead(db, redis, route, members, CARRIED).await,
        Holding::Scheduled | Holding::Retrying | Holding::Held => {
            let copy = (JobCopy::Live, Via::Archive);
            store_due(db, redis, route, members, copy, payload_limit).await
        }
    }
}

/// The last error of a dead job carried at decommission.
const CARRIED: &str = "carried from the framework's dead set at decommission";

/// Stores members as jobs (`copy`: live at decommission, mirror copies when
/// imported) due at their scores; returns how many were new.
pub(crate) async fn store_due(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    members: &[(Vec<u8>, f64)],
    (copy, via): (JobCopy, Via),
    payload_limit: usize,
) -> Result<usize> {
    let mut items: Vec<Item<'_>> = members
        .iter()
        .map(|(member, score)| {
            let decoded = decode_bytes(&route.format, member.clone().into());
            let mut item = Item::new(route, decoded, copy, via);
            item.run_at = structures::score_time(*score);
            item
        })
        .collect();
    rq_jobs::attach(
        redis,
        (&route.format, &route.config.keys),
        items.iter_mut().map(|i| &mut i.decoded),
    )
    .await;
    // `store` starts a retried job from the attempts it used.
    ingest::store_counting_new(db, items, payload_limit).await
}

/// The job of a dead member. A Resque failure entry wraps the job in its
/// `payload` (`lib/resque/failure/redis.rb`): the job's class and arguments
/// are that (what a requeue runs), while its key stays the whole entry's
/// hash (two failures of identical jobs are two dead jobs) and the entry as
/// a whole is the row's `original`, byte for byte.
fn dead_job(format: &crate::model::formats::Format, member: &[u8]) -> Decoded {
    let whole = decode_bytes(format, member.to_vec().into());
    if *format != crate::model::formats::Format::Resque {
        return whole;
    }
    let entry: Option<serde_json::Value> = serde_json::from_slice(member).ok();
    let job = entry
        .as_ref()
        .and_then(|e| e.get("payload"))
        .filter(|p| p.is_object());
    match job.and_then(|j| serde_json::to_vec(j).ok()) {
        Some(bytes) => Decoded {
            key: whole.key,
            original: whole.original,
            ..decode_bytes(format, bytes.into())
        },
        None => whole,
    }
}

/// Copies members into `qbridge.jobs_dead` with `why` as their last error,
/// each key once; returns how many were new.
pub(crate) async fn to_dead(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    members: &[(Vec<u8>, f64)],
    why: &str,
) -> Result<usize> {
    let mut decoded: Vec<_> = members
        .iter()
        .map(|(member, _)| dead_job(&route.format, member))
        .collect();
    rq_jobs::attach(
        redis,
        (&route.format, &route.config.keys),
        decoded.iter_mut(),
    )
    .await;
    let mut tx = db.begin().await?;
    let mut added = 0;
    for ((member, _), decoded) in members.iter().zip(decoded) {
        let done = sqlx::query(
            "INSERT INTO qbridge.jobs_dead \
                 (id, queue, kind, key, payload, priority, attempts, max_attempts, last_error, \
                  created_at, copy, original) \
             SELECT nextval(pg_get_serial_sequence('qbridge.jobs', 'id')), $1, $2, $3, $4, 0, \
                    $7, GREATEST($7, 1), $6, now(), 'live', $5 \
              WHERE NOT EXISTS (SELECT 1 FROM qbridge.jobs_dead WHERE queue = $1 AND key = $3)",
        )
        .bind(&route.queue)
        .bind(&decoded.kind)
        .bind(decoded.key.with_occurrence(0))
        .bind(&decoded.payload)
        .bind(&member[..])
        .bind(why)
        .bind(attempts_so_far(&route.format, &decoded.payload).unwrap_or(0))
        .execute(&mut *tx)
        .await?;
        added += done.rows_affected() as usize;
    }
    tx.commit().await?;
    Ok(added)
}
