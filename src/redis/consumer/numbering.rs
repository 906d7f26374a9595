//! The pop-side numbering of content-hash job keys: the n-th pop of some
//! bytes gets the key the n-th push of them got, so both sides of the
//! comparison name the same job.

use std::time::Duration;

use sqlx::PgPool;

use crate::model::formats::{Decoded, KeySource};
use crate::model::Phase;

const POP_OCCURRENCE_SQL: &str = r#"
INSERT INTO qbridge.key_occurrences (queue, side, hash, n)
VALUES ($1, 'pop', $2, 1)
ON CONFLICT (queue, side, hash) DO UPDATE SET n = key_occurrences.n + 1
RETURNING n
"#;

/// How long numbering a pop may wait for Postgres before the item runs
/// with an unnumbered key: the live run must not wait on the comparison.
const NUMBERING_TIMEOUT: Duration = Duration::from_secs(2);

/// The job key of a freshly popped item. Ids are keys as they are. A
/// content hash gets the next pop occurrence of its hash on the queue
/// (`key_occurrences`, side `pop`), so the n-th pop of some bytes gets the
/// key the n-th push of them got.
///
/// In `redis_only` the push side numbers nothing (nothing is mirrored), so
/// counting pops then would put the two counts out of step for good; the
/// key is then `sha256:<hex>:0`, as it is when Postgres cannot be reached in
/// time. Occurrence 0 is never a push's number, so such an outcome never
/// matches a wrong job.
pub(super) async fn job_key(db: &PgPool, queue: &str, phase: Phase, decoded: &Decoded) -> String {
    let KeySource::ContentHash(hash) = &decoded.key else {
        return decoded.key.with_occurrence(0);
    };
    if phase == Phase::RedisOnly {
        return decoded.key.with_occurrence(0);
    }
    let numbered = sqlx::query_scalar::<_, i64>(POP_OCCURRENCE_SQL)
        .bind(queue)
        .bind(hash)
        .fetch_one(db);
    match tokio::time::timeout(NUMBERING_TIMEOUT, numbered).await {
        Ok(Ok(n)) => decoded.key.with_occurrence(n.max(0) as u64),
        Ok(Err(e)) => {
            tracing::warn!(queue, error = %e, "cannot number a popped item; its outcome gets occurrence 0");
            decoded.key.with_occurrence(0)
        }
        Err(_) => {
            tracing::warn!(
                queue,
                "numbering a popped item timed out; its outcome gets occurrence 0"
            );
            decoded.key.with_occurrence(0)
        }
    }
}
