//! Recording that Redis let go of a job scheduled while it owned the route
//! (`qbridge.redis_releases`, written by the proxy: `proxy::set_pop`), and
//! using that evidence up when the job's re-push is promoted
//! ([`super::promote`], [`super::held`]).
//!
//! A release counts for ten minutes only: the push it explains follows the
//! pop at once (the framework moves the job on), so an old row explains
//! nothing and must not let a later, unrelated re-push of the key run.

use sqlx::{PgConnection, PgPool};

use crate::error::Result;

/// Whether `(t.queue, t.key)` has a fresh release: a column of the
/// evidence reads (a macro, so `concat!` can put it into their SQL; the same
/// ten minutes as [`PRUNE_SQL`]).
macro_rules! released_sql {
    () => {
        "EXISTS (SELECT 1 FROM qbridge.redis_releases r WHERE r.queue = t.queue \
         AND r.key = t.key AND r.released_at > now() - interval '10 minutes')"
    };
}
pub(crate) use released_sql;

/// Rows too old to explain a re-push.
const PRUNE_SQL: &str =
    "DELETE FROM qbridge.redis_releases WHERE released_at < now() - interval '10 minutes'";

/// Records releases `(queue, key, structure)`; drops rows too old to count.
pub async fn record(pool: &PgPool, rows: &[(String, String, String)]) -> Result<()> {
    // One row per key: ON CONFLICT cannot touch a row twice in a statement.
    let rows: std::collections::BTreeMap<(&str, &str), &str> = rows
        .iter()
        .map(|(q, k, s)| ((q.as_str(), k.as_str()), s.as_str()))
        .collect();
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO qbridge.redis_releases (queue, key, structure) \
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) \
         ON CONFLICT (queue, key) DO UPDATE \
            SET structure = excluded.structure, released_at = now()",
    )
    .bind(rows.keys().map(|k| k.0).collect::<Vec<_>>())
    .bind(rows.keys().map(|k| k.1).collect::<Vec<_>>())
    .bind(rows.values().copied().collect::<Vec<_>>())
    .execute(&mut *tx)
    .await?;
    sqlx::query(PRUNE_SQL).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(())
}

/// Uses up the releases of `(queues[i], keys[i])` (their re-push was promoted).
pub(crate) async fn use_up(conn: &mut PgConnection, queues: &[&str], keys: &[&str]) -> Result<()> {
    sqlx::query(
        "DELETE FROM qbridge.redis_releases r USING unnest($1::text[], $2::text[]) AS t(queue, key) \
          WHERE r.queue = t.queue AND r.key = t.key",
    )
    .bind(queues)
    .bind(keys)
    .execute(&mut *conn)
    .await?;
    Ok(())
}
