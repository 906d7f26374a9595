//! How a slot ends an item it ran: the attempt's outcome handed to the kept
//! recorder first, then the ack or dead script that takes the item out of
//! its processing list, joins its key to the ran set and gives up its
//! running claim, in one step.

use ::redis::aio::MultiplexedConnection;
use ::redis::RedisResult;

use super::Slot;
use crate::metrics as m;
use crate::model::formats::Decoded;
use crate::redis::keys::RAN_RETENTION_MS;
use crate::shadow::{Mode, Outcome, OutcomeKind, Side};

/// An item whose outcome is recorded and whose ack or dead script Redis
/// has not confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unacked {
    pub processing: String,
    pub key: String,
    pub item: bytes::Bytes,
    /// Dead rather than acked.
    pub dead: bool,
}

impl Slot {
    /// Runs the ack script on the item, or the dead script when `dead`. Until Redis confirms it the
    /// slot remembers the item as [`Unacked`]: when the connection broke
    /// (Redis restarted while the handler ran and the keeper wrote the item
    /// into the new server) the item is found again in its list and only
    /// finished, not run again.
    pub(super) async fn finish(
        &mut self,
        conn: &mut MultiplexedConnection,
        dead: bool,
        processing: &str,
        inflight: &str,
        decoded: &Decoded,
        key: &str,
    ) -> RedisResult<()> {
        let now = chrono::Utc::now().timestamp_millis();
        let ctx = std::sync::Arc::clone(&self.ctx);
        let script = if dead { &ctx.dead } else { &ctx.ack };
        let mut call = script.key(processing);
        call.key(inflight)
            .key(self.ctx.route_keys.dead())
            .key(self.ctx.route_keys.ran())
            .key(self.ctx.route_keys.running())
            .arg(&decoded.original[..])
            .arg(key)
            .arg(now)
            .arg(now - RAN_RETENTION_MS);
        self.unacked = Some(Unacked {
            processing: processing.to_string(),
            key: key.to_string(),
            item: decoded.original.clone(),
            dead,
        });
        let removed: i64 = call.invoke_async(conn).await?;
        self.unacked = None;
        if removed == 0 {
            // Someone removed it by hand; nothing to undo.
            tracing::warn!(route = %self.ctx.route.name, slot = self.index,
                "redis consumer: the finished item was no longer in its processing list");
        }
        Ok(())
    }

    /// Hands the attempt's outcome to the kept recorder, waiting for room
    /// (see [`crate::shadow::OutcomeRecorder::record_kept`]): callers ack
    /// only after it, so an acked job's outcome is held by this process
    /// until Postgres takes it, whatever happens to Redis.
    pub(super) async fn record(
        &mut self,
        key: &str,
        outcome: OutcomeKind,
        class: Option<&'static str>,
        digest: Option<String>,
        attempt: i64,
    ) {
        let route = &self.ctx.route;
        match outcome {
            OutcomeKind::Ok => self.report.ok += 1,
            OutcomeKind::Failed => self.report.failed += 1,
            OutcomeKind::Dead => self.report.dead += 1,
        }
        metrics::counter!(m::REDIS_OUTCOMES, "route" => route.name.clone(), "outcome" => outcome.as_str())
            .increment(1);
        self.ctx
            .outcomes
            .record_kept(Outcome {
                queue: route.queue.clone(),
                key: key.to_string(),
                side: Side::Redis,
                mode: Mode::Live,
                outcome,
                error_class: class,
                digest,
                attempt: Some(i32::try_from(attempt).unwrap_or(i32::MAX)),
            })
            .await;
    }
}
