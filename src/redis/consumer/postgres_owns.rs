//! Whether Postgres owns a popped item's job: its key is a live copy there
//! (it ran, runs or will run in Postgres). Then the Redis item is a re-push
//! of that job, not a new one, and the consumer drops it unrun.
//!
//! The case (found by the randomized oracle): a key ran live in
//! Postgres during `postgres_only`; after a rollback to `shadow` a client
//! retries its push through the proxy, which forwards it to Redis before the
//! mirror can tell it is a duplicate. Live copies stay live across rollbacks
//! (fixed at enqueue), so "live in `job_keys`" is positive evidence the job
//! is Postgres's. An outside fleet cannot ask; the diff counts such a run as
//! one on both sides.
//!
//! Only id keys are asked: content-hash keys of Redis pops are numbered
//! apart from live copies (`:pg<n>`), so they can never name one.

use std::time::Duration;

use sqlx::PgPool;

use crate::model::formats::{Decoded, KeySource};

/// How long the consumer waits for the answer before it runs the item as
/// it always did (Postgres down must not stop the Redis side).
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

const LIVE_SQL: &str =
    "SELECT EXISTS (SELECT 1 FROM qbridge.job_keys WHERE queue = $1 AND key = $2 AND copy = 'live')";

/// What Postgres said about a popped item's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Postgres holds the key live: do not run the item on Redis.
    Postgres,
    /// Postgres holds no live copy of it (or it is a content hash).
    NotPostgres,
    /// Postgres did not answer in time (the reason). The item runs: acting
    /// on silence would stop the Redis side whenever Postgres is away.
    Unknown(String),
}

/// Asks Postgres whether `key` (the job key of `decoded`) is live there.
pub async fn owner(db: &PgPool, queue: &str, decoded: &Decoded, key: &str) -> Owner {
    if matches!(decoded.key, KeySource::ContentHash(_)) {
        return Owner::NotPostgres;
    }
    let ask = sqlx::query_scalar::<_, bool>(LIVE_SQL)
        .bind(queue)
        .bind(key)
        .fetch_one(db);
    match tokio::time::timeout(ASK_TIMEOUT, ask).await {
        Ok(Ok(true)) => Owner::Postgres,
        Ok(Ok(false)) => Owner::NotPostgres,
        Ok(Err(e)) => Owner::Unknown(e.to_string()),
        Err(_) => Owner::Unknown("timed out".into()),
    }
}
