//! The one LISTEN connection of a process. Notifications are hints: each one
//! wakes the pools serving that queue; the poll loop in every pool still runs.
//! The connection reconnects with backoff, and after any reconnect every pool is
//! woken, since notifications sent while it was down are gone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::queue::NOTIFY_CHANNEL;

/// Queue name → the wake-up handles of the pools serving it.
#[derive(Debug, Default, Clone)]
pub struct Wakers {
    by_queue: HashMap<String, Vec<Arc<Notify>>>,
}

impl Wakers {
    /// Registers a pool's waker for its queues.
    pub fn register(&mut self, queues: &[String], waker: Arc<Notify>) {
        for q in queues {
            self.by_queue
                .entry(q.clone())
                .or_default()
                .push(waker.clone());
        }
    }

    /// Wakes the pools of one queue. `notify_one` keeps a permit when the pool
    /// is busy, so a wake-up during a claim is not lost.
    pub fn wake(&self, queue: &str) {
        if let Some(wakers) = self.by_queue.get(queue) {
            for w in wakers {
                w.notify_one();
            }
        }
    }

    /// Wakes every pool.
    pub fn wake_all(&self) {
        for wakers in self.by_queue.values() {
            for w in wakers {
                w.notify_one();
            }
        }
    }
}

/// Listens until cancelled, reconnecting with backoff.
pub async fn run(database_url: String, wakers: Wakers, token: CancellationToken) {
    let mut backoff = Duration::from_millis(100);
    while !token.is_cancelled() {
        let mut listener = match connect(&database_url).await {
            Ok(l) => l,
            Err(err) => {
                tracing::warn!(error = %err, retry_in_ms = backoff.as_millis() as u64, "LISTEN connection failed");
                metrics::counter!(crate::metrics::LISTENER_RECONNECTS).increment(1);
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        wakers.wake_all();
        loop {
            let next = tokio::select! {
                _ = token.cancelled() => return,
                n = listener.try_recv() => n,
            };
            match next {
                Ok(Some(n)) => wakers.wake(n.payload()),
                Ok(None) => {
                    // Connection lost and re-established: anything sent meanwhile is gone.
                    tracing::warn!("LISTEN connection was lost and re-established");
                    metrics::counter!(crate::metrics::LISTENER_RECONNECTS).increment(1);
                    wakers.wake_all();
                }
                Err(err) => {
                    tracing::warn!(error = %err, "LISTEN connection broke; reconnecting");
                    metrics::counter!(crate::metrics::LISTENER_RECONNECTS).increment(1);
                    break;
                }
            }
        }
    }
}

async fn connect(url: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect(url).await?;
    listener.listen(NOTIFY_CHANNEL).await?;
    Ok(listener)
}
