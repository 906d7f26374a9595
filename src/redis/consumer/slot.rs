//! One slot of a Redis consumer: its own connection and processing list,
//! one item at a time. Recovers what its lists hold first, then pops.

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, RedisResult};
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::heartbeat;
use super::inflight::item_key;
use super::numbering::numbered;
use super::postgres_owns::{claim, owner, Claim, Owner};
use super::{ConsumerReport, Ctx};

mod finish;
mod keeper;
mod skip;
use crate::config::PushEnd;
use crate::handler::HandlerResult;
use crate::metrics as m;
use crate::model::formats::{decode_bytes, Decoded};
use crate::model::Phase;
use crate::queue::{ClaimedJob, JobCopy};
use crate::shadow::{digest_hex, Mode, OutcomeKind};

/// What one [`Slot::run_once`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Finished one item (acked, dead, or handed back for a retry).
    Handled,
    /// Waited a block timeout and got nothing.
    Idle,
    /// Shutdown or decommissioning: the slot must stop.
    Stop,
}

pub(super) struct Slot {
    ctx: Arc<Ctx>,
    /// Its processing list is `processing(index)`.
    index: usize,
    conn: Option<MultiplexedConnection>,
    /// The `run_id` of the Redis server `conn` reached (read once it
    /// connects, before any pop on it), when INFO answers: a pop names it
    /// when it is numbered, the evidence that the item went with that
    /// server if it is gone and the item never ran.
    server: Option<String>,
    /// Processing lists of a former, larger concurrency this slot drains
    /// before popping (their slots no longer run).
    orphans: Vec<usize>,
    /// Its own list may hold an item (start-up, or a Redis error may have
    /// lost a BLMOVE reply or an ack): look before popping.
    check_own: bool,
    /// Items found in the own list at start-up count as recovered.
    starting: bool,
    /// One of this slot's own lists whose item holds the running claim an
    /// item of another of its lists waits for: handled next, or the slot
    /// would wait on itself.
    holder_next: Option<usize>,
    /// The item whose ack is not confirmed (see [`finish::Unacked`]).
    unacked: Option<finish::Unacked>,
    /// The keeper's connection (see [`keeper`]), kept between items.
    keeper_conn: Option<MultiplexedConnection>,
    pub(super) report: ConsumerReport,
}

impl Slot {
    pub(super) fn new(ctx: Arc<Ctx>, index: usize, orphans: Vec<usize>) -> Slot {
        let report = ConsumerReport {
            route: ctx.route.name.clone(),
            ..ConsumerReport::default()
        };
        Slot {
            ctx,
            index,
            conn: None,
            server: None,
            orphans,
            check_own: true,
            starting: true,
            holder_next: None,
            unacked: None,
            keeper_conn: None,
            report,
        }
    }

    /// Runs until `token` is cancelled or the route is decommissioned.
    /// Redis errors drop the connection and retry after a pause.
    pub(super) async fn run(mut self, token: CancellationToken) -> ConsumerReport {
        loop {
            match self.run_once(&token).await {
                Ok(Step::Stop) => break,
                Ok(Step::Handled | Step::Idle) => {}
                Err(e) => {
                    self.report.redis_errors += 1;
                    tracing::warn!(route = %self.ctx.route.name, slot = self.index, error = %e,
                        "redis consumer: Redis command failed; reconnecting");
                    self.conn = None;
                    self.check_own = true;
                    tokio::select! {
                        _ = token.cancelled() => break,
                        _ = tokio::time::sleep(self.ctx.opts.reconnect_delay) => {}
                    }
                }
            }
        }
        self.report
    }

    /// One step: handles the oldest item left in one of this slot's
    /// processing lists if there is one, else pops one item (waiting up to
    /// the block timeout) and handles it.
    pub(super) async fn run_once(&mut self, token: &CancellationToken) -> RedisResult<Step> {
        if token.is_cancelled() || self.ctx.phase() == Phase::Decommissioned {
            return Ok(Step::Stop);
        }
        if !heartbeat::fresh(&self.ctx.beat_ok_ms) {
            // Its heartbeat may be about to expire, and decommission takes an
            // expired heartbeat for a consumer that touches its lists no
            // more: touch none until the beat is renewed.
            tracing::debug!(route = %self.ctx.route.name, slot = self.index,
                "redis consumer: heartbeat not fresh; not popping");
            tokio::select! {
                _ = token.cancelled() => return Ok(Step::Stop),
                _ = tokio::time::sleep(heartbeat::EVERY) => return Ok(Step::Idle),
            }
        }
        let mut conn = self.connection().await?;
        let keys = &self.ctx.keys;
        if let Some(list) = self.holder_next.take() {
            let item: Option<Vec<u8>> = ::redis::cmd("LINDEX")
                .arg(keys.processing(list))
                .arg(-1)
                .query_async(&mut conn)
                .await?;
            if let Some(item) = item {
                return self.handle(&mut conn, list, item, true, token).await;
            }
        }
        if self.check_own {
            let item: Option<Vec<u8>> = ::redis::cmd("LINDEX")
                .arg(keys.processing(self.index))
                .arg(-1)
                .query_async(&mut conn)
                .await?;
            match item {
                Some(item) => {
                    return self
                        .handle(&mut conn, self.index, item, self.starting, token)
                        .await
                }
                None => {
                    self.check_own = false;
                    self.starting = false;
                }
            }
        }
        while let Some(&list) = self.orphans.last() {
            let item: Option<Vec<u8>> = ::redis::cmd("LINDEX")
                .arg(keys.processing(list))
                .arg(-1)
                .query_async(&mut conn)
                .await?;
            match item {
                Some(item) => return self.handle(&mut conn, list, item, true, token).await,
                None => {
                    self.orphans.pop();
                }
            }
        }
        // Producers push at one end; the oldest item is at the other.
        let from = match self.ctx.route.push {
            PushEnd::Lpush => "RIGHT",
            PushEnd::Rpush => "LEFT",
        };
        // Celery's priority lists (`Route::lists`, the queue's own first, as
        // kombu's workers read them): the first that has an item gives it.
        // Redis blocks on one source only, so the wait below is on the
        // queue's own list, at most a second: an item pushed meanwhile onto
        // a priority list waits that long at most.
        let lists = self.ctx.route.lists();
        let mut block = self.ctx.opts.block;
        if lists.len() > 1 {
            for list in &lists {
                let item: Option<Vec<u8>> = ::redis::cmd("LMOVE")
                    .arg(&list[..])
                    .arg(keys.processing(self.index))
                    .arg(from)
                    .arg("LEFT")
                    .query_async(&mut conn)
                    .await?;
                if let Some(item) = item {
                    return self.handle(&mut conn, self.index, item, false, token).await;
                }
            }
            block = block.min(Duration::from_secs(1));
        }
        let mut blmove = ::redis::cmd("BLMOVE");
        blmove
            .arg(&self.ctx.route.redis_key[..])
            .arg(keys.processing(self.index))
            .arg(from)
            .arg("LEFT")
            .arg(block.as_secs_f64());
        let pop = blmove.query_async::<Option<Vec<u8>>>(&mut conn);
        // Dropping a pending BLMOVE is safe: the item is either still in
        // the source list or already in the processing list, where the next
        // start finds it.
        let item = tokio::select! {
            biased;
            _ = token.cancelled() => return Ok(Step::Stop),
            item = pop => item?,
        };
        match item {
            Some(item) => self.handle(&mut conn, self.index, item, false, token).await,
            None => Ok(Step::Idle),
        }
    }

    async fn connection(&mut self) -> RedisResult<MultiplexedConnection> {
        if let Some(conn) = &self.conn {
            return Ok(conn.clone());
        }
        let opts = &self.ctx.opts;
        // A blocked BLMOVE holds the connection: each slot has its own, and
        // its reply may take the whole block timeout.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(3)))
            .set_response_timeout(Some(opts.block + Duration::from_secs(5)));
        let mut conn = self
            .ctx
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let _: () = ::redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(self.ctx.keys.client_name(self.index))
            .query_async(&mut conn)
            .await?;
        // An ACL user may be denied INFO: the pops then name no server (no
        // evidence, as before), and the slot still runs.
        let info: Option<String> = ::redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .ok();
        self.server = info
            .as_deref()
            .and_then(crate::redis::epoch::run_id_of)
            .map(str::to_string);
        self.conn = Some(conn.clone());
        Ok(conn)
    }

    /// Runs `item` (the oldest of processing list `list`) to its end: acked,
    /// dead, or left in place at shutdown.
    async fn handle(
        &mut self,
        conn: &mut MultiplexedConnection,
        list: usize,
        item: Vec<u8>,
        recovered: bool,
        token: &CancellationToken,
    ) -> RedisResult<Step> {
        let ctx = Arc::clone(&self.ctx);
        // Counted in the heartbeat until the item is acked, dead or left.
        let _held = heartbeat::Held::new(&ctx.holding);
        let (processing, inflight) = (ctx.keys.processing(list), ctx.keys.inflight(list));
        if recovered {
            self.report.recovered += 1;
            metrics::counter!(m::REDIS_RECOVERED, "route" => ctx.route.name.clone()).increment(1);
        }
        let decoded = decode_bytes(&ctx.route.format, Bytes::from(item));
        // A freshly popped item has no state yet; one found in a processing
        // list may have its key and attempts from before.
        let fresh = !recovered && list == self.index && !self.check_own;
        let server = self.server.clone();
        let Some(key) = item_key(&ctx, conn, server.as_deref(), &inflight, fresh, &decoded).await?
        else {
            // Left in its processing list: this slot looks there first next.
            self.check_own = true;
            tokio::select! {
                _ = token.cancelled() => return Ok(Step::Stop),
                _ = tokio::time::sleep(self.ctx.opts.reconnect_delay) => return Ok(Step::Idle),
            }
        };
        // Only the first item this slot handles after the failed ack may be
        // it, found again in its own list with its bytes and key.
        if let Some(done) = self.unacked.take().filter(|u| {
            !fresh && u.processing == processing && u.key == key && u.item == decoded.original
        }) {
            // It ran and its outcome is recorded; only the ack was lost.
            self.finish(conn, done.dead, &processing, &inflight, &decoded, &key)
                .await?;
            return Ok(Step::Handled);
        }
        let claim = claim(
            conn,
            (&ctx.claim, &ctx.route_keys),
            &processing,
            &decoded,
            &key,
        )
        .await;
        if let Claim::HeldBy(holder) = claim {
            // A second item of a job another item runs now: it waits in its
            // processing list until that run ends (then the ran set drops it).
            tracing::debug!(route = %ctx.route.name, key = %key_hash(&key), holder = %holder,
                "redis consumer: the job runs in another item; this one waits");
            // The holder may be one of this slot's own lists (an orphan left
            // by a larger concurrency, or its own list after a restart): only
            // this slot runs it, so it goes next.
            self.holder_next = ctx
                .keys
                .slot_of(&holder)
                .filter(|i| *i == self.index || self.orphans.contains(i));
            self.check_own = true;
            tokio::select! {
                _ = token.cancelled() => return Ok(Step::Stop),
                _ = tokio::time::sleep(self.ctx.opts.reconnect_delay) => return Ok(Step::Idle),
            }
        }
        let owner = match claim {
            // The ran set knows it: no need to ask further.
            Claim::Ran => Owner::RanOnRecord,
            _ => {
                owner(
                    &ctx.db,
                    conn,
                    &ctx.route_keys,
                    &ctx.route.queue,
                    &decoded,
                    &key,
                    server.as_deref(),
                )
                .await
            }
        };
        match owner {
            Owner::Postgres | Owner::RanOnRecord => {
                let reason = match owner {
                    Owner::Postgres => {
                        self.report.dropped_live_in_postgres += 1;
                        "live_in_postgres"
                    }
                    _ => {
                        self.report.dropped_already_ran += 1;
                        "already_ran"
                    }
                };
                self.skip_unrun(conn, (&processing, &inflight), &decoded, &key, reason)
                    .await?;
                return Ok(Step::Handled);
            }
            Owner::NotPostgres => {}
            Owner::Unknown(reason) => {
                // Running it would act on silence: it may be a re-push of a
                // job Postgres runs. It stays in this slot's processing
                // list, which the slot looks at first next time.
                tracing::warn!(route = %ctx.route.name, key = %key_hash(&key), error = %reason,
                    "redis consumer: cannot tell whether Postgres runs this job live; it waits");
                self.check_own = true;
                tokio::select! {
                    _ = token.cancelled() => return Ok(Step::Stop),
                    _ = tokio::time::sleep(self.ctx.opts.reconnect_delay) => return Ok(Step::Idle),
                }
            }
        }
        // A content hash's first 12 hex digits say which identical texts a
        // pop belongs to (nothing about the payload beyond equality), so a
        // campaign's failed seed can be followed pop by pop.
        let (text, occurrence) =
            numbered(&key).map_or(("", 0), |(hash, n)| (&hash[..12.min(hash.len())], n));
        tracing::debug!(route = %ctx.route.name, slot = list, fresh, key = %key_hash(&key),
            text, occurrence, "redis consumer: running an item");
        let max = i64::from(ctx.config.max_attempts);
        loop {
            // Counted before the run: a crash mid-run used up an attempt,
            // so an item that kills the process cannot loop forever.
            let attempt: i64 = ::redis::cmd("HINCRBY")
                .arg(&inflight)
                .arg("attempts")
                .arg(1)
                .query_async(conn)
                .await?;
            if attempt > max {
                // Recorded first, as every outcome: see `record`.
                self.record(
                    &key,
                    OutcomeKind::Dead,
                    Some("interrupted"),
                    None,
                    attempt - 1,
                )
                .await;
                self.finish(conn, true, &processing, &inflight, &decoded, &key)
                    .await?;
                return Ok(Step::Handled);
            }
            let job = redis_job(&ctx, &decoded, &key, attempt, max);
            // In-flight work gets `drain` more once shutdown starts; then it
            // stays in its processing list for the next start.
            let drain = async {
                token.cancelled().await;
                tokio::time::sleep(ctx.opts.drain).await;
            };
            let running = keeper::Running {
                processing: &processing,
                inflight: &inflight,
                item: &decoded.original,
                key: &key,
                attempt,
            };
            let run = tokio::select! {
                run = ctx.handler.run_recorded(&job, Mode::Live, &ctx.route.digester) => run,
                never = keeper::keep(&ctx, server.as_deref(), &mut self.keeper_conn, running) => match never {},
                () = drain => {
                    tracing::info!(route = %ctx.route.name, slot = list, key = %key_hash(&key),
                        "redis consumer: shutdown deadline passed; the item stays in its processing list");
                    return Ok(Step::Stop);
                }
            };
            let digest = run.digest;
            match run.result {
                // The outcome is recorded before the item leaves its
                // processing list: the handler's work is a fact whether or
                // not Redis takes the ack. If Redis dies here and loses the
                // item, the recorded outcome is what keeps `diff --repair`
                // from pushing back a job that already ran (the fault
                // suite's redis-restart scenario caught that order).
                HandlerResult::Done => {
                    self.record(&key, OutcomeKind::Ok, None, digest, attempt)
                        .await;
                    self.finish(conn, false, &processing, &inflight, &decoded, &key)
                        .await?;
                    return Ok(Step::Handled);
                }
                HandlerResult::Retry(_) if attempt < max => {
                    self.record(&key, OutcomeKind::Failed, run.error_class, digest, attempt)
                        .await;
                    tokio::select! {
                        _ = token.cancelled() => return Ok(Step::Stop),
                        _ = tokio::time::sleep(ctx.config.retry_delay) => {}
                    }
                }
                HandlerResult::Retry(_) | HandlerResult::Permanent(_) => {
                    self.record(&key, OutcomeKind::Dead, run.error_class, digest, attempt)
                        .await;
                    self.finish(conn, true, &processing, &inflight, &decoded, &key)
                        .await?;
                    tracing::info!(route = %ctx.route.name, key = %key_hash(&key), attempt,
                        class = run.error_class.unwrap_or("other"), "redis consumer: item moved to the dead list");
                    return Ok(Step::Handled);
                }
            }
        }
    }
}

/// The item as the handler sees it: the shape a claimed Postgres job has,
/// with id 0 and lease 0 (it has neither) and the decoded payload, so a
/// handler serves both sides alike.
fn redis_job(ctx: &Ctx, decoded: &Decoded, key: &str, attempt: i64, max: i64) -> ClaimedJob {
    let now = chrono::Utc::now();
    ClaimedJob {
        id: 0,
        queue: ctx.route.queue.clone(),
        kind: decoded.kind.clone(),
        key: Some(key.to_string()),
        payload: decoded.payload.clone(),
        priority: 0,
        attempts: i32::try_from(attempt).unwrap_or(i32::MAX),
        max_attempts: i32::try_from(max).unwrap_or(i32::MAX),
        lease: 0,
        run_at: now,
        created_at: now,
        lock_key: None,
        tenant: None,
        copy: JobCopy::Live,
    }
}

/// What logs show of a job key: a short hash (a key may be a payload field).
fn key_hash(key: &str) -> String {
    digest_hex(key.as_bytes())[..12].to_string()
}
