//! The Postgres queue core: enqueue, claim, fenced heartbeat/complete/retry/
//! dead-letter, the batched completer, the reaper, dead-letter tools, lock keys,
//! recurring schedules, history retention and the wake-up listener.
//!
//! Knows nothing about Redis. Every value is bound as a parameter; no SQL here is
//! ever built from a caller's value.

pub mod backoff;
pub mod claim;
pub mod claim_head;
pub mod completer;
pub mod dlq;
pub mod enqueue;
pub mod fence;
pub mod history;
pub mod job;
pub mod leader;
pub mod listener;
pub mod lock_keys;
pub mod reaper;
pub mod schedule;
pub mod stats;
pub mod tenants;
pub mod validate;

pub use claim::{claim, ClaimRequest, TenantCap};
pub use enqueue::{enqueue, enqueue_many, EnqueueOutcome};
pub use fence::{complete, dead_letter, heartbeat, release, retry, FenceResult};
pub use job::{ClaimedJob, JobCopy, JobRef, NewJob};

/// The NOTIFY channel that enqueue (via trigger) and the reaper signal on.
pub const NOTIFY_CHANNEL: &str = "qbridge_jobs";

/// The sqlx migrator for the `qbridge` schema (embedded at compile time).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");
