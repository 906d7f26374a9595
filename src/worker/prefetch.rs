//! Prefetch: a pool claims, beyond its free handlers, about as many jobs as
//! it will start within a short window at its recent start rate, and holds
//! them until a handler is free.
//!
//! Why: a claim and its completion batch cost Postgres about the same whether
//! they carry 16 jobs or 300, so a pool that claims only what its free
//! handlers can take pays per job for every handler it lacks. Split the same
//! handlers over four processes and each claims a quarter as much: the drain
//! fell to half. Sizing the extra by start rate keeps it near zero
//! for slow handlers, where a held job would only wait while another process
//! sits idle, and large for fast ones.
//!
//! A held job is claimed (its lease is heartbeated like a running one) but
//! not started. One that is still waiting after [`HOLD`] is handed back with
//! its attempt refunded, as is everything held at shutdown. A job claimed on
//! its last attempt is never held: if the process died while holding it, the
//! reaper would dead-letter it unrun; it is handed back at once instead, and
//! the pool claims without prefetch for [`LAST_ATTEMPT_PAUSE`] (a queue of
//! `max_attempts = 1` jobs would otherwise hand back most of every claim).
//! (Other held jobs of a killed process are charged the attempt, like the
//! running ones: the lease expired, and nothing says whether they ran.)
//!
//! Times are tokio's, so the hand-back timer and the clock it is checked
//! against are one clock (also under a paused test clock).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::queue::ClaimedJob;

/// Longest a job is held unstarted before it is handed back. Jobs start
/// within about the window when the rate estimate holds; this bounds how long
/// a misjudged one (handlers that suddenly slowed) waits while another
/// process could run it.
pub const HOLD: Duration = Duration::from_secs(1);

/// How long a pool claims only its free handlers after a claim brought jobs
/// on their last attempt beyond them.
pub const LAST_ATTEMPT_PAUSE: Duration = Duration::from_secs(1);

/// How often the start rate is re-estimated.
const RATE_PERIOD: Duration = Duration::from_millis(100);

/// A claimed job waiting for a free handler.
pub struct Held {
    pub job: ClaimedJob,
    /// Cancelled by the heartbeat if the lease is lost while it waits.
    pub cancel: CancellationToken,
    since: Instant,
}

/// One pool's held jobs and its start-rate estimate.
pub struct Prefetch {
    window: Duration,
    /// Jobs started per second, smoothed over periods of [`RATE_PERIOD`].
    rate: f64,
    period_start: Instant,
    started_in_period: u64,
    held: VecDeque<Held>,
    /// No prefetch before this (see [`LAST_ATTEMPT_PAUSE`]).
    paused_until: Option<Instant>,
}

impl Held {
    /// `job`, claimed at `now`, with its heartbeat token.
    pub fn new(job: ClaimedJob, cancel: CancellationToken, now: Instant) -> Held {
        Held {
            job,
            cancel,
            since: now,
        }
    }
}

impl Prefetch {
    /// `window` zero turns prefetch off: claims take only free handlers.
    pub fn new(window: Duration, now: Instant) -> Prefetch {
        Prefetch {
            window,
            rate: 0.0,
            period_start: now,
            started_in_period: 0,
            held: VecDeque::new(),
            paused_until: None,
        }
    }

    /// Counts `n` attempts started now.
    pub fn started(&mut self, n: usize, now: Instant) {
        self.started_in_period += n as u64;
        let elapsed = now.saturating_duration_since(self.period_start);
        if elapsed >= RATE_PERIOD {
            let observed = self.started_in_period as f64 / elapsed.as_secs_f64();
            // Half the weight on the last period: a pool that went idle stops
            // prefetching within a few periods, one that got busy ramps as fast.
            self.rate = 0.5 * self.rate + 0.5 * observed;
            self.period_start = now;
            self.started_in_period = 0;
        }
    }

    /// A claim brought jobs on their last attempt beyond the free handlers:
    /// no prefetch for a while.
    pub fn pause(&mut self, now: Instant) {
        self.paused_until = Some(now + LAST_ATTEMPT_PAUSE);
    }

    /// How many jobs to claim for `free` handlers, at most `batch`. Only
    /// called with nothing held (held jobs are started first).
    pub fn claim_limit(&self, free: usize, batch: i64, now: Instant) -> i64 {
        let paused = self.paused_until.is_some_and(|until| now < until);
        // `as` saturates, and the rate is finite and not negative (counts
        // over at least RATE_PERIOD), so this cannot overflow.
        let extra = if paused {
            0
        } else {
            (self.rate * self.window.as_secs_f64()).ceil() as i64
        };
        let free = free as i64;
        free.saturating_add(extra).min(batch).max(free)
    }

    /// Holds a claimed job the free handlers could not take.
    pub fn hold(&mut self, job: ClaimedJob, cancel: CancellationToken, now: Instant) {
        self.held.push_back(Held::new(job, cancel, now));
    }

    /// The oldest held job, first claimed first started.
    pub fn oldest(&mut self) -> Option<Held> {
        self.held.pop_front()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Puts back jobs a hand-back could not return (the database did not
    /// answer): they are still claimed; they start or are tried again after
    /// another hold.
    pub fn hold_again(&mut self, jobs: Vec<Held>, now: Instant) {
        for mut held in jobs.into_iter().rev() {
            held.since = now;
            self.held.push_front(held);
        }
    }

    /// When the oldest held job is due to be handed back.
    pub fn hand_back_at(&self) -> Option<Instant> {
        self.held.front().map(|h| h.since + HOLD)
    }

    /// The held jobs at the front that have waited [`HOLD`] or longer (after
    /// a failed hand-back the jobs held again are at the front, and the ones
    /// behind them wait for them).
    pub fn expired(&mut self, now: Instant) -> Vec<Held> {
        let mut out = Vec::new();
        while self
            .held
            .front()
            .is_some_and(|h| now.saturating_duration_since(h.since) >= HOLD)
        {
            out.extend(self.held.pop_front());
        }
        out
    }

    /// Everything held (shutdown).
    pub fn take_all(&mut self) -> Vec<Held> {
        self.held.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::JobCopy;

    fn job(id: i64) -> ClaimedJob {
        ClaimedJob {
            id,
            queue: "q".into(),
            kind: None,
            key: None,
            payload: serde_json::Value::Null,
            priority: 0,
            attempts: 1,
            max_attempts: 3,
            lease: 1,
            run_at: chrono::Utc::now(),
            created_at: chrono::Utc::now(),
            lock_key: None,
            tenant: None,
            copy: JobCopy::Live,
        }
    }

    #[test]
    fn claims_only_free_handlers_until_a_start_rate_is_known() {
        let t0 = Instant::now();
        let p = Prefetch::new(Duration::from_millis(20), t0);
        assert_eq!(p.claim_limit(16, 500, t0), 16);
    }

    #[test]
    fn claims_what_the_window_starts_at_the_measured_rate_capped_by_the_batch() {
        let t0 = Instant::now();
        let mut p = Prefetch::new(Duration::from_millis(20), t0);
        // 1,000 starts in 100 ms: 10,000/s, smoothed from 0 to 5,000/s.
        p.started(1_000, t0 + Duration::from_millis(100));
        assert_eq!(p.claim_limit(16, 500, t0), 16 + 100);
        p.started(1_000, t0 + Duration::from_millis(200));
        assert_eq!(p.claim_limit(16, 500, t0), 16 + 150);
        assert_eq!(p.claim_limit(16, 50, t0), 50);
        // The batch never cuts below the free handlers.
        assert_eq!(p.claim_limit(16, 8, t0), 16);
    }

    #[test]
    fn slow_handlers_and_a_zero_window_prefetch_nothing() {
        let t0 = Instant::now();
        let mut slow = Prefetch::new(Duration::from_millis(20), t0);
        slow.started(4, t0 + Duration::from_secs(1)); // 4 jobs/s
        assert_eq!(slow.claim_limit(2, 500, t0), 2 + 1);
        let mut off = Prefetch::new(Duration::ZERO, t0);
        off.started(100_000, t0 + Duration::from_secs(1));
        assert_eq!(off.claim_limit(2, 500, t0), 2);
    }

    #[test]
    fn an_idle_pool_stops_prefetching() {
        let t0 = Instant::now();
        let mut p = Prefetch::new(Duration::from_millis(20), t0);
        p.started(1_000, t0 + Duration::from_millis(100));
        let busy = p.claim_limit(0, 10_000, t0);
        for i in 1..=12 {
            p.started(0, t0 + Duration::from_millis(100 + 100 * i));
        }
        assert!(busy > 50 && p.claim_limit(0, 10_000, t0) <= 1, "{busy}");
    }

    #[test]
    fn held_jobs_start_in_claim_order_and_expire_after_the_hold() {
        let t0 = Instant::now();
        let mut p = Prefetch::new(Duration::from_millis(20), t0);
        p.hold(job(1), CancellationToken::new(), t0);
        p.hold(
            job(2),
            CancellationToken::new(),
            t0 + Duration::from_millis(500),
        );
        p.hold(
            job(3),
            CancellationToken::new(),
            t0 + Duration::from_millis(600),
        );
        assert_eq!(p.hand_back_at(), Some(t0 + HOLD));
        assert!(p.expired(t0 + HOLD - Duration::from_millis(1)).is_empty());
        let gone: Vec<i64> = p.expired(t0 + HOLD).iter().map(|h| h.job.id).collect();
        assert_eq!(gone, vec![1]);
        assert_eq!(p.oldest().map(|h| h.job.id), Some(2));
        let rest: Vec<i64> = p.take_all().iter().map(|h| h.job.id).collect();
        assert_eq!(rest, vec![3]);
        assert!(p.is_empty() && p.hand_back_at().is_none());
    }

    #[test]
    fn the_longest_window_the_config_allows_is_well_within_the_hold() {
        // A window as long as the hold would claim jobs only to hand them back.
        assert!(crate::config::MAX_PREFETCH_WINDOW * 2 <= HOLD);
    }

    #[test]
    fn last_attempts_pause_the_prefetch_for_a_while() {
        let t0 = Instant::now();
        let mut p = Prefetch::new(Duration::from_millis(20), t0);
        p.started(1_000, t0 + Duration::from_millis(100));
        let t1 = t0 + Duration::from_millis(100);
        assert!(p.claim_limit(4, 500, t1) > 4);
        p.pause(t1);
        assert_eq!(p.claim_limit(4, 500, t1 + LAST_ATTEMPT_PAUSE / 2), 4);
        assert!(p.claim_limit(4, 500, t1 + LAST_ATTEMPT_PAUSE) > 4);
    }

    #[test]
    fn an_absurd_rate_or_window_cannot_overflow_the_limit() {
        let t0 = Instant::now();
        let mut p = Prefetch::new(Duration::from_secs(u64::MAX / 4), t0);
        p.started(usize::MAX, t0 + RATE_PERIOD);
        assert_eq!(
            p.claim_limit(usize::MAX / 2, 500, t0),
            (usize::MAX / 2) as i64
        );
        assert_eq!(p.claim_limit(3, 500, t0), 500);
    }

    #[test]
    fn jobs_held_again_wait_another_hold_and_start_first() {
        let t0 = Instant::now();
        let mut p = Prefetch::new(Duration::from_millis(20), t0);
        p.hold(job(1), CancellationToken::new(), t0);
        p.hold(job(2), CancellationToken::new(), t0);
        p.hold(
            job(3),
            CancellationToken::new(),
            t0 + Duration::from_millis(900),
        );
        let later = t0 + HOLD;
        let back = p.expired(later);
        assert_eq!(back.len(), 2);
        p.hold_again(back, later);
        assert!(p.expired(later + Duration::from_millis(999)).is_empty());
        assert_eq!(p.hand_back_at(), Some(later + HOLD));
        assert_eq!(p.oldest().map(|h| h.job.id), Some(1));
    }
}
