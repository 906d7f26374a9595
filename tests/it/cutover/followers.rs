//! Pushes are routed only under a phase change every live proxy process
//! follows, and a proxy follows a change only once the pushes it routed
//! before are written (`model::following`, `cutover::follow`). Two views in
//! one test process stand for two processes; a third follower is a row the
//! test writes, as a process that has not polled yet would leave it.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use qbridge::config::{Config, Overrides};
use qbridge::cutover::{follow, store, watch};
use qbridge::model::Phase;

use crate::support::wait_for;

const ROUTE: &str = "follow_w";

async fn followed(pool: &PgPool, process: uuid::Uuid) -> i64 {
    sqlx::query_scalar("SELECT followed FROM qbridge.phase_followers WHERE process = $1")
        .bind(process)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn revision(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT revision FROM qbridge.route_phases WHERE route = $1")
        .bind(ROUTE)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_change_is_followed_once_every_live_proxy_has_written_what_it_routed(pool: PgPool) {
    let toml = "[[routes]]\nname = \"follow_w\"\nredis_key = \"follow_w\"\nqueue = \"follow_w\"\nformat = \"json:/id\"\nphase = \"shadow\"\n";
    let config = Config::from_toml(toml, &Overrides::default()).expect("config");
    let token = CancellationToken::new();
    let url = crate::support::db_url(&pool);
    let proxy_id = uuid::Uuid::new_v4();
    let (proxy, _) = watch::attach_following(
        &pool,
        Some(&url),
        &config.routes,
        "test",
        &token,
        Some(proxy_id),
    )
    .await
    .unwrap();
    let (other, _) = watch::attach(&pool, Some(&url), &config.routes, "test", &token)
        .await
        .unwrap();
    let before = revision(&pool).await;
    assert_eq!(followed(&pool, proxy_id).await, before);
    assert_eq!(other.followed(ROUTE), Some((Phase::Shadow, 100)));

    // A push the proxy routed under `shadow`, its mirror copy not written.
    let in_flight = proxy.route_push();
    let metrics = qbridge::telemetry::prometheus();
    let flip = store::Change {
        route: ROUTE,
        from: Phase::Shadow,
        to: Phase::PostgresOnly,
        changed_by: "test",
        reason: "test",
        forced: true,
        gates: serde_json::Value::Null,
    };
    store::transition(&pool, &flip).await.unwrap();
    let after = revision(&pool).await;
    assert_eq!(after, before + 1, "a change bumps the revision");
    wait_for("both views hold the flip", Duration::from_secs(5), || {
        let seen = (proxy.get(ROUTE), other.get(ROUTE));
        async move { seen == (Phase::PostgresOnly, Phase::PostgresOnly) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        followed(&pool, proxy_id).await,
        before,
        "held by the push in flight"
    );
    assert_eq!(other.followed(ROUTE), None, "pushes wait meanwhile");
    let gauge = "qbridge_route_followed{route=\"follow_w\"}";
    assert!(
        metrics.render().contains(&format!("{gauge} 0")),
        "{gauge} says they wait"
    );

    drop(in_flight);
    wait_for(
        "every view follows the flip",
        Duration::from_secs(5),
        || {
            let both = (proxy.followed(ROUTE), other.followed(ROUTE));
            async move {
                both == (
                    Some((Phase::PostgresOnly, 100)),
                    Some((Phase::PostgresOnly, 100)),
                )
            }
        },
    )
    .await;
    assert_eq!(followed(&pool, proxy_id).await, after);
    wait_for(
        "the gauge says every proxy follows",
        Duration::from_secs(2),
        || {
            let text = metrics.render();
            async move { text.contains(&format!("{gauge} 1")) }
        },
    )
    .await;

    // Another proxy that has not followed the next change holds pushes
    // while it is alive, and no longer once it is silent past the expiry.
    let stale = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO qbridge.phase_followers (process, route, followed) VALUES ($1, $2, $3)",
    )
    .bind(stale)
    .bind(ROUTE)
    .bind(after)
    .execute(&pool)
    .await
    .unwrap();
    store::set_percent(&pool, ROUTE, 100, 50, "test", "test")
        .await
        .unwrap();
    wait_for(
        "the view holds the new share",
        Duration::from_secs(5),
        || {
            let percent = other.percent(ROUTE);
            async move { percent == 50 }
        },
    )
    .await;
    assert_eq!(other.followed(ROUTE), None, "the stale proxy holds pushes");
    let took = wait_for(
        "the silent proxy is taken for gone",
        follow::EXPIRY + Duration::from_secs(3),
        || {
            let state = other.followed(ROUTE);
            async move { state == Some((Phase::PostgresOnly, 50)) }
        },
    )
    .await;
    assert!(
        took >= Duration::from_secs(3),
        "not before it fell silent: {took:?}"
    );
    token.cancel();
    follow::leave(&pool, proxy_id).await.unwrap();
}
