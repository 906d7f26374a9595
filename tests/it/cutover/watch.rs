//! A process keeps its last known phase while Postgres is down (it never
//! falls back to the config's or a default) and picks up a flip within a
//! second once Postgres answers again. Uses a throwaway Postgres it kills.

use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

use qbridge::config::{Config, Overrides};
use qbridge::cutover::store::{self, Change};
use qbridge::cutover::watch;
use qbridge::model::Phase;

use crate::servers::ThrowawayPostgres;

#[tokio::test]
async fn keeps_the_last_known_phase_while_postgres_is_down_and_follows_a_flip_after() {
    let server = ThrowawayPostgres::start();
    let db = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(1))
        .connect(&server.url())
        .await
        .expect("throwaway Postgres");
    qbridge::MIGRATOR.run(&db).await.expect("migrate");
    let toml = "[[routes]]\nname = \"w\"\nredis_key = \"w\"\nqueue = \"w\"\nformat = \"raw\"\nphase = \"redis_only\"\n";
    let config = Config::from_toml(toml, &Overrides::default()).expect("config");
    // Stored earlier by an operator: the stored phase wins over the config's.
    store::register(&db, "w", Phase::RedisOnly, "test")
        .await
        .unwrap();
    let flip = |from, to| Change {
        route: "w",
        from,
        to,
        changed_by: "test",
        reason: "test",
        forced: false,
        gates: serde_json::Value::Null,
    };
    store::transition(&db, &flip(Phase::RedisOnly, Phase::DualWrite))
        .await
        .unwrap();
    let token = CancellationToken::new();
    let (view, task) = watch::attach(
        &db,
        Some(&crate::support::db_url(&db)),
        &config.routes,
        "test",
        &token,
    )
    .await
    .expect("attach");
    assert_eq!(view.get("w"), Phase::DualWrite);

    server.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(view.get("w"), Phase::DualWrite, "last known phase kept");

    server.resume();
    // Wait until Postgres answers through the pool again, then flip.
    let started = Instant::now();
    while sqlx::query("SELECT 1").execute(&db).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "Postgres is back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store::transition(&db, &flip(Phase::DualWrite, Phase::Shadow))
        .await
        .unwrap();
    let flipped = Instant::now();
    while view.get("w") != Phase::Shadow {
        assert!(
            flipped.elapsed() < Duration::from_secs(1),
            "the flip must be seen within a second"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    token.cancel();
    if let Some(task) = task {
        task.await.unwrap();
    }
    db.close().await;
}
