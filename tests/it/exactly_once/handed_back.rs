//! A job a worker took off the list before the flip and hands back after it
//! (a raw `BRPOP`, then an `RPUSH` of the same bytes): its push is answered
//! by the proxy in `postgres_only` and never reaches Redis. Before the fix it
//! was held as a re-push of a mirrored key for ever, and a forced
//! decommission then lost it.

use std::time::Duration;

use sqlx::PgPool;

use qbridge::model::Phase;

use super::{delete_keys, ProxySide, REDIS};

async fn through(side: &ProxySide) -> ::redis::aio::MultiplexedConnection {
    ::redis::Client::open(side.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn count(pool: &PgPool, sql: &str, key: &str) -> i64 {
    sqlx::query_scalar(sql)
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The client that popped a job pushing it back gives it up: it runs live
/// in Postgres. The same push from another client may be a retry while the
/// worker runs the job, and stays held.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_job_handed_back_by_the_client_that_took_it_runs_live(pool: PgPool) {
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (route, list) = (format!("h{id}"), format!("qbt:{id}:jobs"));
    let toml = format!(
        "[[routes]]\nname = \"{route}\"\nredis_key = \"{list}\"\nqueue = \"q\"\n\
         format = \"json:/id\"\nphase = \"shadow\"\nredis_side = \"fleet\"\n"
    );
    let side = ProxySide::start(&pool, &toml).await;
    let (taken, retried) = (&br#"{"id":"k-taken"}"#[..], &br#"{"id":"k-other"}"#[..]);
    let mut producer = through(&side).await;
    for item in [taken, retried] {
        let _: i64 = ::redis::cmd("LPUSH")
            .arg(&list)
            .arg(item)
            .query_async(&mut producer)
            .await
            .unwrap();
    }
    let started = std::time::Instant::now();
    while count(
        &pool,
        "SELECT count(*) FROM qbridge.job_keys WHERE queue = $1",
        "q",
    )
    .await
        < 2
    {
        assert!(started.elapsed() < Duration::from_secs(10), "mirrored");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Two workers each take one job.
    let (mut worker, mut other_worker) = (through(&side).await, through(&side).await);
    for conn in [&mut worker, &mut other_worker] {
        let popped: Option<(String, Vec<u8>)> = ::redis::cmd("BRPOP")
            .arg(&list)
            .arg(2)
            .query_async(conn)
            .await
            .unwrap();
        assert!(popped.is_some());
    }
    side.force_to(&route, REDIS, Phase::PostgresOnly).await;

    // The first worker hands its job back; a third client pushes the
    // second worker's job again.
    let _: i64 = ::redis::cmd("RPUSH")
        .arg(&list)
        .arg(taken)
        .query_async(&mut worker)
        .await
        .unwrap();
    let _: i64 = ::redis::cmd("RPUSH")
        .arg(&list)
        .arg(retried)
        .query_async(&mut producer)
        .await
        .unwrap();
    let live = "SELECT count(*) FROM qbridge.jobs WHERE key = $1 AND copy = 'live'";
    let held = "SELECT count(*) FROM qbridge.held_repushes WHERE key = $1";
    assert_eq!(
        (
            count(&pool, live, "k-taken").await,
            count(&pool, held, "k-taken").await
        ),
        (1, 0),
        "handed back by the client that took it"
    );
    assert_eq!(
        (
            count(&pool, live, "k-other").await,
            count(&pool, held, "k-other").await
        ),
        (0, 1),
        "pushed by another client"
    );
    side.stop().await;
    delete_keys(&[&list, &format!("qbridge:*:{route}*")]).await;
}

/// kombu's Redis transport (Celery) keeps a message a worker took without
/// acking in its `unacked` hash, and a warm shutdown gives it back from
/// whatever connection its pool hands out: WATCH the hash, HGET the entry,
/// then one MULTI that removes the entry (ZREM, HDEL) and pushes the
/// message. (The per-connection hand-back of a list pop does not apply
/// inside MULTI, so only the restore's own evidence can pass this test.)
/// Redis's reply to that HDEL, for the entry this connection read, is the
/// evidence that the delivery was given back: the push runs live in
/// Postgres. Before, it was held for ever.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_celery_message_kombu_restores_after_the_flip_runs_live(pool: PgPool) {
    let redis = crate::servers::ThrowawayRedis::start();
    let (side, route, queue, tasks) = celery_tasks_mirrored(&pool, &redis, "kr", 1).await;
    let task = tasks[0].clone();
    let mut worker = tokio::process::Command::new(crate::support::python())
        .args(["kombu_restore.py", "take-and-restore"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python"))
        .env("QBT_BROKER", side.url())
        .env("QBT_QUEUE", &queue)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut lines = tokio::io::BufReader::new(worker.stdout.take().unwrap()).lines();
    let taken = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the worker takes the message")
        .unwrap();
    assert_eq!(taken, Some(format!("taken {task}")));
    side.force_to(&route, &redis.url(), Phase::PostgresOnly)
        .await;
    let mut stdin = worker.stdin.take().unwrap();
    stdin.write_all(b"restore\n").await.unwrap();
    stdin.flush().await.unwrap();
    let restored = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the worker restores the message")
        .unwrap();
    assert_eq!(restored.as_deref(), Some("restored"));
    let _ = worker.wait().await;
    let live = "SELECT count(*) FROM qbridge.jobs WHERE key = $1 AND copy = 'live'";
    let held = "SELECT count(*) FROM qbridge.held_repushes WHERE key = $1";
    assert_eq!(
        (
            count(&pool, live, &task).await,
            count(&pool, held, &task).await
        ),
        (1, 0),
        "the restored message runs live, not held"
    );
    side.stop().await;
}

/// What is not kombu's restore proves nothing, and the push stays held: an
/// HDEL in a transaction that pushes nothing (kombu's ack), an HDEL outside
/// a transaction, and an entry read before an earlier transaction ended.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_removal_of_an_unacked_entry_outside_a_restore_proves_nothing(pool: PgPool) {
    let redis = crate::servers::ThrowawayRedis::start();
    let (side, route, queue, tasks) = celery_tasks_mirrored(&pool, &redis, "kn", 3).await;
    // A worker took all three: kombu's entries, written straight to Redis.
    let mut direct = ::redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut messages = Vec::new();
    for n in 0..3 {
        let message: Vec<u8> = ::redis::cmd("RPOP")
            .arg(&queue)
            .query_async(&mut direct)
            .await
            .unwrap();
        let value: serde_json::Value = serde_json::from_slice(&message).unwrap();
        let entry = serde_json::json!([value, "", queue]).to_string();
        let _: i64 = ::redis::cmd("HSET")
            .arg("unacked")
            .arg(format!("t{n}"))
            .arg(entry)
            .query_async(&mut direct)
            .await
            .unwrap();
        messages.push(message);
    }
    side.force_to(&route, &redis.url(), Phase::PostgresOnly)
        .await;
    let mut conn = through(&side).await;
    let read = |tag: &str| ::redis::cmd("HGET").arg("unacked").arg(tag).clone();
    // An ack: the entry read, then removed in a MULTI that pushes nothing.
    let _: Option<Vec<u8>> = read("t0").query_async(&mut conn).await.unwrap();
    let _: () = ::redis::pipe()
        .atomic()
        .cmd("ZREM")
        .arg("unacked_index")
        .arg("t0")
        .cmd("HDEL")
        .arg("unacked")
        .arg("t0")
        .query_async(&mut conn)
        .await
        .unwrap();
    // Outside a transaction.
    let _: Option<Vec<u8>> = read("t1").query_async(&mut conn).await.unwrap();
    let _: i64 = ::redis::cmd("HDEL")
        .arg("unacked")
        .arg("t1")
        .query_async(&mut conn)
        .await
        .unwrap();
    // Read before another transaction ended, removed with its push after.
    let _: Option<Vec<u8>> = read("t2").query_async(&mut conn).await.unwrap();
    let _: () = ::redis::pipe()
        .atomic()
        .cmd("PING")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = ::redis::pipe()
        .atomic()
        .cmd("HDEL")
        .arg("unacked")
        .arg("t2")
        .cmd("RPUSH")
        .arg(&queue)
        .arg(&messages[2])
        .query_async(&mut conn)
        .await
        .unwrap();
    for message in &messages[..2] {
        let _: i64 = ::redis::cmd("RPUSH")
            .arg(&queue)
            .arg(message)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let live = "SELECT count(*) FROM qbridge.jobs WHERE key = $1 AND copy = 'live'";
    let held = "SELECT count(*) FROM qbridge.held_repushes WHERE key = $1";
    for task in &tasks {
        assert_eq!(
            (
                count(&pool, live, task).await,
                count(&pool, held, task).await
            ),
            (0, 1),
            "{task} proved nothing: held"
        );
    }
    side.stop().await;
}

/// A Celery route in `shadow` (a fleet runs it) behind a proxy on `redis`,
/// and `n` tasks real Celery sent through it, mirrored: the proxy, the
/// route, its queue and the task ids.
async fn celery_tasks_mirrored(
    pool: &PgPool,
    redis: &crate::servers::ThrowawayRedis,
    prefix: &str,
    n: usize,
) -> (ProxySide, String, String, Vec<String>) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (route, queue) = (
        format!("{prefix}{}", &id[..12]),
        format!("qbt_{prefix}_{id}"),
    );
    let toml = format!(
        "[[routes]]\nname = \"{route}\"\nredis_key = \"{queue}\"\nqueue = \"{route}\"\n\
         format = \"celery\"\nphase = \"shadow\"\nredis_side = \"fleet\"\n"
    );
    let side = ProxySide::start_on(pool, &toml, &redis.url()).await;
    let mut tasks = Vec::new();
    for _ in 0..n {
        let sent = crate::support::python_script_ok(
            &crate::support::python(),
            &["kombu_restore.py", "send"],
            &side.url(),
            &queue,
        )
        .await;
        tasks.push(sent.first().expect("a task id").clone());
    }
    crate::support::wait_for_count(
        pool,
        "the mirror copies",
        &format!("SELECT count(*) FROM qbridge.job_keys WHERE queue = '{route}'"),
        n as i64,
    )
    .await;
    (side, route, queue, tasks)
}
