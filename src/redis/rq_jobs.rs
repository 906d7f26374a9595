//! RQ keeps a job in the hash `rq:job:<id>` and pushes only the id onto
//! `rq:queue:<name>` (with RQ 3's `RQ_KEY_PREFIX`, `<prefix>:job:<id>` and
//! `<prefix>:queue:<name>`: the route's `key_prefix`,
//! `model::structures::KeyNames::rq_job`): a mirror copy of the push alone could never
//! run without Redis. The mirror reads the hashes of a batch's RQ ids in one
//! pipeline before it stores them, and each copy's payload carries its job
//! ([`crate::model::formats::rq::with_job`]).
//!
//! RQ writes the hash and the push in one MULTI (`Queue.enqueue_job` saves
//! the job through the pipeline it pushes with), and the proxy mirrors a
//! push inside MULTI only after EXEC succeeded: by the time the mirror reads,
//! the hash is there. It is gone only when RQ deleted it (its result or
//! failure TTL ran out, or the job was cancelled and deleted) — then the copy
//! keeps the id alone, as before.

use std::collections::HashMap;

use redis::aio::ConnectionManager;

use crate::error::Result;
use crate::model::formats::{self, Decoded, Format, KeySource};
use crate::model::structures::KeyNames;

/// A job hash's fields and values, as stored.
pub type JobHash = Vec<(String, Vec<u8>)>;

/// A job id and the key of its hash (`KeyNames::rq_job`: RQ's
/// `Job.redis_job_namespace_prefix` and the id).
pub type JobKey<'a> = (&'a str, String);

/// The job hashes of `ids`, one pipelined `HGETALL` each; ids whose hash
/// is missing or empty are left out.
pub async fn read(
    conn: &mut ConnectionManager,
    ids: &[JobKey<'_>],
) -> Result<HashMap<String, JobHash>> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let mut pipe = redis::pipe();
    for (_, key) in ids {
        pipe.cmd("HGETALL").arg(key);
    }
    let hashes: Vec<Vec<(String, Vec<u8>)>> = pipe.query_async(conn).await?;
    Ok(ids
        .iter()
        .zip(hashes)
        .filter(|(_, h)| !h.is_empty())
        .map(|((id, _), h)| (id.to_string(), h))
        .collect())
}

/// [`read`], read again for ids whose hash is not there yet, with a short
/// backoff, until every hash is there or `wait` has passed. RQ up to 2.x
/// adds a scheduled job's id to `rq:scheduled:<queue>` on its own, before
/// the MULTI that writes the job's hash (`ScheduledJobRegistry.schedule`
/// ignores the pipeline it is given), so when the proxy sees that `ZADD`
/// answered the hash is usually a moment away. What is still missing after
/// `wait` is left out: the caller decides what an id without its job is.
pub async fn read_appearing(
    conn: &mut ConnectionManager,
    ids: &[JobKey<'_>],
    wait: std::time::Duration,
) -> Result<HashMap<String, JobHash>> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut found = read(conn, ids).await?;
    let mut pause = std::time::Duration::from_millis(5);
    loop {
        let missing: Vec<JobKey<'_>> = ids
            .iter()
            .filter(|(id, _)| !found.contains_key(*id))
            .cloned()
            .collect();
        if missing.is_empty() || tokio::time::Instant::now() + pause > deadline {
            return Ok(found);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(250));
        found.extend(read(conn, &missing).await?);
    }
}

/// [`read`], or no hashes at all — without a connection or when the read
/// fails — logged, since such copies keep the id alone and cannot run on
/// Postgres without Redis.
pub async fn read_or_none(
    conn: Option<&mut ConnectionManager>,
    ids: &[JobKey<'_>],
) -> HashMap<String, JobHash> {
    if ids.is_empty() {
        return HashMap::new();
    }
    let Some(conn) = conn else {
        tracing::warn!(
            items = ids.len(),
            "RQ jobs stored without their job hashes: no Redis connection"
        );
        return HashMap::new();
    };
    match read(conn, ids).await {
        Ok(jobs) => jobs,
        Err(e) => {
            tracing::warn!(items = ids.len(), error = %e, "cannot read RQ job hashes; their copies keep the job id alone");
            HashMap::new()
        }
    }
}

/// Puts each RQ item's job hash into its payload (`formats::rq::with_job`)
/// for items of an RQ route (`format`); others are left as they are. A
/// failed read leaves the items as they are, logged: their copies keep the
/// id alone.
pub async fn attach<'a>(
    conn: &mut ConnectionManager,
    (format, names): (&Format, &KeyNames),
    items: impl IntoIterator<Item = &'a mut Decoded>,
) {
    if *format != Format::Rq {
        return;
    }
    let mut items: Vec<&mut Decoded> = items.into_iter().collect();
    let ids: Vec<JobKey<'_>> = items
        .iter()
        .filter_map(|d| match &d.key {
            KeySource::Id(id) => Some((id.as_str(), names.rq_job(id))),
            KeySource::ContentHash(_) => None,
        })
        .collect();
    let jobs = read_or_none(Some(conn), &ids).await;
    for decoded in items.iter_mut() {
        if let KeySource::Id(id) = &decoded.key {
            if let Some(job) = jobs.get(id) {
                formats::rq::with_job(&mut decoded.payload, job);
            }
        }
    }
}
