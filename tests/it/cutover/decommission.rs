//! postgres_only → decommissioned: the gate waits for Redis to be empty and
//! quiet; a forced decommission archives what is left (runnable items as
//! live Postgres jobs, the Redis dead list into jobs_dead) and deletes the
//! route's Redis keys; a decommissioned route's Redis consumer stops.

use std::time::Duration;

use sqlx::PgPool;

use qbridge::model::Phase;
use qbridge::ops::operate::Refusal;
use qbridge::redis::keys::RouteKeys;

use super::rig::{Options, Rig};
use crate::support;

async fn llen(rig: &Rig, key: &str) -> i64 {
    let mut conn = rig.redis().await;
    redis::cmd("LLEN")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn decommission_waits_for_an_empty_quiet_redis_then_archives_and_deletes(pool: PgPool) {
    let rig = Rig::new(
        &pool,
        Options {
            phase: Phase::PostgresOnly,
            ..Options::default()
        },
    )
    .await;
    // Left in Redis (no consumer runs yet): two items and a dead one.
    rig.push_behind_qbridge(r#"{"id":"left1"}"#).await;
    rig.push_behind_qbridge(r#"{"id":"left2"}"#).await;
    let dead_list = format!("qbridge:dead:{}", rig.name);
    {
        let mut conn = rig.redis().await;
        let _: i64 = redis::cmd("LPUSH")
            .arg(&dead_list)
            .arg(r#"{"id":"gone"}"#)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    match rig.advance(false).await {
        Err(Refusal::Gate(gate)) => {
            let failed = gate.failures();
            assert!(
                failed.contains("items left in Redis: 2 waiting"),
                "{failed}"
            );
        }
        other => panic!("the gate must refuse: {:?}", other.map(|a| a.state)),
    }
    // Forced (audited): the leftovers are archived, not lost.
    let done = rig.advance(true).await.map_err(|_| "advance").unwrap();
    assert!(done.forced);
    let archived = done.archived.expect("archived");
    assert_eq!((archived.enqueued, archived.dead), (2, 1));
    assert_eq!(llen(&rig, &rig.list).await, 0);
    assert_eq!(llen(&rig, &dead_list).await, 0);
    let live: i64 = support::count(
        &pool,
        "SELECT count(*) FROM qbridge.jobs WHERE copy = 'live' AND key IN ('left1', 'left2')",
    )
    .await;
    assert_eq!(live, 2);
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.jobs_dead WHERE key = 'gone'"
        )
        .await,
        1
    );
    let audit: (bool, serde_json::Value) = sqlx::query_as(
        "SELECT forced, gates FROM qbridge.phase_audit WHERE route = $1 AND to_phase = 'decommissioned'",
    )
    .bind(&rig.name)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(audit.0, "the override is audited");
    assert_eq!(audit.1["passed"], serde_json::json!(false));

    // Rolled back to postgres_only, the Redis consumer drains a new push; once
    // Redis is empty and quiet for quiet_period the gate passes on its own.
    assert_eq!(rig.rollback().await, Phase::PostgresOnly);
    let mut rig = rig;
    rig.start().await;
    rig.push_behind_qbridge(r#"{"id":"late"}"#).await;
    support::wait_for_count(
        &pool,
        "late ran on Redis",
        "SELECT count(*) FROM qbridge.outcomes WHERE side = 'redis' AND key = 'late'",
        1,
    )
    .await;
    support::wait_for_count(
        &pool,
        "archived jobs ran",
        "SELECT count(*) FROM qbridge.jobs",
        0,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let done = rig.advance(false).await.map_err(|_| "advance").unwrap();
    assert!(!done.forced, "{:?}", done.gate.failures());
    assert_eq!(done.state.phase, Phase::Decommissioned);
    assert_eq!(rig.calls.live("left1"), 1);
    assert_eq!(rig.calls.live("late"), 1);
    rig.finish().await;
}

/// Decommissions the rig's route and checks that the outbox row of `key`
/// is gone without a live Postgres copy of it (`why` says why none).
async fn decommission_runs_nothing_of(rig: &Rig, key: &str, why: &str) {
    let done = rig.advance(true).await.map_err(|_| "advance").unwrap();
    assert_eq!(done.state.phase, Phase::Decommissioned);
    let live = support::count(
        &rig.pool,
        &format!("SELECT count(*) FROM qbridge.jobs WHERE copy = 'live' AND key = '{key}'"),
    )
    .await;
    assert_eq!(live, 0, "{why}");
    let owed: i64 = support::count(&rig.pool, "SELECT count(*) FROM qbridge.redis_outbox").await;
    assert_eq!(owed, 0);
}

/// A producer-API push whose Redis push happened (its paid marker is in
/// Redis) but whose outbox row stayed — the commit deleting it failed in a
/// Postgres crash — was in Redis, and the Redis side ran it (its report
/// lost). Decommission took the row for a push Redis never got and ran the
/// job again in Postgres, on both sides unseen (found by the oracle
/// campaign, seed 4193: key a-21). The marker is the evidence it was paid.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_outbox_row_redis_was_paid_for_is_not_run_again_at_decommission(pool: PgPool) {
    let rig = Rig::new(
        &pool,
        Options {
            phase: Phase::PostgresOnly,
            ..Options::default()
        },
    )
    .await;
    let route = rig.route();
    let item = br#"{"id":"paid-then-crashed"}"#;
    let token: uuid::Uuid = sqlx::query_scalar(
        "INSERT INTO qbridge.redis_outbox (queue, key, original) VALUES ($1, 'paid-then-crashed', $2) \
         RETURNING token",
    )
    .bind(&route.queue)
    .bind(&item[..])
    .fetch_one(&pool)
    .await
    .unwrap();
    // The pay's Lua step ran (marker set, item pushed), and the Redis side
    // then popped and ran the item; its outcome report was lost.
    {
        let mut conn = rig.redis().await;
        let _: () = redis::cmd("SET")
            .arg(qbridge::redis::keys::paid(&token))
            .arg("1")
            .arg("EX")
            .arg(600)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    decommission_runs_nothing_of(
        &rig,
        "paid-then-crashed",
        "Redis had the job: it must not run again in Postgres",
    )
    .await;
    rig.finish().await;
}

/// An outbox row Redis never got (no paid marker) whose job key the Redis
/// side ran anyway — the same id pushed again by another path, its report
/// lost — is a second copy of a finished job, as a list item whose key is
/// in the ran set is: decommission stores it as the mirror copy it is and
/// nothing runs it again. Before, only the lists were checked against the
/// ran set, and the owed row became a live job: run on both sides.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_owed_outbox_row_whose_key_redis_ran_is_not_run_again_at_decommission(pool: PgPool) {
    let rig = Rig::new(
        &pool,
        Options {
            phase: Phase::PostgresOnly,
            ..Options::default()
        },
    )
    .await;
    let route = rig.route();
    let item = br#"{"id":"ran-then-owed"}"#;
    sqlx::query(
        "INSERT INTO qbridge.redis_outbox (queue, key, original) VALUES ($1, 'ran-then-owed', $2)",
    )
    .bind(&route.queue)
    .bind(&item[..])
    .execute(&pool)
    .await
    .unwrap();
    {
        let mut conn = rig.redis().await;
        let _: () = redis::cmd("ZADD")
            .arg(RouteKeys::of(&route).ran())
            .arg(chrono::Utc::now().timestamp_millis())
            .arg("ran-then-owed")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    decommission_runs_nothing_of(
        &rig,
        "ran-then-owed",
        "Redis ran the job: it must not run again in Postgres",
    )
    .await;
    rig.finish().await;
}

/// Every Redis key of the route, by a `SCAN` for its name.
async fn route_keys(rig: &Rig) -> Vec<String> {
    let mut conn = rig.redis().await;
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("*{}*", rig.name))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        keys.extend(page);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort();
    keys
}

/// Decommission deletes every key of the route that it says it deletes
/// (`docs/src/runbook/4-decommissioned.md`), and reading the decommissioned route's
/// status afterwards, as an operator does, creates none again. Before, the
/// epoch marker `qbridge:epoch:<route>` was set again by every status.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn decommission_leaves_no_key_of_the_route_and_status_creates_none(pool: PgPool) {
    let mut rig = Rig::new(
        &pool,
        Options {
            phase: Phase::PostgresOnly,
            ..Options::default()
        },
    )
    .await;
    rig.start().await;
    rig.push_behind_qbridge(r#"{"id":"drained"}"#).await;
    support::wait_for_count(
        &pool,
        "drained ran on Redis",
        "SELECT count(*) FROM qbridge.outcomes WHERE side = 'redis' AND key = 'drained'",
        1,
    )
    .await;
    assert!(
        !route_keys(&rig).await.is_empty(),
        "the route has keys before decommission"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let done = rig.advance(false).await.map_err(|_| "advance").unwrap();
    assert_eq!(done.state.phase, Phase::Decommissioned);
    rig.stop().await;
    assert_eq!(route_keys(&rig).await, Vec::<String>::new());
    let route = rig.route();
    let mut conn = rig.redis().await;
    for _ in 0..2 {
        let state = qbridge::ops::operate::state_of(&pool, &route, "test@ops")
            .await
            .unwrap();
        qbridge::ops::gates::evaluate(&pool, Some(&mut conn), &route, &state)
            .await
            .unwrap();
    }
    assert_eq!(
        route_keys(&rig).await,
        Vec::<String>::new(),
        "the status of a decommissioned route writes nothing to Redis"
    );
    rig.finish().await;
}
