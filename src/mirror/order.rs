//! The mirror writes a live batch must wait for. A live copy is judged new
//! or a re-push by what `job_keys` holds when it is stored, so a mirror
//! copy of the same key gathered earlier but still being written by
//! another writer (two writers commit at once) would be judged after it:
//! the live copy would run as a new job while Redis runs the original.
//! So every batch holding mirror copies takes a place in gather order, and
//! a batch holding live copies waits until no batch of its routes gathered
//! before it is still being written. Parked copies being written again
//! (`Writer::write_kept`) come before every live batch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::request::Request;
use crate::queue::JobCopy;

/// One mirror write in progress: its ticket's id, its place in gather
/// order, and the routes of its mirror copies (`None`: any route, for
/// parked copies taken before they are read).
type InProgress = (u64, u64, Option<Vec<String>>);

/// The mirror copies a ticket's write holds.
enum Holds {
    Nothing,
    /// Copies of these routes.
    Routes(Vec<String>),
    /// Parked copies, of any route (not yet read when the ticket is taken).
    Any,
}

/// The mirror writes in progress, shared by a mirror's writers.
#[derive(Default)]
pub(super) struct Order {
    next: AtomicU64,
    writing: Mutex<Vec<InProgress>>,
    done: Notify,
}

/// A batch's place; its mirror copies count as in progress until dropped.
pub(super) struct Ticket {
    order: Arc<Order>,
    id: u64,
    pub(super) place: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut writing = self.order.writing.lock().unwrap_or_else(|p| p.into_inner());
        writing.retain(|(id, _, _)| *id != self.id);
        drop(writing);
        self.order.done.notify_waiters();
    }
}

impl Order {
    /// The next place in gather order for `batch` (taken while gathering,
    /// so places follow the order requests were taken from the queue).
    pub(super) fn gathered(self: &Arc<Order>, batch: &[Request]) -> Ticket {
        let place = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let mut routes: Vec<String> = batch
            .iter()
            .filter(|r| r.copy == JobCopy::Mirror)
            .map(|r| r.route.name.clone())
            .collect();
        routes.sort();
        routes.dedup();
        match routes.is_empty() {
            true => self.ticket(place, Holds::Nothing),
            false => self.ticket(place, Holds::Routes(routes)),
        }
    }

    /// Parked copies written again, of any route: before every live batch
    /// (place 0). Taken before the parked copies are, so no live batch
    /// finds them neither parked nor in progress.
    pub(super) fn kept(self: &Arc<Order>) -> Ticket {
        self.ticket(0, Holds::Any)
    }

    /// A ticket at `place` for a write that `holds` mirror copies.
    fn ticket(self: &Arc<Order>, place: u64, holds: Holds) -> Ticket {
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let routes = match holds {
            Holds::Nothing => None,
            Holds::Routes(routes) => Some(Some(routes)),
            Holds::Any => Some(None),
        };
        if let Some(routes) = routes {
            let mut writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
            writing.push((id, place, routes));
        }
        Ticket {
            order: Arc::clone(self),
            id,
            place,
        }
    }

    /// Returns once no mirror write of `routes` placed before `place` is in
    /// progress.
    pub(super) async fn wait_before(&self, place: u64, routes: &[&str]) {
        loop {
            let done = self.done.notified();
            let mut done = std::pin::pin!(done);
            done.as_mut().enable();
            let busy = {
                let writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
                writing.iter().any(|(_, p, rs)| {
                    *p < place
                        && rs
                            .as_ref()
                            .is_none_or(|rs| rs.iter().any(|r| routes.contains(&r.as_str())))
                })
            };
            if !busy {
                return;
            }
            done.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn waiting(order: &Arc<Order>, place: u64, route: &'static str) -> tokio::task::JoinHandle<()> {
        let order = Arc::clone(order);
        tokio::spawn(async move { order.wait_before(place, &[route]).await })
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    #[tokio::test]
    async fn a_live_batch_waits_for_earlier_mirror_writes_of_its_routes_only() {
        let order = Arc::new(Order::default());
        let earlier = order.ticket(1, Holds::Routes(vec!["r".into()]));
        let other_route = order.ticket(2, Holds::Routes(vec!["s".into()]));
        let later = order.ticket(5, Holds::Routes(vec!["r".into()]));
        let live = waiting(&order, 3, "r");
        settle().await;
        assert!(
            !live.is_finished(),
            "an earlier write of its route is in progress"
        );
        drop(other_route);
        settle().await;
        assert!(
            !live.is_finished(),
            "another route's write does not release it"
        );
        drop(earlier);
        tokio::time::timeout(Duration::from_secs(1), live)
            .await
            .expect("released once the earlier write ends")
            .unwrap();
        drop(later);
    }

    #[tokio::test]
    async fn parked_copies_being_written_hold_every_live_batch() {
        let order = Arc::new(Order::default());
        let kept = order.kept();
        let live = waiting(&order, 1, "any");
        settle().await;
        assert!(!live.is_finished());
        drop(kept);
        tokio::time::timeout(Duration::from_secs(1), live)
            .await
            .expect("released once the parked copies are written")
            .unwrap();
    }
}
