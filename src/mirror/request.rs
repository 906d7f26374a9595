//! One request to the mirror's writers: one push's items (or one live
//! store), with what a writer needs to store them and to answer. Queued by
//! `super::writer::Mirror`, gathered into batches by `super::gather`.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::options::StoreError;
use crate::ingest::{Stored, Via};
use crate::model::following::RoutedPush;
use crate::queue::JobCopy;
use crate::routes::Route;

/// A push's items on their way to Postgres.
pub(super) struct Request {
    pub(super) route: Arc<Route>,
    pub(super) items: Vec<Bytes>,
    pub(super) copy: JobCopy,
    pub(super) via: Via,
    /// When Redis acknowledged the push (mirror lag starts here).
    pub(super) acked_at: Instant,
    /// Which Redis server acknowledged it (its `run_id`), when known.
    pub(super) acked_by: Option<Arc<str>>,
    /// Mirror copies recorded in `job_keys` only ([`crate::ingest::Item::ledger_only`]).
    pub(super) ledger_only: bool,
    /// Names this request's writes: item `i` is write `<writes>.<i>`, the
    /// same on every attempt (a retry from the gap list included), so its
    /// content hash is numbered once.
    pub(super) writes: uuid::Uuid,
    pub(super) reply: Option<oneshot::Sender<Result<Vec<Stored>, StoreError>>>,
    /// Returned to the budget when the request is done.
    pub(super) _permit: OwnedSemaphorePermit,
    /// The proxy's count of the push as routed and not yet written
    /// ([`crate::model::following`]), dropped once it is written or parked.
    pub(super) _routed: Option<RoutedPush>,
}
