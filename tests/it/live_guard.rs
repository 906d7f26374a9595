//! The live-key guard's publisher: every key Postgres holds live reaches
//! the route's `qbridge:live:<route>` set, mirror copies never do, a Redis
//! that lost its data is written again in full, and keys past the
//! retention leave the set.

use sqlx::PgPool;

use qbridge::config::Config;
use qbridge::ingest::{self, Item, Via};
use qbridge::model::formats::decode_bytes;
use qbridge::queue::JobCopy;
use qbridge::redis::connect::connect_redis;
use qbridge::redis::keys::RouteKeys;
use qbridge::redis::live_guard::{self, Guard};
use qbridge::routes::Routes;

use crate::servers::ThrowawayRedis;
use crate::support;

async fn store(pool: &PgPool, routes: &Routes, ids: &[String], copy: JobCopy) {
    let route = routes.by_name("g").unwrap();
    let mut tx = pool.begin().await.unwrap();
    let items = ids
        .iter()
        .map(|id| {
            let body = bytes::Bytes::from(format!(r#"{{"id":"{id}"}}"#));
            Item::new(
                route,
                decode_bytes(&route.format, body),
                copy,
                Via::Producer,
            )
        })
        .collect();
    ingest::store(&mut tx, items, support::LIMIT).await.unwrap();
    tx.commit().await.unwrap();
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_guard_holds_every_live_key_and_is_rewritten_after_redis_loses_it(pool: PgPool) {
    let redis = ThrowawayRedis::start();
    let toml =
        "[[routes]]\nname = \"g\"\nredis_key = \"jobs\"\nqueue = \"g\"\nformat = \"json:/id\"\n";
    let config = Config::from_toml(toml, &Default::default()).unwrap();
    let routes = Routes::from_config(&config.routes);
    let route = routes.by_name("g").unwrap().clone();
    let keys = RouteKeys::of(&route);
    let mut conn = connect_redis(&redis.url()).await.unwrap();

    // More live keys than one page, all in one transaction (one seen_at).
    let live: Vec<String> = (0..12_000).map(|i| format!("live-{i}")).collect();
    store(&pool, &routes, &live, JobCopy::Live).await;
    store(&pool, &routes, &["mirror-1".to_string()], JobCopy::Mirror).await;
    let first = live_guard::publish_route(&pool, &mut conn, &route)
        .await
        .unwrap();
    assert!(first.full, "no watermark yet: a full write");
    assert_eq!(first.keys, 12_000);
    let card: i64 = redis::cmd("ZCARD")
        .arg(keys.live())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(card, 12_000);
    assert_eq!(
        live_guard::check(&mut conn, &keys, "live-11999")
            .await
            .unwrap(),
        Guard::Live
    );
    assert_eq!(
        live_guard::check(&mut conn, &keys, "mirror-1")
            .await
            .unwrap(),
        Guard::Absent
    );

    // The next pass tails: only what is new (and the overlap) is written.
    store(&pool, &routes, &["late-1".to_string()], JobCopy::Live).await;
    let tail = live_guard::publish_route(&pool, &mut conn, &route)
        .await
        .unwrap();
    assert!(!tail.full);
    assert_eq!(
        live_guard::check(&mut conn, &keys, "late-1").await.unwrap(),
        Guard::Live
    );

    // Redis loses its data: the guard cannot tell, then is written in full.
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    assert_eq!(
        live_guard::check(&mut conn, &keys, "late-1").await.unwrap(),
        Guard::Unknown
    );
    let again = live_guard::publish_route(&pool, &mut conn, &route)
        .await
        .unwrap();
    assert!(again.full);
    assert_eq!(again.keys, 12_001);

    // A key stored live longer ago than the retention leaves the set.
    sqlx::query(
        "UPDATE qbridge.job_keys SET seen_at = now() - interval '25 hours' WHERE key = 'live-0'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(keys.live_through())
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(keys.live())
        .arg(0)
        .arg("live-0")
        .query_async(&mut conn)
        .await
        .unwrap();
    live_guard::publish_route(&pool, &mut conn, &route)
        .await
        .unwrap();
    assert_eq!(
        live_guard::check(&mut conn, &keys, "live-0").await.unwrap(),
        Guard::Absent
    );
}
