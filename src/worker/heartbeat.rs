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
    /// Registers an attempt; its token is cancelled if the lease is lost. If the
    /// same job is already registered under an older lease (it was reaped and
    /// this pool claimed it again), that older attempt has lost its lease: it
    /// is cancelled here rather than left running unheartbeated.
    pub fn insert(&self, job: JobRef) -> CancellationToken {
        let token = CancellationToken::new();
        if let Ok(mut map) = self.inner.lock() {
            if let Some((_, old)) = map.insert(job.id, (job.lease, token.clone())) {
                old.cancel();
            }
        }
        token
    }

    /// Forgets a finished attempt — only if it is still the registered one, so
    /// an old attempt finishing cannot unregister a newer attempt of the same job.
    pub fn remove(&self, job: JobRef) {
        if let Ok(mut map) = self.inner.lock() {
            if map
                .get(&job.id)
                .is_some_and(|(lease, _)| *lease == job.lease)
            {
                map.remove(&job.id);
            }
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

    /// Cancels the attempts whose lease was lost and that are still running
    /// (one that finished since the heartbeat read the map is not counted).
    /// Returns how many were cancelled.
    pub fn cancel(&self, lost: &[JobRef]) -> usize {
        let mut cancelled = 0;
        if let Ok(map) = self.inner.lock() {
            for r in lost {
                if let Some((lease, token)) = map.get(&r.id) {
                    if *lease == r.lease && !token.is_cancelled() {
                        token.cancel();
                        cancelled += 1;
                    }
                }
            }
        }
        cancelled
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
/// Returns how many were lost, or the error when the pass failed.
pub async fn run_once(
    pool: &PgPool,
    inflight: &InFlight,
    lease: Duration,
) -> Result<usize, crate::error::Error> {
    let refs = inflight.refs();
    if refs.is_empty() {
        return Ok(0);
    }
    let result = fence::heartbeat(pool, &refs, lease).await?;
    let lost = inflight.cancel(&result.lost);
    if lost > 0 {
        tracing::warn!(
            lost,
            "heartbeat found lost leases; cancelling those attempts"
        );
        metrics::counter!(crate::metrics::JOBS_LOST_LEASE).increment(lost as u64);
    }
    Ok(lost)
}

/// Beats every lease/3 until cancelled. When beats keep failing (Postgres
/// unreachable) for most of a lease, the leases are as good as gone — the
/// reaper will hand the jobs to someone else — so the running attempts are
/// cancelled instead of finishing work whose result would be rejected.
pub async fn run(pool: PgPool, inflight: InFlight, lease: Duration, token: CancellationToken) {
    let every = (lease / 3).max(Duration::from_millis(100));
    let mut last_ok = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        match run_once(&pool, &inflight, lease).await {
            Ok(_) => last_ok = tokio::time::Instant::now(),
            Err(err) => {
                tracing::warn!(error = %err, "heartbeat failed");
                if last_ok.elapsed() > lease.mul_f64(0.8) && !inflight.is_empty() {
                    tracing::warn!(
                        running = inflight.len(),
                        "no heartbeat succeeded for most of a lease; cancelling running attempts"
                    );
                    inflight.cancel_all();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(id: i64, lease: i64) -> JobRef {
        JobRef { id, lease }
    }

    #[test]
    fn a_newer_attempt_replaces_and_cancels_the_older_one() {
        let inflight = InFlight::default();
        let old = inflight.insert(r(1, 10));
        let new = inflight.insert(r(1, 11));
        assert!(old.is_cancelled(), "the reaped attempt must be cancelled");
        assert!(!new.is_cancelled());
        // The old attempt finishing must not unregister the new one.
        inflight.remove(r(1, 10));
        assert_eq!(inflight.refs(), vec![r(1, 11)]);
        inflight.remove(r(1, 11));
        assert!(inflight.is_empty());
    }

    #[test]
    fn cancel_counts_only_matching_running_attempts() {
        let inflight = InFlight::default();
        let t = inflight.insert(r(1, 10));
        assert_eq!(inflight.cancel(&[r(1, 9), r(2, 10)]), 0);
        assert!(!t.is_cancelled());
        assert_eq!(inflight.cancel(&[r(1, 10)]), 1);
        assert!(t.is_cancelled());
        assert_eq!(inflight.cancel(&[r(1, 10)]), 0, "already cancelled");
    }
}
