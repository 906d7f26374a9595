//! qbridge's own Redis consumer ran every job, but half of the outcome
//! reports never reached Postgres (the recorder's buffer drops batches it
//! cannot write, e.g. through a Postgres failover): silence is not a loss,
//! and repair must not push those jobs back to run a second time.

use std::time::Duration;

use sqlx::PgPool;

use qbridge::redis::connect::connect_redis;

use super::{delete_keys, ProxySide, REDIS};
use crate::support;

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn jobs_the_consumer_ran_are_never_pushed_back_when_their_reports_are_lost(pool: PgPool) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (route, list) = (format!("lr{}", &id[..12]), format!("qbt:{id}:jobs"));
    let toml = format!(
        "[[routes]]\nname = \"{route}\"\nredis_key = \"{list}\"\nqueue = \"{route}\"\n\
         format = \"json:/id\"\nphase = \"dual_write\"\nhandler = {{ type = \"noop\" }}\n\
         redis_consumer = {{ concurrency = 2, consumer_name = \"c{}\" }}\n\
         diff = {{ settle = \"0s\" }}\n",
        &id[..8]
    );
    let mut side = ProxySide::start(&pool, &toml).await;
    side.start_consumers(&pool, &toml).await;
    let client = ::redis::Client::open(side.url()).unwrap();
    let mut producer = client.get_multiplexed_async_connection().await.unwrap();
    for n in 0..20 {
        let _: i64 = ::redis::cmd("LPUSH")
            .arg(&list)
            .arg(format!(r#"{{"id":"job-{n}"}}"#))
            .query_async(&mut producer)
            .await
            .unwrap();
    }
    support::wait_for_count(
        &pool,
        "every job ran on Redis and was reported",
        &format!(
            "SELECT count(DISTINCT key) FROM qbridge.outcomes \
              WHERE queue = '{route}' AND side = 'redis' AND outcome = 'ok'"
        ),
        20,
    )
    .await;
    // Half of the reports are lost on the way to Postgres.
    sqlx::query(
        "DELETE FROM qbridge.outcomes WHERE queue = $1 AND side = 'redis' \
            AND key IN (SELECT key FROM qbridge.outcomes WHERE queue = $1 AND side = 'redis' \
                        ORDER BY key LIMIT 10)",
    )
    .bind(&route)
    .execute(&pool)
    .await
    .unwrap();

    let mut redis = connect_redis(REDIS).await.unwrap();
    let routes = side.side_routes();
    let route_ref = routes.by_name(&route).unwrap().clone();
    let since = chrono::Utc::now() - chrono::Duration::minutes(10);
    let (diff, report) = super::diff_and_repair(&pool, &mut redis, &route_ref, since).await;
    assert_eq!(
        report.repushed, 0,
        "jobs the consumer ran were pushed back: {report:?}; diff: {}",
        diff.verdict
    );
    assert_eq!(
        diff.only_postgres, 0,
        "a job that ran on Redis is not 'only on postgres': {}",
        diff.verdict
    );
    // Nothing waits in Redis to run a second time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let runs: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.outcomes WHERE queue = $1 AND side = 'redis'",
    )
    .bind(&route)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(runs, 10, "no job ran again");

    side.stop().await;
    delete_keys(&[&format!("*{id}*"), &format!("*{route}*")]).await;
}
