//! In-flight bookkeeping and the heartbeat. Every running attempt is registered
//! with its lease and a cancellation token; one task per pool extends all their
//! leases in a single statement every lease/3. An attempt whose lease is gone
//! (reaped, claimed again) is cancelled, and its result is discarded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::queue::{fence, JobRef};

/// The attempts a pool is running now.
#[derive(Debug, Default, Clone)]
pub struct InFlight {
    inner: Arc<Mutex<HashMap<i64, (i64, CancellationToken)>>>,
}

impl InFlight {
    /// Registers an attempt; its token is cancelled if the lease is lost.
    pub fn insert(&self, job: JobRef) -> CancellationToken {
        let token = CancellationToken::new();
        if let Ok(mut map) = self.inner.lock() {
            map.insert(job.id, (job.lease, token.clone()));
        }
        token
    }

    /// Forgets a finished attempt.
    pub fn remove(&self, id: i64) {
        if let Ok(mut map) = self.inner.lock() {
            map.remove(&id);
        }
    }

    /// The attempts running now.
    pub fn refs(&self) -> Vec<JobRef> {
        self.inner
            .lock()
            .map(|m| {
                m.iter()
                    .map(|(&id, (lease, _))| JobRef { id, lease: *lease })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Cancels the attempts whose lease was lost.
    pub fn cancel(&self, lost: &[JobRef]) {
        if let Ok(map) = self.inner.lock() {
            for r in lost {
                if let Some((lease, token)) = map.get(&r.id) {
                    if *lease == r.lease {
                        token.cancel();
                    }
                }
            }
        }
    }

    /// Cancels every attempt (shutdown deadline passed).
    pub fn cancel_all(&self) {
        if let Ok(map) = self.inner.lock() {
            for (_, token) in map.values() {
                token.cancel();
            }
        }
    }

    /// Number of running attempts.
    pub fn len(&self) -> usize {
        self.inner.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// True when nothing runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One heartbeat pass: extends every running lease, cancels lost ones.
/// Returns how many were lost.
pub async fn run_once(pool: &PgPool, inflight: &InFlight, lease: Duration) -> usize {
    let refs = inflight.refs();
    if refs.is_empty() {
        return 0;
    }
    match fence::heartbeat(pool, &refs, lease).await {
        Ok(result) => {
            if !result.lost.is_empty() {
                tracing::warn!(
                    lost = result.lost.len(),
                    "heartbeat found lost leases; cancelling those attempts"
                );
                inflight.cancel(&result.lost);
                metrics::counter!(crate::metrics::JOBS_LOST_LEASE)
                    .increment(result.lost.len() as u64);
            }
            result.lost.len()
        }
        Err(err) => {
            // The lease still runs; the next beat (lease/3 later) tries again.
            tracing::warn!(error = %err, "heartbeat failed");
            0
        }
    }
}

/// Beats every lease/3 until cancelled.
pub async fn run(pool: PgPool, inflight: InFlight, lease: Duration, token: CancellationToken) {
    let every = (lease / 3).max(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        run_once(&pool, &inflight, lease).await;
    }
}
