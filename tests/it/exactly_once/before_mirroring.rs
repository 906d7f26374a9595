//! Jobs pushed while the route was still in `redis_only` (found by the
//! randomized oracle once its walks started there with a backlog): Postgres
//! has no copy of them, only what the Redis side reported or still holds.

use std::sync::Arc;

use bytes::Bytes;
use sqlx::PgPool;

use qbridge::model::Phase;
use qbridge::ops::operate;
use qbridge::redis::connect::connect_redis;
use qbridge::redis::keys::RouteKeys;
use qbridge::redis::producer::Producer;
use qbridge::routes::{Route, Routes};

use crate::servers::ThrowawayRedis;

fn routes_in(phase: &str) -> Routes {
    super::routes_in("json:/id", phase)
}

fn route() -> Arc<Route> {
    routes_in("redis_only").by_name("r").unwrap().clone()
}

async fn advance_to(pool: &PgPool, conn: &mut ::redis::aio::ConnectionManager, phase: Phase) {
    super::force_to(pool, conn, &route(), phase).await;
}

/// A job ran on the Redis side in `redis_only` (its outcome reported, no
/// copy in Postgres); after the flip a client retries its push. Before the
/// fix the unknown key was a new live job and ran a second time in Postgres
/// (oracle seeds 3 and 7, a backlog item re-pushed in `postgres_only`). The
/// Redis side's outcome is the evidence the job exists: the key is recorded
/// as the mirror copy it would have been, and the re-push is judged as any
/// re-push of a mirrored key (a duplicate of a job that ran).
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_repush_of_a_job_that_ran_before_mirroring_does_not_run_again(pool: PgPool) {
    let server = ThrowawayRedis::start();
    let mut conn = connect_redis(&server.url()).await.unwrap();
    operate::state_of(&pool, &route(), "test@ops")
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO qbridge.outcomes (queue, key, side, mode, outcome) \
         VALUES ('q', 'ran-early', 'redis', 'live', 'ok')",
    )
    .execute(&pool)
    .await
    .unwrap();
    advance_to(&pool, &mut conn, Phase::PostgresOnly).await;
    let producer = Producer::connect(
        pool.clone(),
        Some(&server.url()),
        routes_in("postgres_only"),
        1 << 20,
    )
    .await
    .expect("producer");
    let item = Bytes::from_static(br#"{"id":"ran-early"}"#);
    producer.enqueue("r", vec![item]).await.unwrap();
    let live_jobs: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.jobs WHERE queue = 'q' AND key = 'ran-early' AND copy = 'live'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let copy: String = sqlx::query_scalar(
        "SELECT copy FROM qbridge.job_keys WHERE queue = 'q' AND key = 'ran-early'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((live_jobs, copy.as_str()), (0, "mirror"));
}

/// A job qbridge's consumer holds in its processing list (taken in
/// `redis_only`, waiting for its retry, its worker killed) when the route
/// enters `dual_write`: `import` copied the list and the frameworks'
/// structures but not qbridge's own, so when Redis then restarted without
/// persistence the job was gone with nothing in Postgres to show it (oracle
/// seed 7). Imported, it is a mirror copy, and the restart is evidence.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_job_qbridges_consumer_holds_when_mirroring_begins_is_imported(pool: PgPool) {
    let mut server = ThrowawayRedis::start();
    let mut conn = connect_redis(&server.url()).await.unwrap();
    let processing = RouteKeys::of(&route()).consumer("w1").processing(0);
    let _: i64 = ::redis::cmd("LPUSH")
        .arg(&processing)
        .arg(br#"{"id":"held-early"}"#)
        .query_async(&mut conn)
        .await
        .unwrap();
    advance_to(&pool, &mut conn, Phase::DualWrite).await;
    let since = chrono::Utc::now() - chrono::Duration::minutes(5);
    let imported = qbridge::ops::import::import(
        &pool,
        &mut conn,
        &route(),
        Phase::DualWrite,
        false,
        1 << 20,
        |_, _| {},
    )
    .await
    .unwrap();
    let new: usize = imported.structures.iter().map(|s| s.new).sum();
    assert_eq!(new, 1, "{imported:?}");
    qbridge::ops::gates::diff_since(&pool, &mut conn, &route(), Phase::DualWrite, since)
        .await
        .unwrap();
    drop(conn);
    server.kill();
    server.resume();
    let mut conn = connect_redis(&server.url()).await.unwrap();
    let (diff, report) = super::diff_and_repair(&pool, &mut conn, &route(), since).await;
    assert_eq!(report.repushed, 1, "{}", diff.verdict);
}
