//! The proxy follows a stored phase flip within a second, through the real
//! wiring of `qbridge proxy` (RedisSide: phase watch, mirror writers, proxy):
//! in `dual_write` a push reaches Redis and a mirror copy reaches Postgres;
//! once the route is `postgres_only` the push is answered in place with a live
//! copy in Postgres and the Redis list stops growing; after a rollback to
//! `shadow` pushes reach Redis again.

use std::time::{Duration, Instant};

use ::redis::AsyncCommands;
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use qbridge::app::RedisSide;
use qbridge::config::{Config, Overrides};
use qbridge::cutover::store::{self, Change};
use qbridge::model::Phase;
use qbridge::periodic::Services;

use crate::support;

const REDIS: &str = "redis://127.0.0.1:6379";
/// How soon every process must follow a flip (the watch polls every 500 ms).
const FOLLOW_WITHIN: Duration = Duration::from_secs(1);

fn change<'a>(route: &'a str, from: Phase, to: Phase) -> Change<'a> {
    Change {
        route,
        from,
        to,
        changed_by: "ops@example",
        reason: "proxy flip test",
        forced: false,
        gates: json!({}),
    }
}

/// The copy (`mirror`/`live`) Postgres recorded job `key` as: its ledger
/// row (a push in dual_write is a ledger-only mirror copy, with no jobs row).
async fn copies(db: &PgPool, key: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT copy::text FROM qbridge.job_keys WHERE key = $1")
        .bind(key)
        .fetch_all(db)
        .await
        .unwrap()
}

/// Pushes `{"id": "<prefix><n>"}` through the proxy every 20 ms until `done`
/// says the push was handled the new way (given the Redis list length before
/// and after it and the reply); returns the key of that push and how long
/// it took. Panics after 10 s.
async fn push_until<F>(
    proxy: &mut ::redis::aio::MultiplexedConnection,
    redis: &mut ::redis::aio::MultiplexedConnection,
    list: &str,
    prefix: &str,
    mut done: F,
) -> (String, Duration)
where
    F: FnMut(i64, i64, i64) -> bool,
{
    let started = Instant::now();
    for n in 0.. {
        let key = format!("{prefix}{n}");
        let before: i64 = redis.llen(list).await.unwrap();
        let reply: i64 = proxy
            .lpush(list, format!(r#"{{"id":"{key}"}}"#))
            .await
            .expect("push through the proxy");
        let after: i64 = redis.llen(list).await.unwrap();
        if done(before, after, reply) {
            return (key, started.elapsed());
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the proxy did not follow the flip ({prefix}) in 10s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    unreachable!()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_proxy_follows_a_phase_flip_within_a_second(pool: PgPool) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (route, list) = (format!("px{}", &id[..12]), format!("qbt:{id}:list"));
    let toml = format!(
        "[proxy]\nenabled = true\n\
         [[routes]]\nname = \"{route}\"\nredis_key = \"{list}\"\nqueue = \"{route}\"\n\
         format = \"json:/id\"\nphase = \"dual_write\"\n"
    );
    let overrides = Overrides {
        database_url: Some(support::db_url(&pool)),
        redis_url: Some(REDIS.into()),
        ..Overrides::default()
    };
    let cfg = Config::from_toml(&toml, &overrides).expect("config");
    // The Redis side gets its own pool (the test's is capped at 5).
    let db = support::extra_pool(&pool, 8).await;
    let mut maintenance = Services::new();
    let intake = CancellationToken::new();
    let mut side = RedisSide::start(&cfg, &db, true, &mut maintenance)
        .await
        .expect("redis side");
    let addr = side
        .start_proxy(&cfg, Some("127.0.0.1:0"), intake.clone())
        .await
        .expect("proxy");
    let mut proxy = ::redis::Client::open(format!("redis://{addr}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut redis = ::redis::Client::open(REDIS)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    assert_eq!(
        store::current(&pool, &route).await.unwrap().unwrap().phase,
        Phase::DualWrite
    );

    // dual_write: Redis takes the push (and answers it), Postgres gets a mirror.
    let len: i64 = proxy.lpush(&list, r#"{"id":"dw"}"#).await.unwrap();
    assert_eq!(len, 1);
    assert_eq!(redis.llen::<_, i64>(&list).await.unwrap(), 1);
    support::wait_for("the mirror copy of dw", Duration::from_secs(10), || {
        let db = db.clone();
        async move { copies(&db, "dw").await == ["mirror"] }
    })
    .await;

    // Forward to postgres_only: pushes stop reaching Redis.
    store::transition(&pool, &change(&route, Phase::DualWrite, Phase::Shadow))
        .await
        .unwrap();
    store::transition(&pool, &change(&route, Phase::Shadow, Phase::PostgresOnly))
        .await
        .unwrap();
    let (key, took) = push_until(&mut proxy, &mut redis, &list, "pg", |before, after, _| {
        after == before
    })
    .await;
    println!("the proxy answered pushes in place {took:?} after the flip");
    assert!(
        took <= FOLLOW_WITHIN,
        "the proxy took {took:?} to follow dual_write → postgres_only"
    );
    // The reply came after the live copy's commit.
    assert_eq!(copies(&db, &key).await, ["live"]);
    // And it stays so: answered with the item count, the list untouched.
    let before: i64 = redis.llen(&list).await.unwrap();
    let reply: i64 = proxy
        .lpush(&list, &[r#"{"id":"pg-a"}"#, r#"{"id":"pg-b"}"#])
        .await
        .unwrap();
    assert_eq!(reply, 2);
    assert_eq!(redis.llen::<_, i64>(&list).await.unwrap(), before);
    assert_eq!(copies(&db, "pg-a").await, ["live"]);
    assert_eq!(copies(&db, "pg-b").await, ["live"]);
    let items: Vec<String> = redis.lrange(&list, 0, -1).await.unwrap();
    assert!(
        !items.iter().any(|i| i.contains(r#""pg-"#)),
        "a postgres_only push reached Redis: {items:?}"
    );

    // Roll back to shadow: pushes reach Redis again, mirrored.
    store::transition(&pool, &change(&route, Phase::PostgresOnly, Phase::Shadow))
        .await
        .unwrap();
    let (key, took) = push_until(&mut proxy, &mut redis, &list, "back", |before, after, _| {
        after == before + 1
    })
    .await;
    println!("the proxy forwarded pushes again {took:?} after the rollback");
    assert!(
        took <= FOLLOW_WITHIN,
        "the proxy took {took:?} to follow postgres_only → shadow"
    );
    let head: Vec<String> = redis.lrange(&list, 0, 0).await.unwrap();
    assert_eq!(head, [format!(r#"{{"id":"{key}"}}"#)]);
    support::wait_for(
        "the mirror copy after the rollback",
        Duration::from_secs(10),
        || {
            let (db, key) = (db.clone(), key.clone());
            async move { copies(&db, &key).await == ["mirror"] }
        },
    )
    .await;
    // Every job is in Postgres once, as exactly one kind of copy.
    assert_eq!(
        support::count(
            &db,
            "SELECT count(*) - count(DISTINCT key) FROM qbridge.jobs"
        )
        .await,
        0
    );

    drop(proxy);
    intake.cancel();
    side.finish(Duration::from_secs(10)).await;
    maintenance.stop(Duration::from_secs(5)).await;
    db.close().await;
    let mut keys: Vec<String> = ::redis::cmd("KEYS")
        .arg(format!("qbridge:*:{route}*"))
        .query_async(&mut redis)
        .await
        .unwrap_or_default();
    keys.push(list.clone());
    let _: i64 = redis.del(&keys).await.unwrap();
}
