//! The consumer's heartbeat: the hash `qbridge:consumer:<route>:<consumer>`
//! ([`ConsumerKeys::heartbeat`]) saying which phase the consumer acts on,
//! how many items its slots hold (a handler running or waiting to retry)
//! and when it last beat, with a TTL so that a consumer that dies stops
//! being there.
//!
//! Decommission archives a route's processing lists only on this evidence
//! (`ops::decommission`): every consumer says `decommissioned` with nothing
//! held, or its heartbeat has expired. So the consumer keeps three promises:
//!
//! - it beats before its slots touch any list, and a slot pops nothing while
//!   its last successful beat is older than [`FRESH_FOR`] (an expired key
//!   must mean that nobody works on the lists);
//! - it writes `decommissioned` only once every slot has stopped (a slot
//!   finishes the item in hand, acked or dead, then pops no more), never
//!   while one may still pop or run a handler;
//! - a clean exit deletes the key: the process is gone, whatever it left in
//!   its processing lists is nobody's work until a next start, and a
//!   decommission may archive it at once instead of waiting for the TTL.
//!
//! After acknowledging `decommissioned` it beats no more (a decommissioned
//! consumer opens no Redis connection, and decommission deletes the key at
//! the end: a beat after that would leave a key of the route behind). The
//! acknowledgement expires after [`TTL`]; it is then a consumer that is
//! gone, which decommission treats alike: it stopped and touches nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::{AsyncConnectionConfig, RedisResult};
use tokio_util::sync::CancellationToken;

use super::Ctx;
use crate::model::Phase;
use crate::redis::keys::{ConsumerKeys, RouteKeys};

/// How often a running consumer beats. Decommission polls the heartbeats
/// about as often, so this is roughly how long it waits after the last
/// handler finished.
pub const EVERY: Duration = Duration::from_secs(1);

/// How long a heartbeat lives without being renewed: ten beats, so a slow
/// Redis reply or a reconnect does not make a live consumer look dead, and
/// a dead one is known to be gone within seconds.
pub const TTL: Duration = Duration::from_secs(10);

/// A slot pops only while the last successful beat is younger than this:
/// half the TTL, so the key is surely still there when it does.
pub const FRESH_FOR: Duration = Duration::from_secs(5);

const PHASE: &str = "phase";
const HOLDING: &str = "holding";
const AT: &str = "at";

/// One consumer's heartbeat as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// The consumer's name.
    pub consumer: String,
    /// The phase it acts on; `None` if the field does not read as a phase.
    pub phase: Option<Phase>,
    /// Items its slots hold.
    pub holding: u64,
    /// When it beat (ms since the epoch).
    pub at_ms: i64,
}

impl Heartbeat {
    /// It stopped for `decommissioned` and holds nothing.
    pub fn acknowledged_decommission(&self) -> bool {
        self.phase == Some(Phase::Decommissioned) && self.holding == 0
    }
}

/// Writes one beat of `keys`'s consumer, renewing its TTL, in one step.
pub async fn write<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &ConsumerKeys,
    phase: Phase,
    holding: u64,
) -> RedisResult<()> {
    let key = keys.heartbeat();
    let at = chrono::Utc::now().timestamp_millis();
    ::redis::pipe()
        .atomic()
        .hset_multiple(
            &key,
            &[
                (PHASE, phase.as_str().to_string()),
                (HOLDING, holding.to_string()),
                (AT, at.to_string()),
            ],
        )
        .ignore()
        .pexpire(&key, TTL.as_millis() as i64)
        .ignore()
        .query_async(conn)
        .await
}

/// Whether another running consumer beats under `keys`'s name, asked before
/// this one beats for the first time: two consumers with one name would
/// share — and each recover — the same processing lists. A heartbeat that
/// is there may also be this consumer's own previous run, killed before it
/// could delete it; only one that is renewed while we watch (two beats)
/// is another's. A consumer that exited cleanly deleted its key.
pub async fn in_use<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &ConsumerKeys,
) -> RedisResult<bool> {
    let key = keys.heartbeat();
    let first: Option<String> = ::redis::cmd("HGET")
        .arg(&key)
        .arg(AT)
        .query_async(conn)
        .await?;
    let Some(first) = first else {
        return Ok(false);
    };
    tokio::time::sleep(EVERY * 2 + Duration::from_millis(500)).await;
    let then: Option<String> = ::redis::cmd("HGET")
        .arg(&key)
        .arg(AT)
        .query_async(conn)
        .await?;
    Ok(then.is_some_and(|then| then != first))
}

/// The heartbeats stored under `found` (keys SCANned with
/// [`RouteKeys::any_heartbeat`]); a key that expired since is left out.
pub async fn read<C: ConnectionLike + Send>(
    conn: &mut C,
    route: &RouteKeys,
    found: &[String],
) -> RedisResult<Vec<Heartbeat>> {
    let mut beats = Vec::with_capacity(found.len());
    for key in found {
        let Some(consumer) = route.heartbeat_owner(key) else {
            continue;
        };
        let fields: std::collections::HashMap<String, String> =
            ::redis::cmd("HGETALL").arg(key).query_async(conn).await?;
        if fields.is_empty() {
            continue;
        }
        let number = |name: &str| fields.get(name).and_then(|v| v.parse().ok());
        beats.push(Heartbeat {
            consumer: consumer.to_string(),
            phase: fields.get(PHASE).and_then(|p| p.parse().ok()),
            // Unreadable counts as holding: never take silence for idle.
            holding: number(HOLDING).unwrap_or(u64::MAX),
            at_ms: number(AT).map_or(0, |v: u64| v as i64),
        });
    }
    Ok(beats)
}

/// An item a slot holds, counted in the heartbeat while it lives.
pub(super) struct Held<'a>(&'a AtomicU64);

impl<'a> Held<'a> {
    pub(super) fn new(count: &'a AtomicU64) -> Held<'a> {
        count.fetch_add(1, Ordering::SeqCst);
        Held(count)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The beats of one run of a consumer's slots, on one connection of its own.
pub(super) struct Beater<'a> {
    ctx: &'a Ctx,
    conn: Option<MultiplexedConnection>,
}

impl<'a> Beater<'a> {
    pub(super) fn new(ctx: &'a Ctx) -> Beater<'a> {
        Beater { ctx, conn: None }
    }

    async fn beat(&mut self, phase: Phase) -> RedisResult<()> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(3)))
                    .set_response_timeout(Some(Duration::from_secs(3)));
                let conn = self
                    .ctx
                    .client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                self.conn.insert(conn)
            }
        };
        let holding = self.ctx.holding.load(Ordering::SeqCst);
        match write(conn, &self.ctx.keys, phase, holding).await {
            Ok(()) => {
                let now = chrono::Utc::now().timestamp_millis();
                self.ctx.beat_ok_ms.store(now, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => {
                self.conn = None;
                Err(e)
            }
        }
    }

    /// The first beat, before any slot starts: retried until it is written
    /// (true) or `token` is cancelled (false).
    pub(super) async fn first(&mut self, phase: Phase, token: &CancellationToken) -> bool {
        loop {
            match self.beat(phase).await {
                Ok(()) => return true,
                Err(e) => tracing::warn!(route = %self.ctx.route.name, error = %e,
                    "redis consumer: cannot write its heartbeat; its slots wait for it"),
            }
            tokio::select! {
                _ = token.cancelled() => return false,
                _ = tokio::time::sleep(self.ctx.opts.reconnect_delay) => {}
            }
        }
    }

    /// Beats every [`EVERY`] until `stop`. The phase it writes is the one
    /// the slots act on: the route's phase, but never `decommissioned` while
    /// slots still run (they stop at their next step; the acknowledgement
    /// comes once they all did).
    pub(super) async fn while_running(&mut self, started: Phase, stop: CancellationToken) {
        let mut acting = started;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(EVERY) => {}
            }
            let phase = self.ctx.phase();
            if phase != Phase::Decommissioned {
                acting = phase;
            }
            if let Err(e) = self.beat(acting).await {
                tracing::warn!(route = %self.ctx.route.name, error = %e,
                    "redis consumer: heartbeat failed; retrying at the next beat");
            }
        }
    }

    /// Every slot stopped for `decommissioned`: says so, holding nothing,
    /// once (see the module docs for why it beats no more).
    pub(super) async fn acknowledge(mut self) {
        if let Err(e) = self.beat(Phase::Decommissioned).await {
            // The last beat then expires: decommission waits out the TTL.
            tracing::warn!(route = %self.ctx.route.name, error = %e,
                "redis consumer: cannot acknowledge decommissioned; its heartbeat expires instead");
        }
    }

    /// A clean exit: the heartbeat goes with the process.
    pub(super) async fn remove(mut self) {
        let key = self.ctx.keys.heartbeat();
        let removed = match self.conn.take() {
            Some(mut conn) => {
                ::redis::cmd("DEL")
                    .arg(&key)
                    .query_async::<i64>(&mut conn)
                    .await
            }
            None => Ok(0),
        };
        if let Err(e) = removed {
            tracing::warn!(route = %self.ctx.route.name, error = %e,
                "redis consumer: cannot delete its heartbeat at exit; it expires instead");
        }
    }
}

/// Whether the last successful beat (ms since the epoch, 0 = none) is
/// recent enough for a slot to pop.
pub(super) fn fresh(beat_ok_ms: &std::sync::atomic::AtomicI64) -> bool {
    let last = beat_ok_ms.load(Ordering::SeqCst);
    let now = chrono::Utc::now().timestamp_millis();
    last > 0 && now - last < FRESH_FOR.as_millis() as i64
}
