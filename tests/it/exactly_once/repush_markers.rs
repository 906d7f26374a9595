//! A push-back of an identical copy stands in for a count, not for a key.
//! Copies of one text no pop has taken are named by count (the oldest
//! numbers no pop took are the missing ones), so every judgement of a text
//! names its missing copies from the same oldest numbers, whichever copy
//! was lost. The marker that keeps a push-back from happening twice must
//! therefore count push-backs of the text, not name a key: keyed by the
//! name, a second loss found on the same server was taken for the first
//! and never pushed back (oracle seed 90000: after a Redis restart, repair
//! on evidence pushed back copies 31–35 of a text; the operator's "lost
//! before the restart" then found one more copy missing, named it 31, and
//! the marker left from the first repair dropped it — the job never ran).
//! The marker therefore names the key's last recorded push-back too, and two
//! repairs of a route never run at once (each reads Redis after the other's
//! push-backs), so one loss is still pushed back once.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use qbridge::config::{Config, Overrides};
use qbridge::model::Phase;
use qbridge::ops::{gates, repair};
use qbridge::redis::connect::connect_redis;
use qbridge::redis::producer::Producer;
use qbridge::routes::{Route, Routes};

use crate::servers::ThrowawayRedis;

const TEXT: &[u8] = b"send the weekly digest";

/// One repair pass of route `route` with the operator's decision that
/// every copy pushed before `before` was lost.
async fn repair_assuming(
    pool: &PgPool,
    conn: &mut ::redis::aio::ConnectionManager,
    route: &Route,
    before: DateTime<Utc>,
) -> repair::RepairReport {
    let since = Utc::now() - chrono::Duration::minutes(5);
    let (_, held) = gates::diff_since(pool, conn, route, Phase::DualWrite, since)
        .await
        .unwrap();
    let assume = repair::Assumption {
        before: Some(before),
        by: "test@ops".into(),
        reason: "Redis was killed without persistence".into(),
        ..repair::Assumption::default()
    };
    let input = repair::RepairInput {
        route,
        phase: Phase::DualWrite,
        since,
        held: &held,
        payload_limit: 1 << 20,
        assume: Some(&assume),
    };
    repair::repair_with(pool, conn, input).await.unwrap()
}

/// Three copies of one text pushed to a throwaway Redis on a route run by
/// an outside fleet (a restart alone is no evidence: only the operator's
/// decisions push back), then Redis restarted without persistence. Returns
/// the server, the route and a time between the second and third push.
async fn three_copies_lost(
    pool: &PgPool,
) -> (ThrowawayRedis, std::sync::Arc<Route>, DateTime<Utc>) {
    let mut server = ThrowawayRedis::start();
    let toml = "[[routes]]\nname = \"r\"\nredis_key = \"jobs\"\nqueue = \"q\"\nformat = \"raw\"\n\
                phase = \"dual_write\"\nredis_side = \"fleet\"\ndiff = { settle = \"0s\" }\n";
    let cfg = Config::from_toml(toml, &Overrides::default()).expect("route config");
    let routes = Routes::from_config(&cfg.routes);
    let route = std::sync::Arc::clone(routes.by_name("r").unwrap());
    let producer = Producer::connect(pool.clone(), Some(&server.url()), routes.clone(), 1 << 20)
        .await
        .expect("producer");
    let text = Bytes::from_static(TEXT);
    let two = producer
        .enqueue("r", vec![text.clone(), text.clone()])
        .await
        .unwrap();
    assert_eq!(two.pushed, 2);
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let between = Utc::now();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert_eq!(producer.enqueue("r", vec![text]).await.unwrap().pushed, 1);
    server.kill();
    server.resume();
    (server, route, between)
}

async fn waiting(conn: &mut ::redis::aio::ConnectionManager) -> i64 {
    ::redis::cmd("LLEN")
        .arg("jobs")
        .query_async(conn)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_second_loss_of_a_text_is_pushed_back_though_its_name_was_used(pool: PgPool) {
    let (server, route, between) = three_copies_lost(&pool).await;
    let mut conn = connect_redis(&server.url()).await.unwrap();
    let first = repair_assuming(&pool, &mut conn, &route, between).await;
    assert_eq!(first.repushed, 2, "the two copies pushed before: {first:?}");
    // The third copy is missing too, and is named like the first of those
    // two (the oldest number no pop took): it must still be pushed back.
    let second = repair_assuming(&pool, &mut conn, &route, Utc::now()).await;
    assert_eq!(
        (second.repushed, second.already_repushed),
        (1, 0),
        "{second:?}"
    );
    assert_eq!(
        waiting(&mut conn).await,
        3,
        "one copy in Redis per copy pushed"
    );
    // And a third pass finds nothing more to push back.
    let third = repair_assuming(&pool, &mut conn, &route, Utc::now()).await;
    assert_eq!(third.repushed, 0, "{third:?}");
}

/// Two repairs started at once (an operator's retry of a slow admin call,
/// the console and the CLI) both read Redis before either pushes back: they
/// must not both push back the same three losses. Before the route's repair
/// lock the marker alone decided, and one named after the last recorded
/// push-back is a new name once the other repair recorded its own.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn two_repairs_at_once_push_a_loss_back_once(pool: PgPool) {
    let (server, route, _) = three_copies_lost(&pool).await;
    let mut a = connect_redis(&server.url()).await.unwrap();
    let mut b = connect_redis(&server.url()).await.unwrap();
    let now = Utc::now();
    let (ra, rb) = tokio::join!(
        repair_assuming(&pool, &mut a, &route, now),
        repair_assuming(&pool, &mut b, &route, now)
    );
    assert_eq!(ra.repushed + rb.repushed, 3, "{ra:?} {rb:?}");
    assert_eq!(
        waiting(&mut a).await,
        3,
        "one copy in Redis per copy pushed"
    );
}
