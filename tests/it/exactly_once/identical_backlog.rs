//! Identical items (content-hash keys) that waited in Redis before the route
//! was mirrored. Copies of a text are counted, not named: the n-th pop of it
//! takes the number of its n-th mirrored push. A copy pushed in `redis_only`
//! was never counted, so once qbridge's consumer pops it in `dual_write` it
//! takes the number of a later mirrored push, and the mirror, finding that
//! number already ran, keeps no bytes of the later push. When Redis then
//! restarts without persistence, the later pushes are gone and nothing in
//! Postgres says so: the diff said MATCH and repair found nothing. The
//! backlog is now counted as the route enters `dual_write`.

use std::sync::Arc;

use bytes::Bytes;
use sqlx::PgPool;

use qbridge::model::Phase;
use qbridge::ops::operate;
use qbridge::redis::connect::connect_redis;
use qbridge::redis::producer::Producer;
use qbridge::routes::{Route, Routes};

use super::restart_evidence::pop_and_number;
use crate::servers::ThrowawayRedis;

const TEXT: &[u8] = b"send the weekly digest";

/// Route `r` (raw items) as a process in `phase` sees it.
fn routes_in(phase: &str) -> Routes {
    super::routes_in("raw", phase)
}

/// The route as registered: in `redis_only` until the test advances it.
fn route() -> Arc<Route> {
    routes_in("redis_only").by_name("r").unwrap().clone()
}

async fn push_direct(conn: &mut ::redis::aio::ConnectionManager, copies: usize) {
    for _ in 0..copies {
        let _: i64 = ::redis::cmd("LPUSH")
            .arg("jobs")
            .arg(TEXT)
            .query_async(conn)
            .await
            .unwrap();
    }
}

async fn advance_to_dual_write(pool: &PgPool, conn: &mut ::redis::aio::ConnectionManager) {
    super::force_to(pool, conn, &route(), Phase::DualWrite).await;
}

/// Pushes `copies` of the text through the producer (Redis and the mirror),
/// restarts Redis without persistence, and returns what repair pushed back
/// and what the list then holds.
async fn mirrored_pushes_then_restart(
    pool: &PgPool,
    server: &mut ThrowawayRedis,
    conn: ::redis::aio::ConnectionManager,
    copies: usize,
) -> (usize, i64, String) {
    let route = route();
    let producer = Producer::connect(
        pool.clone(),
        Some(&server.url()),
        routes_in("dual_write"),
        1 << 20,
    )
    .await
    .expect("producer");
    let texts = vec![Bytes::from_static(TEXT); copies];
    assert_eq!(producer.enqueue("r", texts).await.unwrap().pushed, copies);
    let since = chrono::Utc::now() - chrono::Duration::minutes(5);
    let mut conn = conn;
    // Every process with a Redis side observes it each second.
    qbridge::ops::gates::diff_since(pool, &mut conn, &route, Phase::DualWrite, since)
        .await
        .unwrap();
    drop(conn);
    server.kill();
    server.resume();
    let mut conn = connect_redis(&server.url()).await.unwrap();
    let (diff, report) = super::diff_and_repair(pool, &mut conn, &route, since).await;
    let left: i64 = ::redis::cmd("LLEN")
        .arg("jobs")
        .query_async(&mut conn)
        .await
        .unwrap();
    (report.repushed, left, diff.verdict)
}

/// The reproduction: two copies pushed in `redis_only`, the route advanced,
/// both popped (and run) in `dual_write`, two more pushed through the
/// mirror, Redis restarted. Before the fix repair pushed back nothing and
/// the diff said MATCH: two acknowledged pushes were gone without a trace.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn copies_pushed_before_the_mirror_do_not_hide_a_later_loss(pool: PgPool) {
    let mut server = ThrowawayRedis::start();
    let mut conn = connect_redis(&server.url()).await.unwrap();
    operate::state_of(&pool, &route(), "test@ops")
        .await
        .unwrap();
    push_direct(&mut conn, 2).await;
    advance_to_dual_write(&pool, &mut conn).await;
    pop_and_number(&pool, &mut conn, &route(), 0..2, true).await;
    let (repushed, left, verdict) = mirrored_pushes_then_restart(&pool, &mut server, conn, 2).await;
    assert_eq!((repushed, left), (2, 2), "{verdict}");
}

/// The way back in: mirrored in `dual_write`, rolled back to `redis_only`
/// where more copies were pushed unmirrored, advanced again. The count at
/// the second entry takes only the copies Postgres did not count yet (one
/// mirrored copy still waits): counting it again would make a copy no pop
/// can ever take, pushed back after a restart as a third run.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_rollback_below_dual_write_and_back_counts_only_the_new_copies(pool: PgPool) {
    let mut server = ThrowawayRedis::start();
    let mut conn = connect_redis(&server.url()).await.unwrap();
    operate::state_of(&pool, &route(), "test@ops")
        .await
        .unwrap();
    advance_to_dual_write(&pool, &mut conn).await;
    let producer = Producer::connect(
        pool.clone(),
        Some(&server.url()),
        routes_in("dual_write"),
        1 << 20,
    )
    .await
    .expect("producer");
    let one = vec![Bytes::from_static(TEXT)];
    assert_eq!(producer.enqueue("r", one).await.unwrap().pushed, 1);
    operate::rollback(&pool, Some(&mut conn), &route(), &super::FORCED)
        .await
        .expect("rollback");
    push_direct(&mut conn, 2).await;
    advance_to_dual_write(&pool, &mut conn).await;
    pop_and_number(&pool, &mut conn, &route(), 0..3, true).await;
    let (repushed, left, verdict) = mirrored_pushes_then_restart(&pool, &mut server, conn, 2).await;
    assert_eq!((repushed, left), (2, 2), "{verdict}");
}

/// A copy qbridge's consumer had popped but not numbered yet when the route
/// entered `dual_write` (it waits in a processing list, its pop id stored):
/// Redis still holds it and its pop will take a number, so the count takes
/// it too. Counting the list alone, its pop later took the number of a
/// mirrored push, and that push's loss in a restart went unseen (the oracle
/// found it once its walks started in `redis_only` under load).
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_copy_popped_but_not_yet_numbered_is_counted(pool: PgPool) {
    let mut server = ThrowawayRedis::start();
    let mut conn = connect_redis(&server.url()).await.unwrap();
    operate::state_of(&pool, &route(), "test@ops")
        .await
        .unwrap();
    push_direct(&mut conn, 2).await;
    let consumer = qbridge::redis::keys::RouteKeys::of(&route()).consumer("w1");
    let _: i64 = ::redis::cmd("LPUSH")
        .arg(consumer.processing(0))
        .arg(TEXT)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: i64 = ::redis::cmd("HSET")
        .arg(consumer.inflight(0))
        .arg("pop")
        .arg("p-unnumbered")
        .query_async(&mut conn)
        .await
        .unwrap();
    advance_to_dual_write(&pool, &mut conn).await;
    // The consumer numbers the pop it held, then pops the list's two.
    let decoded = qbridge::model::formats::decode_bytes(&route().format, Bytes::from_static(TEXT));
    let held = qbridge::redis::consumer::numbering::pop_key(
        &pool,
        "q",
        Phase::DualWrite,
        &decoded,
        "p-unnumbered",
    )
    .await;
    let qbridge::redis::consumer::numbering::PopKey::Numbered(key) = held else {
        panic!("{held:?}")
    };
    sqlx::query(
        "INSERT INTO qbridge.outcomes (queue, key, side, mode, outcome) \
         VALUES ('q', $1, 'redis', 'live', 'ok')",
    )
    .bind(&key)
    .execute(&pool)
    .await
    .unwrap();
    let _: i64 = ::redis::cmd("DEL")
        .arg(consumer.processing(0))
        .arg(consumer.inflight(0))
        .query_async(&mut conn)
        .await
        .unwrap();
    pop_and_number(&pool, &mut conn, &route(), 0..2, true).await;
    let (repushed, left, verdict) = mirrored_pushes_then_restart(&pool, &mut server, conn, 2).await;
    assert_eq!((repushed, left), (2, 2), "{verdict}");
}
