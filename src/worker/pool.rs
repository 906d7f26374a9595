//! One worker pool: claims batches from its queues while it has free slots (plus
//! a prefetch sized by its start rate, see [`crate::worker::prefetch`]), runs
//! each job's handler in its own task, and sends the outcome to the completer.
//! Sleeps until a NOTIFY wake-up or the poll interval, whichever comes first
//! (after a wake-up, an empty claim is followed up, see
//! [`crate::worker::follow_up`]).
//! A pool whose handlers take several batches at once keeps that many claims
//! in flight (up to four claimers sharing its slots, see [`claims_in_flight`]).
//!
//! Shutdown: when `intake` is cancelled it stops claiming; running handlers get
//! until `deadline`; after that they are cancelled and their jobs handed back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant as TokioInstant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::PoolConfig;
use crate::handler::Handler;
use crate::metrics as m;
use crate::queue::claim::claim_batch;
use crate::queue::claim_head::HeadTracker;
use crate::queue::completer::Finished;
use crate::queue::{fence, ClaimRequest, ClaimedJob, JobRef};
use crate::worker::attempt::AttemptCtx;
pub use crate::worker::attempt::RouteRuns;
use crate::worker::follow_up::FollowUps;
use crate::worker::heartbeat::{self, InFlight};
use crate::worker::prefetch::{Held, Prefetch};

/// Totals of one pool's life.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolReport {
    pub claimed: u64,
    /// Jobs handed back at shutdown because their handler did not finish in time.
    pub handed_back: u64,
    /// Prefetched jobs handed back unstarted (held too long, claimed on their
    /// last attempt, or at shutdown).
    pub prefetch_handed_back: u64,
}

/// Everything a pool needs.
pub struct WorkerPool {
    pub config: PoolConfig,
    pub db: PgPool,
    pub handler: Arc<Handler>,
    pub completer: mpsc::Sender<Finished>,
    pub waker: Arc<Notify>,
    pub worker_id: String,
    /// Set on a route's pool: live attempts of keyed jobs are recorded (side
    /// `postgres`) and mirror copies are shadowed or drained by phase.
    pub routes: Option<RouteRuns>,
}

/// Most claims one pool keeps in flight (see [`claims_in_flight`]).
pub const MAX_CLAIMS_IN_FLIGHT: usize = 4;

/// What a pool's claimers share: the handler slots, the running attempts
/// and the metric handles.
struct Shared {
    slots: Arc<Semaphore>,
    tracker: TaskTracker,
    inflight: InFlight,
    to_start: metrics::Histogram,
    claim_seconds: metrics::Histogram,
    claimed_total: metrics::Counter,
    queue_label: Arc<str>,
    /// How many claimers share them.
    claimers: usize,
    /// Where the claimers' next claim starts its walk of the claim index.
    walk: std::sync::Mutex<HeadTracker>,
}

impl Shared {
    /// The claimers' shared [`HeadTracker`] (held only to read or note a
    /// head; a claimer that panicked holding it left nothing half-written).
    fn walk(&self) -> std::sync::MutexGuard<'_, HeadTracker> {
        self.walk.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl WorkerPool {
    /// Runs until `intake` is cancelled and every attempt is settled.
    pub async fn run(self, intake: CancellationToken, deadline: Duration) -> PoolReport {
        let tracker = TaskTracker::new();
        let inflight = InFlight::default();
        let beat_stop = CancellationToken::new();
        let beat = tokio::spawn(heartbeat::run(
            self.db.clone(),
            inflight.clone(),
            self.config.lease,
            beat_stop.clone(),
        ));
        let queue_label: Arc<str> = Arc::from(self.config.queues.join(",").as_str());
        let label = queue_label.to_string();
        // Handles resolved once: a labelled lookup per job is measurable at 30k jobs/s.
        let shared = Shared {
            slots: Arc::new(Semaphore::new(self.config.concurrency)),
            tracker,
            inflight,
            to_start: metrics::histogram!(m::ENQUEUE_TO_START, "queue" => label.clone()),
            claim_seconds: metrics::histogram!(m::CLAIM_SECONDS, "queue" => label.clone()),
            claimed_total: metrics::counter!(m::JOBS_CLAIMED, "queue" => label),
            queue_label,
            claimers: claims_in_flight(&self.config),
            walk: std::sync::Mutex::default(),
        };
        let claimers = (0..shared.claimers).map(|_| self.claim_loop(&shared, &intake));
        let mut report = PoolReport::default();
        for r in futures_util::future::join_all(claimers).await {
            report.claimed += r.claimed;
            report.prefetch_handed_back += r.prefetch_handed_back;
        }
        report.handed_back = self
            .settle(&shared.tracker, &shared.inflight, deadline)
            .await;
        beat_stop.cancel();
        let _ = beat.await;
        report
    }

    /// One claimer: claims while the pool has free slots, starts what it
    /// claimed, holds the rest (its own prefetch), sleeps when the queue looks
    /// empty; until `intake` is cancelled, then hands back what it holds.
    async fn claim_loop(&self, shared: &Shared, intake: &CancellationToken) -> PoolReport {
        let Shared {
            slots, inflight, ..
        } = shared;
        let mut report = PoolReport::default();
        let mut failures = 0u32;
        // Where the next tenant-capped claim starts (claims rotate through tenants).
        let mut tenant_cursor: Option<String> = None;

        let mut prefetch = Prefetch::new(self.prefetch_window(), TokioInstant::now());
        let mut follow_ups = FollowUps::default();

        while !intake.is_cancelled() {
            // Wait for one free slot, then take as many more as are free now;
            // hand back held jobs that waited too long meanwhile.
            let first = tokio::select! {
                _ = intake.cancelled() => break,
                _ = sleep_until_some(prefetch.hand_back_at()) => {
                    let expired = prefetch.expired(TokioInstant::now());
                    report.prefetch_handed_back += self.hand_back_or_hold(expired, inflight, &mut prefetch).await;
                    continue;
                }
                p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            };
            let mut permits = self.more_permits(slots, first);
            // Held jobs first: they were claimed first.
            let mut ready = Vec::new();
            let mut cancelled = Vec::new();
            while ready.len() < permits.len() {
                let Some(held) = prefetch.oldest() else { break };
                if held.cancel.is_cancelled() {
                    // The heartbeat gave up on it: its lease was lost, or
                    // could not be renewed. Hand it back (fenced: a no-op when
                    // someone else holds it now) rather than start it.
                    cancelled.push(held);
                    continue;
                }
                ready.push((held.job, held.cancel));
            }
            report.prefetch_handed_back += self
                .hand_back_or_hold(cancelled, inflight, &mut prefetch)
                .await;
            let from_held = ready.len();
            if from_held > 0 {
                self.spawn_attempts(ready, &mut permits, shared);
                prefetch.started(from_held, TokioInstant::now());
            }
            if permits.is_empty() {
                continue;
            }
            let req = ClaimRequest {
                queues: &self.config.queues,
                kinds: self.config.kinds.as_deref(),
                limit: prefetch.claim_limit(
                    permits.len(),
                    self.config.batch_size,
                    TokioInstant::now(),
                ),
                worker: &self.worker_id,
                lease: self.config.lease,
                tenant: self.config.tenant.as_ref(),
                tenant_after: tenant_cursor.as_deref(),
                lock_retry_delay: self.config.lock_retry_delay,
                start: shared.walk().start(TokioInstant::now()),
            };
            let started = Instant::now();
            let claimed = match claim_batch(&self.db, &req).await {
                Ok(claimed) => {
                    failures = 0;
                    shared.claim_seconds.record(started.elapsed().as_secs_f64());
                    claimed
                }
                Err(err) => {
                    failures += 1;
                    tracing::warn!(error = %err, pool = %self.config.name, "claim failed");
                    drop(permits);
                    let pause = self
                        .config
                        .poll_interval
                        .min(Duration::from_millis(100 * u64::from(failures.min(20))));
                    tokio::select! {
                        _ = intake.cancelled() => break,
                        _ = tokio::time::sleep(pause) => {}
                    }
                    continue;
                }
            };
            // An empty claim restarts the rotation from the first tenant.
            tenant_cursor = claimed.tenant_cursor;
            shared.walk().claimed(claimed.head);
            let got = claimed.jobs.len();
            report.claimed += got as u64;
            if got > 0 {
                shared.claimed_total.increment(got as u64);
            }
            if claimed.more && shared.claimers > 1 {
                // The queue has more than this claim took: pass the wake-up
                // on to a claimer that may be asleep (one NOTIFY wakes one;
                // with none asleep, the next to sleep claims once more first).
                self.waker.notify_one();
            }
            // Every claimed job is heartbeated from now, started or held.
            let mut jobs = claimed.jobs.into_iter().map(|job| {
                let cancel = inflight.insert(job.job_ref());
                (job, cancel)
            });
            let now_running: Vec<_> = jobs.by_ref().take(permits.len()).collect();
            let running = now_running.len();
            self.spawn_attempts(now_running, &mut permits, shared);
            let now = TokioInstant::now();
            let mut last_attempts = Vec::new();
            for (job, cancel) in jobs {
                if job.attempts >= job.max_attempts {
                    // Never held: should this process die holding it, the
                    // reaper would dead-letter a job that never ran.
                    last_attempts.push(Held::new(job, cancel, now));
                } else {
                    prefetch.hold(job, cancel, now);
                }
            }
            prefetch.started(running, now);
            if !last_attempts.is_empty() {
                prefetch.pause(now);
            }
            report.prefetch_handed_back += self
                .hand_back_or_hold(last_attempts, inflight, &mut prefetch)
                .await;
            drop(permits);
            if !claimed.more && prefetch.is_empty() {
                // The queue looked empty: sleep until a wake-up or the poll
                // backstop. Polls keep a fixed cadence from the last claim's
                // start, so a job nobody was told about waits at most one poll
                // interval plus one claim.
                // After a hint, a neighbour's commit may land just after this
                // claim looked: claim again shortly (see worker::follow_up).
                let next_poll = TokioInstant::from_std(started + self.config.poll_interval);
                let wake_at = follow_ups.wake_at(TokioInstant::now(), next_poll);
                tokio::select! {
                    _ = intake.cancelled() => break,
                    _ = self.waker.notified() => follow_ups.woken(),
                    _ = tokio::time::sleep_until(wake_at) => {}
                }
            }
        }

        // Held jobs never started: hand them back now, attempts refunded,
        // rather than after their leases expire.
        match self.hand_back(prefetch.take_all(), inflight).await {
            Ok(n) => report.prefetch_handed_back += n,
            Err(kept) => {
                // Stopping: nobody will heartbeat them; their leases expire.
                for held in kept {
                    inflight.remove(held.job.job_ref());
                }
            }
        }
        report
    }

    /// The pool's prefetch window; off for tenant-capped pools, whose cap
    /// counts claimed jobs, so a held job would use a tenant's share unrun.
    fn prefetch_window(&self) -> Duration {
        if self.config.tenant.is_some() {
            Duration::ZERO
        } else {
            self.config.prefetch_window
        }
    }

    /// Hands held jobs back unstarted, attempts refunded (fenced: a job whose
    /// lease was lost meanwhile is left to its new holder). Returns how many
    /// were handed back or, when the database did not answer, the jobs: still
    /// claimed and heartbeated.
    async fn hand_back(
        &self,
        mut held: Vec<Held>,
        inflight: &InFlight,
    ) -> std::result::Result<u64, Vec<Held>> {
        if held.is_empty() {
            return Ok(0);
        }
        let refs: Vec<JobRef> = held.iter().map(|h| h.job.job_ref()).collect();
        // Out of the heartbeat first, so it never counts a released lease as lost.
        for r in &refs {
            inflight.remove(*r);
        }
        match fence::release(&self.db, &refs, true).await {
            Ok(result) => {
                let n = result.applied.len() as u64;
                metrics::counter!(m::PREFETCH_HANDED_BACK, "queue" => self.config.queues.join(","))
                    .increment(n);
                Ok(n)
            }
            Err(err) => {
                tracing::warn!(pool = %self.config.name, jobs = refs.len(), error = %err,
                    "could not hand prefetched jobs back; holding them and trying again");
                for h in &mut held {
                    h.cancel = inflight.insert(h.job.job_ref());
                }
                Err(held)
            }
        }
    }

    /// [`Self::hand_back`]; what it could not return is held again, for
    /// another try after a hold (or to start, if a handler frees first).
    async fn hand_back_or_hold(
        &self,
        held: Vec<Held>,
        inflight: &InFlight,
        prefetch: &mut Prefetch,
    ) -> u64 {
        match self.hand_back(held, inflight).await {
            Ok(n) => n,
            Err(kept) => {
                prefetch.hold_again(kept, TokioInstant::now());
                0
            }
        }
    }

    /// The free slot `first` plus as many more as are free now, up to a batch.
    fn more_permits(
        &self,
        slots: &Arc<Semaphore>,
        first: OwnedSemaphorePermit,
    ) -> Vec<OwnedSemaphorePermit> {
        let mut permits = vec![first];
        while (permits.len() as i64) < self.config.batch_size {
            match slots.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        permits
    }

    /// Starts one attempt per claimed job (already registered in flight),
    /// each holding one of `permits` until it is settled.
    fn spawn_attempts(
        &self,
        jobs: Vec<(ClaimedJob, CancellationToken)>,
        permits: &mut Vec<OwnedSemaphorePermit>,
        shared: &Shared,
    ) {
        debug_assert!(jobs.len() <= permits.len(), "a job without a slot");
        let n = jobs.len().min(permits.len());
        for ((job, cancel), permit) in jobs.into_iter().zip(permits.drain(..n)) {
            let ctx = AttemptCtx {
                db: self.db.clone(),
                handler: self.handler.clone(),
                completer: self.completer.clone(),
                inflight: shared.inflight.clone(),
                backoff: self.config.backoff,
                to_start: shared.to_start.clone(),
                routes: self.routes.clone(),
                queue: if self.config.queues.len() == 1 {
                    shared.queue_label.clone()
                } else {
                    Arc::from(job.queue.as_str())
                },
            };
            shared.tracker.spawn(async move {
                ctx.run(job, cancel).await;
                drop(permit);
            });
        }
    }

    /// Waits up to `deadline` for the running attempts, then cancels the rest
    /// and hands their jobs back; returns how many were handed back.
    async fn settle(&self, tracker: &TaskTracker, inflight: &InFlight, deadline: Duration) -> u64 {
        tracker.close();
        if tokio::time::timeout(deadline, tracker.wait())
            .await
            .is_err()
        {
            let left = inflight.len();
            tracing::warn!(pool = %self.config.name, running = left,
                "shutdown deadline passed; cancelling handlers and handing their jobs back");
            inflight.cancel_all();
            tracker.wait().await;
            return left as u64;
        }
        0
    }
}

/// How many claims a pool keeps in flight: one per batch its handlers can
/// take at once, at most [`MAX_CLAIMS_IN_FLIGHT`]. A claim's round trip is
/// the pool's pace when its handlers are fast (a no-op handler frees its slot
/// long before the next claim returns), so a pool with room for several
/// batches that claims one at a time leaves Postgres idle (the
/// steady state). One for a tenant-capped pool, whose claims rotate through
/// the tenants in turn.
pub fn claims_in_flight(config: &PoolConfig) -> usize {
    if config.tenant.is_some() {
        return 1;
    }
    let batches = config.concurrency as i64 / config.batch_size.max(1);
    batches.clamp(1, MAX_CLAIMS_IN_FLIGHT as i64) as usize
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_some(at: Option<TokioInstant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HandlerConfig;
    use crate::queue::backoff::Backoff;
    use crate::queue::claim::TenantCap;

    fn pool(concurrency: usize, batch_size: i64) -> PoolConfig {
        PoolConfig {
            name: "p".into(),
            queues: vec!["q".into()],
            kinds: None,
            concurrency,
            batch_size,
            lease: Duration::from_secs(60),
            poll_interval: Duration::from_secs(1),
            backoff: Backoff::default(),
            lock_retry_delay: Duration::from_secs(1),
            prefetch_window: Duration::from_millis(50),
            tenant: None,
            handler: HandlerConfig::Noop {},
        }
    }

    #[test]
    fn one_claim_in_flight_per_batch_the_handlers_take_at_once() {
        assert_eq!(claims_in_flight(&pool(10, 100)), 1);
        assert_eq!(claims_in_flight(&pool(199, 100)), 1);
        assert_eq!(claims_in_flight(&pool(200, 100)), 2);
        assert_eq!(claims_in_flight(&pool(1000, 100)), MAX_CLAIMS_IN_FLIGHT);
        assert_eq!(claims_in_flight(&pool(1, 0)), 1);
    }

    #[test]
    fn a_tenant_capped_pool_claims_one_batch_at_a_time() {
        let mut p = pool(1000, 100);
        p.tenant = Some(TenantCap {
            path: vec!["t".into()],
            cap: 5,
        });
        assert_eq!(claims_in_flight(&p), 1);
    }
}
