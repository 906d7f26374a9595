//! Write ids (`qbridge.numbered_writes`): a content-hash item carries the id
//! of its write, so storing the same write again — gap repair after a
//! failed trim, the proxy's writer keeping what it parked, a retried batch —
//! finds the key it got instead of numbering its text a second time.

use std::collections::HashMap;

use sqlx::PgConnection;

use crate::error::{Error, Result};

/// Keys of writes numbered before.
const WRITTEN_SQL: &str =
    "SELECT write_id, key FROM qbridge.numbered_writes WHERE write_id = ANY($1::text[])";

/// One lock per queue whose writes a store looks up, in one order, held to
/// the end of the transaction. Per queue, not per write id: a batch of
/// thousands of writes took thousands of locks and exhausted the server's
/// lock table ("out of shared memory", seen in the test suite).
const LOCK_SQL: &str = r#"
SELECT count(pg_advisory_xact_lock(hashtextextended('qbridge:writes:' || q, 7483)))
  FROM (SELECT DISTINCT unnest($1::text[]) AS q ORDER BY 1) s
"#;

/// Remembers the key each write got.
const RECORD_SQL: &str = r#"
INSERT INTO qbridge.numbered_writes (write_id, queue, key, side)
SELECT t.*, 'push' FROM unnest($1::text[], $2::text[], $3::text[]) AS t
ON CONFLICT (write_id) DO NOTHING
RETURNING write_id
"#;

/// The keys `writes` (to `queues`) got before, if any. Locks the queues
/// first (until the caller's transaction ends) and reads after the lock, so
/// two writers storing the same writes at once — gap repair and the proxy's
/// writer — take turns: the second reads the keys the first committed.
/// Reading before the first committed, it numbered the items again (oracle
/// seed 100558: phantom numbers that a Redis restart later made "lost").
pub(super) async fn written_before(
    conn: &mut PgConnection,
    writes: &[&str],
    queues: &[&str],
) -> Result<HashMap<String, String>> {
    sqlx::query(LOCK_SQL)
        .bind(queues)
        .execute(&mut *conn)
        .await?;
    let rows: Vec<(String, String)> = sqlx::query_as(WRITTEN_SQL)
        .bind(writes)
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows.into_iter().collect())
}

/// Records the key each write got. A write recorded already means it was
/// numbered twice: an error, so the transaction (and its numbers) rolls
/// back rather than leave a number no push has.
pub(super) async fn record(
    conn: &mut PgConnection,
    writes: &[&str],
    queues: &[&str],
    keys: &[String],
) -> Result<()> {
    if writes.is_empty() {
        return Ok(());
    }
    let recorded: Vec<String> = sqlx::query_scalar(RECORD_SQL)
        .bind(writes)
        .bind(queues)
        .bind(keys)
        .fetch_all(&mut *conn)
        .await?;
    // Distinct ids: one write twice in a batch is one record.
    let distinct: std::collections::HashSet<&str> = writes.iter().copied().collect();
    if recorded.len() < distinct.len() {
        return Err(Error::Refused(format!(
            "{} of {} writes were numbered by another store at the same time; not stored, retried",
            distinct.len() - recorded.len(),
            distinct.len()
        )));
    }
    Ok(())
}
