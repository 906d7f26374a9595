//! A popped item's job key, kept in its slot's inflight hash beside the
//! processing list: the key the hash remembers, else one numbered now
//! ([`super::numbering`]) and stored there, so a recovered item runs under
//! the key it was first given and is never numbered twice.

use ::redis::aio::MultiplexedConnection;
use ::redis::RedisResult;

use super::numbering::{pop_key_from, PopKey};
use super::Ctx;
use crate::model::formats::Decoded;

/// The job key of an item: the one its inflight hash remembers, else a new
/// one stored there (a fresh item also starts at zero attempts). `None` when
/// Postgres could not number it yet: the item stays where it is and is
/// numbered on the next try, never run under a made-up key. `server` is the
/// `run_id` of the Redis server `conn` talks to, when known.
pub(super) async fn item_key(
    ctx: &Ctx,
    conn: &mut MultiplexedConnection,
    server: Option<&str>,
    inflight: &str,
    fresh: bool,
    decoded: &Decoded,
) -> RedisResult<Option<String>> {
    if fresh {
        // Overwrites whatever a hand-edited list left behind; the pop id is
        // stored before numbering, so numbering again finds its number.
        let _: i64 = ::redis::cmd("HSET")
            .arg(inflight)
            .arg("attempts")
            .arg(0)
            .arg("pop")
            .arg(uuid::Uuid::new_v4().simple().to_string())
            .query_async(conn)
            .await?;
        let _: i64 = ::redis::cmd("HDEL")
            .arg(inflight)
            .arg("key")
            .query_async(conn)
            .await?;
    }
    let (known, pop): (Option<String>, Option<String>) = ::redis::cmd("HMGET")
        .arg(inflight)
        .arg("key")
        .arg("pop")
        .query_async(conn)
        .await?;
    if let Some(key) = known {
        return Ok(Some(key));
    }
    let pop = match pop {
        Some(pop) => pop,
        None => {
            // Recovered from an older version's list: give it its pop id now.
            let id = uuid::Uuid::new_v4().simple().to_string();
            let _: bool = ::redis::cmd("HSETNX")
                .arg(inflight)
                .arg("pop")
                .arg(&id)
                .query_async(conn)
                .await?;
            ::redis::cmd("HGET")
                .arg(inflight)
                .arg("pop")
                .query_async(conn)
                .await?
        }
    };
    let key = match pop_key_from(
        &ctx.db,
        &ctx.route.queue,
        ctx.phase(),
        decoded,
        &pop,
        server,
    )
    .await
    {
        PopKey::Numbered(key) | PopKey::Unmirrored(key) => key,
        PopKey::Retry(reason) => {
            tracing::warn!(route = %ctx.route.name, error = %reason,
                "cannot number a popped item yet; it waits in its processing list");
            return Ok(None);
        }
    };
    let _: i64 = ::redis::cmd("HSET")
        .arg(inflight)
        .arg("key")
        .arg(&key)
        .query_async(conn)
        .await?;
    Ok(Some(key))
}
