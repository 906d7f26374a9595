//! Crash recovery and shutdown: an item left in a processing list (a crash
//! mid-job, a former larger concurrency) runs at the next start under the
//! same key and attempt count; shutdown finishes the item in hand.

use std::time::Duration;

use ::redis::AsyncCommands;
use sqlx::PgPool;

use qbridge::config::PushEnd;
use qbridge::model::Phase;

use super::{marker_dir, outcomes, redis, Fixture};
use crate::support::{self, sh, wait_for, wait_for_count};

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_consumer_killed_mid_job_recovers_the_item_at_restart(pool: PgPool) {
    let dir = marker_dir();
    let started = dir.path().join("started");
    // First run: mark and hang (the crash comes mid-job); later runs succeed.
    let script = r#"if [ -e "$1" ]; then exit 0; fi; touch "$1"; sleep 60"#;
    let fx = Fixture::new(
        "raw",
        Phase::Shadow,
        PushEnd::Lpush,
        sh(script, &[started.to_str().unwrap()]),
        2,
        3,
    );
    let _: i64 = redis()
        .await
        .lpush(&fx.list, b"\xffpayload".as_slice())
        .await
        .unwrap();

    let first = fx.start(&pool).await;
    wait_for("the handler to start", Duration::from_secs(10), || async {
        started.exists()
    })
    .await;
    first.task.abort();
    assert!(first.task.await.unwrap_err().is_cancelled());

    // The item is in one processing list, not in the source list.
    let mut held = 0;
    for n in 0..2 {
        held += redis()
            .await
            .llen::<_, i64>(fx.processing(n))
            .await
            .unwrap();
    }
    assert_eq!(
        (held, redis().await.llen::<_, i64>(&fx.list).await.unwrap()),
        (1, 0)
    );
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.outcomes").await,
        0
    );

    // Same consumer name: it finds the item and runs it again, as attempt 2
    // and under the same key.
    let second = fx.start(&pool).await;
    wait_for_count(
        &pool,
        "the recovered item's outcome",
        "SELECT count(*) FROM qbridge.outcomes",
        1,
    )
    .await;
    let report = second.stop().await;
    assert_eq!((report.recovered, report.ok), (1, 1));
    let got = outcomes(&pool).await;
    assert_eq!((got[0].1.as_str(), got[0].3), ("ok", 2), "{got:?}");
    let key: String = sqlx::query_scalar("SELECT key FROM qbridge.outcomes")
        .fetch_one(&pool)
        .await
        .unwrap();
    let pops: i64 = sqlx::query_scalar("SELECT n FROM qbridge.key_occurrences WHERE side = 'pop'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        key.ends_with(":1") && pops == 1,
        "numbered once: {key}, {pops} pops"
    );
    assert_eq!(fx.leftovers().await, vec![fx.ran()]);
    fx.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn lists_of_a_former_larger_concurrency_are_recovered(pool: PgPool) {
    let fx = Fixture::new(
        "json:/id",
        Phase::Shadow,
        PushEnd::Lpush,
        sh("exit 0", &[]),
        1,
        3,
    );
    // Left by a run with four slots.
    let _: i64 = redis()
        .await
        .lpush(fx.processing(3), r#"{"id":"orphan"}"#)
        .await
        .unwrap();
    let running = fx.start(&pool).await;
    wait_for_count(
        &pool,
        "the orphan's outcome",
        "SELECT count(*) FROM qbridge.outcomes",
        1,
    )
    .await;
    let report = running.stop().await;
    assert_eq!(report.recovered, 1);
    assert_eq!(outcomes(&pool).await[0].0, "orphan");
    assert_eq!(fx.leftovers().await, vec![fx.ran()]);
    fx.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn shutdown_finishes_the_item_in_hand_within_the_drain_deadline(pool: PgPool) {
    let dir = marker_dir();
    let started = dir.path().join("started");
    let script = r#"touch "$1"; sleep 0.5"#;
    let fx = Fixture::new(
        "json:/id",
        Phase::Shadow,
        PushEnd::Lpush,
        sh(script, &[started.to_str().unwrap()]),
        1,
        3,
    );
    let _: i64 = redis()
        .await
        .lpush(&fx.list, r#"{"id":"a"}"#)
        .await
        .unwrap();
    let _: i64 = redis()
        .await
        .lpush(&fx.list, r#"{"id":"b"}"#)
        .await
        .unwrap();
    let running = fx.start(&pool).await;
    wait_for("the handler to start", Duration::from_secs(10), || async {
        started.exists()
    })
    .await;
    let report = running.stop().await;
    // The item in hand finished; the next one was never popped.
    assert_eq!(report.ok, 1);
    let left: Vec<String> = redis().await.lrange(&fx.list, 0, -1).await.unwrap();
    assert_eq!(left, vec![r#"{"id":"b"}"#.to_string()]);
    assert_eq!(
        redis()
            .await
            .llen::<_, i64>(fx.processing(0))
            .await
            .unwrap(),
        0
    );
    fx.cleanup().await;
}
