//! The attempts a job already used on the Redis side, recorded on its
//! waiting row when it is carried or mirrored from a framework's retry set.

use crate::error::Result;

/// A job from a framework's retry set has used attempts on the Redis side
/// (`formats::attempts_so_far`, by job key): its waiting row starts from
/// them, so the route's `max_attempts` bounds the whole job, not the
/// Postgres part.
pub async fn record_attempts(
    conn: &mut sqlx::PgConnection,
    queue: &str,
    used: &[(String, i32)],
) -> Result<()> {
    if used.is_empty() {
        return Ok(());
    }
    // Rows locked in key order, as everything that writes jobs does, so two
    // batches with the same keys in another order cannot deadlock.
    sqlx::query(
        "WITH t AS (SELECT key, max(n) AS n FROM unnest($2::text[], $3::int4[]) AS u(key, n) \
                     GROUP BY key), \
              locked AS (SELECT j.id, t.n FROM qbridge.jobs j JOIN t ON j.key = t.key \
                          WHERE j.queue = $1 AND j.state = 'ready' AND j.attempts < t.n \
                          ORDER BY j.key FOR UPDATE OF j) \
         UPDATE qbridge.jobs j SET attempts = l.n FROM locked l WHERE j.id = l.id",
    )
    .bind(queue)
    .bind(used.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>())
    .bind(used.iter().map(|(_, n)| *n).collect::<Vec<_>>())
    .execute(conn)
    .await?;
    Ok(())
}
