//! Keeps the item a handler is running recorded in Redis, across a restart
//! of Redis that lost it.
//!
//! While a handler runs, its item sits in the slot's processing list, its
//! state in the inflight hash and its claim in the route's running hash.
//! A Redis restart without persistence takes all three while the handler
//! goes on: repair would then find the job's mirror copy in no list, take
//! the restart as evidence of a loss and push the job back, and a second
//! item of it would find no claim and run beside the first. So beside the
//! handler, the keeper asks the server once a beat which it is; when it is
//! another server than the one the item was popped from and the item is
//! not in its processing list, it writes the item, its inflight state and
//! its claim into the new server as they were. Evidence only: a server it
//! cannot name, or the item still there, changes nothing.
//!
//! Once the handler ends the slot acks as usual; the ack on the old
//! connection fails, the slot reconnects, finds the kept item in its list
//! and only finishes it, without running it again (`finish.rs`'s
//! `Unacked`).

use std::convert::Infallible;

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, RedisResult, Script};

use super::super::{heartbeat, Ctx};

/// Writes a running item back into a server that lost it, unless its
/// processing list still holds it. KEYS: processing, inflight, running.
/// ARGV: item, job key, attempts, then the inflight hash's other fields
/// and values as they were. Returns 1 when it wrote, 0 when the item was
/// there.
const KEEP_LUA: &str = r#"
if redis.call('LPOS', KEYS[1], ARGV[1]) then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
for i = 4, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('HSET', KEYS[2], 'key', ARGV[2], 'attempts', ARGV[3])
if not redis.call('HGET', KEYS[3], ARGV[2]) then redis.call('HSET', KEYS[3], ARGV[2], KEYS[1]) end
return 1
"#;

/// The item a handler runs, and where the slot keeps it.
pub(in crate::redis::consumer) struct Running<'a> {
    pub processing: &'a str,
    pub inflight: &'a str,
    pub item: &'a [u8],
    pub key: &'a str,
    /// The attempt running (already counted in the inflight hash).
    pub attempt: i64,
}

/// Runs beside the handler (never returns; dropped when the handler ends):
/// see the module docs. `server` is the `run_id` the item was popped from;
/// `conn` is the slot's keeper connection, kept for its next item. It
/// first looks after one beat: most handlers are done by then, and open no
/// connection and send nothing.
pub(in crate::redis::consumer) async fn keep(
    ctx: &Ctx,
    server: Option<&str>,
    conn: &mut Option<MultiplexedConnection>,
    running: Running<'_>,
) -> Infallible {
    let Some(server) = server else {
        // No server named: no evidence that another one answers later.
        return std::future::pending().await;
    };
    let mut known = server.to_string();
    let mut state: Option<Vec<(String, String)>> = None;
    loop {
        tokio::time::sleep(heartbeat::EVERY).await;
        if conn.is_none() {
            *conn = connect(ctx).await.ok();
        }
        if let Some(c) = conn.as_mut() {
            match keep_once(c, ctx, (&mut known, &mut state), &running).await {
                Ok(true) => {
                    tracing::info!(route = %ctx.route.name,
                        "redis consumer: Redis restarted while a handler ran; its item is recorded in the new server");
                }
                Ok(false) => {}
                Err(_) => *conn = None,
            }
        }
    }
}

async fn connect(ctx: &Ctx) -> RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(heartbeat::EVERY))
        .set_response_timeout(Some(heartbeat::EVERY));
    ctx.client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// One look: the item's inflight state is read from the server it was
/// popped from (once), and written back when another server answers now.
/// True when it wrote.
async fn keep_once(
    conn: &mut MultiplexedConnection,
    ctx: &Ctx,
    (known, state): (&mut String, &mut Option<Vec<(String, String)>>),
    running: &Running<'_>,
) -> RedisResult<bool> {
    let info: String = ::redis::cmd("INFO").arg("server").query_async(conn).await?;
    let Some(now) = crate::redis::epoch::run_id_of(&info) else {
        return Ok(false);
    };
    if now == known.as_str() {
        if state.is_none() {
            *state = Some(
                ::redis::cmd("HGETALL")
                    .arg(running.inflight)
                    .query_async(conn)
                    .await?,
            );
        }
        return Ok(false);
    }
    // Another server. Without the state read from the first one (the
    // restart came within a beat or two of the run's start) the item's key
    // and attempt count are still known, and are what a recovery needs.
    let fields: Vec<(String, String)> = state
        .iter()
        .flatten()
        .filter(|(f, _)| f != "key" && f != "attempts")
        .cloned()
        .collect();
    let keep = Script::new(KEEP_LUA);
    let mut script = keep.prepare_invoke();
    script
        .key(running.processing)
        .key(running.inflight)
        .key(ctx.route_keys.running())
        .arg(running.item)
        .arg(running.key)
        .arg(running.attempt);
    for (field, value) in &fields {
        script.arg(field).arg(value);
    }
    let wrote: i64 = script.invoke_async(conn).await?;
    *known = now.to_string();
    Ok(wrote == 1)
}
