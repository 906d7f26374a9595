//! A client's retry of a job the route already ran, arriving after Redis
//! lost its data (a restart without persistence erased the ran set): the
//! outcome in Postgres is the record that it ran, and the consumer drops
//! the second item unrun instead of running the job again (found by the
//! randomized oracle once it refused second items after a run on record).

use ::redis::AsyncCommands;
use sqlx::PgPool;

use qbridge::config::PushEnd;
use qbridge::model::Phase;

use super::{redis, Fixture};
use crate::support::{sh, wait_for_count};

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_retry_of_a_job_that_ran_is_dropped_after_redis_lost_its_ran_set(pool: PgPool) {
    let fx = Fixture::new(
        "json:/id",
        Phase::DualWrite,
        PushEnd::Lpush,
        sh("exit 0", &[]),
        1,
        3,
    );
    let running = fx.start(&pool).await;
    let item = r#"{"id":"k-ran-before"}"#;
    let _: i64 = redis().await.lpush(&fx.list, item).await.unwrap();
    wait_for_count(
        &pool,
        "the first run's outcome",
        "SELECT count(*) FROM qbridge.outcomes WHERE key = 'k-ran-before'",
        1,
    )
    .await;
    // What a Redis restart without persistence does to the ran set.
    let _: i64 = redis().await.del(fx.ran()).await.unwrap();
    let _: i64 = redis().await.lpush(&fx.list, item).await.unwrap();
    fx.wait_handled("the second item handled").await;
    let report = running.stop().await;
    assert_eq!(report.ok, 1, "ran once: {report:?}");
    assert_eq!(report.dropped_already_ran, 1, "{report:?}");
    fx.cleanup().await;
}
