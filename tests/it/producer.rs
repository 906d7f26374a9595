//! The producer API on real Postgres and Redis: each phase writes the sides it
//! should, the caller's transaction decides, keys deduplicate, and a Redis
//! outage leaves owed pushes in the outbox for repair instead of losing them.

use std::time::Duration;

use ::redis::AsyncCommands;
use bytes::Bytes;
use sqlx::PgPool;

use qbridge::config::{Config, Overrides};
use qbridge::ingest::Stored;
use qbridge::model::Phase;
use qbridge::redis::connect::connect_redis;
use qbridge::redis::outbox;
use qbridge::redis::producer::Producer;
use qbridge::routes::Routes;

use crate::servers::ThrowawayRedis;
use crate::support;

const REDIS: &str = "redis://127.0.0.1:6379";

/// A route `r` → queue `q` on a fresh random Redis key.
pub fn route_table(format: &str, phase: Phase) -> (Routes, String) {
    let key = format!("qbt:{}:list", uuid::Uuid::new_v4());
    let toml = format!(
        "[[routes]]\nname = \"r\"\nredis_key = \"{key}\"\nqueue = \"q\"\nformat = \"{format}\"\nphase = \"{phase}\"\n"
    );
    let cfg = Config::from_toml(&toml, &Overrides::default()).expect("route config");
    (Routes::from_config(&cfg.routes), key)
}

/// A producer of `routes` on the shared Redis.
pub async fn producer(pool: &PgPool, routes: &Routes) -> Producer {
    Producer::connect(pool.clone(), Some(REDIS), routes.clone(), 1 << 20)
        .await
        .expect("producer on the shared Redis")
}

async fn redis() -> ::redis::aio::MultiplexedConnection {
    ::redis::Client::open(REDIS)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("shared Redis on 6379")
}

fn json_item(id: usize) -> Bytes {
    Bytes::from(format!(r#"{{"id":"job-{id}","n":{id}}}"#))
}

async fn list(key: &str) -> Vec<Vec<u8>> {
    redis().await.lrange(key, 0, -1).await.expect("LRANGE")
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn dual_write_stores_mirror_copies_and_pushes_after_commit(pool: PgPool) {
    let (routes, key) = route_table("json:/id", Phase::DualWrite);
    let producer = producer(&pool, &routes).await;

    // Half on the producer's own transaction, half inside a business one.
    for i in 0..20 {
        let done = producer
            .enqueue("r", vec![json_item(i)])
            .await
            .expect("enqueue");
        assert_eq!((done.pushed, done.deferred), (1, 0));
        assert!(matches!(done.stored[0], Stored::New { .. }));
    }
    sqlx::query("CREATE TABLE orders (id int)")
        .execute(&pool)
        .await
        .unwrap();
    for i in 20..40 {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("INSERT INTO orders VALUES ($1)")
            .bind(i as i32)
            .execute(&mut *tx)
            .await
            .unwrap();
        let pending = producer
            .enqueue_in(&mut tx, "r", vec![json_item(i)])
            .await
            .unwrap();
        // Not in Redis before the commit.
        assert_eq!(list(&key).await.len(), i);
        tx.commit().await.unwrap();
        assert_eq!(pending.push(&producer).await.unwrap().pushed, 1);
    }

    let rows: Vec<(String, String, Vec<u8>)> =
        sqlx::query_as("SELECT j.key, j.copy, coalesce(j.original, k.original) FROM qbridge.jobs j LEFT JOIN qbridge.job_keys k ON k.queue = j.queue AND k.key = j.key ORDER BY j.id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 40);
    for (i, (k, copy, original)) in rows.iter().enumerate() {
        assert_eq!(k, &format!("job-{i}"));
        assert_eq!(copy, "mirror");
        assert_eq!(original.as_slice(), json_item(i).as_ref());
    }
    // LPUSH: the newest is at the head; the bytes are the producer's.
    let mut items = list(&key).await;
    items.reverse();
    let expected: Vec<Vec<u8>> = (0..40).map(|i| json_item(i).to_vec()).collect();
    assert_eq!(items, expected);
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.redis_outbox").await,
        0
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_rolled_back_transaction_leaves_nothing_anywhere(pool: PgPool) {
    let (routes, key) = route_table("json:/id", Phase::DualWrite);
    let producer = producer(&pool, &routes).await;
    let mut tx = pool.begin().await.unwrap();
    let pending = producer
        .enqueue_in(&mut tx, "r", vec![json_item(1)])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    // The owed rows rolled back with the job: paying finds nothing to push.
    assert_eq!(pending.push(&producer).await.unwrap().pushed, 0);
    assert_eq!(support::jobs(&pool).await, 0);
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.redis_outbox").await,
        0
    );
    assert!(list(&key).await.is_empty());
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_known_key_is_neither_a_new_job_nor_a_second_push(pool: PgPool) {
    let (routes, key) = route_table("sidekiq", Phase::Shadow);
    let producer = producer(&pool, &routes).await;
    let job =
        Bytes::from_static(br#"{"class":"Mailer","args":[1],"jid":"abc123","queue":"default"}"#);
    let first = producer.enqueue("r", vec![job.clone()]).await.unwrap();
    // A Sidekiq retry of the same jid, after the first copy was drained.
    sqlx::query("DELETE FROM qbridge.jobs")
        .execute(&pool)
        .await
        .unwrap();
    let again = producer.enqueue("r", vec![job]).await.unwrap();
    assert!(matches!(first.stored[0], Stored::New { .. }));
    assert_eq!(
        again.stored,
        vec![Stored::Duplicate {
            key: "abc123".into()
        }]
    );
    assert_eq!(again.pushed, 0);
    assert_eq!(list(&key).await.len(), 1);
    assert_eq!(support::jobs(&pool).await, 0);
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn postgres_only_writes_live_copies_and_redis_only_writes_redis(pool: PgPool) {
    let (routes, key) = route_table("json:/id", Phase::PostgresOnly);
    let producer = producer(&pool, &routes).await;
    let done = producer
        .enqueue("r", vec![json_item(1), json_item(2)])
        .await
        .unwrap();
    assert_eq!((done.phase, done.pushed), (Phase::PostgresOnly, 0));
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.jobs WHERE copy = 'live'"
        )
        .await,
        2
    );
    assert!(list(&key).await.is_empty());

    routes.phases().set("r", Phase::RedisOnly);
    let done = producer.enqueue("r", vec![json_item(3)]).await.unwrap();
    assert_eq!((done.pushed, done.stored.len()), (1, 0));
    assert_eq!(list(&key).await, vec![json_item(3).to_vec()]);
    assert_eq!(support::jobs(&pool).await, 2);
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn raw_items_round_trip_and_identical_bytes_stay_two_jobs(pool: PgPool) {
    let (routes, _key) = route_table("raw", Phase::DualWrite);
    let producer = producer(&pool, &routes).await;
    let binary = Bytes::from_static(b"\xff\x00not utf-8\r\n\x80");
    producer
        .enqueue("r", vec![binary.clone(), binary.clone()])
        .await
        .unwrap();
    let rows: Vec<(String, Vec<u8>)> =
        sqlx::query_as("SELECT j.key, coalesce(j.original, k.original) FROM qbridge.jobs j LEFT JOIN qbridge.job_keys k ON k.queue = j.queue AND k.key = j.key ORDER BY j.id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 2);
    assert!(
        rows[0].0.ends_with(":1") && rows[1].0.ends_with(":2"),
        "{rows:?}"
    );
    assert_eq!(
        rows[0].0[..rows[0].0.len() - 2],
        rows[1].0[..rows[1].0.len() - 2]
    );
    assert!(rows.iter().all(|(_, o)| o.as_slice() == binary.as_ref()));
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_item_in_the_wrong_format_is_kept_raw_and_flagged(pool: PgPool) {
    let (routes, _key) = route_table("json:/id", Phase::DualWrite);
    let producer = producer(&pool, &routes).await;
    let done = producer
        .enqueue("r", vec![Bytes::from_static(b"not json at all")])
        .await
        .unwrap();
    assert!(done.stored[0].key().starts_with("sha256:"));
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.job_keys WHERE flagged IS NOT NULL"
        )
        .await,
        1
    );
    let original: Vec<u8> = sqlx::query_scalar("SELECT coalesce(j.original, k.original) FROM qbridge.jobs j LEFT JOIN qbridge.job_keys k ON k.queue = j.queue AND k.key = j.key")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(original, b"not json at all");
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn redis_down_reports_the_error_and_acknowledges_only_what_was_stored(pool: PgPool) {
    // Unreachable at start-up: a clear error naming Redis.
    let closed = format!("redis://127.0.0.1:{}", crate::servers::free_port());
    let (routes, key) = route_table("json:/id", Phase::RedisOnly);
    let err = Producer::connect(pool.clone(), Some(&closed), routes.clone(), 1 << 20)
        .await
        .err()
        .expect("unreachable Redis is an error");
    assert!(
        err.to_string().starts_with("cannot connect to Redis"),
        "{err}"
    );

    // Redis dies after start-up.
    let mut server = ThrowawayRedis::start();
    let producer = Producer::connect(pool.clone(), Some(&server.url()), routes.clone(), 1 << 20)
        .await
        .unwrap();
    server.kill();

    // redis_only: the push was the only copy, so it is an error.
    let err = producer.enqueue("r", vec![json_item(1)]).await.unwrap_err();
    assert!(err.to_string().contains("nothing was enqueued"), "{err}");
    assert_eq!(support::jobs(&pool).await, 0);

    // dual_write: the job is stored; the push is reported failed and owed.
    routes.phases().set("r", Phase::DualWrite);
    let done = producer.enqueue("r", vec![json_item(2)]).await.unwrap();
    assert_eq!((done.pushed, done.deferred), (0, 1));
    assert!(done.push_error.is_some());
    assert_eq!(support::jobs(&pool).await, 1);
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.redis_outbox").await,
        1
    );

    // Redis is back (here: the shared one): the repair pass pays the debt.
    let mut conn = connect_redis(REDIS).await.unwrap();
    let paid = outbox::repair_once(&pool, &mut conn, &routes, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(paid, 1);
    assert_eq!(list(&key).await, vec![json_item(2).to_vec()]);
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.redis_outbox").await,
        0
    );
    // Nothing left to pay: a second pass pushes nothing twice.
    assert_eq!(
        outbox::repair_once(&pool, &mut conn, &routes, Duration::ZERO)
            .await
            .unwrap(),
        0
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_repush_after_the_flip_of_a_mirrored_key_runs_live(pool: PgPool) {
    let (routes, key) = route_table("json:/id", Phase::DualWrite);
    let producer = producer(&pool, &routes).await;
    producer
        .enqueue("r", vec![json_item(1), json_item(2)])
        .await
        .unwrap();
    // job-1's mirror copy was drained; job-2's still waits in the queue.
    sqlx::query("DELETE FROM qbridge.jobs WHERE key = 'job-1'")
        .execute(&pool)
        .await
        .unwrap();
    let waiting: i64 = sqlx::query_scalar("SELECT id FROM qbridge.jobs WHERE key = 'job-2'")
        .fetch_one(&pool)
        .await
        .unwrap();

    // The fleet reported job-1 dead and job-2's attempt failed. After the
    // flip, Sidekiq-style retries of both come in: Redis will never see
    // them, so both must become live copies here. (Before re-pushes were held on evidence, this
    // test had no reports: both items were still in the Redis list, and
    // promoting them ran each job on both sides. Without evidence a re-push
    // is held now: tests/it/exactly_once/promotion.rs.)
    for (key, outcome) in [("job-1", "dead"), ("job-2", "failed")] {
        sqlx::query("SELECT qbridge.report_outcome('q', $1, $2)")
            .bind(key)
            .bind(outcome)
            .execute(&pool)
            .await
            .unwrap();
    }
    routes.phases().set("r", Phase::PostgresOnly);
    let done = producer
        .enqueue("r", vec![json_item(1), json_item(2)])
        .await
        .unwrap();
    assert!(
        matches!(done.stored[0], Stored::New { .. }),
        "{:?}",
        done.stored
    );
    assert_eq!(
        done.stored[1],
        Stored::New {
            id: waiting,
            key: "job-2".into()
        }
    );
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.jobs WHERE copy = 'live'"
        )
        .await,
        2
    );
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.job_keys WHERE copy = 'live'"
        )
        .await,
        2
    );
    // A third push of a now-live key is a plain duplicate.
    let again = producer.enqueue("r", vec![json_item(1)]).await.unwrap();
    assert!(matches!(again.stored[0], Stored::Duplicate { .. }));
    assert_eq!(
        list(&key).await.len(),
        2,
        "nothing more was pushed to Redis"
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn keys_past_the_dedup_window_are_forgotten(pool: PgPool) {
    let (routes, _key) = route_table("json:/id", Phase::PostgresOnly);
    let producer = producer(&pool, &routes).await;
    producer
        .enqueue("r", vec![json_item(1), json_item(2)])
        .await
        .unwrap();
    sqlx::query(
        "UPDATE qbridge.job_keys SET seen_at = now() - interval '8 days' WHERE key = 'job-1'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let pruned = qbridge::ingest::prune_keys_once(&pool, &routes)
        .await
        .unwrap();
    assert_eq!(pruned, 1);
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.job_keys").await,
        1
    );
}

/// A push that reached Redis but whose row was not deleted (the reply timed
/// out, the process died before its commit) is not pushed a second time.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_owed_push_already_made_is_not_made_twice(pool: PgPool) {
    let (routes, key) = route_table("json:/id", Phase::DualWrite);
    let producer = producer(&pool, &routes).await;
    let mut tx = pool.begin().await.unwrap();
    let pending = producer
        .enqueue_in(&mut tx, "r", vec![json_item(1)])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // The first pay pushes, but pretend its commit was lost: the row stays.
    drop(pending);
    let token: uuid::Uuid = sqlx::query_scalar("SELECT token FROM qbridge.redis_outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut conn = connect_redis(REDIS).await.unwrap();
    assert_eq!(
        outbox::repair_once(&pool, &mut conn, &routes, Duration::ZERO)
            .await
            .unwrap(),
        1
    );
    assert_eq!(list(&key).await.len(), 1);
    sqlx::query("INSERT INTO qbridge.redis_outbox (queue, key, original, token) VALUES ('q', 'job-1', $1, $2)")
        .bind(json_item(1).as_ref())
        .bind(token)
        .execute(&pool)
        .await
        .unwrap();
    outbox::repair_once(&pool, &mut conn, &routes, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        list(&key).await.len(),
        1,
        "the marker kept the second pay from pushing"
    );
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.redis_outbox").await,
        0
    );
}
