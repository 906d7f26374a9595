//! A re-push after the flip (postgres_only) of a key whose original was
//! mirrored: it becomes live in Postgres only when the Redis side provably
//! no longer holds or owes the original — the Redis side reported it dead,
//! or an outside fleet reported the failed attempt its retry follows.
//! Otherwise it is held as a duplicate of the original, counted and shown,
//! and released once the evidence arrives. A running mirror copy is never
//! the reason a live job is dropped.

use bytes::Bytes;
use sqlx::PgPool;

use qbridge::config::{Config, Overrides};
use qbridge::ingest::{self, Stored};
use qbridge::model::Phase;
use qbridge::redis::producer::Producer;
use qbridge::routes::Routes;

use super::{delete_keys, REDIS};
use crate::support;

/// Route `r` → queue `q` on a fresh list, run on the Redis side by
/// `redis_side` ("fleet" or "qbridge").
fn routes(redis_side: &str) -> (Routes, String) {
    let list = format!("qbt:{}:promo", uuid::Uuid::new_v4().simple());
    let toml = format!(
        "[[routes]]\nname = \"r\"\nredis_key = \"{list}\"\nqueue = \"q\"\nformat = \"json:/id\"\n\
         phase = \"dual_write\"\nredis_side = \"{redis_side}\"\n"
    );
    let cfg = Config::from_toml(&toml, &Overrides::default()).expect("route config");
    (Routes::from_config(&cfg.routes), list)
}

fn item(id: &str) -> Bytes {
    Bytes::from(format!(r#"{{"id":"{id}"}}"#))
}

async fn producer(pool: &PgPool, routes: &Routes) -> Producer {
    Producer::connect(pool.clone(), Some(REDIS), routes.clone(), 1 << 20)
        .await
        .expect("producer on the shared Redis")
}

async fn report(pool: &PgPool, key: &str, outcome: &str) {
    sqlx::query("SELECT qbridge.report_outcome('q', $1, $2)")
        .bind(key)
        .bind(outcome)
        .execute(pool)
        .await
        .expect("report_outcome");
}

async fn live_jobs(pool: &PgPool, key: &str) -> i64 {
    support::count(
        pool,
        &format!("SELECT count(*) FROM qbridge.jobs WHERE key = '{key}' AND copy = 'live'"),
    )
    .await
}

async fn held(pool: &PgPool, key: &str) -> i64 {
    support::count(
        pool,
        &format!("SELECT count(*) FROM qbridge.held_repushes WHERE queue = 'q' AND key = '{key}'"),
    )
    .await
}

/// Class 4: a client retries an LPUSH whose reply was lost; the retry
/// arrives after the flip while the original still waits in Redis. Before
/// the fix it became live in Postgres and the job ran on both sides.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_repush_of_a_key_redis_still_holds_is_held_not_run_live(pool: PgPool) {
    let (routes, list) = routes("fleet");
    let producer = producer(&pool, &routes).await;
    producer.enqueue("r", vec![item("a")]).await.unwrap();
    routes.phases().set("r", Phase::PostgresOnly);

    let again = producer.enqueue("r", vec![item("a")]).await.unwrap();
    assert!(
        matches!(again.stored[0], Stored::Duplicate { .. }),
        "no evidence the Redis side let go of the original: {:?}",
        again.stored
    );
    assert_eq!(live_jobs(&pool, "a").await, 0, "no live copy in Postgres");
    assert_eq!(held(&pool, "a").await, 1, "the re-push is kept, held");
    let reason: String =
        sqlx::query_scalar("SELECT reason FROM qbridge.held_repushes WHERE key = 'a'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(reason.contains("no outcome"), "{reason}");

    // The Redis side then runs the original and reports it ok: the held
    // re-push was a duplicate of a job that ran, and is resolved as one.
    report(&pool, "a", "ok").await;
    let settled = ingest::settle_held_once(&pool, 1 << 20).await.unwrap();
    assert_eq!((settled.released, settled.resolved), (0, 1), "{settled:?}");
    assert_eq!(held(&pool, "a").await, 0);
    assert_eq!(live_jobs(&pool, "a").await, 0, "it ran once, on Redis");
    delete_keys(&[&list]).await;
}

/// Class 4, the other way: a Celery-style retry arrives before the fleet's
/// report of the failed attempt. It is held, then released as a live job
/// once the failure report arrives — never lost.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_held_retry_is_released_live_when_the_failed_attempt_is_reported(pool: PgPool) {
    let (routes, list) = routes("fleet");
    let producer = producer(&pool, &routes).await;
    producer.enqueue("r", vec![item("b")]).await.unwrap();
    routes.phases().set("r", Phase::PostgresOnly);

    let retry = producer.enqueue("r", vec![item("b")]).await.unwrap();
    assert!(matches!(retry.stored[0], Stored::Duplicate { .. }));
    assert_eq!(held(&pool, "b").await, 1);
    // A settle pass without evidence changes nothing.
    let none = ingest::settle_held_once(&pool, 1 << 20).await.unwrap();
    assert_eq!((none.released, none.resolved), (0, 0), "{none:?}");

    report(&pool, "b", "failed").await;
    let settled = ingest::settle_held_once(&pool, 1 << 20).await.unwrap();
    assert_eq!((settled.released, settled.resolved), (1, 0), "{settled:?}");
    assert_eq!(live_jobs(&pool, "b").await, 1, "the retry runs in Postgres");
    assert_eq!(held(&pool, "b").await, 0);
    let promoted: String =
        sqlx::query_scalar("SELECT copy FROM qbridge.job_keys WHERE queue = 'q' AND key = 'b'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(promoted, "live");
    delete_keys(&[&list]).await;
}

/// Evidence at the time of the re-push: a fleet's failed attempt (its retry
/// follows) or a dead job (a retry from the dead set) runs live at once; a
/// re-push of a job Redis finished is a duplicate. qbridge's own consumer
/// retries in place, so a failed report there is no evidence.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_repush_runs_live_only_on_evidence_the_redis_side_let_go(pool: PgPool) {
    let (fleet, fleet_list) = routes("fleet");
    let producer = producer(&pool, &fleet).await;
    let ids = ["failed", "dead", "ok"];
    let items: Vec<Bytes> = ids.iter().map(|id| item(id)).collect();
    producer.enqueue("r", items.clone()).await.unwrap();
    for id in ids {
        report(&pool, id, id).await;
    }
    fleet.phases().set("r", Phase::PostgresOnly);
    let again = producer.enqueue("r", items).await.unwrap();
    assert!(matches!(again.stored[0], Stored::New { .. }), "{again:?}");
    assert!(matches!(again.stored[1], Stored::New { .. }), "{again:?}");
    assert!(
        matches!(again.stored[2], Stored::Duplicate { .. }),
        "{again:?}"
    );
    assert_eq!(live_jobs(&pool, "failed").await, 1);
    assert_eq!(live_jobs(&pool, "dead").await, 1);
    assert_eq!(live_jobs(&pool, "ok").await, 0);
    assert_eq!(held(&pool, "ok").await, 0, "a duplicate of a finished job");
    delete_keys(&[&fleet_list]).await;

    let (own, own_list) = routes("qbridge");
    sqlx::query("DELETE FROM qbridge.job_keys")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM qbridge.jobs")
        .execute(&pool)
        .await
        .unwrap();
    let producer = self::producer(&pool, &own).await;
    producer.enqueue("r", vec![item("failed")]).await.unwrap();
    own.phases().set("r", Phase::PostgresOnly);
    let again = producer.enqueue("r", vec![item("failed")]).await.unwrap();
    assert!(
        matches!(again.stored[0], Stored::Duplicate { .. }),
        "qbridge's consumer retries in place: {again:?}"
    );
    assert_eq!(held(&pool, "failed").await, 1);
    delete_keys(&[&own_list]).await;
}

/// Class 3: the retry of a dead job comes in while its mirror copy is being
/// drained (state running). Before the fix the key was marked live, the
/// running mirror row held the unique key, the new job became a duplicate:
/// no live job existed although the producer was told it was stored.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_retry_while_the_mirror_copy_runs_still_gets_a_live_job(pool: PgPool) {
    let (routes, list) = routes("fleet");
    let producer = producer(&pool, &routes).await;
    producer.enqueue("r", vec![item("c")]).await.unwrap();
    report(&pool, "c", "dead").await;
    sqlx::query(
        "UPDATE qbridge.jobs SET state = 'running', lease = nextval('qbridge.lease_seq'), \
                locked_by = 'drain', lease_until = now() + interval '1 minute' WHERE key = 'c'",
    )
    .execute(&pool)
    .await
    .unwrap();
    routes.phases().set("r", Phase::PostgresOnly);

    let retry = producer.enqueue("r", vec![item("c")]).await.unwrap();
    assert!(matches!(retry.stored[0], Stored::New { .. }), "{retry:?}");
    assert_eq!(
        live_jobs(&pool, "c").await,
        1,
        "a live job exists beside the running mirror copy"
    );
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.jobs WHERE key = 'c'").await,
        2
    );
    delete_keys(&[&list]).await;
}

/// An operator's decision never runs a job on both sides: a held re-push is
/// released only when its key is named (a Redis crash at some time says
/// nothing of whether the original had run before it: the randomized
/// oracle's seed 253 ran one on both sides when `--assume-lost-before`
/// released it), and a named key runs once, in Postgres: its original is
/// not pushed back to Redis as well.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_assumption_releases_a_held_repush_only_by_key_and_never_twice(pool: PgPool) {
    use qbridge::ops::{gates, repair};
    let (routes, list) = routes("fleet");
    let producer = producer(&pool, &routes).await;
    producer
        .enqueue("r", vec![item("by-time"), item("by-key")])
        .await
        .unwrap();
    routes.phases().set("r", Phase::PostgresOnly);
    producer
        .enqueue("r", vec![item("by-time"), item("by-key")])
        .await
        .unwrap();
    assert_eq!(
        held(&pool, "by-time").await + held(&pool, "by-key").await,
        2
    );
    // Markers of an earlier run of this test (route "r") would stop the
    // push-back.
    delete_keys(&["qbridge:repushed:r:by-*"]).await;
    // Redis loses both originals (by hand: no evidence qbridge could see).
    let mut redis = qbridge::redis::connect::connect_redis(REDIS).await.unwrap();
    let _: i64 = ::redis::cmd("DEL")
        .arg(&list)
        .query_async(&mut redis)
        .await
        .unwrap();
    let route = routes.by_name("r").unwrap().clone();
    let since = chrono::Utc::now() - chrono::Duration::minutes(5);
    let repair = |assume: repair::Assumption| {
        let (pool, route) = (pool.clone(), route.clone());
        async move {
            let mut redis = qbridge::redis::connect::connect_redis(REDIS).await.unwrap();
            let (_, held) =
                gates::diff_since(&pool, &mut redis, &route, Phase::PostgresOnly, since)
                    .await
                    .unwrap();
            let input = repair::RepairInput {
                route: &route,
                phase: Phase::PostgresOnly,
                since,
                held: &held,
                payload_limit: 1 << 20,
                assume: Some(&assume),
            };
            repair::repair_with(&pool, &mut redis, input).await.unwrap()
        }
    };
    // Settled past the route's default settle time.
    sqlx::query("UPDATE qbridge.job_keys SET seen_at = seen_at - interval '1 minute'")
        .execute(&pool)
        .await
        .unwrap();
    // Named: its original is gone from Redis, so the re-push runs once, in
    // Postgres, and the original is not pushed back.
    let by_key = repair(repair::Assumption {
        keys: vec!["by-key".into()],
        by: "t".into(),
        reason: "seen gone from Redis and never run".into(),
        ..repair::Assumption::default()
    })
    .await;
    assert_eq!((by_key.released, by_key.repushed), (1, 0), "{by_key:?}");
    assert_eq!(live_jobs(&pool, "by-key").await, 1);
    // By time: the mirror copy is pushed back, the held re-push stays held
    // (it resolves when Redis reports the original).
    let by_time = repair(repair::Assumption {
        before: Some(chrono::Utc::now()),
        by: "t".into(),
        reason: "Redis crashed".into(),
        ..repair::Assumption::default()
    })
    .await;
    assert_eq!((by_time.released, by_time.repushed), (0, 1), "{by_time:?}");
    assert_eq!(held(&pool, "by-time").await, 1, "still held: {by_time:?}");
    // Named now: Redis holds its original again, so it is not released.
    let again = repair(repair::Assumption {
        keys: vec!["by-time".into()],
        by: "t".into(),
        reason: "too late: it was pushed back".into(),
        ..repair::Assumption::default()
    })
    .await;
    assert_eq!(again.released, 0, "{again:?}");
    let in_redis: Vec<String> = ::redis::cmd("LRANGE")
        .arg(&list)
        .arg(0)
        .arg(-1)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(
        in_redis,
        vec![r#"{"id":"by-time"}"#.to_string()],
        "one path per key"
    );
    delete_keys(&[&list, "qbridge:repushed:r:by-*"]).await;
}
