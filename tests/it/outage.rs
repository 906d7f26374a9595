//! A Postgres outage during `dual_write`, through the real wiring of
//! `qbridge proxy` (RedisSide: proxy, mirror writers, gap repair): producers
//! keep getting their Redis replies, the unmirrored items wait in the gap
//! list, and the repair loop fills the gap once Postgres is back.

use std::time::Duration;

use ::redis::AsyncCommands;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

use qbridge::app::RedisSide;
use qbridge::config::{Config, Overrides};
use qbridge::periodic::Services;

use crate::servers::ThrowawayPostgres;
use crate::support;

#[tokio::test]
async fn postgres_down_in_dual_write_keeps_pushes_working_and_fills_the_gap_later() {
    let server = ThrowawayPostgres::start();
    let db = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&server.url())
        .await
        .expect("throwaway Postgres");
    qbridge::MIGRATOR.run(&db).await.expect("migrate");

    let id = uuid::Uuid::new_v4();
    let (route, list) = (format!("outage-{id}"), format!("qbt:{id}:list"));
    let toml = format!(
        "database_url = \"{}\"\n[proxy]\nenabled = true\n\
         [[routes]]\nname = \"{route}\"\nredis_key = \"{list}\"\nqueue = \"q\"\nformat = \"json:/id\"\nphase = \"dual_write\"\n",
        server.url()
    );
    let cfg = Config::from_toml(&toml, &Overrides::default()).expect("config");
    let mut maintenance = Services::new();
    let intake = CancellationToken::new();
    let mut side = RedisSide::start(&cfg, &db, true, &mut maintenance)
        .await
        .expect("redis side");
    let addr = side
        .start_proxy(&cfg, Some("127.0.0.1:0"), intake.clone())
        .await
        .expect("proxy");

    server.kill();
    let mut producer = ::redis::Client::open(format!("redis://{addr}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for i in 0..10 {
        // The producer's push succeeds although Postgres is down.
        let len: i64 = producer
            .lpush(&list, format!(r#"{{"id":"o{i}"}}"#))
            .await
            .expect("push through the proxy");
        assert_eq!(len, i + 1);
    }
    let mut redis = ::redis::Client::open("redis://127.0.0.1:6379")
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let gap = format!("qbridge:gap:{route}");
    support::wait_for("the gap recorded", Duration::from_secs(30), || {
        let (mut redis, gap) = (redis.clone(), gap.clone());
        async move { redis.llen::<_, i64>(&gap).await.unwrap_or(0) == 10 }
    })
    .await;

    server.resume();
    support::wait_for("the gap filled", Duration::from_secs(60), || {
        let db = db.clone();
        async move {
            // The ledger: a parked copy is written back by the proxy's
            // retained copy (a ledger entry) or by gap repair (a row,
            // drained), whichever commits first; either is in the ledger.
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM qbridge.job_keys WHERE copy = 'mirror'",
            )
            .fetch_one(&db)
            .await
            .map(|n| n == 10)
            .unwrap_or(false)
        }
    })
    .await;
    let mut keys: Vec<String> = sqlx::query_scalar("SELECT key FROM qbridge.job_keys")
        .fetch_all(&db)
        .await
        .unwrap();
    keys.sort();
    let mut expected: Vec<String> = (0..10).map(|i| format!("o{i}")).collect();
    expected.sort();
    assert_eq!(keys, expected);
    // The writers write what they parked as soon as Postgres is back (they
    // keep it in memory too); gap repair then finds the entries written and
    // trims them.
    support::wait_for("the gap list trimmed", Duration::from_secs(30), || {
        let (mut redis, gap) = (redis.clone(), gap.clone());
        async move { redis.llen::<_, i64>(&gap).await.unwrap_or(-1) == 0 }
    })
    .await;
    // The live copies stayed in Redis all along.
    assert_eq!(redis.llen::<_, i64>(&list).await.unwrap(), 10);

    intake.cancel();
    side.finish(Duration::from_secs(10)).await;
    maintenance.stop(Duration::from_secs(5)).await;
    let _: () = redis.del(&list).await.unwrap();
}
