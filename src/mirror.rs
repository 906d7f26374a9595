//! The proxy's Postgres writer: pushed items are queued here and written in
//! group-commit transactions, so thousands of concurrent one-item pushes cost
//! a few transactions, not thousands.
//!
//! Two kinds of request share the writers:
//! - [`Mirror::mirror`] — `dual_write`/`shadow`: Redis already took the item,
//!   the client already has its reply; the item becomes a mirror copy. If
//!   Postgres is down the items are parked in the route's Redis gap list
//!   (`qbridge:gap:<route>`) and written when it is back
//!   ([`repair_gaps_once`]); the Redis push is never failed for it.
//! - [`Mirror::store_live`] — `postgres_only`/`decommissioned`: Postgres is
//!   the only copy, so the caller waits for the commit and learns of failure.
//!
//! Memory is bounded by `buffer_bytes` of queued items: a request waits for
//! room (the proxy then stops reading from that client) instead of growing
//! the queue. Nothing here logs an item.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::aio::ConnectionManager;
use ::redis::AsyncCommands;
use bytes::Bytes;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot, Mutex, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::ingest::{self, Item, Stored, Via};
use crate::metrics as m;
use crate::model::formats::decode_bytes;
use crate::queue::JobCopy;
use crate::redis::keys::gap_key;
use crate::routes::{Route, Routes};

/// Tuning of the writers; see `[proxy]` in the config.
#[derive(Debug, Clone, Copy)]
pub struct MirrorOptions {
    /// Bytes of items queued at most.
    pub buffer_bytes: usize,
    /// Items per transaction at most.
    pub batch_items: usize,
    /// Transactions in flight at once.
    pub writers: usize,
    /// The queue's payload limit (larger items are stored flagged).
    pub payload_limit: usize,
}

/// Why a live store failed; one line, safe to send to a Redis client.
pub type StoreError = String;

/// A handle to the writers. Cheap to clone; the writers stop once every
/// handle is dropped and the queue is drained.
#[derive(Clone)]
pub struct Mirror {
    tx: mpsc::Sender<Request>,
    budget: Arc<Semaphore>,
    budget_units: u32,
}

struct Request {
    route: Arc<Route>,
    items: Vec<Bytes>,
    copy: JobCopy,
    via: Via,
    /// When Redis acknowledged the push (mirror lag starts here).
    acked_at: Instant,
    reply: Option<oneshot::Sender<Result<Vec<Stored>, StoreError>>>,
    /// Returned to the budget when the request is done.
    _permit: OwnedSemaphorePermit,
}

/// The budget is counted in KiB so a u32 of permits covers any buffer size.
const UNIT: usize = 1024;

/// The writers are gone (shutdown): nothing more can be queued.
#[derive(Debug, thiserror::Error)]
#[error("qbridge is shutting down: the mirror writer has stopped")]
pub struct MirrorClosed;

impl Mirror {
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
        // budget bounds the requests queued too; the channel must not be the
        // tighter bound (it would cap one-item pushes far below the buffer).
        let (tx, rx) = mpsc::channel(units as usize);
        let rx = Arc::new(Mutex::new(rx));
        let mut writers = JoinSet::new();
        let breaker = Breaker::new();
        for _ in 0..opts.writers.max(1) {
            let writer = Writer {
                pool: pool.clone(),
                spool: spool.clone(),
                rx: Arc::clone(&rx),
                opts,
                probe: probe.clone(),
                breaker: breaker.clone(),
            };
            writers.spawn(writer.run());
        }
        let mirror = Mirror {
            tx,
            budget: Arc::new(Semaphore::new(units as usize)),
            budget_units: units,
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
        let (name, n) = (route.name.clone(), items.len() as u64);
        let queued = self
            .send(route, items, JobCopy::Mirror, Via::Proxy, acked_at, None)
            .await;
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
        let (reply, rx) = oneshot::channel();
        self.send(
            route,
            items,
            JobCopy::Live,
            Via::Proxy,
            Instant::now(),
            Some(reply),
        )
        .await
        .map_err(|e| e.to_string())?;
        rx.await.map_err(|_| MirrorClosed.to_string())?
    }

    async fn send(
        &self,
        route: Arc<Route>,
        items: Vec<Bytes>,
        copy: JobCopy,
        via: Via,
        acked_at: Instant,
        reply: Option<oneshot::Sender<Result<Vec<Stored>, StoreError>>>,
    ) -> Result<(), MirrorClosed> {
        let bytes: usize = items.iter().map(|i| i.len() + 64).sum();
        let units = u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .clamp(1, self.budget_units);
        let permit = Arc::clone(&self.budget)
            .acquire_many_owned(units)
            .await
            .map_err(|_| MirrorClosed)?;
        let request = Request {
            route,
            items,
            copy,
            via,
            acked_at,
            reply,
            _permit: permit,
        };
        self.tx.send(request).await.map_err(|_| MirrorClosed)
    }
}

struct Writer {
    pool: PgPool,
    spool: Option<ConnectionManager>,
    rx: Arc<Mutex<mpsc::Receiver<Request>>>,
    opts: MirrorOptions,
    probe: Option<LagProbe>,
    breaker: Breaker,
}

/// Shared by a mirror's writers: open (skip Postgres) for a moment after a
/// write found Postgres unavailable. Milliseconds since `epoch`; 0 = closed.
#[derive(Clone)]
struct Breaker {
    epoch: Instant,
    open_until_ms: Arc<std::sync::atomic::AtomicU64>,
}

/// How long writers skip Postgres after finding it unavailable.
const BREAKER_OPEN: Duration = Duration::from_secs(1);

impl Breaker {
    fn new() -> Breaker {
        Breaker {
            epoch: Instant::now(),
            open_until_ms: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn is_open(&self) -> bool {
        self.now_ms()
            < self
                .open_until_ms
                .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn open(&self) {
        let until = self.now_ms() + BREAKER_OPEN.as_millis() as u64;
        self.open_until_ms
            .store(until, std::sync::atomic::Ordering::Relaxed);
    }

    fn close(&self) {
        self.open_until_ms
            .store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Errors that mean "Postgres is not there" (as opposed to a bad batch).
fn is_unavailable(err: &crate::error::Error) -> bool {
    matches!(
        err,
        crate::error::Error::Db(
            sqlx::Error::Io(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::Tls(_)
                | sqlx::Error::Protocol(_)
        )
    ) || matches!(err, crate::error::Error::Db(sqlx::Error::Database(e)) if e.code().is_some_and(|c| c.starts_with("57") || c.starts_with("08") || c == "55P03"))
}

/// Where [`Mirror::start_probed`] puts lag samples, in seconds.
pub type LagProbe = Arc<std::sync::Mutex<Vec<f64>>>;

impl Writer {
    async fn run(mut self) {
        while let Some(batch) = self.gather().await {
            self.write(batch).await;
        }
    }

    /// Waits for one request, then takes whatever else is queued, up to the
    /// batch size: under load batches fill while the last one commits.
    async fn gather(&self) -> Option<Vec<Request>> {
        let mut rx = self.rx.lock().await;
        let first = rx.recv().await?;
        let mut count = first.items.len();
        let mut batch = vec![first];
        while count < self.opts.batch_items {
            match rx.try_recv() {
                Ok(request) => {
                    count += request.items.len();
                    batch.push(request);
                }
                Err(_) => break,
            }
        }
        Some(batch)
    }

    async fn write(&mut self, batch: Vec<Request>) {
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
        let result = write_batch(
            &self.pool,
            &batch,
            self.opts.payload_limit,
            self.opts.batch_items,
        )
        .await;
        match &result {
            Ok(_) => self.breaker.close(),
            Err(e) if is_unavailable(e) => self.breaker.open(),
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
            let _ = reply.send(Err(format!("Postgres write failed: {reason}")));
            return;
        }
        let n = request.items.len() as u64;
        match &mut self.spool {
            Some(conn) => match spool(conn, &request.route, &request.items).await {
                Ok(()) => metrics::counter!(m::MIRROR_SPOOLED, "route" => route).increment(n),
                Err(e) => {
                    tracing::error!(route = %route, items = n, error = %e,
                        "could not park unmirrored items in the gap list; the diff will report them");
                    metrics::counter!(m::MIRROR_LOST, "route" => route).increment(n);
                }
            },
            None => metrics::counter!(m::MIRROR_LOST, "route" => route).increment(n),
        }
    }
}

/// Decodes and stores every item of `batch` in one transaction; results in
/// request order, items in order. Items are decoded and stored `chunk` at a
/// time: one push may carry a million items, and decoding them all at once
/// (payloads, keys, bind arrays) cost about 3 KiB each, far past the mirror
/// buffer. Chunks of one transaction see each other's rows, so keys and
/// duplicates come out as in one statement.
async fn write_batch(
    pool: &PgPool,
    batch: &[Request],
    payload_limit: usize,
    chunk: usize,
) -> crate::error::Result<Vec<Stored>> {
    let all: Vec<(&Request, &Bytes)> = batch
        .iter()
        .flat_map(|r| r.items.iter().map(move |bytes| (r, bytes)))
        .collect();
    let mut tx = pool.begin().await?;
    // A batch stuck behind a lock (a business transaction holding a key it
    // shares, a manual LOCK TABLE) fails over to the gap list instead of
    // stalling every proxy client behind the mirror buffer.
    sqlx::query("SET LOCAL lock_timeout = '2s'")
        .execute(&mut *tx)
        .await?;
    let mut stored = Vec::with_capacity(all.len());
    for part in all.chunks(chunk.max(1)) {
        let items: Vec<Item<'_>> = part
            .iter()
            .map(|&(r, bytes)| Item {
                route: &r.route,
                decoded: decode_bytes(&r.route.format, bytes.clone()),
                copy: r.copy,
                via: r.via,
            })
            .collect();
        stored.extend(ingest::store(&mut tx, items, payload_limit).await?);
    }
    tx.commit().await?;
    Ok(stored)
}

async fn spool(
    conn: &mut ConnectionManager,
    route: &Route,
    items: &[Bytes],
) -> ::redis::RedisResult<()> {
    let items: Vec<&[u8]> = items.iter().map(|b| b.as_ref()).collect();
    conn.rpush::<_, _, ()>(gap_key(route), items).await
}

/// Items per gap-repair transaction.
const REPAIR_BATCH: usize = 500;

/// Writes up to one batch per route from the gap lists into Postgres (as
/// mirror copies); returns how many items were repaired.
///
/// Items are read (LRANGE), written, and only then trimmed from the list, so
/// a crash or a failed write leaves them where they were. New items are
/// appended at the tail meanwhile and the trim removes only the head that was
/// written. A short Redis lock per route keeps two processes from writing
/// the same items (identical raw items would otherwise get two occurrences).
pub async fn repair_gaps_once(
    pool: &PgPool,
    conn: &mut ConnectionManager,
    routes: &Routes,
    payload_limit: usize,
) -> crate::error::Result<u64> {
    let redis_err = |e: ::redis::RedisError| crate::error::Error::Redis(format!("gap repair: {e}"));
    let mut repaired = 0;
    for route in routes.iter() {
        let key = gap_key(route);
        let lock = format!("{key}:lock");
        let token = uuid::Uuid::new_v4().to_string();
        let locked: Option<String> = ::redis::cmd("SET")
            .arg(&lock)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(REPAIR_LOCK.as_millis() as u64)
            .query_async(conn)
            .await
            .map_err(redis_err)?;
        if locked.is_none() {
            continue;
        }
        let result = repair_route(pool, conn, route, &key, payload_limit).await;
        // Released only if still ours (it may have expired and been taken).
        let _: ::redis::RedisResult<i64> = ::redis::Script::new(RELEASE_LUA)
            .key(&lock)
            .arg(&token)
            .invoke_async(conn)
            .await;
        repaired += result?;
    }
    Ok(repaired)
}

/// How long one process may hold a route's gap repair.
const REPAIR_LOCK: Duration = Duration::from_secs(60);

const RELEASE_LUA: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

async fn repair_route(
    pool: &PgPool,
    conn: &mut ConnectionManager,
    route: &Route,
    key: &str,
    payload_limit: usize,
) -> crate::error::Result<u64> {
    let taken: Vec<Vec<u8>> = conn
        .lrange(key, 0, REPAIR_BATCH as isize - 1)
        .await
        .map_err(|e| crate::error::Error::Redis(format!("gap repair: {e}")))?;
    if taken.is_empty() {
        return Ok(0);
    }
    let items = taken
        .iter()
        .map(|b| Item {
            route,
            decoded: decode_bytes(&route.format, Bytes::copy_from_slice(b)),
            copy: JobCopy::Mirror,
            via: Via::Repair,
        })
        .collect();
    let mut tx = pool.begin().await?;
    ingest::store(&mut tx, items, payload_limit).await?;
    tx.commit().await?;
    // Written: now drop them from the head. If this trim fails they are
    // written again next pass, and their keys make that a no-op (content-hash
    // items would get a second occurrence: counted as a duplicate by the diff).
    conn.ltrim::<_, ()>(key, taken.len() as isize, -1)
        .await
        .map_err(|e| crate::error::Error::Redis(format!("gap repair: {e}")))?;
    Ok(taken.len() as u64)
}

/// Repairs gaps every `interval` until `token` is cancelled. Quiet unless it
/// repaired something or failed.
pub async fn repair_gaps(
    pool: PgPool,
    mut conn: ConnectionManager,
    routes: Routes,
    payload_limit: usize,
    interval: Duration,
    token: tokio_util::sync::CancellationToken,
) {
    loop {
        match repair_gaps_once(&pool, &mut conn, &routes, payload_limit).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(items = n, "mirrored items parked during a Postgres outage");
                // More may be waiting: go again at once, unless stopping.
                if token.is_cancelled() {
                    return;
                }
                continue;
            }
            Err(e) => tracing::debug!(error = %e, "gap repair deferred"),
        }
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
