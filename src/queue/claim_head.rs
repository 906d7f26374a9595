//! Where a claimer's next claim starts its walk of the claim index: at the
//! head of the queue its previous claim found, not at the start of the index.
//!
//! A claimed row's entry stays at the start of `jobs_claim_idx` until vacuum
//! removes it, so a walk from the start steps over every job claimed since
//! the last vacuum; in the steady state at full speed that walk was most of
//! what a claim cost. A walk from the head (`qbridge.ready_ids_from`,
//! migration 0023) starts past them. Claim order stays exact for every job
//! due at or after the head, less [`SLOW_COMMIT_MARGIN`], and for every other
//! priority. A ready job of the head's priority due earlier than that (handed
//! back with its old `run_at`, or enqueued by a transaction that committed
//! long after it took its `run_at`) is found by the next walk from the start,
//! which one of each pool's claimers makes every [`FULL_WALK_EVERY`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use super::job::ClaimedJob;

/// How far before the head's due time a walk from the head starts. An
/// enqueue takes its `run_at` when its transaction starts and is seen only
/// when it commits: a job committed after a later-due one was claimed sits
/// behind the head by as long as its transaction took.
pub const SLOW_COMMIT_MARGIN: Duration = Duration::from_millis(200);

/// The longest a pool goes without walking the claim index from its start
/// (while it claims), and so the longest a ready job behind the head waits
/// for it.
pub const FULL_WALK_EVERY: Duration = Duration::from_millis(250);

/// The first job a claim took, in claim order: where the queue's head was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimHead {
    /// The head's priority (higher is claimed first).
    pub priority: i32,
    /// When the head was due (Postgres's clock, as stored).
    pub run_at: DateTime<Utc>,
}

impl ClaimHead {
    /// The head of `jobs`, given in claim order (the first).
    pub fn of(jobs: &[ClaimedJob]) -> Option<ClaimHead> {
        jobs.first().map(|j| ClaimHead {
            priority: j.priority,
            run_at: j.run_at,
        })
    }

    /// Where a walk from this head starts: its due time less
    /// [`SLOW_COMMIT_MARGIN`].
    pub fn walk_from(&self) -> DateTime<Utc> {
        let margin = chrono::Duration::from_std(SLOW_COMMIT_MARGIN).unwrap_or_default();
        self.run_at - margin
    }
}

/// A worker pool's memory of the head, shared by its claimers, and when one
/// of them walks from the start next. Shared, so a pool makes one walk from
/// the start per [`FULL_WALK_EVERY`], not one per claimer: that walk reads
/// every entry left since the last vacuum, which at full speed is most of
/// the index.
#[derive(Debug, Default)]
pub struct HeadTracker {
    head: Option<ClaimHead>,
    /// When the next walk from the start is due; `None`: now.
    full_walk_due: Option<Instant>,
}

impl HeadTracker {
    /// Where the claim about to be made starts: `None` walks the index from
    /// its start (no head known yet, or a walk from the start is due, which
    /// this claim then makes).
    pub fn start(&mut self, now: Instant) -> Option<ClaimHead> {
        let due = self.full_walk_due.is_none_or(|at| now >= at);
        if due || self.head.is_none() {
            self.full_walk_due = Some(now + FULL_WALK_EVERY);
            return None;
        }
        self.head
    }

    /// What a claim found: its head in claim order, `None` when it took
    /// nothing. An empty claim keeps the head it started from: nothing was
    /// ready past it, so the next claim starts there again. (Walking from
    /// the start after every empty claim cost the steady state most of what
    /// walking from the head saved: claimers that keep up find the queue
    /// empty often.)
    pub fn claimed(&mut self, head: Option<ClaimHead>) {
        if head.is_some() {
            self.head = head;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(priority: i32) -> ClaimHead {
        ClaimHead {
            priority,
            run_at: DateTime::from_timestamp(1_800_000_000, 0).expect("a time"),
        }
    }

    #[test]
    fn the_first_claim_walks_from_the_start_and_the_next_from_its_head() {
        let t0 = Instant::now();
        let mut tracker = HeadTracker::default();
        assert_eq!(tracker.start(t0), None);
        tracker.claimed(Some(head(3)));
        assert_eq!(tracker.start(t0), Some(head(3)));
        tracker.claimed(Some(head(1)));
        assert_eq!(tracker.start(t0 + Duration::from_millis(1)), Some(head(1)));
    }

    #[test]
    fn a_walk_from_the_start_comes_round_every_full_walk_period() {
        let t0 = Instant::now();
        let mut tracker = HeadTracker::default();
        tracker.start(t0);
        tracker.claimed(Some(head(0)));
        let before = t0 + FULL_WALK_EVERY - Duration::from_millis(1);
        assert_eq!(tracker.start(before), Some(head(0)));
        tracker.claimed(Some(head(0)));
        // Claims from the head do not put the full walk off.
        let at = t0 + FULL_WALK_EVERY;
        assert_eq!(tracker.start(at), None);
        tracker.claimed(Some(head(0)));
        assert_eq!(tracker.start(at), Some(head(0)));
    }

    #[test]
    fn of_claimers_sharing_a_tracker_one_walks_from_the_start_per_period() {
        let t0 = Instant::now();
        let mut tracker = HeadTracker::default();
        tracker.start(t0);
        tracker.claimed(Some(head(0)));
        let at = t0 + FULL_WALK_EVERY;
        // The first claimer to start once the period is over walks from
        // the start; the others, before it reports, from the head.
        assert_eq!(tracker.start(at), None);
        assert_eq!(tracker.start(at), Some(head(0)));
        assert_eq!(tracker.start(at + Duration::from_millis(1)), Some(head(0)));
    }

    #[test]
    fn an_empty_claim_keeps_the_head_it_started_from() {
        let t0 = Instant::now();
        let mut tracker = HeadTracker::default();
        tracker.start(t0);
        tracker.claimed(Some(head(0)));
        tracker.start(t0);
        tracker.claimed(None);
        assert_eq!(tracker.start(t0), Some(head(0)));
    }

    #[test]
    fn with_no_head_known_every_claim_walks_from_the_start() {
        let t0 = Instant::now();
        let mut tracker = HeadTracker::default();
        assert_eq!(tracker.start(t0), None);
        tracker.claimed(None);
        assert_eq!(tracker.start(t0), None);
    }

    #[test]
    fn a_walk_from_the_head_starts_the_margin_before_it() {
        let h = head(0);
        assert_eq!(
            (h.run_at - h.walk_from()).to_std().expect("positive"),
            SLOW_COMMIT_MARGIN
        );
    }
}
