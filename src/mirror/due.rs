//! Mirror copies due later: members the proxy saw Redis take into a
//! framework's schedule or retry set (Sidekiq's `ZADD schedule` and `ZADD
//! retry`, `routes::Routes::set_route`), stored as mirror copies due at
//! their score, with the attempts a retry already used (issue 14). So a
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

use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::options::{DueWriter, MirrorClosed};
use super::writer::Mirror;
use crate::ingest::{self, Item, Via};
use crate::metrics as m;
use crate::model::formats::decode_bytes;
use crate::queue::JobCopy;
use crate::routes::Route;

/// How long one of them may take before it counts as failed.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Mirror {
    /// Stores members Redis took into a schedule or retry set as mirror
    /// copies due at their times. Returns once the write has started (after
    /// waiting for room), not once it committed.
    pub async fn mirror_due(
        &self,
        route: Arc<Route>,
        items: Vec<(Bytes, Option<DateTime<Utc>>)>,
    ) -> Result<(), MirrorClosed> {
        let due = self.due.clone();
        let permit = Arc::clone(&due.room)
            .acquire_owned()
            .await
            .map_err(|_| MirrorClosed)?;
        tokio::spawn(async move {
            let _permit = permit;
            let n = items.len() as u64;
            // Postgres hanging must not hold the room for good: every ZADD
            // to these sets waits for it, Sidekiq's retry handler's too.
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

async fn store(
    due: &DueWriter,
    route: &Route,
    items: Vec<(Bytes, Option<DateTime<Utc>>)>,
) -> crate::error::Result<()> {
    let items: Vec<Item<'_>> = items
        .into_iter()
        .map(|(bytes, at)| {
            let decoded = decode_bytes(&route.format, bytes);
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
