//! kombu's Redis transport pushes a Celery task in more than one way: to a
//! queue declared with `expires`, each send is a MULTI of the LPUSH and a
//! PEXPIRE per priority list; inside `Producer.batch()` (kombu 5.7) the
//! LPUSHes go out together in one pipeline without MULTI. Real Celery sends
//! both ways through the proxy in `dual_write`, and every task is mirrored
//! exactly once, while Redis's list holds each once too.

use std::time::Duration;

use sqlx::PgPool;

use crate::exactly_once::ProxySide;
use crate::servers::ThrowawayRedis;
use crate::support;

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn celery_sends_in_multi_with_expiry_and_in_batches_are_mirrored_once(pool: PgPool) {
    let redis = ThrowawayRedis::start();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (route, queue) = (format!("cf{}", &id[..12]), format!("qbt_cf_{id}"));
    let toml = format!(
        "[[routes]]\nname = \"{route}\"\nredis_key = \"{queue}\"\nqueue = \"{route}\"\n\
         format = \"celery\"\nphase = \"dual_write\"\n"
    );
    let side = ProxySide::start_on(&pool, &toml, &redis.url()).await;
    let mut sent = send(&side.url(), &queue, "expiring", 5).await;
    sent.extend(send(&side.url(), &queue, "batch", 7).await);
    assert_eq!(sent.len(), 12);
    support::wait_for_count(
        &pool,
        "every task mirrored",
        &format!("SELECT count(*) FROM qbridge.job_keys WHERE queue = '{route}'"),
        12,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let keys: Vec<String> =
        sqlx::query_scalar("SELECT key FROM qbridge.job_keys WHERE queue = $1 ORDER BY key")
            .bind(&route)
            .fetch_all(&pool)
            .await
            .unwrap();
    let mut expected = sent.clone();
    expected.sort();
    assert_eq!(keys, expected, "each task once, by its id");
    let mut conn = qbridge::redis::connect::connect_redis(&redis.url())
        .await
        .unwrap();
    let (waiting, ttl): (i64, i64) = ::redis::pipe()
        .cmd("LLEN")
        .arg(&queue)
        .cmd("PTTL")
        .arg(&queue)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(waiting, 12, "Redis holds each task once");
    assert!(ttl > 0, "kombu's PEXPIRE reached Redis: {ttl}");
    side.stop().await;
}

/// Sends `n` tasks in `form` with real Celery through `broker`; their ids.
async fn send(broker: &str, queue: &str, form: &str, n: usize) -> Vec<String> {
    let n = n.to_string();
    let args = ["celery_push_forms.py", form, n.as_str()];
    support::python_script_ok(&support::python(), &args, broker, queue).await
}
