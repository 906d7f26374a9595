//! The job key ledger's write (`qbridge.job_keys`): every item's key, with
//! its copy, path, flag, push time, due time and (for a mirror copy) bytes;
//! the keys not seen before are the new jobs.

use std::collections::{HashMap, HashSet};

use sqlx::PgConnection;

use super::Item;
use crate::error::Result;
use crate::queue::JobCopy;

const KEYS_SQL: &str = r#"
INSERT INTO qbridge.job_keys (queue, key, copy, via, flagged, pushed_at, due_at, original)
SELECT t.queue, t.key,
       -- A live push of a key Postgres never recorded whose job the Redis
       -- side reported running (pushed before the route was mirrored):
       -- recorded as the mirror copy it would have been, so the push is
       -- judged as a re-push of it (`promote`), not run as a new job.
       CASE WHEN t.copy = 'live' AND EXISTS (
                SELECT 1 FROM qbridge.outcomes o
                 WHERE o.queue = t.queue AND o.key = t.key AND o.side = 'redis'
                   AND o.mode = 'live')
            THEN 'mirror' ELSE t.copy END,
       t.via, t.flagged, t.pushed_at, t.due_at,
       -- No bytes to keep when the Redis side already finished the job.
       CASE WHEN t.original IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM qbridge.outcomes o
                 WHERE o.queue = t.queue AND o.key = t.key AND o.side = 'redis'
                   AND o.outcome IN ('ok', 'dead'))
            THEN t.original END
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[],
              $7::timestamptz[], $8::timestamptz[])
       WITH ORDINALITY AS t(queue, key, copy, via, flagged, original, pushed_at, due_at, ord)
 -- The batch's first item of a key is the one inserted (as `store` claims).
 ORDER BY t.queue, t.key, t.ord
ON CONFLICT (queue, key) DO NOTHING
RETURNING queue, key, copy
"#;

/// Records every key in `job_keys` and returns the ones that were new: not
/// a live item's key recorded as a mirror copy (see `KEYS_SQL`), which is a
/// re-push.
pub(super) async fn known_keys(
    conn: &mut PgConnection,
    items: &[Item<'_>],
    keys: &[String],
    flags: &[Option<&str>],
) -> Result<HashSet<(String, String)>> {
    let rows: Vec<(String, String, String)> = sqlx::query_as(KEYS_SQL)
        .bind(
            items
                .iter()
                .map(|i| i.route.queue.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(keys)
        .bind(items.iter().map(|i| i.copy.as_str()).collect::<Vec<_>>())
        .bind(items.iter().map(|i| i.via.as_str()).collect::<Vec<_>>())
        .bind(flags)
        // A mirror copy's bytes stay until the Redis side reports the job,
        // so `qbridge diff --repair` can push back what Redis lost.
        .bind(
            items
                .iter()
                .map(|i| (i.copy == JobCopy::Mirror).then_some(&i.decoded.original[..]))
                .collect::<Vec<_>>(),
        )
        .bind(items.iter().map(|i| i.pushed_at).collect::<Vec<_>>())
        // When a job scheduled for later is due: the diff's lag counts from
        // then, not from its push.
        .bind(items.iter().map(Item::due_at).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
    // The copy the batch's first item of each key asked for: a row stored
    // as `mirror` for a first item that asked `live` was converted.
    let mut first: HashMap<(&str, &str), JobCopy> = HashMap::new();
    for (item, key) in items.iter().zip(keys) {
        first
            .entry((item.route.queue.as_str(), key.as_str()))
            .or_insert(item.copy);
    }
    Ok(rows
        .into_iter()
        .filter(|(queue, key, copy)| {
            let asked = first.get(&(queue.as_str(), key.as_str()));
            !(copy == JobCopy::Mirror.as_str() && asked == Some(&JobCopy::Live))
        })
        .map(|(queue, key, _)| (queue, key))
        .collect())
}
