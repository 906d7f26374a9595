//! Whether every process that routes a route's pushes has followed its
//! latest phase change, and the count each such process keeps of the
//! pushes it routed and has not written yet.
//!
//! Processes learn of a phase change at different moments (each polls the
//! stored flag, or hears of it sooner). A push one process routed under
//! the old phase may still be on its way to Postgres — a mirror copy a
//! writer is committing, a live store — when another process routes a
//! re-push of the same job under the new phase. Judged against what
//! Postgres holds at that moment, the re-push would be taken for a new job
//! after a flip (stored live while Redis runs the original), or forwarded
//! to Redis beside a live copy after a rollback: the job would run twice.
//!
//! So each route's changes are numbered (the stored flag's `revision`),
//! and:
//! - every push a process routes is counted from before its phase is read
//!   until its write is done ([`RoutedPush`], a guard that counts down when
//!   dropped), in one of two generations;
//! - a process that routes pushes (a *follower*, one that runs the proxy)
//!   starts a new generation once its view holds a new revision
//!   ([`Routed::barrier`]), waits until the pushes of the one before are
//!   written, and only then records that it follows the revision
//!   (`cutover::follow`, in `qbridge.phase_followers`);
//! - a push is routed only when every live follower follows the revision
//!   the process's view holds (`PhaseView::followed`), read in the
//!   same lock as the phase. A push read before a later change is counted
//!   in the generation that change waits for, so no follower follows the
//!   later revision until that push is written.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// How long a push waits for every process to follow its route's latest
/// phase change before it is refused (longer than a dead follower takes to
/// be taken for gone, `cutover::follow::EXPIRY`).
pub const FOLLOW_WAIT: Duration = Duration::from_secs(8);

/// Why a push was refused after [`FOLLOW_WAIT`]; nothing was stored.
pub const NOT_FOLLOWED: &str = "not every process routing this route's pushes has followed its \
     latest phase change yet; nothing was stored, push again";

/// The pushes a process routed and has not written yet, by generation,
/// and the signal a change of the followed revisions gives.
#[derive(Debug, Default)]
pub struct Routed {
    generation: AtomicU64,
    pending: [AtomicUsize; 2],
    /// Woken when a route's followed revision moves.
    pub(super) followed: Notify,
}

/// One routed push, counted until it is dropped: hold it until the push's
/// mirror copy is written or parked, or its live store answered.
#[derive(Debug)]
pub struct RoutedPush {
    routed: Arc<Routed>,
    slot: usize,
}

impl Clone for RoutedPush {
    /// Another count in the same generation (held while the original is,
    /// so that generation cannot have drained).
    fn clone(&self) -> RoutedPush {
        self.routed.pending[self.slot].fetch_add(1, Ordering::SeqCst);
        RoutedPush {
            routed: Arc::clone(&self.routed),
            slot: self.slot,
        }
    }
}

impl Drop for RoutedPush {
    fn drop(&mut self) {
        self.routed.pending[self.slot].fetch_sub(1, Ordering::SeqCst);
    }
}

/// The generation a barrier closed: drained once its pushes are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Barrier {
    slot: usize,
}

impl Routed {
    /// Counts one push in the current generation. A push counted just as
    /// the generation moves counts again in the new one, so a barrier never
    /// misses a push counted before it.
    pub fn push(self: &Arc<Self>) -> RoutedPush {
        loop {
            let generation = self.generation.load(Ordering::SeqCst);
            let slot = (generation % 2) as usize;
            self.pending[slot].fetch_add(1, Ordering::SeqCst);
            if self.generation.load(Ordering::SeqCst) == generation {
                return RoutedPush {
                    routed: Arc::clone(self),
                    slot,
                };
            }
            self.pending[slot].fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Starts a new generation; the returned barrier is drained once every
    /// push counted before is written. Only one barrier may be open at a
    /// time (the next one reuses the drained generation's count).
    pub fn barrier(&self) -> Barrier {
        let closed = self.generation.fetch_add(1, Ordering::SeqCst);
        Barrier {
            slot: (closed % 2) as usize,
        }
    }

    /// Whether every push counted before `barrier` is written.
    pub fn drained(&self, barrier: Barrier) -> bool {
        self.pending(barrier) == 0
    }

    /// How many pushes counted before `barrier` are not written yet.
    pub fn pending(&self, barrier: Barrier) -> usize {
        self.pending[barrier.slot].load(Ordering::SeqCst)
    }

    /// Waits up to `most` for `barrier` to drain.
    pub async fn drain(&self, barrier: Barrier, most: Duration) -> bool {
        let until = tokio::time::Instant::now() + most;
        while !self.drained(barrier) {
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_barrier_waits_for_the_pushes_counted_before_it_only() {
        let routed = Arc::new(Routed::default());
        let before = routed.push();
        let barrier = routed.barrier();
        let after = routed.push();
        assert!(!routed.drained(barrier));
        drop(before);
        assert!(routed.drained(barrier), "a later push is not waited for");
        drop(after);
        let next = routed.barrier();
        assert!(routed.drained(next));
    }
}
