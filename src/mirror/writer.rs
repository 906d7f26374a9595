//! The mirror's handle and its group-commit writers. A request (one push's
//! items) takes room in a byte budget, then waits in a channel; each writer
//! takes one request, gathers whatever else is queued up to the batch size,
//! and stores the whole batch in one transaction. Under load batches fill
//! while the previous one commits, so the commit rate, not the push rate,
//! sets the number of transactions.

use std::sync::Arc;
use std::time::Instant;

use ::redis::aio::ConnectionManager;
use bytes::Bytes;
use sqlx::PgPool;
use tokio::sync::{oneshot, Notify, Semaphore};
use tokio::task::JoinSet;

use super::batch::{rq_jobs_of, write_batch, Part};
use super::breaker::Breaker;
use super::gather::{Gatherer, Turns};
use super::options::{MirrorClosed, MirrorOptions, StoreError};
use super::order::Order;
use super::request::Request;
use super::retained::{Kept, Retained};
use super::spool;
use crate::ingest::{Stored, Via};
use crate::metrics as m;
use crate::model::following::RoutedPush;
use crate::queue::JobCopy;
use crate::routes::Route;

/// Where a live store's result goes.
type Reply = oneshot::Sender<Result<Vec<Stored>, StoreError>>;

/// A handle to the writers. Cheap to clone; the writers stop once every
/// handle is dropped and the queue is drained.
#[derive(Clone)]
pub struct Mirror {
    tx: async_channel::Sender<Request>,
    budget: Arc<Semaphore>,
    budget_units: u32,
    /// Wakes lingering writers when a live store is queued.
    urgent: Arc<Notify>,
    /// Copies due later (members of a framework's schedule or retry set),
    /// written beside the writers (`super::due`).
    pub(super) due: super::options::DueWriter,
}

/// The budget is counted in KiB so a u32 of permits covers any buffer size.
const UNIT: usize = 1024;

impl Mirror {
    /// The Postgres pool the mirror writes with.
    pub fn pool(&self) -> &PgPool {
        &self.due.pool
    }

    /// Starts `opts.writers` writers on `pool`. `spool` is the Redis
    /// connection of the gap lists; without one, items a failed transaction
    /// could not write are counted as lost (their Redis copies still run).
    pub fn start(
        pool: PgPool,
        spool: Option<ConnectionManager>,
        opts: MirrorOptions,
    ) -> (Mirror, JoinSet<()>) {
        Mirror::start_probed(pool, spool, opts, None)
    }

    /// [`Mirror::start`] that also appends every mirror copy's lag (seconds
    /// from Redis's acknowledgement to commit) to `probe`: the benchmark
    /// reads exact percentiles there instead of histogram buckets.
    pub fn start_probed(
        pool: PgPool,
        spool: Option<ConnectionManager>,
        opts: MirrorOptions,
        probe: Option<LagProbe>,
    ) -> (Mirror, JoinSet<()>) {
        let units = u32::try_from((opts.buffer_bytes / UNIT).max(1)).unwrap_or(u32::MAX);
        // Every request holds at least one unit of the byte budget, so the
        // budget bounds the requests queued; the channel needs no bound of
        // its own. A bounded one of `units` slots (65,536 at 64 MiB) was a
        // ring of 8 MiB, allocated up front, that every push stepped
        // through cold: 5.4% of the process's samples at depth 1 (perf).
        let (tx, rx) = async_channel::unbounded();
        let mut writers = JoinSet::new();
        let breaker = Breaker::new();
        let retained = Retained::new(opts.buffer_bytes);
        let urgent = Arc::new(Notify::new());
        let turns = Arc::new(Turns::default());
        let order = Arc::new(Order::default());
        for _ in 0..opts.writers.max(1) {
            let writer = Writer {
                pool: pool.clone(),
                spool: spool.clone(),
                gather: Arc::new(Gatherer {
                    rx: rx.clone(),
                    urgent: Arc::clone(&urgent),
                    turns: Arc::clone(&turns),
                    order: Arc::clone(&order),
                    linger: opts.linger,
                    batch_items: opts.batch_items,
                }),
                opts,
                probe: probe.clone(),
                breaker: breaker.clone(),
                retained: retained.clone(),
            };
            writers.spawn(writer.run());
        }
        let mirror = Mirror {
            tx,
            budget: Arc::new(Semaphore::new(units as usize)),
            budget_units: units,
            urgent,
            due: super::options::DueWriter::new(pool, spool, opts),
        };
        (mirror, writers)
    }

    /// Queues items Redis has taken, as mirror copies. Returns once they are
    /// queued (waiting for buffer room), not once they are written.
    pub async fn mirror(
        &self,
        route: Arc<Route>,
        items: Vec<Bytes>,
        acked_at: Instant,
    ) -> Result<(), MirrorClosed> {
        self.mirror_as(route, items, (acked_at, None), false, None)
            .await
    }

    /// [`Mirror::mirror`], the copies recorded in `job_keys` alone when
    /// `ledger_only` ([`ingest::Item::ledger_only`]: pushed in `dual_write`
    /// on a route that records its mirror copies in the ledger). `acked` is
    /// when Redis acknowledged the push and, when known, which server did
    /// (its `run_id`: the evidence if that server is gone later).
    pub async fn mirror_as(
        &self,
        route: Arc<Route>,
        items: Vec<Bytes>,
        acked: (Instant, Option<Arc<str>>),
        ledger_only: bool,
        routed: Option<RoutedPush>,
    ) -> Result<(), MirrorClosed> {
        let (name, n) = (route.name.clone(), items.len() as u64);
        let copy = (JobCopy::Mirror, Via::Proxy, ledger_only);
        let queued = self.send(route, items, copy, acked, (None, routed)).await;
        if queued.is_err() {
            // Redis has the item and runs it; only its mirror copy is
            // missing, and the diff reports it.
            metrics::counter!(m::MIRROR_LOST, "route" => name).increment(n);
        }
        queued
    }

    /// Writes items as live copies and waits for the commit.
    pub async fn store_live(
        &self,
        route: Arc<Route>,
        items: Vec<Bytes>,
    ) -> Result<Vec<Stored>, StoreError> {
        self.store_live_routed(route, items, None).await
    }

    /// [`Mirror::store_live`] of a push the proxy counts as routed until
    /// this write ends ([`crate::model::following`]).
    pub async fn store_live_routed(
        &self,
        route: Arc<Route>,
        items: Vec<Bytes>,
        routed: Option<RoutedPush>,
    ) -> Result<Vec<Stored>, StoreError> {
        let (reply, rx) = oneshot::channel();
        let copy = (JobCopy::Live, Via::Proxy, false);
        self.send(
            route,
            items,
            copy,
            (Instant::now(), None),
            (Some(reply), routed),
        )
        .await?;
        rx.await.map_err(|_| MirrorClosed)?
    }

    async fn send(
        &self,
        route: Arc<Route>,
        items: Vec<Bytes>,
        (copy, via, ledger_only): (JobCopy, Via, bool),
        (acked_at, acked_by): (Instant, Option<Arc<str>>),
        (reply, routed): (Option<Reply>, Option<RoutedPush>),
    ) -> Result<(), MirrorClosed> {
        let bytes: usize = items.iter().map(|i| i.len() + 64).sum();
        let units = u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .clamp(1, self.budget_units);
        let permit = Arc::clone(&self.budget)
            .acquire_many_owned(units)
            .await
            .map_err(|_| MirrorClosed)?;
        let live = reply.is_some();
        let request = Request {
            route,
            items,
            copy,
            via,
            acked_at,
            acked_by,
            ledger_only,
            writes: uuid::Uuid::new_v4(),
            reply,
            _permit: permit,
            _routed: routed,
        };
        self.tx.send(request).await.map_err(|_| MirrorClosed)?;
        if live {
            // A client waits for this commit: no writer may linger over it.
            self.urgent.notify_waiters();
        }
        Ok(())
    }
}

struct Writer {
    pool: PgPool,
    spool: Option<ConnectionManager>,
    gather: Arc<Gatherer>,
    opts: MirrorOptions,
    probe: Option<LagProbe>,
    breaker: Breaker,
    retained: Retained,
}

/// How often a writer with nothing new to write tries again what it parked.
const RETRY_KEPT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Where [`Mirror::start_probed`] puts lag samples, in seconds.
pub type LagProbe = Arc<std::sync::Mutex<Vec<f64>>>;

impl Writer {
    async fn run(mut self) {
        // Its own handle, so a turn (which borrows it) is no borrow of self.
        let gather = Arc::clone(&self.gather);
        loop {
            // Only the wait for a first request gives way to the retry of
            // what was parked: a batch given up while it gathered lost the
            // requests it held (`tests::a_push_gathered_as_parked_items_are_retried_is_kept`).
            let turn = tokio::select! {
                turn = gather.first() => turn,
                _ = tokio::time::sleep(RETRY_KEPT_EVERY), if !self.retained.is_empty() => {
                    self.write_kept().await;
                    continue;
                }
            };
            let Some(turn) = turn else { break };
            let (batch, ticket) = gather.fill(turn).await;
            let batch = self.before_live(batch, ticket.place).await;
            self.write(batch).await;
            drop(ticket);
            if !self.retained.is_empty() {
                self.write_kept().await;
            }
        }
        // Stopping: a last try for what was parked (the gap list has it too).
        if !self.retained.is_empty() {
            self.write_kept().await;
        }
    }

    /// Writes what this mirror parked (see `retained`), unless Postgres is
    /// known to be down; on failure it is kept for the next try.
    async fn write_kept(&mut self) {
        if self.breaker.is_open() {
            return;
        }
        let turns = Arc::clone(&self.gather.turns);
        let _writing = turns.writing();
        // Before the take: a live batch then finds them parked or in progress.
        let _ticket = self.gather.order.kept();
        let kept = self.retained.take();
        if kept.is_empty() {
            return;
        }
        let parts: Vec<Part<'_>> = kept
            .iter()
            .flat_map(|k| {
                Part::all(
                    &k.route,
                    (k.copy, k.via, k.ledger_only),
                    k.writes,
                    (k.acked_at, k.acked_by.as_deref()),
                    &k.items,
                )
            })
            .collect();
        let jobs = rq_jobs_of(&mut self.spool, &parts).await;
        let result = write_batch(
            &self.pool,
            parts,
            &jobs,
            self.opts.payload_limit,
            self.opts.batch_items,
        )
        .await;
        match result {
            Ok(stored) => {
                self.breaker.close();
                tracing::info!(
                    items = stored.len(),
                    "mirrored items parked during a Postgres outage"
                );
            }
            Err(e) => {
                if e.is_unavailable() {
                    self.breaker.open();
                }
                tracing::debug!(error = %e, "parked items not written yet");
                self.retained.give_back(kept);
            }
        }
    }

    async fn write(&mut self, batch: Vec<Request>) {
        let turns = Arc::clone(&self.gather.turns);
        let _writing = turns.writing();
        let count: usize = batch.iter().map(|r| r.items.len()).sum();
        metrics::histogram!(m::MIRROR_BATCH_ITEMS).record(count as f64);
        // While Postgres is known to be down, do not make every batch wait
        // out a connect timeout: park it at once and probe again later.
        if self.breaker.is_open() {
            for request in batch {
                self.fail(
                    request,
                    "Postgres unavailable (a recent write failed; retrying shortly)",
                )
                .await;
            }
            return;
        }
        let parts: Vec<Part<'_>> = batch
            .iter()
            .flat_map(|r| {
                Part::all(
                    &r.route,
                    (r.copy, r.via, r.ledger_only),
                    r.writes,
                    (r.acked_at, r.acked_by.as_deref()),
                    &r.items,
                )
            })
            .collect();
        let jobs = rq_jobs_of(&mut self.spool, &parts).await;
        let result = write_batch(
            &self.pool,
            parts,
            &jobs,
            self.opts.payload_limit,
            self.opts.batch_items,
        )
        .await;
        match &result {
            Ok(_) => self.breaker.close(),
            Err(e) if e.is_unavailable() => self.breaker.open(),
            Err(_) => {}
        }
        match result {
            Ok(mut results) => {
                let now = Instant::now();
                for request in batch.into_iter().rev() {
                    let mine = results.split_off(results.len() - request.items.len());
                    if request.copy == JobCopy::Mirror {
                        let lag = now.duration_since(request.acked_at).as_secs_f64();
                        metrics::histogram!(m::MIRROR_LAG, "route" => request.route.name.clone())
                            .record(lag);
                        if let Some(probe) = &self.probe {
                            if let Ok(mut samples) = probe.lock() {
                                samples.extend(std::iter::repeat_n(lag, request.items.len()));
                            }
                        }
                    }
                    if let Some(reply) = request.reply {
                        let _ = reply.send(Ok(mine));
                    }
                }
            }
            Err(err) => {
                let reason = err.to_string();
                tracing::warn!(items = count, error = %reason, "mirror write failed");
                for request in batch {
                    self.fail(request, &reason).await;
                }
            }
        }
    }

    async fn fail(&mut self, request: Request, reason: &str) {
        let route = request.route.name.clone();
        metrics::counter!(m::MIRROR_FAILURES, "route" => route.clone())
            .increment(request.items.len() as u64);
        if let Some(reply) = request.reply {
            let _ = reply.send(Err(StoreError::Failed(reason.to_string())));
            return;
        }
        let n = request.items.len() as u64;
        self.retained.keep(Kept {
            route: Arc::clone(&request.route),
            items: request.items.clone(),
            copy: request.copy,
            via: request.via,
            ledger_only: request.ledger_only,
            writes: request.writes,
            acked_at: request.acked_at,
            acked_by: request.acked_by.clone(),
        });
        match &mut self.spool {
            Some(conn) => {
                match spool::park(conn, &request.route, request.writes, &request.items).await {
                    Ok(()) => metrics::counter!(m::MIRROR_SPOOLED, "route" => route).increment(n),
                    Err(e) => {
                        tracing::error!(route = %route, items = n, error = %e,
                        "could not park unmirrored items in the gap list; the diff will report them");
                        metrics::counter!(m::MIRROR_LOST, "route" => route).increment(n);
                    }
                }
            }
            None => metrics::counter!(m::MIRROR_LOST, "route" => route).increment(n),
        }
    }
}

mod before_live;
#[cfg(test)]
mod tests;
