//! The writers' circuit breaker: once a write finds Postgres unavailable,
//! every writer parks its batches at once for a moment instead of each
//! waiting out a connect timeout, then probes again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long writers skip Postgres after finding it unavailable.
const OPEN_FOR: Duration = Duration::from_secs(1);

/// Shared by a mirror's writers: open (skip Postgres) until a moment after
/// the last write that found Postgres unavailable. Milliseconds since
/// `epoch`; 0 = closed.
#[derive(Clone)]
pub(super) struct Breaker {
    epoch: Instant,
    open_until_ms: Arc<AtomicU64>,
}

impl Breaker {
    pub(super) fn new() -> Breaker {
        Breaker {
            epoch: Instant::now(),
            open_until_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Whether writers should skip Postgres now.
    pub(super) fn is_open(&self) -> bool {
        self.now_ms() < self.open_until_ms.load(Ordering::Relaxed)
    }

    /// A write found Postgres unavailable.
    pub(super) fn open(&self) {
        let until = self.now_ms() + OPEN_FOR.as_millis() as u64;
        self.open_until_ms.store(until, Ordering::Relaxed);
    }

    /// A write went through.
    pub(super) fn close(&self) {
        self.open_until_ms.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_for_a_moment_and_closes_on_success() {
        let b = Breaker::new();
        assert!(!b.is_open());
        b.open();
        assert!(b.is_open());
        b.close();
        assert!(!b.is_open());
    }
}
