//! Claims after a wake-up finds the queue empty.
//!
//! Wake-ups are coalesced in the database (migration 0020): of the
//! transactions of one queue committing at the same moment, only one sends
//! the hint, and the others' jobs become visible while their commits finish,
//! possibly just after the woken claim looked. So a claimer woken up (by a
//! hint, by another claimer passing one on, or by the listener after a
//! reconnect) claims again shortly after an empty-looking claim, three
//! times, before it falls back to the poll interval. A lone enqueue on an
//! idle queue costs each woken claimer three empty claims more; in exchange a
//! job whose hint went to a neighbour waits for the poll only when that
//! neighbour's commit finished more than about 250 ms after the hint's.

use std::time::Duration;

use tokio::time::Instant;

/// Delays of the claims that follow a wake-up, each from the moment
/// the claimer goes back to sleep (so at about 5, 50 and 250 ms): a
/// neighbour's commit lands within a WAL flush or two of the hint's; the
/// later ones cover a slow flush on a loaded server. Three empty claims of
/// an index cost the database well under a millisecond.
pub const FOLLOW_UPS: &[Duration] = &[
    Duration::from_millis(5),
    Duration::from_millis(45),
    Duration::from_millis(200),
];

/// Where one claimer stands in the follow-ups of its latest wake-up.
#[derive(Debug, Default)]
pub struct FollowUps {
    /// The next follow-up to take (an index into [`FOLLOW_UPS`]); `None`
    /// when nothing woke the claimer since its last poll-length sleep.
    next: Option<usize>,
}

impl FollowUps {
    /// A wake-up woke the claimer: its next empty claims are followed up again.
    pub fn woken(&mut self) {
        self.next = Some(0);
    }

    /// When a claimer whose queue looked empty at `now` claims next: at the
    /// next follow-up of its latest wake-up, or at `next_poll`, whichever is first.
    pub fn wake_at(&mut self, now: Instant, next_poll: Instant) -> Instant {
        match self.next {
            Some(i) if i < FOLLOW_UPS.len() => {
                self.next = Some(i + 1);
                (now + FOLLOW_UPS[i]).min(next_poll)
            }
            _ => {
                self.next = None;
                next_poll
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Now, a poll one second away, and a claimer nothing has woken yet.
    fn start() -> (Instant, Instant, FollowUps) {
        let now = Instant::now();
        (now, now + Duration::from_secs(1), FollowUps::default())
    }

    #[test]
    fn without_a_wake_up_the_claimer_sleeps_until_the_poll() {
        let (now, poll, mut f) = start();
        assert_eq!(f.wake_at(now, poll), poll);
    }

    #[test]
    fn a_wake_up_is_followed_by_each_follow_up_then_the_poll() {
        let (now, poll, mut f) = start();
        f.woken();
        for delay in FOLLOW_UPS {
            assert_eq!(f.wake_at(now, poll), now + *delay);
        }
        assert_eq!(f.wake_at(now, poll), poll);
        assert_eq!(f.wake_at(now, poll), poll);
    }

    #[test]
    fn a_new_wake_up_restarts_the_follow_ups() {
        let (now, poll, mut f) = start();
        f.woken();
        f.wake_at(now, poll);
        f.woken();
        assert_eq!(f.wake_at(now, poll), now + FOLLOW_UPS[0]);
    }

    #[test]
    fn a_follow_up_never_waits_past_the_poll() {
        let (now, _, mut f) = start();
        let poll = now + Duration::from_millis(2);
        f.woken();
        assert_eq!(f.wake_at(now, poll), poll);
    }
}
