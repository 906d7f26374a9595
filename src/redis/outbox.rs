//! The outbox of Redis pushes the producer API owes: rows written with the
//! job in the caller's transaction, deleted once Redis took the item.
//!
//! Paying is fenced by row locks. [`pay`] deletes its rows in a transaction,
//! pushes, then commits; the repair loop ([`repair_once`]) takes only rows
//! older than a grace period with `SKIP LOCKED`. So a row is pushed by one of
//! them at a time. The push itself is idempotent: a Lua script pushes an
//! item only if it can first set the marker `qbridge:paid:<row token>`
//! (kept 7 days), so when the push happened but its reply was lost (a
//! timeout, a crash before the commit) the row is paid again without a
//! second copy in Redis.

use std::time::Duration;

use ::redis::aio::ConnectionManager;
use ::redis::AsyncCommands;
use bytes::Bytes;
use sqlx::{PgConnection, PgPool};

use crate::config::PushEnd;
use crate::error::Result;
use crate::metrics as m;
use crate::model::Phase;
use crate::routes::{Route, Routes};

/// Which of the rows with `tokens` Redis has a paid marker for, in order:
/// their push went through (only the commit deleting the row may have
/// failed), so the job is Redis's.
pub async fn paid_markers(
    conn: &mut ConnectionManager,
    tokens: &[uuid::Uuid],
) -> Result<Vec<bool>> {
    if tokens.is_empty() {
        return Ok(Vec::new());
    }
    let markers: Vec<String> = tokens.iter().map(crate::redis::keys::paid).collect();
    let found: Vec<Option<String>> = ::redis::cmd("MGET").arg(&markers).query_async(conn).await?;
    Ok(found.iter().map(Option::is_some).collect())
}

/// One push owed to Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owed {
    /// The outbox row.
    pub id: i64,
    /// The row's random token: names its paid marker in Redis.
    pub token: uuid::Uuid,
    /// The item, byte for byte.
    pub original: Bytes,
}

/// Records pushes owed for `(key, item)` pairs of `queue`, on the caller's
/// transaction. Returns the rows in input order.
pub async fn owe(
    conn: &mut PgConnection,
    queue: &str,
    items: &[(&str, &Bytes)],
) -> Result<Vec<Owed>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<(i64, uuid::Uuid)> = sqlx::query_as(
        "INSERT INTO qbridge.redis_outbox (queue, key, original) \
         SELECT $1, k, o FROM unnest($2::text[], $3::bytea[]) WITH ORDINALITY AS t(k, o, ord) \
         ORDER BY ord RETURNING id, token",
    )
    .bind(queue)
    .bind(items.iter().map(|(k, _)| *k).collect::<Vec<_>>())
    .bind(items.iter().map(|(_, b)| b.as_ref()).collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;
    let mut rows = rows;
    // Identity values follow insertion order (ORDER BY ord).
    rows.sort_unstable_by_key(|(id, _)| *id);
    Ok(rows
        .into_iter()
        .zip(items)
        .map(|((id, token), (_, b))| Owed {
            id,
            token,
            original: (*b).clone(),
        })
        .collect())
}

/// Pushes items to the route's list at the end its producers use, in order.
pub async fn push_items(
    conn: &mut ConnectionManager,
    route: &Route,
    items: &[&[u8]],
) -> ::redis::RedisResult<()> {
    let key = route.redis_key.as_ref();
    match route.push {
        PushEnd::Lpush => conn.lpush::<_, _, ()>(key, items).await,
        PushEnd::Rpush => conn.rpush::<_, _, ()>(key, items).await,
    }
}

/// How long a paid marker is kept: longer than any outbox row waits.
const PAID_TTL_SECS: u64 = 7 * 86_400;

/// Pushes each item unless its marker says it was pushed already. Returns
/// how many it pushed and the server's `run_id`: which server took them, the
/// evidence if it is gone later (`crate::redis::epoch::record_acks`). Read in
/// the script, so it names the server that ran the pushes, whatever the
/// connection did before or after.
const PUSH_ONCE_LUA: &str = r#"
local pushed = 0
for i = 3, #ARGV, 2 do
  if redis.call('SET', ARGV[i], '1', 'NX', 'EX', tonumber(ARGV[2])) then
    redis.call(ARGV[1], KEYS[1], ARGV[i + 1])
    pushed = pushed + 1
  end
end
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
return {pushed, run}
"#;

/// The idempotent push of outbox rows, in order.
async fn push_once(
    conn: &mut ConnectionManager,
    route: &Route,
    rows: &[&Owed],
) -> ::redis::RedisResult<(i64, String)> {
    let script = ::redis::Script::new(PUSH_ONCE_LUA);
    let mut invocation = script.key(route.redis_key.as_ref());
    invocation.arg(match route.push {
        PushEnd::Lpush => "LPUSH",
        PushEnd::Rpush => "RPUSH",
    });
    invocation.arg(PAID_TTL_SECS);
    for row in rows {
        invocation.arg(crate::redis::keys::paid(&row.token));
        invocation.arg(row.original.as_ref());
    }
    invocation.invoke_async(conn).await
}

/// Pushes `owed` and deletes their rows; the rows some other payer holds or
/// already paid are skipped. Returns how many this call pushed. On a Redis
/// error nothing is deleted and the attempt is recorded on the rows.
pub async fn pay(
    pool: &PgPool,
    conn: &mut ConnectionManager,
    route: &Route,
    owed: &[Owed],
) -> std::result::Result<usize, crate::error::Error> {
    let ids: Vec<i64> = owed.iter().map(|o| o.id).collect();
    let mut tx = pool.begin().await?;
    let mine: Vec<i64> = sqlx::query_scalar(
        "DELETE FROM qbridge.redis_outbox WHERE id IN \
           (SELECT id FROM qbridge.redis_outbox WHERE id = ANY($1) FOR UPDATE SKIP LOCKED) \
         RETURNING id",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    let paying: Vec<&Owed> = owed.iter().filter(|o| mine.contains(&o.id)).collect();
    if paying.is_empty() {
        return Ok(0);
    }
    let run = match push_once(conn, route, &paying).await {
        Ok((_, run)) => run,
        Err(e) => {
            tx.rollback().await?;
            let reason = format!("Redis push failed: {e}");
            let error = crate::error::Error::redis("Redis push failed", e);
            sqlx::query(
            "UPDATE qbridge.redis_outbox SET attempts = attempts + 1, last_error = $2 WHERE id = ANY($1)",
        )
        .bind(&mine)
        .bind(&reason)
        .execute(pool)
        .await?;
            return Err(error);
        }
    };
    crate::redis::epoch::record_acks(&mut tx, &[(&route.name, &run, None)]).await?;
    tx.commit().await?;
    Ok(paying.len())
}

/// Rows per repair pass and route.
const REPAIR_BATCH: i64 = 500;

/// Pays, per route, up to one batch of outbox rows older than `grace` (so a
/// producer still pushing after its commit is not raced). Rows of routes in
/// `decommissioned`, whose Redis keys are gone, are left alone. Returns how
/// many items were pushed.
pub async fn repair_once(
    pool: &PgPool,
    conn: &mut ConnectionManager,
    routes: &Routes,
    grace: Duration,
) -> Result<u64> {
    let mut paid = 0;
    for route in routes.iter() {
        if routes.phase(route) == Phase::Decommissioned {
            continue;
        }
        let rows: Vec<(i64, uuid::Uuid, Vec<u8>)> = sqlx::query_as(
            "SELECT id, token, original FROM qbridge.redis_outbox \
              WHERE queue = $1 AND created_at < now() - $2 * interval '1 millisecond' \
              ORDER BY id LIMIT $3",
        )
        .bind(&route.queue)
        .bind(grace.as_millis() as i64)
        .bind(REPAIR_BATCH)
        .fetch_all(pool)
        .await?;
        if rows.is_empty() {
            continue;
        }
        let owed: Vec<Owed> = rows
            .into_iter()
            .map(|(id, token, original)| Owed {
                id,
                token,
                original: Bytes::from(original),
            })
            .collect();
        let n = pay(pool, conn, route, &owed).await?;
        if n > 0 {
            metrics::counter!(m::OUTBOX_REPAIRED, "route" => route.name.clone())
                .increment(n as u64);
            tracing::info!(route = %route.name, items = n, "pushed items the producer API owed Redis");
        }
        paid += n as u64;
    }
    Ok(paid)
}
