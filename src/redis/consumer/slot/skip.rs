//! Dropping an item a slot must not run: a second push of a job the route
//! already ran, or a re-push of one Postgres runs live. The item leaves its
//! processing list unrun, the skip is recorded for the diff, and counted.

use ::redis::aio::MultiplexedConnection;
use ::redis::RedisResult;

use super::{key_hash, Slot};
use crate::metrics as m;
use crate::model::formats::Decoded;
use crate::redis::consumer::postgres_owns::record_skip;

impl Slot {
    /// Drops an item that must not run (a second push of a job that ran
    /// here, or one Postgres runs live), records the skip for the diff and
    /// counts it under `reason` (the metric's label).
    pub(super) async fn skip_unrun(
        &self,
        conn: &mut MultiplexedConnection,
        (processing, inflight): (&str, &str),
        decoded: &Decoded,
        key: &str,
        reason: &'static str,
    ) -> RedisResult<()> {
        self.drop_unrun(conn, processing, inflight, decoded, key)
            .await?;
        let route = &self.ctx.route;
        record_skip(&self.ctx.db, &route.queue, key);
        metrics::counter!(m::REDIS_DROPPED_UNRUN, "route" => route.name.clone(), "reason" => reason)
            .increment(1);
        tracing::info!(route = %route.name, key = %key_hash(key), reason,
            "redis consumer: a re-push of a job that ran or runs elsewhere; dropped unrun");
        Ok(())
    }

    /// Removes an item that must not run on Redis from its processing list,
    /// with its inflight state and its running claim, in one step; it joins
    /// neither the ran set nor the dead list.
    async fn drop_unrun(
        &self,
        conn: &mut MultiplexedConnection,
        processing: &str,
        inflight: &str,
        decoded: &Decoded,
        key: &str,
    ) -> RedisResult<()> {
        let _: i64 = self
            .ctx
            .drop
            .key(processing)
            .key(inflight)
            .key(self.ctx.route_keys.running())
            .arg(&decoded.original[..])
            .arg(key)
            .invoke_async(conn)
            .await?;
        Ok(())
    }
}
