//! How the mirror's writers gather batches. They take turns: one writer at
//! a time waits for requests and gathers a batch while the others write
//! theirs. A batch that is not full waits for the linger and, after it,
//! for the other writers' commits to end (at most [`COMMIT_WAIT`] lingers),
//! so when pushes come one at a time one commit is in flight and the next
//! batch fills meanwhile; full batches start at once, in parallel. Two
//! small commits at once cost Postgres two backends' wake-ups on the cores
//! the proxy's clients need: one writer gave 0.69–0.75 of the splice at
//! depth 1 against two writers' 0.59–0.65, but two sustain more at depth
//! 16. Taking turns keeps both.
//!
//! Waiting for the first request is cancel-safe ([`Gatherer::first`]): the
//! writer's loop gives it up to retry what it parked. Filling the batch is
//! not, and must run to its end ([`Gatherer::fill`]): a batch given up
//! halfway lost the requests it held.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard, Notify};

use super::order::{Order, Ticket};
use super::request::Request;

/// How long a batch that is not full waits, after its linger, for the
/// other writers' commits to end, in lingers: a commit stuck behind a lock
/// (up to the writers' `lock_timeout`) must not hold this batch as long.
const COMMIT_WAIT: u32 = 10;

/// Shared by a mirror's writers: whose turn it is to gather, and how many
/// are writing.
#[derive(Default)]
pub(super) struct Turns {
    gather: Mutex<()>,
    writing: AtomicUsize,
    written: Notify,
}

impl Turns {
    /// Marks a write in progress until the returned guard is dropped.
    pub(super) fn writing(&self) -> Writing<'_> {
        self.writing.fetch_add(1, Ordering::SeqCst);
        Writing(self)
    }

    fn anyone_writing(&self) -> bool {
        self.writing.load(Ordering::SeqCst) > 0
    }
}

/// A write in progress ([`Turns::writing`]).
pub(super) struct Writing<'a>(&'a Turns);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.writing.fetch_sub(1, Ordering::SeqCst);
        self.0.written.notify_waiters();
    }
}

/// One writer's side of the queue.
pub(super) struct Gatherer {
    pub(super) rx: async_channel::Receiver<Request>,
    /// Notified when a live store is queued: nobody lingers over it.
    pub(super) urgent: Arc<Notify>,
    pub(super) turns: Arc<Turns>,
    pub(super) order: Arc<Order>,
    pub(super) linger: Duration,
    pub(super) batch_items: usize,
}

/// This writer's turn to gather, and the request that started its batch.
pub(super) struct Turn<'a> {
    _gathering: MutexGuard<'a, ()>,
    first: Request,
}

impl Gatherer {
    /// Waits for this writer's turn, then for one request; `None` once the
    /// queue is closed and empty. Cancel-safe: given up before it returns,
    /// it has taken nothing.
    pub(super) async fn first(&self) -> Option<Turn<'_>> {
        let gathering = self.turns.gather.lock().await;
        let first = self.rx.recv().await.ok()?;
        Some(Turn {
            _gathering: gathering,
            first,
        })
    }

    /// Takes whatever else is queued, up to the batch size, and gives the
    /// batch its place in gather order (`super::order`) before the next
    /// writer may gather. A batch of mirror copies that is not full waits up
    /// to the linger for more, then while another writer is writing (see
    /// the module docs); a live store queued meanwhile ends the wait at
    /// once. Not cancel-safe.
    pub(super) async fn fill(&self, turn: Turn<'_>) -> (Vec<Request>, Ticket) {
        let Turn { _gathering, first } = turn;
        let batch = self.fill_from(first).await;
        let ticket = self.order.gathered(&batch);
        drop(_gathering);
        (batch, ticket)
    }

    async fn fill_from(&self, first: Request) -> Vec<Request> {
        let until = tokio::time::Instant::now() + self.linger;
        let mut count = first.items.len();
        let mut batch = vec![first];
        // Registered before the queue is read, so a live store queued after
        // that read cannot slip past this writer's wait unnoticed.
        let urgent = self.urgent.notified();
        let mut urgent = std::pin::pin!(urgent);
        urgent.as_mut().enable();
        self.take_queued(&mut batch, &mut count);
        if !self.lingers(&batch, count) {
            return batch;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {}
            _ = urgent.as_mut() => {
                self.take_queued(&mut batch, &mut count);
                return batch;
            }
        }
        self.take_queued(&mut batch, &mut count);
        let give_up = until + self.linger * COMMIT_WAIT;
        while self.lingers(&batch, count) {
            let written = self.turns.written.notified();
            let mut written = std::pin::pin!(written);
            written.as_mut().enable();
            if !self.turns.anyone_writing() {
                break;
            }
            tokio::select! {
                _ = written => break,
                _ = urgent.as_mut() => break,
                _ = tokio::time::sleep_until(give_up) => break,
                request = self.rx.recv() => match request {
                    Ok(request) => {
                        count += request.items.len();
                        batch.push(request);
                    }
                    Err(_) => break,
                },
            }
        }
        self.take_queued(&mut batch, &mut count);
        batch
    }

    /// Moves what is queued now into `batch`, up to the batch size.
    fn take_queued(&self, batch: &mut Vec<Request>, count: &mut usize) {
        while *count < self.batch_items {
            match self.rx.try_recv() {
                Ok(request) => {
                    *count += request.items.len();
                    batch.push(request);
                }
                Err(_) => break,
            }
        }
    }

    /// Whether a batch waits for more: only mirror copies (nobody waits for
    /// their commit), and room left.
    fn lingers(&self, batch: &[Request], count: usize) -> bool {
        !self.linger.is_zero()
            && count < self.batch_items
            && batch.iter().all(|r| r.reply.is_none())
    }
}
