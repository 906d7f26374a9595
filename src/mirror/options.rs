//! The mirror's tuning, its errors, and the due copies' writer handle
//! (`super::due` writes with it).

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::Semaphore;

/// Tuning of the writers; see `[proxy]` in the config.
#[derive(Debug, Clone, Copy)]
pub struct MirrorOptions {
    /// Bytes of items queued at most.
    pub buffer_bytes: usize,
    /// Items per transaction at most.
    pub batch_items: usize,
    /// Transactions in flight at once.
    pub writers: usize,
    /// How long a writer holding fewer than `batch_items` mirror copies
    /// waits for more before it writes. Fewer, fuller transactions cost
    /// Postgres less per item and wake it less often, which is what the
    /// proxy's clients feel on a small machine; the wait adds to mirror lag
    /// only. Live stores (a client waits for their commit) never wait.
    pub linger: Duration,
    /// The queue's payload limit (larger items are stored flagged).
    pub payload_limit: usize,
}

/// Why a live store failed. Its text is one line, safe to send to a Redis
/// client (the proxy answers `-ERR qbridge: <it>` so the producer retries).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The writers have stopped (shutdown).
    #[error(transparent)]
    Closed(#[from] MirrorClosed),
    /// The transaction failed; the reason is the database error's one line.
    #[error("Postgres write failed: {0}")]
    Failed(String),
    /// Mirror copies of the route pushed before this one are not written
    /// yet (the reason): storing it now could take a re-push for a new job.
    #[error("not stored yet: {0}; retry")]
    NotYet(String),
}

/// The writers are gone (shutdown): nothing more can be queued.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("qbridge is shutting down: the mirror writer has stopped")]
pub struct MirrorClosed;

/// Transactions of due copies in flight at once.
const IN_FLIGHT: usize = 4;

/// The due copies' own writer: the pool, room for [`IN_FLIGHT`], and the
/// Redis connection RQ's job hashes are read on.
#[derive(Clone)]
pub(crate) struct DueWriter {
    pub(super) pool: PgPool,
    pub(super) room: Arc<Semaphore>,
    pub(super) payload_limit: usize,
    pub(super) redis: Option<redis::aio::ConnectionManager>,
}

impl DueWriter {
    pub(super) fn new(
        pool: PgPool,
        redis: Option<redis::aio::ConnectionManager>,
        opts: MirrorOptions,
    ) -> DueWriter {
        DueWriter {
            pool,
            room: Arc::new(Semaphore::new(IN_FLIGHT)),
            payload_limit: opts.payload_limit,
            redis,
        }
    }
}
