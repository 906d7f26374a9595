//! Mirror copies due later: members the proxy saw Redis take into a
//! framework's schedule or retry set (Sidekiq's `ZADD schedule` and `ZADD
//! retry`, `routes::Routes::set_route`), stored as mirror copies due at
//! their score, with the attempts a retry already used. So a
//! `perform_in` job is in Postgres from the moment it is pushed, as a list
//! push is, without waiting for `qbridge import` or the decommission carry.
//!
//! They are few next to list pushes and carry a time, so they do not go
//! through the group-commit writers (whose requests and gap entries have
//! none): each ZADD's members are one transaction of their own, at most
//! `IN_FLIGHT` at a time — a client waits for room, as it waits for the
//! writers' buffer. A write that fails is not spooled: the job is still in
//! its set, where `cutover status` counts it and `qbridge import` or the
//! decommission carry copies it (idempotent by `jid`); the failure is
//! counted (`qbridge_mirror_lost_total`) and logged, without the job.
//!
//! RQ's scheduled registry holds bare job ids; the job is the hash
//! `rq:job:<id>`, read before the write (waiting up to [`RQ_HASH_WAIT`] for
//! it: RQ up to 2.x adds the id before it writes the hash). An id whose hash
//! does not appear is not stored — without its job a copy could never run —
//! and is counted the same way: it waits in the registry, where the gates
//! count it and the carry copies it once its job is there.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::options::{DueWriter, MirrorClosed};
use super::writer::Mirror;
use crate::ingest::{self, Item, Via};
use crate::metrics as m;
use crate::model::following::RoutedPush;
use crate::model::formats::{self, decode_bytes, Decoded, Format, KeySource};
use crate::queue::JobCopy;
use crate::redis::rq_jobs;
use crate::routes::Route;

/// How long one of them may take before it counts as failed.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long an RQ id added to a scheduled registry may wait for its job
/// hash (the client writes it right after the `ZADD`; see the module docs).
const RQ_HASH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Mirror {
    /// Stores members Redis took into a schedule or retry set as mirror
    /// copies due at their times. Returns once the write has started (after
    /// waiting for room), not once it committed.
    pub async fn mirror_due(
        &self,
        route: Arc<Route>,
        items: Vec<(Bytes, Option<DateTime<Utc>>)>,
        routed: Option<RoutedPush>,
    ) -> Result<(), MirrorClosed> {
        let due = self.due.clone();
        let permit = Arc::clone(&due.room)
            .acquire_owned()
            .await
            .map_err(|_| MirrorClosed)?;
        tokio::spawn(async move {
            let (_permit, _routed) = (permit, routed);
            // Postgres hanging must not hold the room for good: every ZADD
            // to these sets waits for it, Sidekiq's retry handler's too.
            let (items, unread) = with_rq_jobs(&due, &route, items).await;
            if unread > 0 {
                metrics::counter!(m::MIRROR_LOST, "route" => route.name.clone())
                    .increment(unread as u64);
                tracing::warn!(route = %route.name, items = unread,
                    "scheduled RQ jobs whose job hash did not appear were not mirrored; \
                     they wait in their registry, where qbridge import or the decommission carry copies them");
            }
            let n = items.len() as u64;
            let stored = tokio::time::timeout(WRITE_TIMEOUT, store(&due, &route, items)).await;
            let failed = match stored {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!("no commit within {WRITE_TIMEOUT:?}")),
            };
            if let Some(e) = failed {
                metrics::counter!(m::MIRROR_LOST, "route" => route.name.clone()).increment(n);
                tracing::warn!(route = %route.name, items = n, error = %e,
                    "scheduled jobs Redis took were not mirrored; they wait in their set, \
                     where qbridge import or the decommission carry copies them");
            }
        });
        Ok(())
    }
}

/// Members decoded in the route's format; for an RQ route each with its job
/// hash put into its payload, leaving out (and counting) ids whose hash did
/// not appear within [`RQ_HASH_WAIT`] or could not be read.
async fn with_rq_jobs(
    due: &DueWriter,
    route: &Route,
    items: Vec<(Bytes, Option<DateTime<Utc>>)>,
) -> (Vec<(Decoded, Option<DateTime<Utc>>)>, usize) {
    let mut decoded: Vec<(Decoded, Option<DateTime<Utc>>)> = items
        .into_iter()
        .map(|(bytes, at)| (decode_bytes(&route.format, bytes), at))
        .collect();
    if route.format != Format::Rq {
        return (decoded, 0);
    }
    let names = &route.config.keys;
    let ids: Vec<rq_jobs::JobKey<'_>> = decoded
        .iter()
        .filter_map(|(d, _)| match &d.key {
            KeySource::Id(id) => Some((id.as_str(), names.rq_job(id))),
            KeySource::ContentHash(_) => None,
        })
        .collect();
    let jobs = match due.redis.clone() {
        Some(mut conn) => rq_jobs::read_appearing(&mut conn, &ids, RQ_HASH_WAIT)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(route = %route.name, error = %e, "cannot read RQ job hashes");
                HashMap::new()
            }),
        None => HashMap::new(),
    };
    let before = decoded.len();
    decoded.retain_mut(|(d, _)| {
        let KeySource::Id(id) = &d.key else {
            return false;
        };
        match jobs.get(id) {
            Some(job) => {
                formats::rq::with_job(&mut d.payload, job);
                true
            }
            None => false,
        }
    });
    let unread = before - decoded.len();
    (decoded, unread)
}

async fn store(
    due: &DueWriter,
    route: &Route,
    items: Vec<(Decoded, Option<DateTime<Utc>>)>,
) -> crate::error::Result<()> {
    if items.is_empty() {
        return Ok(());
    }
    let items: Vec<Item<'_>> = items
        .into_iter()
        .map(|(decoded, at)| {
            let mut item = Item::new(route, decoded, JobCopy::Mirror, Via::Proxy);
            item.run_at = at;
            item
        })
        .collect();
    // `store` starts a retried job from the attempts it used.
    let mut tx = due.pool.begin().await?;
    ingest::store(&mut tx, items, due.payload_limit).await?;
    tx.commit().await?;
    Ok(())
}
