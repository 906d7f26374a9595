//! The proxy's Postgres writer: pushed items are queued here and written in
//! group-commit transactions, so thousands of concurrent one-item pushes cost
//! a few transactions, not thousands.
//!
//! Two kinds of request share the writers (a third, [`Mirror::mirror_due`],
//! writes members of a framework's schedule and retry sets beside them:
//! `due`):
//! - [`Mirror::mirror`] — `dual_write`/`shadow`: Redis already took the item,
//!   the client already has its reply; the item becomes a mirror copy. If
//!   Postgres is down the items are parked in the route's Redis gap list
//!   ([`spool`]) and written when it is back ([`repair_gaps_once`]); the
//!   Redis push is never failed for it.
//! - [`Mirror::store_live`] — `postgres_only`/`decommissioned`: Postgres is
//!   the only copy, so the caller waits for the commit and learns of failure
//!   ([`StoreError`]).
//!
//! Memory is bounded by `buffer_bytes` of queued items: a request waits for
//! room (the proxy then stops reading from that client) instead of growing
//! the queue. Nothing here logs an item.
//!
//! Layout: [`writer`] (the handle and the group-commit writers), `batch`
//! (one batch's decode and store, in one transaction), `options`
//! (their tuning and errors), `due` (copies due later), [`breaker`]
//! (writers skip Postgres for a moment after finding it down), [`spool`]
//! (parking items in the gap list), `retained` (the writers' own copy of
//! what they parked, written once Postgres is back even if Redis lost the
//! gap list), [`gap_repair`] (writing the gap list once Postgres is back).

mod batch;
mod breaker;
mod due;
mod gap_repair;
mod gather;
mod options;
mod order;
mod release;
mod request;
mod retained;
mod spool;
mod writer;

pub use gap_repair::{gap_repair_pass, repair_gaps_once};
pub use options::{MirrorClosed, MirrorOptions, StoreError};
pub use writer::{LagProbe, Mirror};
