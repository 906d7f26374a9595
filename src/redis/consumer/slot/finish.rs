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

impl Slot {
    /// Runs the ack or dead script on the item.
    pub(super) async fn finish(
        &self,
        conn: &mut MultiplexedConnection,
        script: &::redis::Script,
        processing: &str,
        inflight: &str,
        decoded: &Decoded,
        key: &str,
    ) -> RedisResult<()> {
        let now = chrono::Utc::now().timestamp_millis();
        let mut call = script.key(processing);
        call.key(inflight)
            .key(self.ctx.route_keys.dead())
            .key(self.ctx.route_keys.ran())
            .key(self.ctx.route_keys.running())
            .arg(&decoded.original[..])
            .arg(key)
            .arg(now)
            .arg(now - RAN_RETENTION_MS);
        let removed: i64 = call.invoke_async(conn).await?;
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
